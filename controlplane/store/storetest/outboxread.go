package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// testOutboxRead: OutboxQuery filters by topic prefix, key, time and id in
// either order; OutboxPrune deletes a prefix of ids by age and records how
// far it went, which only rises.
func testOutboxRead(ctx context.Context, t *testing.T, h *Harness) {
	if p := must(h.Store.OutboxPrunedThrough(ctx)); p != 0 {
		t.Fatalf("OutboxPrunedThrough of a new outbox = %d, want 0", p)
	}
	if n := must(h.Store.OutboxPrune(ctx, time.Now().Add(time.Hour))); n != 0 {
		t.Fatalf("OutboxPrune of an empty outbox = %d, want 0", n)
	}
	ids := []int64{
		must(h.Store.OutboxInsert(ctx, "com.better-compute.node.ready", "node_a", []byte(`{"n":1}`))),
		must(h.Store.OutboxInsert(ctx, "com.better-compute.node.cordoned", "node_b", []byte(`{"n":2}`))),
		must(h.Store.OutboxInsert(ctx, "com.better-compute.command.created", "cmd_1", []byte(`{"n":3}`))),
		must(h.Store.OutboxInsert(ctx, "com.better-compute.node.ready", "node_b", []byte(`{"n":4}`))),
	}
	got := func(p store.OutboxQueryParams) []int64 {
		t.Helper()
		var out []int64
		for _, e := range must(h.Store.OutboxQuery(ctx, &p)) {
			out = append(out, e.ID)
		}
		return out
	}
	same := func(name string, a, b []int64) {
		t.Helper()
		if len(a) != len(b) {
			t.Fatalf("%s = %v, want %v", name, a, b)
		}
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("%s = %v, want %v", name, a, b)
			}
		}
	}
	same("all", got(store.OutboxQueryParams{}), []int64{ids[3], ids[2], ids[1], ids[0]})
	same("ascending", got(store.OutboxQueryParams{Ascending: true, Limit: 2}), []int64{ids[0], ids[1]})
	same("after", got(store.OutboxQueryParams{Ascending: true, AfterID: ids[1]}), []int64{ids[2], ids[3]})
	same("before", got(store.OutboxQueryParams{BeforeID: ids[2], Limit: 1}), []int64{ids[1]})
	same("prefix", got(store.OutboxQueryParams{TopicPrefix: "com.better-compute.node."}), []int64{ids[3], ids[1], ids[0]})
	same("prefix is literal", got(store.OutboxQueryParams{TopicPrefix: "com.better-compute.node%"}), nil)
	same("key", got(store.OutboxQueryParams{Key: "node_b"}), []int64{ids[3], ids[1]})
	same("key and prefix", got(store.OutboxQueryParams{Key: "node_b", TopicPrefix: "com.better-compute.node.ready"}), []int64{ids[3]})
	same("since now+1h", got(store.OutboxQueryParams{Since: time.Now().Add(time.Hour)}), nil)
	same("until now-1h", got(store.OutboxQueryParams{Until: time.Now().Add(-time.Hour)}), nil)
	same("since and until", got(store.OutboxQueryParams{Since: time.Now().Add(-time.Hour), Until: time.Now().Add(time.Hour)}),
		[]int64{ids[3], ids[2], ids[1], ids[0]})
	e := must(h.Store.OutboxQuery(ctx, &store.OutboxQueryParams{Limit: 1}))[0]
	if e.Topic != "com.better-compute.node.ready" || e.Key != "node_b" || string(e.Payload) == "" || e.CreatedAt.IsZero() {
		t.Fatalf("newest entry = %+v", e)
	}

	// Nothing is old enough: nothing goes.
	if n := must(h.Store.OutboxPrune(ctx, time.Now().Add(-time.Hour))); n != 0 {
		t.Fatalf("OutboxPrune of nothing old = %d", n)
	}
	if n := must(h.Store.OutboxPrune(ctx, time.Now().Add(time.Hour))); n != 4 {
		t.Fatalf("OutboxPrune of everything = %d, want 4", n)
	}
	if p := must(h.Store.OutboxPrunedThrough(ctx)); p != ids[3] {
		t.Fatalf("OutboxPrunedThrough = %d, want %d", p, ids[3])
	}
	later := must(h.Store.OutboxInsert(ctx, "com.better-compute.node.ready", "node_a", []byte(`{}`)))
	if later <= ids[3] {
		t.Fatalf("id after a prune = %d, not above %d", later, ids[3])
	}
	same("after prune", got(store.OutboxQueryParams{}), []int64{later})
	if n := must(h.Store.OutboxPrune(ctx, time.Now().Add(-time.Hour))); n != 0 {
		t.Fatalf("second OutboxPrune = %d", n)
	}
	if p := must(h.Store.OutboxPrunedThrough(ctx)); p != ids[3] {
		t.Fatalf("OutboxPrunedThrough after a prune of nothing = %d, want %d", p, ids[3])
	}
}
