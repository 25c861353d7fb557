package session_test

import (
	"context"
	"crypto/x509"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// gatewayKeeper is a keeper that takes part in gateway-CA rotations.
type gatewayKeeper struct {
	keeper
	mu    sync.Mutex
	roots []*x509.Certificate
}

func (k *gatewayKeeper) KeepGatewayRoots(_ context.Context, roots []*x509.Certificate) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.roots = roots
	return nil
}

// TestGatewayBundle: a client whose keeper keeps gateway roots offers
// "gateway.bundle", keeps a gateway-CA rotation's roots and only then
// acknowledges the bundle.
func TestGatewayBundle(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{HeartbeatInterval: time.Hour})
	n := joinNode(t, g)
	cfg := n.config()
	k := &gatewayKeeper{}
	cfg.Identity = k
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))
	ev.next(t, session.EventConnected)
	s := latestSession(t, g)
	if !slices.Contains(s.Hello.GetCapabilities(), sessionv1.CapabilityGatewayBundle) {
		t.Fatalf("Hello capabilities %v, want %s", s.Hello.GetCapabilities(), sessionv1.CapabilityGatewayBundle)
	}
	newCA := p.NodeCA // any CA certificate stands in for the next gateway CA
	if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Bundle{Bundle: &sessionv1.Bundle{
		NodeCaRoots: [][]byte{p.NodeCA.Raw}, RotationId: "rot_gw", GatewayCaRoots: [][]byte{p.GatewayCA.Raw, newCA.Raw}}}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(wait)
	for {
		select {
		case m := <-s.Messages():
			if m.GetBundleAck().GetRotationId() != "rot_gw" {
				continue
			}
			k.mu.Lock()
			kept := len(k.roots)
			k.mu.Unlock()
			if kept != 2 {
				t.Fatalf("acked after keeping %d gateway roots, want 2", kept)
			}
			return
		case <-deadline:
			t.Fatal("no BundleAck for the gateway-CA bundle")
		}
	}
}
