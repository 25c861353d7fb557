package gateway

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TestDrainOnCommand: an operator's drain request in the gateway's row
// (gateways.drain) is followed at the next lease renewal: the session gets
// Drain within the window, new sessions are refused, the row shows
// draining, and the gateway keeps running; the undrain request lets
// sessions in again.
func TestDrainOnCommand(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(func(c *Config) { c.LeaseRenewInterval = 50 * time.Millisecond; c.DrainDelay = 2 * time.Second })
		n := e.join(g, "gpu-80", "")
		s := e.connect(g, n)
		got := make(chan *sessionv1.GatewayMessage, 1)
		go func() {
			for {
				m, err := s.stream.Recv()
				if err != nil {
					close(got)
					return
				}
				if m.GetDrain() != nil {
					got <- m
					return
				}
			}
		}()

		if _, err := e.st.GatewayDrainSet(ctx, g.ID(), true); err != nil {
			t.Fatal(err)
		}
		select {
		case m, ok := <-got:
			if !ok {
				t.Fatal("the session ended without a Drain")
			}
			if d := m.GetDrain(); d.GetReason() != drainReason || d.GetDelay().AsDuration() > 2*time.Second {
				t.Fatalf("Drain = %v, want reason %q and a delay within the 2 s window", d, drainReason)
			}
		case <-deadline(t, 20*time.Second):
			t.Fatal("no Drain within 20 s of the request")
		}
		_, err := e.tryConnect(g, &n.cert)
		wantCode(t, err, codes.Unavailable)
		e.eventually(t, 30*time.Second, "row marked draining", func() bool {
			row, err := e.st.GatewayGet(ctx, g.ID())
			return err == nil && row.Draining && row.DrainRequested
		})
		select {
		case <-g.done:
			t.Fatalf("the gateway stopped on a drain: %v", g.err)
		default:
		}

		if _, err := e.st.GatewayDrainSet(ctx, g.ID(), false); err != nil {
			t.Fatal(err)
		}
		e.eventually(t, 30*time.Second, "sessions taken again", func() bool {
			s, err := e.tryConnect(g, &n.cert)
			if err == nil {
				s.cancel()
			}
			return err == nil
		})
		e.eventually(t, 30*time.Second, "row no longer draining", func() bool {
			row, err := e.st.GatewayGet(ctx, g.ID())
			return err == nil && !row.Draining && !row.DrainRequested
		})
	})
}
