package session_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TestGatewayFieldsOutOfRangeRefused (issue 29, item 6): bcd refuses what a
// hostile gateway sends out of range, as the gateway refuses a node's: a
// Welcome listing 3,003 gateways ends the handshake with nothing kept, and
// a command with a 1 MiB id ends the session without reaching the handler;
// a well-formed command on the next session is handled.
func TestGatewayFieldsOutOfRangeRefused(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{HeartbeatInterval: time.Hour})
	n := joinNode(t, g)
	many := make([]string, 3003)
	for i := range many {
		many[i] = fmt.Sprintf("https://gw-%d.example:8443", i)
	}
	g.SetWelcomeGateways(many...)
	cfg := n.config()
	cfg.BackoffBase, cfg.BackoffMax = 20*time.Millisecond, 100*time.Millisecond
	var mu sync.Mutex
	var saved []int
	cfg.Identity = keeper{gateways: func(_ context.Context, k []session.KnownGateway) error {
		mu.Lock()
		saved = append(saved, len(k))
		mu.Unlock()
		return nil
	}}
	h := &commandsSeen{}
	cfg.Handler = h
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))
	// The oversized Welcome: refused, so no session is established.
	g.NextSession(t, wait)
	ev.next(t, session.EventBackoff)
	for quiet := time.After(200 * time.Millisecond); ; {
		var e session.Event
		select {
		case e = <-ev:
		case <-quiet:
		}
		if e.Kind == session.EventConnected {
			t.Fatalf("connected through a Welcome of 3,003 gateways: %+v", e)
		}
		if e == (session.Event{}) {
			break
		}
	}
	mu.Lock()
	if len(saved) != 0 {
		t.Errorf("kept gateway lists of %v entries from an oversized Welcome", saved)
	}
	mu.Unlock()

	g.SetWelcomeGateways(g.URL)
	ev.next(t, session.EventConnected)
	s := latestSession(t, g)
	if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{
		Command: &sessionv1.Command{Id: strings.Repeat("c", 1<<20), Kind: "reboot"}}}); err != nil {
		t.Fatal(err)
	}
	// The session ends, and the node connects again.
	ev.next(t, session.EventConnected)
	s = latestSession(t, g)
	if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{
		Command: &sessionv1.Command{Id: "c-ok", Kind: "reboot"}}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(wait)
	for h.ids() == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if ids := h.ids(); len(ids) != 1 || ids[0] != "c-ok" {
		t.Errorf("handled commands %d ids (first %.20q), want only c-ok", len(ids), ids)
	}
}

// latestSession returns the newest session g has opened: the ones before
// it (refused or ended) are skipped.
func latestSession(t *testing.T, g *sessiontest.Gateway) *sessiontest.Session {
	t.Helper()
	s := g.NextSession(t, wait)
	for {
		select {
		case next := <-g.Sessions():
			s = next
		default:
			return s
		}
	}
}

// commandsSeen records the ids of the commands it is handed.
type commandsSeen struct {
	mu   sync.Mutex
	seen []string
}

func (h *commandsSeen) HandleCommand(_ context.Context, cmd *sessionv1.Command, _ func(*sessionv1.CommandUpdate) error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = append(h.seen, cmd.GetId())
}

func (h *commandsSeen) HandleCancel(context.Context, *sessionv1.Cancel) {}

func (h *commandsSeen) ids() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.seen...)
}
