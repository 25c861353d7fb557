package api_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/wake"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
)

// TestEventsWatchWokenByAnotherProcess: on PostgreSQL an event that
// another process writes (here another store handle with its own pool, as
// a gateway's) reaches an open event stream through the writing
// transaction's NOTIFY, which the api hears on a wake.ListenChannels bus
// (Config.EventWakeups, as serve wires it): the feed's poll is an hour, so
// only the wake-up can deliver it, and the feed counts the read it woke.
func TestEventsWatchWokenByAnotherProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := pgtest.URL(t)
	st, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	other, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	// The token is written (an event) before the feed starts, so the
	// stream's first event is one of the other handle's.
	viewer := (&fixture{t: t, st: st}).token(store.RoleViewer, 0)

	bus := wake.NewBus(nil)
	wakeups, unsubscribe := bus.Subscribe()
	t.Cleanup(unsubscribe)
	runCtx, stopRun := context.WithCancel(context.Background())
	done := make(chan error, 2)
	t.Cleanup(func() {
		stopRun()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	})
	go func() {
		done <- wake.ListenChannels(runCtx, url, map[string]*wake.Bus{postgres.OutboxChannel: bus}, slog.New(slog.DiscardHandler))
	}()
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Secret: strings.Repeat("s", 32), EventWakeups: wakeups,
		EventPoll: time.Hour}, st, nil)
	go func() { done <- srv.Run(runCtx) }()
	select {
	case <-srv.Ready():
	case <-ctx.Done():
		t.Fatal("the API never listened")
	}
	f := &streamFixture{fixture: &fixture{t: t, st: st, srv: srv}, base: "http://" + srv.Addr().String() + "/api"}
	resp, s := f.open(ctx, viewer, "")
	if resp.StatusCode != 200 {
		t.Fatalf("watch = %d", resp.StatusCode)
	}
	if first := s.next(t); !first.comment {
		t.Fatalf("first block %+v, want the opening comment", first)
	}
	// Until the listener is connected a NOTIFY goes unheard: write again
	// until the stream carries one of the writes. The first may meet the
	// feed's first read (Run reads once as it starts), so twice: once a
	// read has taken a write, only a wake-up reads again.
	written := map[string]bool{}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for range 2 {
		got := make(chan sse, 1)
		go func() { got <- s.nextEvent(t) }()
	write:
		for {
			env, err := events.New(events.NodeReady, "node_other", events.NodeData{NodeID: "node_other", State: "ready"}, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			b, _ := env.Marshal()
			id, err := other.OutboxInsert(ctx, env.Type, env.Subject, b)
			if err != nil {
				t.Fatal(err)
			}
			written[strconv.FormatInt(id, 10)] = true
			select {
			case e := <-got:
				if !written[e.id] || e.event != events.NodeReady {
					t.Fatalf("stream carried %+v, want one of the other handle's writes", e)
				}
				break write
			case <-tick.C:
			case <-ctx.Done():
				t.Fatal("no event written through the other handle reached the stream")
			}
		}
	}
	if n := srv.Feed().WokenReads(); n < 1 {
		t.Fatalf("feed WokenReads = %d, want the read the NOTIFY woke", n)
	}
}
