package control

import (
	"bytes"
	"cmp"
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/certreload"
	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// ErrPeer reports a peer certificate that is not an internal identity of
// the deployment.
var ErrPeer = errors.New("peer is not an internal control-plane identity")

// Identity is what both sides of the internal API need: their own
// certificate and the internal CAs that vouch for the other side. The
// roots follow the deployment's bundle (SetBundle, Run): during an
// internal-CA rotation a process trusts the CA in force and the rotation's
// other one, and presents a certificate from the CA in force, re-issued in
// memory for the files' key and names when the files hold one from another
// internal CA of the deployment (DESIGN.md, "CA rotation").
type Identity struct {
	// Certs holds this process's internal certificate as the files have
	// it (leaf, then the internal CA), hot-reloaded.
	Certs *certreload.Reloader
	// TrustDomain is the deployment's SPIFFE trust domain; a peer must name
	// spiffe://<TrustDomain>/internal/<name>.
	TrustDomain string

	log   *slog.Logger
	now   func() time.Time
	trust atomic.Pointer[internalTrust]
}

// internalTrust is one version of the bundle and what the identity derives
// from it; replaced whole, never changed.
type internalTrust struct {
	bundle *pki.Bundle
	sealed []byte // the stored form, to tell a changed bundle; nil for the one given
	roots  *x509.CertPool
	ids    []string // pki.NodeCAID of each root, the CA in force first
	// presented is the certificate handshakes present under this bundle
	// and the files' certificate it was made from.
	presented atomic.Pointer[presentedCert]
}

type presentedCert struct{ file, cert *tls.Certificate }

// NewIdentity reads the certificate files (pki issue-internal writes them)
// and takes the internal CAs and trust domain from bundle. It fails when
// the files do not hold a key pair or the bundle has no internal CA.
func NewIdentity(bundle *pki.Bundle, certFile, keyFile string, log *slog.Logger) (*Identity, error) {
	if bundle == nil || bundle.InternalCA == nil || bundle.InternalCA.Cert == nil {
		return nil, errors.New("internal control API: the PKI bundle has no internal CA")
	}
	if certFile == "" || keyFile == "" {
		return nil, errors.New("internal control API: the certificate and key files are required (better-compute pki issue-internal writes them)")
	}
	certs, err := certreload.New(certFile, keyFile, log)
	if err != nil {
		return nil, fmt.Errorf("internal control API: %w", err)
	}
	id := &Identity{Certs: certs, TrustDomain: bundle.TrustDomain, log: log, now: time.Now}
	id.trust.Store(newInternalTrust(bundle, nil))
	return id, nil
}

func newInternalTrust(b *pki.Bundle, sealed []byte) *internalTrust {
	t := &internalTrust{bundle: b, sealed: sealed, roots: x509.NewCertPool()}
	for _, c := range b.InternalCARoots() {
		t.roots.AddCert(c)
		t.ids = append(t.ids, pki.NodeCAID(c))
	}
	return t
}

// SetBundle trusts b's internal CAs from the next handshake on, and
// presents a certificate from its CA in force. A bundle of another trust
// domain is refused.
func (id *Identity) SetBundle(b *pki.Bundle) error {
	return id.setBundle(b, nil)
}

func (id *Identity) setBundle(b *pki.Bundle, sealed []byte) error {
	if b.TrustDomain != id.TrustDomain {
		return fmt.Errorf("internal control API: the bundle's trust domain changed from %s to %s; restart the process", id.TrustDomain, b.TrustDomain)
	}
	cur := id.trust.Load()
	next := newInternalTrust(b, sealed)
	if p := cur.presented.Load(); p != nil && cur.bundle.InternalCA.Cert.Equal(b.InternalCA.Cert) {
		// The same CA in force: what it presented still holds.
		next.presented.Store(p)
	}
	id.trust.Store(next)
	if !slices.Equal(cur.ids, next.ids) {
		id.log.Info("Internal CA roots reloaded", "roots", len(next.ids), "internal_ca", next.ids[0])
	}
	return nil
}

// BundleSource is where Run reads the sealed bundle: the store.
type BundleSource interface {
	PKIBundleGet(ctx context.Context) (*store.PKIBundle, error)
}

// DefaultBundleReload is how often Run reads the bundle: an internal-CA
// rotation's phase change reaches the process within it.
const DefaultBundleReload = time.Second

// DefaultCertReload is how often Run re-reads the certificate files.
const DefaultCertReload = 60 * time.Second

// Run re-reads the bundle from src (opened with secret) every
// bundleEvery and the certificate files every certEvery until ctx ends. A
// bundle that cannot be read or opened keeps the one in force, logged; it
// returns nil.
func (id *Identity) Run(ctx context.Context, src BundleSource, secret string, bundleEvery, certEvery time.Duration) error {
	bundleEvery, certEvery = cmp.Or(bundleEvery, DefaultBundleReload), cmp.Or(certEvery, DefaultCertReload)
	go id.Certs.Run(ctx, certEvery)
	if src == nil || secret == "" {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(bundleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := id.reload(ctx, src, secret); err != nil && ctx.Err() == nil {
			id.log.WarnContext(ctx, "PKI bundle not reloaded for the internal control API; the one in force stays", logkey.Err, err)
		}
	}
}

func (id *Identity) reload(ctx context.Context, src BundleSource, secret string) error {
	sealed, err := src.PKIBundleGet(ctx)
	if err != nil {
		return err
	}
	if bytes.Equal(id.trust.Load().sealed, sealed.Sealed) {
		return nil
	}
	b, err := pki.OpenBundle(secret, sealed.Sealed)
	if err != nil {
		return err
	}
	return id.setBundle(b, sealed.Sealed)
}

// Trusts returns the ids (pki.NodeCAID) of the internal CAs this process
// accepts peers from now, the CA in force first: what it reports in its
// process row, the proof an internal-CA rotation advances on.
func (id *Identity) Trusts() []string { return slices.Clone(id.trust.Load().ids) }

// Presents returns the id of the internal CA whose certificate this
// process presents now ("" when the files' certificate cannot be
// parsed).
func (id *Identity) Presents() string {
	c := id.certificate()
	if c == nil || len(c.Certificate) == 0 {
		return ""
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return ""
	}
	for _, r := range id.trust.Load().bundle.InternalCARoots() {
		if leaf.CheckSignatureFrom(r) == nil {
			return pki.NodeCAID(r)
		}
	}
	return ""
}

// certificate is the certificate both sides present: the files' one when
// the internal CA in force issued it or no internal CA of the deployment
// did (a mistake, refused by peers and doctor alike); else one
// re-issued in memory from the CA in force for the same key and names
// (pki.Bundle.ReissueInternal), made once per bundle and files.
func (id *Identity) certificate() *tls.Certificate {
	file := id.Certs.Current()
	t := id.trust.Load()
	if p := t.presented.Load(); p != nil && p.file == file {
		return p.cert
	}
	cert, err := presentFor(t.bundle, file, id.now())
	switch {
	case err != nil:
		id.log.Warn("Internal certificate not re-issued from the internal CA in force; presenting the files' certificate",
			"internal_ca", t.ids[0], logkey.Err, err)
		cert = file
	case cert != file:
		id.log.Info("Internal certificate re-issued from the internal CA in force", "internal_ca", t.ids[0],
			"not_after", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	t.presented.Store(&presentedCert{file: file, cert: cert})
	return cert
}

// presentFor is the certificate to present for the files' certificate file
// under bundle b: file itself, or a re-issue from b's internal CA in force
// when another internal CA of the deployment issued it
// (pki.Bundle.FromOtherInternalCA: a rotation's, or one it retired).
func presentFor(b *pki.Bundle, file *tls.Certificate, now time.Time) (*tls.Certificate, error) {
	leaf := file.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(file.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parse internal certificate: %w", err)
		}
	}
	if !b.FromOtherInternalCA(leaf) {
		return file, nil
	}
	key, ok := file.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("internal key is %T, want an ECDSA key to re-issue", file.PrivateKey)
	}
	chain, err := b.ReissueInternal(leaf, key, now)
	if err != nil {
		return nil, err
	}
	out := &tls.Certificate{PrivateKey: key, Leaf: chain[0]}
	for _, c := range chain {
		out.Certificate = append(out.Certificate, c.Raw)
	}
	return out, nil
}

// verifyPeer checks that the verified chain's leaf names an internal SPIFFE
// ID of td: exactly one URI SAN spiffe://td/internal/<name>.
func verifyPeer(td string, cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return fmt.Errorf("%w: no verified certificate", ErrPeer)
	}
	leaf := cs.VerifiedChains[0][0]
	if len(leaf.URIs) != 1 {
		return fmt.Errorf("%w: certificate %q names %d URIs, want one internal SPIFFE ID", ErrPeer, leaf.Subject.CommonName, len(leaf.URIs))
	}
	id := leaf.URIs[0].String()
	prefix := pki.InternalSPIFFEID(td, "")
	if !strings.HasPrefix(id, prefix) || len(id) == len(prefix) {
		return fmt.Errorf("%w: certificate names %s, want %s<name>", ErrPeer, id, prefix)
	}
	return nil
}

// serverTLS is the listener's configuration: TLS 1.3, this identity's
// certificate, a client certificate from an internal CA the bundle in
// force trusts required (chosen per handshake, so a reloaded bundle
// applies to the next one).
func (id *Identity) serverTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return &tls.Config{
				MinVersion:       tls.VersionTLS13,
				GetCertificate:   func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return id.certificate(), nil },
				ClientAuth:       tls.RequireAndVerifyClientCert,
				ClientCAs:        id.trust.Load().roots,
				NextProtos:       []string{"h2"},
				VerifyConnection: func(cs tls.ConnectionState) error { return verifyPeer(id.TrustDomain, cs) },
			}, nil
		},
	}
}

// clientTLS is the dialer's configuration: TLS 1.3, this identity's
// certificate offered, the server verified against the internal CAs of the
// bundle in force at each handshake for serverName (the host of the
// gateway's internal address). crypto/tls reads RootCAs once per
// configuration, and gRPC keeps one configuration per connection, so the
// chain is verified here (VerifyConnection) with the roots of the moment.
func (id *Identity) clientTLS(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: serverName,
		// Verified below, by the same rules crypto/tls applies, against
		// the roots in force.
		InsecureSkipVerify: true, //nolint:gosec // the chain and name are verified in VerifyConnection
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return id.certificate(), nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if serverName == "" {
				// crypto/tls refuses to verify without a name; so does this.
				return fmt.Errorf("%w: the internal address names no host to verify the server's certificate for", ErrPeer)
			}
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("%w: no certificate", ErrPeer)
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			chains, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: id.trust.Load().roots, Intermediates: inter,
				DNSName: serverName, CurrentTime: id.now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			if err != nil {
				return fmt.Errorf("internal control API: server certificate: %w", err)
			}
			cs.VerifiedChains = chains
			return verifyPeer(id.TrustDomain, cs)
		},
	}
}
