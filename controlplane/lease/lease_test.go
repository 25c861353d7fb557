package lease_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/better-compute/better-compute/controlplane/lease"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
)

func openStore(t *testing.T) store.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func newHolder(t *testing.T, st store.Store, holder string) *lease.Holder {
	t.Helper()
	h, err := lease.New(lease.Config{Name: "singleton:test", Holder: holder, TTL: 600 * time.Millisecond, Renew: 100 * time.Millisecond, Margin: 100 * time.Millisecond, Retry: 50 * time.Millisecond}, st, quiet())
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOneHolderAtATimeAndHandover(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
	st := openStore(t)
	var running, maxRunning, runsA, runsB atomic.Int32
	job := func(count *atomic.Int32) lease.Job {
		return func(ctx context.Context, fence store.Fence) error {
			n := running.Add(1)
			defer running.Add(-1)
			if n > maxRunning.Load() {
				maxRunning.Store(n)
			}
			count.Add(1)
			<-ctx.Done()
			return nil
		}
	}
	ctxA, stopA := context.WithCancel(context.Background())
	ctxB, stopB := context.WithCancel(context.Background())
	doneA, doneB := make(chan struct{}), make(chan struct{})
	go func() { newHolder(t, st, "a").Run(ctxA, job(&runsA)); close(doneA) }()
	eventually(t, "a to hold the lease", func() bool { return runsA.Load() == 1 })
	go func() { newHolder(t, st, "b").Run(ctxB, job(&runsB)); close(doneB) }()
	time.Sleep(300 * time.Millisecond) // b retries several times meanwhile
	if runsB.Load() != 0 {
		t.Fatal("b ran while a held the lease")
	}
	stopA()
	<-doneA
	// a released the lease, so b takes it on its next retry, not after the TTL.
	start := time.Now()
	eventually(t, "b to take over", func() bool { return runsB.Load() == 1 })
	if waited := time.Since(start); waited > 500*time.Millisecond {
		t.Fatalf("b took over after %v; a released the lease, so it should not wait for the TTL", waited)
	}
	stopB()
	<-doneB
	if maxRunning.Load() != 1 {
		t.Fatalf("%d jobs ran at once", maxRunning.Load())
	}
	l, err := st.LeaseGet(context.Background(), "singleton:test")
	if err != nil || l.Epoch != 2 {
		t.Fatalf("lease after handover = %+v %v, want epoch 2", l, err)
	}
}

func TestLostLeaseCancelsJob(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
	st := openStore(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	fences := make(chan store.Fence, 4)
	ended := make(chan struct{}, 4)
	done := make(chan struct{})
	go func() {
		newHolder(t, st, "a").Run(ctx, func(ctx context.Context, f store.Fence) error {
			fences <- f
			<-ctx.Done()
			ended <- struct{}{}
			return nil
		})
		close(done)
	}()
	f := <-fences
	// Another process takes the lease over (as after a long pause of a).
	if err := st.LeaseRelease(context.Background(), f.Lease, f.Holder, f.Epoch); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.LeaseAcquire(context.Background(), &store.LeaseAcquireParams{Name: f.Lease, Holder: "intruder", TTL: time.Hour}); err != nil || !ok {
		t.Fatalf("intruder acquire: %v %v", ok, err)
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("job kept running after its lease was lost")
	}
	// Its old fence no longer lets it write.
	err := st.FencedTx(context.Background(), f, func(store.Store) error { return nil })
	if err == nil {
		t.Fatal("old fence still accepted")
	}
	stop()
	<-done
}
