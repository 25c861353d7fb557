package feed_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/feed"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

func insert(ctx context.Context, t *testing.T, st store.Store, n int) []int64 {
	t.Helper()
	var ids []int64
	for i := range n {
		env, err := events.New("com.better-compute.node.ready", fmt.Sprintf("node_%d", i), map[string]int{"i": i}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := env.Marshal()
		id, err := st.OutboxInsert(ctx, env.Type, env.Subject, b)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// start runs a feed with a long poll, so that only Notify wakes it.
func start(t *testing.T, st store.Store, buffer int) *feed.Feed {
	ctx, cancel := context.WithCancel(context.Background())
	f := feed.New(feed.Config{Poll: time.Hour, Buffer: buffer}, st, nil)
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

// TestFeed: Head starts after what was written before; Next waits for a
// Notify and returns the new entries in order with their envelopes; an old
// cursor is read from the store beyond the ring; a cursor below the pruned
// mark is a GapError, one at the mark is not.
func TestFeed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := sqlitetest.Open(t)
	before := insert(ctx, t, st, 3)
	f := start(t, st, 4)
	head, err := f.Head(ctx)
	if err != nil || head != before[2] {
		t.Fatalf("Head = %d, %v; want %d", head, err, before[2])
	}
	got := make(chan []*feed.Event, 1)
	go func() {
		evs, err := f.Next(ctx, head, 100)
		if err != nil {
			t.Error(err)
		}
		got <- evs
	}()
	ids := insert(ctx, t, st, 6)
	f.Notify()
	var evs []*feed.Event
	select {
	case evs = <-got:
	case <-ctx.Done():
		t.Fatal("Next did not return after Notify")
	}
	for len(evs) < 6 { // the loop may have read the inserts in two batches
		more, err := f.Next(ctx, evs[len(evs)-1].ID, 100)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, more...)
	}
	for i, e := range evs {
		env, err := events.Parse(e.JSON)
		if e.ID != ids[i] || err != nil || env.Type != e.Type || env.Subject != fmt.Sprintf("node_%d", i) {
			t.Fatalf("event %d = %+v (%v), want id %d", i, e, err, ids[i])
		}
	}
	// The ring holds the last 4; a cursor before them is read from the
	// store, from the start.
	old, err := f.Next(ctx, 0, 100)
	if err != nil || len(old) != 9 || old[0].ID != before[0] || old[8].ID != ids[5] {
		t.Fatalf("Next(0) = %d events, %v", len(old), err)
	}
	// Prune everything written so far: a cursor below it has a gap, one at
	// it does not.
	if _, err := st.OutboxPrune(ctx, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	var gap *feed.GapError
	if _, err := f.Next(ctx, before[1], 100); !errors.As(err, &gap) || gap.PrunedThrough != ids[5] {
		t.Fatalf("Next below the pruned mark = %v, want a GapError through %d", err, ids[5])
	}
	later := insert(ctx, t, st, 1)
	f.Notify()
	if evs, err := f.Next(ctx, ids[5], 100); err != nil || len(evs) != 1 || evs[0].ID != later[0] {
		t.Fatalf("Next at the pruned mark = %v, %v", evs, err)
	}
	// A cursor the ring still covers is answered from memory even after
	// the store pruned it.
	if evs, err := f.Next(ctx, ids[3], 100); err != nil || len(evs) != 3 {
		t.Fatalf("Next from the ring = %d events, %v", len(evs), err)
	}
}

// TestNextEndsWithContext: a waiting Next returns ctx's error.
func TestNextEndsWithContext(t *testing.T) {
	st := sqlitetest.Open(t)
	f := start(t, st, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := f.Next(ctx, 0, 10); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next = %v, want the deadline", err)
	}
}
