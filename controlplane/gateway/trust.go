package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
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
	// rotationID is the node-CA rotation open (propagating or activated)
	// when the bundle was read, "" when none: sessions are sent a Bundle
	// with it and their acks recorded against it.
	rotationID string
	// gwRotationID is the gateway-CA rotation open when the bundle was
	// read, "" when none: sessions that offer "gateway.bundle" are sent a
	// Bundle with the gateway CA roots (gwRootsDER) and their acks
	// recorded against it.
	gwRotationID string
	gwRootsDER   [][]byte
	// gwRotated reports that the gateway CA's latest rotation activated
	// (activated or retired): a serving certificate from another gateway
	// CA of the deployment is then re-issued from the CA in force
	// (servingFor).
	gwRotated bool
	// serving is the certificate handshakes present: the files' key with
	// a leaf from the gateway CA in force and the chain the bundle's phase
	// calls for (servingFor); nil until first asked.
	serving atomic.Pointer[servingCert]
	// tls is the configuration of each handshake (GetConfigForClient):
	// the base configuration with the serving roots as ClientCAs.
	tls *tls.Config
}

// newTrust derives a trust from b, cloning base for the handshakes.
func newTrust(b *pki.Bundle, sealed []byte, base *tls.Config) *trust {
	roots := b.NodeCARoots()
	t := &trust{bundle: b, sealed: sealed, verifier: b.NodeVerifier(), reattest: b.ReattestVerifier(),
		rootsDER: make([][]byte, len(roots))}
	for _, c := range b.GatewayCARoots() {
		t.gwRootsDER = append(t.gwRootsDER, c.Raw)
	}
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
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.cfg.Clock.After(g.cfg.BundleReload):
		}
		if err := g.reloadBundle(ctx); err != nil && ctx.Err() == nil {
			g.log.WarnContext(ctx, "PKI bundle not reloaded; the one in force stays", logkey.Err, err)
		}
	}
}

// reloadBundle reads the bundle once and swaps it in when it changed.
func (g *Gateway) reloadBundle(ctx context.Context) error {
	sealed, err := g.store.PKIBundleGet(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return nil // a gateway given a bundle the database does not hold (tests): it keeps it
	}
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
	ro, err := g.store.PKIRotationLatest(ctx, store.RotationCANode)
	switch {
	case err == nil && (ro.Phase == store.RotationPropagating || ro.Phase == store.RotationActivated):
		next.rotationID = ro.ID
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return err
	}
	gro, err := g.store.PKIRotationLatest(ctx, store.RotationCAGateway)
	switch {
	case err == nil && (gro.Phase == store.RotationPropagating || gro.Phase == store.RotationActivated):
		next.gwRotationID = gro.ID
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return err
	}
	next.gwRotated = err == nil && (gro.Phase == store.RotationActivated || gro.Phase == store.RotationRetired)
	gwChanged := !sameRoots(cur.gwRootsDER, next.gwRootsDER) || !cur.bundle.GatewayCA.Cert.Equal(b.GatewayCA.Cert) || cur.gwRotated != next.gwRotated
	changed := !sameRoots(cur.rootsDER, next.rootsDER) || !cur.bundle.NodeCA.Cert.Equal(b.NodeCA.Cert)
	g.trust.Store(next)
	g.admit.SetBundle(b)
	if changed {
		g.log.InfoContext(ctx, "Node CA roots reloaded", "roots", len(next.rootsDER), "issuer", pki.NodeCAID(b.NodeCA.Cert),
			"rotation_id", next.rotationID)
	}
	if next.rotationID != "" && (changed || next.rotationID != cur.rotationID) {
		g.broadcastBundle(ctx, next)
	}
	if gwChanged {
		g.log.InfoContext(ctx, "Gateway CA roots reloaded", "roots", len(next.gwRootsDER), "serving_ca", pki.NodeCAID(b.GatewayCA.Cert),
			"rotation_id", next.gwRotationID)
	}
	if next.gwRotationID != "" && (gwChanged || next.gwRotationID != cur.gwRotationID) {
		g.broadcastGatewayBundle(ctx, next)
	}
	return nil
}

// gatewayBundleMessage is the Bundle message of t's open gateway-CA
// rotation, nil without one: the gateway CA roots, and the node CA roots in
// force (a node keeps those as they are).
func (t *trust) gatewayBundleMessage() *sessionv1.GatewayMessage {
	if t.gwRotationID == "" {
		return nil
	}
	return &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Bundle{Bundle: &sessionv1.Bundle{
		NodeCaRoots: t.rootsDER, RotationId: t.gwRotationID, GatewayCaRoots: t.gwRootsDER}}}
}

// broadcastGatewayBundle sends t's gateway-CA Bundle to every open session
// that offers "gateway.bundle", as broadcastBundle does.
func (g *Gateway) broadcastGatewayBundle(ctx context.Context, t *trust) {
	msg := t.gatewayBundleMessage()
	n := 0
	for _, s := range g.sessions.snapshot() {
		if s.hasCap(sessionv1.CapabilityGatewayBundle) {
			n++
			go func() { _ = s.send(msg) }() // a session that ended has nothing to ack
		}
	}
	g.log.InfoContext(ctx, "Gateway CA bundle sending to sessions", "rotation_id", t.gwRotationID, "sessions", n)
}

// bundleMessage is the Bundle message of t, nil without an open rotation.
func (t *trust) bundleMessage() *sessionv1.GatewayMessage {
	if t.rotationID == "" {
		return nil
	}
	return &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Bundle{Bundle: &sessionv1.Bundle{
		NodeCaRoots: t.rootsDER, RotationId: t.rotationID}}}
}

// broadcastBundle sends t's Bundle to every open session, each on its own
// goroutine: a node that stops reading blocks only its own stream (until
// the session ends), never the reload loop or the other sessions. A
// session that cannot take it now (not yet welcomed: it is sent after
// Welcome) is skipped.
func (g *Gateway) broadcastBundle(ctx context.Context, t *trust) {
	msg := t.bundleMessage()
	sessions := g.sessions.snapshot()
	for _, s := range sessions {
		go func() { _ = s.send(msg) }() // a session that ended has nothing to ack
	}
	g.log.InfoContext(ctx, "Node CA bundle sending to sessions", "rotation_id", t.rotationID, "sessions", len(sessions))
}

// sendBundle sends the bundle in force to s after its Welcome, while a
// rotation is open.
func (g *Gateway) sendBundle(s *session) {
	cur := g.current()
	if msg := cur.bundleMessage(); msg != nil {
		_ = s.send(msg) // a session that ended has nothing to ack
	}
	if msg := cur.gatewayBundleMessage(); msg != nil && s.hasCap(sessionv1.CapabilityGatewayBundle) {
		_ = s.send(msg)
	}
}

// maxRotationIDLen bounds BundleAck.rotation_id.
const maxRotationIDLen = 64

// bundleAck records a node's acknowledgement of the rotation in force; an
// ack of another rotation (one that ended meanwhile) is dropped.
func (g *Gateway) bundleAck(s *session, ack *sessionv1.BundleAck) {
	id := ack.GetRotationId()
	cur := g.current()
	if id == "" || len(id) > maxRotationIDLen || (id != cur.rotationID && id != cur.gwRotationID) {
		return
	}
	g.acks.add(id, s.nodeID)
}

// ackBatch holds acknowledgements not yet written, by rotation.
type ackBatch struct {
	mu    sync.Mutex
	nodes map[string]map[string]struct{}
}

func (a *ackBatch) add(rotationID, nodeID string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.nodes == nil {
		a.nodes = map[string]map[string]struct{}{}
	}
	if a.nodes[rotationID] == nil {
		a.nodes[rotationID] = map[string]struct{}{}
	}
	a.nodes[rotationID][nodeID] = struct{}{}
}

func (a *ackBatch) take() map[string]map[string]struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.nodes
	a.nodes = nil
	return out
}

// ackLoop writes the acknowledgements received every Config.BundleReload,
// one statement per rotation; a failed write puts them back.
func (g *Gateway) ackLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			g.flushAcks(final)
			cancel()
			return
		case <-g.cfg.Clock.After(g.cfg.BundleReload):
			g.flushAcks(ctx)
		}
	}
}

func (g *Gateway) flushAcks(ctx context.Context) {
	for rotationID, set := range g.acks.take() {
		ids := slices.Sorted(maps.Keys(set))
		if err := g.store.PKIRotationAck(ctx, rotationID, ids, nil); err != nil {
			g.log.WarnContext(ctx, "Node CA bundle acks not written; retrying", "rotation_id", rotationID, "nodes", len(ids), logkey.Err, err)
			for _, id := range ids {
				g.acks.add(rotationID, id)
			}
		}
	}
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

// bundleStore is what bundleLoop and ackLoop read and write.
type bundleStore interface {
	PKIBundleGet(ctx context.Context) (*store.PKIBundle, error)
	PKIRotationLatest(ctx context.Context, ca string) (*store.PKIRotation, error)
	PKIRotationAck(ctx context.Context, rotationID string, nodeIDs []string, now *time.Time) error
}
