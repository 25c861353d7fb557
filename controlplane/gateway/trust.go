package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// DefaultBundleReload is how often a gateway reads the PKI bundle from the
// database (Config.BundleReload): a node-CA rotation's roots are trusted,
// and its new issuer used, within this of the phase change, without a
// restart.
const DefaultBundleReload = time.Second

// trust is one version of the PKI bundle and everything the gateway
// derives from it: the node verifiers, the roots it sends, and the TLS
// configuration handshakes use. It is replaced whole, never changed.
type trust struct {
	bundle *pki.Bundle
	// sealed is the stored form, to tell a changed bundle without opening
	// it; nil for the bundle New was given.
	sealed []byte
	// verifier checks sessions' and renewals' certificates against the
	// serving roots (pki.Bundle.NodeCARoots).
	verifier *pki.NodeVerifier
	// reattest checks key proofs' chains against the serving and the
	// retired roots (pki.Bundle.ReattestRoots).
	reattest *pki.NodeVerifier
	rootsDER [][]byte
	// tls is the configuration of each handshake (GetConfigForClient):
	// the base configuration with the serving roots as ClientCAs.
	tls *tls.Config
}

// newTrust derives a trust from b, cloning base for the handshakes.
func newTrust(b *pki.Bundle, sealed []byte, base *tls.Config) *trust {
	roots := b.NodeCARoots()
	t := &trust{bundle: b, sealed: sealed, verifier: b.NodeVerifier(), reattest: b.ReattestVerifier(),
		rootsDER: make([][]byte, len(roots))}
	pool := x509.NewCertPool()
	for i, c := range roots {
		t.rootsDER[i] = c.Raw
		pool.AddCert(c)
	}
	t.tls = base.Clone()
	t.tls.GetConfigForClient = nil
	t.tls.ClientCAs = pool
	// gRPC's credentials add h2 to the configuration they are given; the
	// one chosen per handshake must offer it too.
	t.tls.NextProtos = []string{"h2"}
	return t
}

// current is the trust in force.
func (g *Gateway) current() *trust { return g.trust.Load() }

// configForClient is the TLS configuration's GetConfigForClient: each
// handshake checks client certificates against the roots in force.
func (g *Gateway) configForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	return g.current().tls, nil
}

// bundleLoop reads the bundle every Config.BundleReload and, when it
// changed, trusts its roots and issues from its node CA from then on. A
// bundle that cannot be read or opened keeps the one in force, logged.
func (g *Gateway) bundleLoop(ctx context.Context) {
	if g.cfg.Secret == "" {
		return // nothing to open it with: the bundle New was given stays
	}
	t := time.NewTicker(g.cfg.BundleReload)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := g.reloadBundle(ctx); err != nil && ctx.Err() == nil {
			g.log.WarnContext(ctx, "PKI bundle not reloaded; the one in force stays", logkey.Err, err)
		}
	}
}

// reloadBundle reads the bundle once and swaps it in when it changed.
func (g *Gateway) reloadBundle(ctx context.Context) error {
	sealed, err := g.store.PKIBundleGet(ctx)
	if err != nil {
		return err
	}
	cur := g.current()
	if bytes.Equal(cur.sealed, sealed.Sealed) {
		return nil
	}
	b, err := pki.OpenBundle(g.cfg.Secret, sealed.Sealed)
	if err != nil {
		return err
	}
	if b.TrustDomain != cur.bundle.TrustDomain {
		return errTrustDomainChanged{was: cur.bundle.TrustDomain, now: b.TrustDomain}
	}
	next := newTrust(b, sealed.Sealed, g.tlsBase)
	changed := !sameRoots(cur.rootsDER, next.rootsDER) || !cur.bundle.NodeCA.Cert.Equal(b.NodeCA.Cert)
	g.trust.Store(next)
	g.admit.SetBundle(b)
	if changed {
		g.log.InfoContext(ctx, "Node CA roots reloaded", "roots", len(next.rootsDER), "issuer", pki.NodeCAID(b.NodeCA.Cert))
	}
	return nil
}

func sameRoots(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// errTrustDomainChanged refuses a bundle of another trust domain: every
// node's identity names the one the gateway started with.
type errTrustDomainChanged struct{ was, now string }

func (e errTrustDomainChanged) Error() string {
	return "the bundle in the database is for trust domain " + e.now + ", this gateway serves " + e.was + ": restart it"
}

// bundleStore is what bundleLoop reads.
type bundleStore interface {
	PKIBundleGet(ctx context.Context) (*store.PKIBundle, error)
}
