package wake_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/wake"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
)

func TestLocalWakeCoalesces(t *testing.T) {
	b := wake.NewBus(nil)
	ch, stop := b.Subscribe()
	defer stop()
	b.Wake(context.Background(), nil)
	b.Wake(context.Background(), nil)
	<-ch
	select {
	case <-ch:
		t.Fatal("two wake-ups were not coalesced into one")
	default:
	}
}

func TestPostgresWakeReachesAnotherProcess(t *testing.T) {
	url := pgtest.URL(t)
	wakeAcross(t, url, url)
}

// TestPostgresWakeThroughPgBouncer: the API notifies through PgBouncer in
// transaction mode (database.url) and the gateway listens on a direct
// connection (database.notifyURL), as docs/scaling.md sets it up.
func TestPostgresWakeThroughPgBouncer(t *testing.T) {
	direct, bouncer := pgtest.Database(t)
	wakeAcross(t, bouncer, direct)
}

// wakeAcross checks that a wake-up sent through notifyURL reaches a bus
// listening on listenURL.
func wakeAcross(t *testing.T, notifyURL, listenURL string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The gateway's side: a bus fed by a listener.
	gw := wake.NewBus(nil)
	ch, stop := gw.Subscribe()
	defer stop()
	done := make(chan struct{})
	go func() { wake.Listen(ctx, listenURL, gw, slog.New(slog.DiscardHandler)); close(done) }()
	// The API's side: a bus with a notifier and no local subscriber.
	n, err := wake.NewPGNotifier(ctx, notifyURL)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	api := wake.NewBus(n)
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond) // until the listener is connected
	defer tick.Stop()
	for {
		api.Wake(ctx, []string{"node_1"})
		select {
		case <-ch:
			cancel()
			<-done
			return
		case <-tick.C:
		case <-deadline:
			t.Fatal("the NOTIFY never woke the listening bus")
		}
	}
}
