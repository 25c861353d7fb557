package lease_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/better-compute/better-compute/controlplane/internal/clock"
	"github.com/better-compute/better-compute/controlplane/internal/clocktest"
	"github.com/better-compute/better-compute/controlplane/pkg/lease"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
)

// wait bounds anything a test waits for; tests wait on signals, so it is
// only reached when something is wrong.
const wait = 30 * time.Second

// Timings of the test holders. The lease lives an hour in the store, on the
// database's clock, so it never expires there by itself: everything the
// holder does is timed by its fake clock.
const (
	ttl    = time.Hour
	renew  = 10 * time.Minute
	margin = 5 * time.Minute // not a multiple of renew: the window ends between renewals
	retry  = time.Minute
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

func newHolder(t *testing.T, st lease.Store, holder string, clock clock.Clock) *lease.Holder {
	t.Helper()
	h, err := lease.New(lease.Config{Name: "singleton:test", Holder: holder, TTL: ttl, Renew: renew, Margin: margin, Retry: retry, Clock: clock}, st, quiet())
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// blockUntil waits until n waits are pending on clock.
func blockUntil(t *testing.T, clock *clocktest.Clock, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := clock.BlockUntil(ctx, n); err != nil {
		t.Fatal(err)
	}
}

// receive waits for a value on ch.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestOneHolderAtATimeAndHandover(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
	st := openStore(t)
	var running, maxRunning atomic.Int32
	job := func(started chan<- struct{}) lease.Job {
		return func(ctx context.Context, fence store.Fence) error {
			n := running.Add(1)
			defer running.Add(-1)
			if n > maxRunning.Load() {
				maxRunning.Store(n)
			}
			started <- struct{}{}
			<-ctx.Done()
			return nil
		}
	}
	// Each holder has its own clock, so a test knows which one waits.
	clockA, clockB := clocktest.New(time.Now()), clocktest.New(time.Now())
	startedA, startedB := make(chan struct{}, 4), make(chan struct{}, 4)
	ctxA, stopA := context.WithCancel(context.Background())
	ctxB, stopB := context.WithCancel(context.Background())
	doneA, doneB := make(chan struct{}), make(chan struct{})
	go func() { newHolder(t, st, "a", clockA).Run(ctxA, job(startedA)); close(doneA) }()
	receive(t, startedA, "a to hold the lease")
	go func() { newHolder(t, st, "b", clockB).Run(ctxB, job(startedB)); close(doneB) }()
	// b tries, finds the lease held, and waits to retry: several times.
	for range 3 {
		blockUntil(t, clockB, 1)
		clockB.Advance(retry * 3 / 2) // past the longest jittered retry
	}
	blockUntil(t, clockB, 1)
	select {
	case <-startedB:
		t.Fatal("b ran while a held the lease")
	default:
	}
	stopA()
	<-doneA
	// a released the lease, so b takes it at its next retry, not after the
	// TTL.
	clockB.Advance(retry * 3 / 2)
	receive(t, startedB, "b to take over at its next retry")
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
	clock := clocktest.New(time.Now())
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	fences := make(chan store.Fence, 4)
	ended := make(chan error, 4)
	done := make(chan struct{})
	go func() {
		newHolder(t, st, "a", clock).Run(ctx, func(ctx context.Context, f store.Fence) error {
			fences <- f
			<-ctx.Done()
			ended <- context.Cause(ctx)
			return nil
		})
		close(done)
	}()
	f := receive(t, fences, "the job to start")
	// Another process takes the lease over (as after a long pause of a).
	if err := st.LeaseRelease(context.Background(), f.Lease, f.Holder, f.Epoch); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.LeaseAcquire(context.Background(), &store.LeaseAcquireParams{Name: f.Lease, Holder: "intruder", TTL: time.Hour}); err != nil || !ok {
		t.Fatalf("intruder acquire: %v %v", ok, err)
	}
	// The next renewal finds it gone.
	blockUntil(t, clock, 1)
	clock.Advance(renew)
	if cause := receive(t, ended, "the job to end after its lease was lost"); cause == nil || cause.Error() != "lease lost" {
		t.Errorf("job ended with %v, want lease lost", cause)
	}
	// Its old fence no longer lets it write.
	err := st.FencedTx(context.Background(), f, func(store.Store) error { return nil })
	if err == nil {
		t.Fatal("old fence still accepted")
	}
	stop()
	<-done
}

// failingRenewals is the real store whose renewals fail while fail is set,
// as when the database is unreachable.
type failingRenewals struct {
	store.Store
	fail    atomic.Bool
	renewed chan struct{} // a renewal was tried
}

func (f *failingRenewals) LeaseRenew(ctx context.Context, p *store.LeaseRenewParams) (*store.Lease, bool, error) {
	defer func() { f.renewed <- struct{}{} }()
	if f.fail.Load() {
		return nil, false, errors.New("database unreachable")
	}
	return f.Store.LeaseRenew(ctx, p)
}

// TestTrustEndsAtTTLMinusMargin: renewals that fail leave the lease trusted
// until TTL − Margin after the last good one, on the holder's clock, and the
// job ends exactly then, not at some later renewal tick; good renewals keep
// it going meanwhile.
func TestTrustEndsAtTTLMinusMargin(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
	st := &failingRenewals{Store: openStore(t), renewed: make(chan struct{}, 16)}
	clock := clocktest.New(time.Now())
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	started := make(chan struct{}, 4)
	ended := make(chan error, 4)
	done := make(chan struct{})
	go func() {
		newHolder(t, st, "a", clock).Run(ctx, func(ctx context.Context, f store.Fence) error {
			started <- struct{}{}
			<-ctx.Done()
			ended <- context.Cause(ctx)
			return nil
		})
		close(done)
	}()
	receive(t, started, "the job to start")
	// Two good renewals move the window on.
	for range 2 {
		blockUntil(t, clock, 1)
		clock.Advance(renew)
		receive(t, st.renewed, "a renewal")
	}
	lastGood := clock.Now()
	st.fail.Store(true)
	// Failed renewals up to the end of the window: the job runs on.
	window := ttl - margin
	for clock.Now().Add(renew).Before(lastGood.Add(window)) {
		blockUntil(t, clock, 1)
		clock.Advance(renew)
		receive(t, st.renewed, "a failed renewal")
	}
	select {
	case cause := <-ended:
		t.Fatalf("job ended with %v while the lease was still trusted", cause)
	default:
	}
	// The holder's next wait ends with the window, before a renewal is due.
	blockUntil(t, clock, 1)
	clock.Advance(lastGood.Add(window).Sub(clock.Now()))
	if cause := receive(t, ended, "the job to end with the trust window"); cause == nil || cause.Error() != "lease expired before renewal" {
		t.Errorf("job ended with %v, want lease expired before renewal", cause)
	}
	stop()
	<-done
}
