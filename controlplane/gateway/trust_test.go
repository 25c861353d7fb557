package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rotation"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TestGatewayReloadsNodeCARoots: a running gateway trusts a rotation's
// next node CA within its bundle reload, issues from the new CA once the
// rotation is activated, and stops trusting the old CA for new
// handshakes once it is retired, while the session opened on the old CA
// stays up throughout.
func TestGatewayReloadsNodeCARoots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	e := newEnv(t, st)
	sealed, err := e.bundle.SealBundle(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PKIBundleCreate(ctx, &store.PKIBundle{TrustDomain: e.bundle.TrustDomain, Sealed: sealed}); err != nil {
		t.Fatal(err)
	}
	g := e.start(func(c *Config) { c.BundleReload = 50 * time.Millisecond })
	old := e.join(g, "gpu-old", "m-old")
	oldSession := e.connect(g, old)
	mid := e.join(g, "gpu-mid", "m-mid")

	rot, err := rotation.New(rotation.Config{Secret: testSecret}, st)
	if err != nil {
		t.Fatal(err)
	}
	ro, err := rot.Start(ctx, rotation.StartParams{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	e.eventually(t, 30*time.Second, "gateway trusts the next node CA", func() bool { return len(g.current().rootsDER) == 2 })
	// A certificate from the next CA (issued by hand: no gateway issues
	// from it yet) opens a session.
	next := loadTestBundle(t, st)
	next.NodeCA = next.NextNodeCA
	key, csr := newKey(t)
	issued, err := next.IssueNode(csr, mid.id, pki.IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.connect(g, &node{id: mid.id, cert: tls.Certificate{Certificate: [][]byte{issued.CertDER}, PrivateKey: key}})

	if _, err := rot.Advance(ctx, rotation.AdvanceParams{Actor: "test", Force: true}); err != nil {
		t.Fatal(err)
	}
	e.eventually(t, 30*time.Second, "gateway issues from the new CA", func() bool {
		return pki.NodeCAID(g.current().bundle.NodeCA.Cert) == ro.NewCAID
	})
	joined := e.join(g, "gpu-new", "m-new")
	leaf, err := x509.ParseCertificate(joined.resp.CertificateChain[0])
	if err != nil {
		t.Fatal(err)
	}
	if pki.NodeCAID(next.NodeCA.Cert) != ro.NewCAID || leaf.CheckSignatureFrom(next.NodeCA.Cert) != nil {
		t.Fatal("a join after activation did not get a certificate from the new CA")
	}
	if len(joined.resp.NodeCaRoots) != 2 {
		t.Fatalf("join answer carries %d node CA roots, want old + new", len(joined.resp.NodeCaRoots))
	}
	e.connect(g, joined)

	if _, err := rot.Advance(ctx, rotation.AdvanceParams{Actor: "test", Force: true}); err != nil {
		t.Fatal(err)
	}
	e.eventually(t, 30*time.Second, "gateway drops the retired root", func() bool { return len(g.current().rootsDER) == 1 })
	if s, err := e.tryConnect(g, &old.cert); err == nil {
		s.cancel()
		t.Fatal("a certificate of the retired CA still opens a session")
	}
	// The session opened on the old CA before the rotation is still up:
	// a rotation drops no session.
	if n := g.Sessions(); n != 3 {
		t.Fatalf("gateway holds %d sessions, want the 3 opened on the old, next and new CA", n)
	}
	if err := oldSession.stream.Send(&sessionv1.NodeMessage{Seq: 2, Body: &sessionv1.NodeMessage_Heartbeat{Heartbeat: &sessionv1.Heartbeat{}}}); err != nil {
		t.Fatalf("the session opened before the rotation was dropped: %v", err)
	}
}

func loadTestBundle(t *testing.T, st store.Store) *pki.Bundle {
	t.Helper()
	sealed, err := st.PKIBundleGet(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b, err := pki.OpenBundle(testSecret, sealed.Sealed)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGatewaySendsBundleAndRecordsAcks: while a rotation is open, open
// sessions get a Bundle with the rotation's roots and new sessions get it
// after Welcome; a BundleAck is recorded for its node, and an ack naming
// another rotation is not.
func TestGatewaySendsBundleAndRecordsAcks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	e := newEnv(t, st)
	sealed, err := e.bundle.SealBundle(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PKIBundleCreate(ctx, &store.PKIBundle{TrustDomain: e.bundle.TrustDomain, Sealed: sealed}); err != nil {
		t.Fatal(err)
	}
	g := e.start(func(c *Config) { c.BundleReload = 50 * time.Millisecond })
	early, late := e.join(g, "gpu-early", "m-early"), e.join(g, "gpu-late", "m-late")
	earlySession := e.connect(g, early)

	rot, err := rotation.New(rotation.Config{Secret: testSecret}, st)
	if err != nil {
		t.Fatal(err)
	}
	ro, err := rot.Start(ctx, rotation.StartParams{Actor: "test"})
	if err != nil {
		t.Fatal(err)
	}
	recvBundle := func(s *clientSession) *sessionv1.Bundle {
		t.Helper()
		for {
			m, err := s.stream.Recv()
			if err != nil {
				t.Fatalf("session ended before a Bundle: %v", err)
			}
			if b := m.GetBundle(); b != nil {
				return b
			}
		}
	}
	b := recvBundle(earlySession)
	if b.GetRotationId() != ro.ID || len(b.GetNodeCaRoots()) != 2 {
		t.Fatalf("bundle = rotation %q with %d roots, want %s with old + new", b.GetRotationId(), len(b.GetNodeCaRoots()), ro.ID)
	}
	lateSession := e.connect(g, late)
	if b := recvBundle(lateSession); b.GetRotationId() != ro.ID {
		t.Fatalf("a session opened during the rotation got bundle %q", b.GetRotationId())
	}
	ack := func(s *clientSession, seq uint64, id string) {
		t.Helper()
		if err := s.stream.Send(&sessionv1.NodeMessage{Seq: seq, Body: &sessionv1.NodeMessage_BundleAck{BundleAck: &sessionv1.BundleAck{RotationId: id}}}); err != nil {
			t.Fatal(err)
		}
	}
	ack(earlySession, 2, ro.ID)
	ack(lateSession, 2, "rot_other")
	e.eventually(t, 30*time.Second, "the ack is recorded", func() bool {
		c, err := st.PKIRotationAckCounts(ctx, ro.ID, 10)
		return err == nil && c.Acked == 1
	})
	c, err := st.PKIRotationAckCounts(ctx, ro.ID, 10)
	if err != nil {
		t.Fatal(err)
	}
	if c.Live != 2 || len(c.Missing) != 1 || c.Missing[0] != late.id {
		t.Fatalf("counts = %+v, want 2 live, %s missing (its ack named another rotation)", c, late.id)
	}
}
