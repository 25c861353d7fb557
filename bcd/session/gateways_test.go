package session_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
)

func urls(ks []session.KnownGateway) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.URL
	}
	return out
}

// TestMergeGateways follows a gateway's life in a node's list: listed,
// still listed, gone for a day less a second (kept), gone longer
// (dropped).
func TestMergeGateways(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	a, b, c := "https://gw-a.example:8443", "https://gw-b.example:8443", "https://gw-c.example:8443"
	known := session.MergeGateways(nil, []string{a, b, "not a url", a}, t0, session.GatewayKeep)
	if got := urls(known); !slices.Equal(got, []string{a, b}) {
		t.Fatalf("first list = %v", got)
	}
	// a drains and goes; c starts.
	known = session.MergeGateways(known, []string{c, b}, t0.Add(time.Hour), session.GatewayKeep)
	if got := urls(known); !slices.Equal(got, []string{c, b, a}) {
		t.Fatalf("after a left = %v, want the listed first and a kept", got)
	}
	known = session.MergeGateways(known, []string{c, b}, t0.Add(24*time.Hour), session.GatewayKeep)
	if got := urls(known); !slices.Equal(got, []string{c, b, a}) {
		t.Fatalf("a day after a was last listed = %v, want a still kept", got)
	}
	known = session.MergeGateways(known, []string{c, b}, t0.Add(24*time.Hour+time.Second), session.GatewayKeep)
	if got := urls(known); !slices.Equal(got, []string{c, b}) {
		t.Fatalf("more than a day after = %v, want a dropped", got)
	}
	if known[0].ListedAt != t0.Add(24*time.Hour+time.Second) {
		t.Errorf("listed at %v", known[0].ListedAt)
	}
}

// TestWelcomeListReachesANewGateway: a node joined while only gateway A
// existed learns B from a Welcome, saves the list, and reaches B once A is
// gone for good, though B was never in its join-time list.
func TestWelcomeListReachesANewGateway(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	gwA := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{ID: "gw-a"})
	gwB := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{ID: "gw-b"})
	gwA.SetWelcomeGateways(gwA.URL, gwB.URL)
	n := joinNode(t, gwA)
	cfg := n.config()
	var mu sync.Mutex
	var saved [][]session.KnownGateway
	cfg.Identity = keeper{gateways: func(_ context.Context, k []session.KnownGateway) error {
		mu.Lock()
		saved = append(saved, k)
		mu.Unlock()
		return nil
	}}
	ev := newEvents(&cfg)
	c := newClient(t, cfg)
	run(t, c)
	gwA.NextSession(t, wait)
	ev.next(t, session.EventConnected)
	mu.Lock()
	if len(saved) != 1 || !slices.Equal(urls(saved[0]), []string{gwA.URL, gwB.URL}) {
		t.Fatalf("saved lists = %v, want [A B] once", saved)
	}
	mu.Unlock()

	gwA.Close() // removed for good
	gwB.NextSession(t, wait)

	// A restarted node starts from what it saved.
	cfg2 := n.config()
	cfg2.KnownGateways = saved[0][1:]
	c2 := newClient(t, cfg2)
	run(t, c2)
	gwB.NextSession(t, wait)
}

// TestDeadGatewaysCostOneBackoffStepARound: gateways that refuse (one gone
// for good, one down) cost the next gateway of the list only BackoffBase;
// the backoff grows once per round of the list, so a live gateway behind
// dead ones is reached at once.
func TestDeadGatewaysCostOneBackoffStepARound(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	cfg := n.config("https://127.0.0.1:1", "https://127.0.0.1:2", g.URL)
	cfg.BackoffBase, cfg.BackoffMax = 50*time.Millisecond, time.Hour
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))
	var backoffs []session.Event
	deadline := time.After(wait)
	for {
		var e session.Event
		select {
		case e = <-ev:
		case <-deadline:
			t.Fatalf("not connected within %v; backoffs %+v", wait, backoffs)
		}
		if e.Kind == session.EventConnected {
			break
		}
		if e.Kind == session.EventBackoff {
			backoffs = append(backoffs, e)
		}
	}
	if len(backoffs) != 2 {
		t.Fatalf("%d backoffs before the live gateway, want 2 (one per dead gateway): %+v", len(backoffs), backoffs)
	}
	for _, b := range backoffs {
		if b.Attempt != 0 || b.Delay > cfg.BackoffBase {
			t.Errorf("backoff %+v within the first round, want attempt 0 and at most %v", b, cfg.BackoffBase)
		}
	}
	g.NextSession(t, wait)
}
