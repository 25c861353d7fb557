package feed_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/feed"
	"github.com/better-compute/better-compute/controlplane/pkg/wake"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// TestFeedWokenByStoreWrite: on SQLite (one process) an outbox write through
// the store, not through the feed's Notify, wakes a feed that polls once an
// hour, through the store's OutboxWritten.
func TestFeedWokenByStoreWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := sqlitetest.Open(t)
	written, stop := st.OutboxWritten()
	defer stop()
	f := feed.New(feed.Config{Poll: time.Hour}, st, nil)
	runCtx, stopRun := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(runCtx, written) }()
	defer func() { stopRun(); <-done }()
	head, err := f.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The first write may meet the loop's first read (Run reads once as
	// it starts); once a read has taken it, only a wake-up reads again.
	for range 2 {
		ids := insert(ctx, t, st, 1)
		evs, err := f.Next(ctx, head, 10)
		if err != nil || len(evs) != 1 || evs[0].ID != ids[0] {
			t.Fatalf("Next = %v, %v; want entry %d (woken by the write, the poll is an hour)", evs, err, ids[0])
		}
		head = ids[0]
	}
	if n := f.WokenReads(); n < 1 {
		t.Fatalf("WokenReads = %d, want the read the write woke", n)
	}
}

// TestFeedWokenByAnotherProcess: on PostgreSQL an outbox write through
// another store handle (another process's pool) wakes a feed that polls
// once an hour: the writing transaction's NOTIFY on postgres.OutboxChannel
// reaches a wake.ListenChannels bus the feed runs on.
func TestFeedWokenByAnotherProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := pgtest.URL(t)
	reader, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if _, err := reader.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	writer, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()

	bus := wake.NewBus(nil)
	wakeups, unsubscribe := bus.Subscribe()
	defer unsubscribe()
	own, stop := reader.OutboxWritten() // as the api runs it; the reader writes nothing here
	defer stop()
	f := feed.New(feed.Config{Poll: time.Hour}, reader, nil)
	runCtx, stopRun := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() {
		_ = wake.ListenChannels(runCtx, url, map[string]*wake.Bus{postgres.OutboxChannel: bus}, slog.New(slog.DiscardHandler))
		done <- struct{}{}
	}()
	go func() { _ = f.Run(runCtx, own, wakeups); done <- struct{}{} }()
	defer func() { stopRun(); <-done; <-done }()
	head, err := f.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Until the listener is connected a NOTIFY goes unheard: write again
	// until a write is read. The first may meet the loop's first read (Run
	// reads once as it starts), so twice: once a read has taken a write,
	// only a wake-up reads again.
	for range 2 {
		for {
			insert(ctx, t, writer, 1)
			wait, cancelWait := context.WithTimeout(ctx, 200*time.Millisecond)
			evs, err := f.Next(wait, head, 100)
			cancelWait()
			if err == nil && len(evs) > 0 {
				head = evs[len(evs)-1].ID
				break
			}
			if ctx.Err() != nil {
				t.Fatal("no write through the other handle woke the feed")
			}
		}
	}
	if n := f.WokenReads(); n < 1 {
		t.Fatalf("WokenReads = %d, want the read the NOTIFY woke", n)
	}
}
