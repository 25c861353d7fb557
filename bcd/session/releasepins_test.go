package session_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

var _ session.ReleasePinKeeper = (*pinKeeper)(nil)

// pinKeeper records the statements applied and holds pins: "add:PIN"
// statements add PIN, "bad" ones are refused.
type pinKeeper struct {
	mu   sync.Mutex
	pins []string
}

func (k *pinKeeper) ApplyPinStatement(_ context.Context, statement, _ []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	s := string(statement)
	if !strings.HasPrefix(s, "add:") {
		return errors.New("signed by an unpinned key")
	}
	if p := strings.TrimPrefix(s, "add:"); !slices.Contains(k.pins, p) {
		k.pins = append(k.pins, p)
	}
	return nil
}

func (k *pinKeeper) HeldPins(context.Context) ([]string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.pins), nil
}

// TestReleasePinsApplied: with a ReleasePinKeeper, Hello offers
// release.pins; a ReleasePins is applied statement by statement (one
// refused does not stop the rest) and answered with the pins held; one
// over the bounds is refused whole, unanswered.
func TestReleasePinsApplied(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	cfg := n.config()
	cfg.Capabilities = []string{"exec"}
	k := &pinKeeper{pins: []string{"sha256/old"}}
	cfg.ReleasePins = k
	run(t, newClient(t, cfg))

	s := g.NextSession(t, wait)
	if caps := s.Hello.GetCapabilities(); !slices.Equal(caps, []string{"exec", sessionv1.CapabilityReleasePins}) {
		t.Fatalf("Hello capabilities = %v", caps)
	}
	stmt := func(doc string) *sessionv1.ReleasePinStatement {
		return &sessionv1.ReleasePinStatement{Statement: []byte(doc), Signature: []byte("sig")}
	}
	held := func() []string {
		t.Helper()
		deadline := time.After(wait)
		for {
			select {
			case m := <-s.Messages():
				if h := m.GetReleasePinsHeld(); h != nil {
					return h.GetPins()
				}
			case <-deadline:
				t.Fatal("no ReleasePinsHeld")
			}
		}
	}
	// Over the bounds (an empty signature): refused whole, unanswered;
	// then a good one is answered with only its own effect.
	over := &sessionv1.ReleasePins{Statements: []*sessionv1.ReleasePinStatement{stmt("add:sha256/over"), {Statement: []byte("add:x")}}}
	if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_ReleasePins{ReleasePins: over}}); err != nil {
		t.Fatal(err)
	}
	good := &sessionv1.ReleasePins{Statements: []*sessionv1.ReleasePinStatement{stmt("bad"), stmt("add:sha256/new")}}
	if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_ReleasePins{ReleasePins: good}}); err != nil {
		t.Fatal(err)
	}
	if got := held(); !slices.Equal(got, []string{"sha256/old", "sha256/new"}) {
		t.Fatalf("ReleasePinsHeld = %v, want old and new (the refused statement skipped, the oversized message not applied)", got)
	}
}
