package storetest

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// testCounts: NodeCounts groups nodes by their pool's site and by state
// (cordoned counted apart), CommandCountOpen counts only commands not yet
// terminal; both are empty on an empty database.
func testCounts(ctx context.Context, t *testing.T, h *Harness) {
	if got := must(h.Store.NodeCounts(ctx)); len(got) != 0 {
		t.Fatalf("NodeCounts of no nodes = %v", got)
	}
	if got := must(h.Store.CommandCountOpen(ctx)); len(got) != 0 {
		t.Fatalf("CommandCountOpen of no commands = %v", got)
	}
	a, b := fixture(ctx, t, h), fixture(ctx, t, h)
	for _, id := range []string{"node_a1", "node_a2", "node_a3"} {
		addNode(ctx, t, h, a, id)
	}
	addNode(ctx, t, h, b, "node_b1")
	check(t, h.Store.NodeSetState(ctx, "node_a1", store.NodeReady))
	check(t, h.Store.NodeSetState(ctx, "node_a2", store.NodeReady))
	check(t, h.Store.NodeSetCordoned(ctx, "node_a2", true))
	check(t, h.Store.NodeSetState(ctx, "node_b1", store.NodeUnreachable))
	want := []store.NodeCount{
		{SiteID: a.SiteID, State: store.NodeJoined, Nodes: 1},
		{SiteID: a.SiteID, State: store.NodeReady, Nodes: 2, Cordoned: 1},
		{SiteID: b.SiteID, State: store.NodeUnreachable, Nodes: 1},
	}
	slices.SortFunc(want, func(x, y store.NodeCount) int {
		return cmp.Or(cmp.Compare(x.SiteID, y.SiteID), cmp.Compare(x.State, y.State))
	})
	got := must(h.Store.NodeCounts(ctx))
	if len(got) != len(want) {
		t.Fatalf("NodeCounts = %d rows, want %v", len(got), want)
	}
	for i, c := range got {
		if *c != want[i] {
			t.Fatalf("NodeCounts[%d] = %+v, want %+v", i, *c, want[i])
		}
	}

	cmds := must(h.Store.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_a1", "node_a2", "node_b1"},
		Kind: "reboot", Timeout: time.Minute}))
	if ok := must(h.Store.CommandSetState(ctx, &store.CommandSetStateParams{ID: cmds[1].ID, State: store.CommandRunning})); !ok {
		t.Fatal("CommandSetState running: not ok")
	}
	if ok := must(h.Store.CommandFinish(ctx, &store.CommandFinishParams{ID: cmds[2].ID, State: store.CommandSucceeded})); !ok {
		t.Fatal("CommandFinish: not ok")
	}
	open := must(h.Store.CommandCountOpen(ctx))
	if wantOpen := map[string]int{store.CommandQueued: 1, store.CommandRunning: 1}; !maps.Equal(open, wantOpen) {
		t.Fatalf("CommandCountOpen = %v, want %v", open, wantOpen)
	}
}
