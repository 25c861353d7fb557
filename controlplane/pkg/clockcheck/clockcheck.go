package clockcheck

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/controlplane/store"
)

// MaxDifference is how far this process's clock may be from the
// database's, or behind the newest node certificate issued, and still
// serve (issue 36: "more than a minute").
const MaxDifference = time.Minute

// ErrClockWrong reports a process clock that must not serve: the error's
// text says what it reads, against what, and to fix it.
var ErrClockWrong = errors.New("this process's clock is wrong")

// ErrNotChecked is Gate.Check's answer before the first check has run.
var ErrNotChecked = errors.New("the clock has not been checked yet")

// Store is what the check reads: the database's clock and the audit log.
type Store interface {
	Now(ctx context.Context) (time.Time, error)
	AuditQuery(ctx context.Context, p *store.AuditQueryParams) ([]*store.AuditEntry, error)
}

// issueActions are the audit actions of an issued node certificate.
var issueActions = []string{admission.ActionJoin, admission.ActionRenew, admission.ActionReattest}

// Check judges now, this process's clock, against the database's and the
// newest node certificate issued. It returns nil when the clock may serve,
// an error wrapping ErrClockWrong when it must not, and another error when
// the store cannot answer.
func Check(ctx context.Context, st Store, now time.Time) error {
	const layout = time.RFC3339
	db, err := st.Now(ctx)
	if err != nil {
		return fmt.Errorf("check the clock: %w", err)
	}
	if d := now.Sub(db); d.Abs() > MaxDifference {
		way := "ahead of"
		if d < 0 {
			way = "behind"
		}
		return fmt.Errorf("%w: it reads %s, %s %s the database's clock (%s), more than %s: fix this machine's clock (NTP), then it becomes ready by itself",
			ErrClockWrong, now.UTC().Format(layout), d.Abs().Round(time.Second), way, db.UTC().Format(layout), MaxDifference)
	}
	for _, action := range issueActions {
		// Only rows stamped more than MaxDifference after now: a range of
		// the audit log's time index, empty when the clock is right.
		rows, err := st.AuditQuery(ctx, &store.AuditQueryParams{Since: now.Add(MaxDifference), ActionPrefix: action,
			Outcome: admission.OutcomeSuccess, Limit: 1})
		if err != nil {
			return fmt.Errorf("check the clock: %w", err)
		}
		if len(rows) == 0 || rows[0].Action != action {
			continue
		}
		if issued := rows[0].Time; now.Before(issued.Add(-MaxDifference)) {
			return fmt.Errorf("%w: it reads %s, %s before the newest node certificate this deployment issued (%s of %s at %s): "+
				"serving would refuse the fleet's valid certificates as not yet valid; fix this machine's clock (NTP), then it becomes ready by itself",
				ErrClockWrong, now.UTC().Format(layout), issued.Sub(now).Round(time.Second), action, rows[0].Resource, issued.UTC().Format(layout))
		}
	}
	return nil
}

// Config configures a Gate.
type Config struct {
	// Store is read by every check.
	Store Store
	// Now is this process's wall clock. Defaults to time.Now.
	Now func() time.Time
	// Interval is the wait between checks until the clock is right.
	// Defaults to 10 s.
	Interval time.Duration
	// Logger receives the reason, once per change. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Gate holds the roles of a process back until its clock is right. Its
// methods are safe for concurrent use.
type Gate struct {
	cfg   Config
	ready chan struct{}

	mu     sync.Mutex
	reason error // nil once ready
}

// New returns a Gate; Run checks.
func New(cfg Config) (*Gate, error) {
	if cfg.Store == nil {
		return nil, errors.New("clockcheck: Config.Store is required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Interval = cmp.Or(cfg.Interval, 10*time.Second)
	if cfg.Interval < 0 {
		return nil, fmt.Errorf("clockcheck: Config.Interval %v is negative", cfg.Interval)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Gate{cfg: cfg, ready: make(chan struct{}), reason: ErrNotChecked}, nil
}

// Ready is closed once a check found the clock right.
func (g *Gate) Ready() <-chan struct{} { return g.ready }

// Check returns why the process is not ready: nil once the clock was found
// right, ErrNotChecked before the first check, else the last check's error.
func (g *Gate) Check() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reason
}

// Run checks the clock now and every Interval until it is right, then
// closes Ready and returns nil; it returns nil when ctx ends first.
func (g *Gate) Run(ctx context.Context) error {
	var logged string
	for {
		cctx, cancel := context.WithTimeout(ctx, max(g.cfg.Interval, 5*time.Second))
		err := Check(cctx, g.cfg.Store, g.cfg.Now())
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		g.mu.Lock()
		g.reason = err
		g.mu.Unlock()
		if err == nil {
			if logged != "" {
				g.cfg.Logger.InfoContext(ctx, "This process's clock is right again: starting the roles")
			}
			close(g.ready)
			return nil
		}
		if msg := err.Error(); msg != logged {
			logged = msg
			if errors.Is(err, ErrClockWrong) {
				g.cfg.Logger.ErrorContext(ctx, "Not ready: this process's clock is wrong; the gateway and workers wait for it", logkey.Err, err)
			} else {
				g.cfg.Logger.WarnContext(ctx, "Not ready: the clock cannot be checked", logkey.Err, err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(g.cfg.Interval):
		}
	}
}
