package storetest

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// testReleasePins: statements kept byte for byte and listed oldest first;
// a node's reported pins replaced whole (duplicates folded, a deleted
// node skipped); counts among live nodes (those with a session) of those
// holding any of the pins asked, with the others listed.
func testReleasePins(ctx context.Context, t *testing.T, h *Harness) {
	if sts := must(h.Store.ReleasePinStatements(ctx)); len(sts) != 0 {
		t.Fatalf("statements before any = %+v", sts)
	}
	signed := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)
	t0 := time.Now().UTC().Truncate(time.Second)
	add := must(h.Store.ReleasePinStatementAdd(ctx, &store.ReleasePinStatement{Action: "add", Pin: "sha256/new",
		Statement: []byte(`{"action":"add"}`), Signature: []byte("sig\x00\xff"), SignedAt: signed, AddedBy: "token:t1", AddedAt: t0}))
	rm := must(h.Store.ReleasePinStatementAdd(ctx, &store.ReleasePinStatement{Action: "remove", Pin: "sha256/old",
		Statement: []byte(`{"action":"remove"}`), Signature: []byte("sig2"), SignedAt: signed, AddedAt: t0.Add(time.Second)}))
	sts := must(h.Store.ReleasePinStatements(ctx))
	if len(sts) != 2 || sts[0].ID != add.ID || sts[1].ID != rm.ID {
		t.Fatalf("statements = %+v", sts)
	}
	if s := sts[0]; s.Action != "add" || s.Pin != "sha256/new" || !bytes.Equal(s.Signature, []byte("sig\x00\xff")) ||
		!s.SignedAt.Equal(signed) || s.AddedBy != "token:t1" || !s.AddedAt.Equal(t0) {
		t.Fatalf("statement = %+v", s)
	}
	_, err := h.Store.ReleasePinStatementAdd(ctx, &store.ReleasePinStatement{Action: "rotate", Pin: "x", Statement: []byte("x"), Signature: []byte("x"), SignedAt: signed})
	if err == nil {
		t.Fatal("a statement of action rotate was stored")
	}

	pool := fixture(ctx, t, h)
	var ids []string
	for i := range 3 {
		id := fmt.Sprintf("node_pins%d", i)
		addNode(ctx, t, h, pool, id)
		ids = append(ids, id)
	}
	for _, id := range ids[:2] {
		if _, _, err := h.Store.SessionOpen(ctx, &store.SessionOpenParams{NodeID: id, SessionID: "sess_" + id, GatewayID: "gw-1"}); err != nil {
			t.Fatal(err)
		}
	}
	c := must(h.Store.ReleasePinCounts(ctx, []string{"sha256/new"}, 10))
	if c.Live != 2 || c.Holding != 0 || !slices.Equal(c.Missing, ids[:2]) {
		t.Fatalf("counts before reports = %+v", c)
	}
	check(t, h.Store.NodeReleasePinsSet(ctx, ids[0], []string{"sha256/old", "sha256/new", "sha256/new"}, nil))
	check(t, h.Store.NodeReleasePinsSet(ctx, ids[1], []string{"sha256/old"}, nil))
	check(t, h.Store.NodeReleasePinsSet(ctx, ids[2], []string{"sha256/new"}, nil)) // not live: not counted
	check(t, h.Store.NodeReleasePinsSet(ctx, "node_gone", []string{"sha256/new"}, nil))
	c = must(h.Store.ReleasePinCounts(ctx, []string{"sha256/new"}, 10))
	if c.Live != 2 || c.Holding != 1 || !slices.Equal(c.Missing, ids[1:2]) {
		t.Fatalf("counts of the new pin = %+v", c)
	}
	if c = must(h.Store.ReleasePinCounts(ctx, []string{"sha256/new", "sha256/old"}, 10)); c.Holding != 2 || len(c.Missing) != 0 {
		t.Fatalf("counts of either pin = %+v", c)
	}
	// A report replaces the last one.
	check(t, h.Store.NodeReleasePinsSet(ctx, ids[0], []string{"sha256/old"}, nil))
	if c = must(h.Store.ReleasePinCounts(ctx, []string{"sha256/new"}, 1)); c.Holding != 0 || !slices.Equal(c.Missing, ids[:1]) {
		t.Fatalf("counts after a new report = %+v", c)
	}
}
