package clockcheck_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/controlplane/pkg/clockcheck"
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

// skewedDB is a store whose database clock is off by skew.
type skewedDB struct {
	store.Store
	skew time.Duration
}

func (s skewedDB) Now(ctx context.Context) (time.Time, error) {
	t, err := s.Store.Now(ctx)
	return t.Add(s.skew), err
}

func TestCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	now := time.Now()
	if err := clockcheck.Check(ctx, st, now); err != nil {
		t.Fatalf("a fresh deployment on the right clock: %v", err)
	}

	// The database's clock, either way.
	for _, skew := range []time.Duration{2 * time.Minute, -2 * time.Minute} {
		err := clockcheck.Check(ctx, skewedDB{st, skew}, now)
		if !errors.Is(err, clockcheck.ErrClockWrong) || !strings.Contains(err.Error(), "the database's clock") {
			t.Errorf("database %v off: %v, want ErrClockWrong naming the database's clock", skew, err)
		}
	}
	if err := clockcheck.Check(ctx, skewedDB{st, 30 * time.Second}, now); err != nil {
		t.Errorf("database 30 s off: %v, want nil (within a minute)", err)
	}

	// A certificate issued (a renewal audited) at issued: a process more
	// than a minute behind it must not serve, on either action, even with
	// the database's clock its own (SQLite).
	for _, action := range []string{admission.ActionRenew, admission.ActionReattest} {
		issued := now.Add(10 * time.Minute)
		if _, err := st.AuditInsert(ctx, &store.AuditEntry{Time: issued, Actor: "node:n1", Action: action, Resource: "node/n1",
			Outcome: admission.OutcomeSuccess}); err != nil {
			t.Fatal(err)
		}
		err := clockcheck.Check(ctx, fixedDB{st, now}, now)
		if !errors.Is(err, clockcheck.ErrClockWrong) || !strings.Contains(err.Error(), "newest node certificate") || !strings.Contains(err.Error(), action) {
			t.Errorf("%s 10 min ahead of the clock: %v, want ErrClockWrong naming the newest certificate", action, err)
		}
		if err := clockcheck.Check(ctx, fixedDB{st, issued}, issued.Add(-30*time.Second)); err != nil {
			t.Errorf("%s 30 s ahead of the clock: %v, want nil (within a minute)", action, err)
		}
		now = issued
	}
	// A refused attempt issued nothing.
	if _, err := st.AuditInsert(ctx, &store.AuditEntry{Time: now.Add(time.Hour), Actor: "join-token", Action: admission.ActionJoin,
		Resource: "join-token", Outcome: admission.OutcomeRefused}); err != nil {
		t.Fatal(err)
	}
	if err := clockcheck.Check(ctx, fixedDB{st, now}, now); err != nil {
		t.Errorf("after a refused join stamped later: %v, want nil", err)
	}
}

// fixedDB is a store whose database clock reads at.
type fixedDB struct {
	store.Store
	at time.Time
}

func (s fixedDB) Now(context.Context) (time.Time, error) { return s.at, nil }

func TestGate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	var off time.Duration = -48 * time.Hour
	offs := make(chan time.Duration, 1)
	g, err := clockcheck.New(clockcheck.Config{Store: st, Interval: time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		Now: func() time.Time {
			select {
			case off = <-offs:
			default:
			}
			return time.Now().Add(off)
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Check(); !errors.Is(err, clockcheck.ErrNotChecked) {
		t.Fatalf("Check before Run: %v, want ErrNotChecked", err)
	}
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !errors.Is(g.Check(), clockcheck.ErrClockWrong) {
		if time.Now().After(deadline) {
			t.Fatalf("Check with a clock 48 h behind the database's: %v, want ErrClockWrong", g.Check())
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-g.Ready():
		t.Fatal("Ready closed with a clock 48 h behind")
	default:
	}
	offs <- 0
	select {
	case <-g.Ready():
	case <-time.After(10 * time.Second):
		t.Fatalf("Ready not closed once the clock was right: %v", g.Check())
	}
	if err := <-done; err != nil || g.Check() != nil {
		t.Fatalf("Run: %v, Check: %v, want nil", err, g.Check())
	}
}
