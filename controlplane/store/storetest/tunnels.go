package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

// testTunnels: a ticket opens one tunnel, only with its secret and within
// its TTL (an injected clock); two uses at once open one; the tunnel's
// opening and end write tunnel.opened and tunnel.closed with their data.
func testTunnels(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	pool := fixture(ctx, t, h)
	addNode(ctx, t, h, pool, "node_tun")
	now := time.Now().UTC().Truncate(time.Millisecond)
	secret := []byte("hash-of-the-secret-0123456789abcd")
	create := func(id string) *store.Tunnel {
		return must(st.TunnelCreate(ctx, &store.TunnelCreateParams{ID: id, SecretHash: secret, NodeID: "node_tun", Kind: "shell",
			AsRoot: true, CreatedBy: "token:tok_1", TTL: 30 * time.Second, Now: &now}))
	}
	tu := create("tun_1")
	if tu.OpenedAt != nil || !tu.ExpiresAt.Equal(now.Add(30*time.Second)) || !tu.AsRoot {
		t.Fatalf("created tunnel = %+v", tu)
	}
	at := now.Add(10 * time.Second)
	if _, err := st.TunnelUse(ctx, &store.TunnelUseParams{ID: "tun_1", SecretHash: []byte("wrong"), Now: &at}); !errors.Is(err, store.ErrTunnelTicketInvalid) {
		t.Fatalf("wrong secret: %v, want ErrTunnelTicketInvalid", err)
	}
	if _, err := st.TunnelUse(ctx, &store.TunnelUseParams{ID: "tun_none", SecretHash: secret, Now: &at}); !errors.Is(err, store.ErrTunnelTicketInvalid) {
		t.Fatalf("unknown id: %v, want ErrTunnelTicketInvalid", err)
	}
	used := must(st.TunnelUse(ctx, &store.TunnelUseParams{ID: "tun_1", SecretHash: secret, Now: &at}))
	if used.OpenedAt == nil {
		t.Fatalf("used tunnel = %+v", used)
	}
	if _, err := st.TunnelUse(ctx, &store.TunnelUseParams{ID: "tun_1", SecretHash: secret, Now: &at}); !errors.Is(err, store.ErrTunnelTicketUsed) {
		t.Fatalf("second use: %v, want ErrTunnelTicketUsed", err)
	}
	create("tun_2")
	late := now.Add(30 * time.Second)
	if _, err := st.TunnelUse(ctx, &store.TunnelUseParams{ID: "tun_2", SecretHash: secret, Now: &late}); !errors.Is(err, store.ErrTunnelTicketExpired) {
		t.Fatalf("use at 30 s: %v, want ErrTunnelTicketExpired", err)
	}

	// Concurrent uses: exactly one wins.
	create("tun_3")
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for range 8 {
		wg.Go(func() {
			if _, err := st.TunnelUse(ctx, &store.TunnelUseParams{ID: "tun_3", SecretHash: secret, Now: &at}); err == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("%d concurrent uses opened the tunnel, want 1", wins)
	}

	check(t, st.TunnelOpened(ctx, "tun_1", "gw_1", &at))
	code := int32(3)
	end := at.Add(time.Minute)
	check(t, st.TunnelClose(ctx, &store.TunnelCloseParams{ID: "tun_1", BytesIn: 12, BytesOut: 345, ExitCode: &code, Reason: "exit", Now: &end}))
	check(t, st.TunnelClose(ctx, &store.TunnelCloseParams{ID: "tun_1", BytesIn: 99, Reason: "again", Now: &end}))
	got := must(st.TunnelGet(ctx, "tun_1"))
	if got.ClosedAt == nil || got.BytesIn != 12 || got.BytesOut != 345 || got.ExitCode == nil || *got.ExitCode != 3 || got.GatewayID != "gw_1" || got.Reason != "exit" {
		t.Fatalf("closed tunnel = %+v", got)
	}
	entries := must(st.OutboxQuery(ctx, &store.OutboxQueryParams{Key: "tun_1", Ascending: true}))
	var types []string
	for _, e := range entries {
		env, err := events.Parse(e.Payload)
		if err != nil {
			t.Fatalf("tunnel event %d: %v", e.ID, err)
		}
		types = append(types, env.Type)
		var d events.TunnelData
		check(t, json.Unmarshal(env.Data, &d))
		if d.TunnelID != "tun_1" || d.NodeID != "node_tun" || d.Kind != "shell" || !d.AsRoot || d.CreatedBy != "token:tok_1" || d.GatewayID != "gw_1" {
			t.Errorf("%s data = %+v", env.Type, d)
		}
		if env.Type == events.TunnelClosed && (d.BytesIn != 12 || d.BytesOut != 345 || d.ExitCode == nil || *d.ExitCode != 3 || d.Reason != "exit") {
			t.Errorf("tunnel.closed data = %+v", d)
		}
	}
	if len(types) != 2 || types[0] != events.TunnelOpened || types[1] != events.TunnelClosed {
		t.Fatalf("tunnel events = %v, want tunnel.opened then tunnel.closed", types)
	}
}

// produceTunnelEvents writes one tunnel.opened and one tunnel.closed, for
// testEvents.
func produceTunnelEvents(ctx context.Context, t *testing.T, h *Harness, pool *store.Pool) {
	t.Helper()
	st := h.Store
	addNode(ctx, t, h, pool, "node_evtun")
	secret := []byte("tunnel-events-secret-hash")
	must(st.TunnelCreate(ctx, &store.TunnelCreateParams{ID: "tun_ev", SecretHash: secret, NodeID: "node_evtun", Kind: "port", Port: 8080,
		CreatedBy: "token:tok_ev", TTL: 30 * time.Second}))
	must(st.TunnelUse(ctx, &store.TunnelUseParams{ID: "tun_ev", SecretHash: secret}))
	check(t, st.TunnelOpened(ctx, "tun_ev", "gw_ev", nil))
	check(t, st.TunnelClose(ctx, &store.TunnelCloseParams{ID: "tun_ev", BytesIn: 1, BytesOut: 2, Reason: "client closed"}))
}
