// Package process registers a control-plane process in the processes
// table, whatever its roles (api-only and sinks,iam processes included), so
// that `processes list`, doctor and the upgrade order (issue 40,
// docs/upgrade-control-plane.md) can tell which builds still run.
//
// A Registrar writes its row (roles, host, pid, build version, and the
// newest migration its build embeds) when Run starts, refreshes it every
// HeartbeatInterval, and on each refresh deletes the rows of processes not
// heard from for PruneAfter (a process killed without warning leaves its
// row behind; any live process clears it). A clean stop deletes its own
// row. A failed write is logged and retried at the next interval: the
// registry is for people and doctor, never a reason to stop serving.
package process

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Store is what a Registrar needs of the store.
type Store interface {
	ProcessHeartbeat(ctx context.Context, p *store.ProcessHeartbeatParams) (*store.Process, error)
	ProcessDelete(ctx context.Context, id string) error
	ProcessPrune(ctx context.Context, olderThan time.Duration, now *time.Time) ([]string, error)
}

// Config configures a Registrar.
type Config struct {
	// ID names this process's row. Required.
	ID string
	// Roles are the roles this process runs.
	Roles []string
	// Hostname and PID are where it runs.
	Hostname string
	PID      int
	// Version is the build's version.
	Version string
	// HeartbeatInterval is how often the row is refreshed (and dead rows
	// pruned). Defaults to 5 s.
	HeartbeatInterval time.Duration
	// PruneAfter is how long a row may stay silent before it is deleted.
	// Defaults to 1 min; at least 3 heartbeat intervals.
	PruneAfter time.Duration
	// Internal, when the process has the internal control API, reports
	// the internal CAs it trusts and presents with every heartbeat: the
	// proof an internal-CA rotation advances on (docs/pki.md). Nil
	// otherwise.
	Internal InternalTrust
}

// InternalTrust is what a process's internal control API identity
// (control.Identity) reports: the ids of the internal CAs it accepts, the
// one in force first, and the id of the one whose certificate it presents.
type InternalTrust interface {
	Trusts() []string
	Presents() string
}

// Registrar keeps one process's row in the processes table.
type Registrar struct {
	cfg Config
	st  Store
	log *slog.Logger
}

// New returns a Registrar; call Run. It returns an error for a Config
// without an ID or with PruneAfter under three heartbeat intervals.
func New(cfg Config, st Store, log *slog.Logger) (*Registrar, error) {
	cfg.HeartbeatInterval = cmp.Or(cfg.HeartbeatInterval, 5*time.Second)
	cfg.PruneAfter = cmp.Or(cfg.PruneAfter, time.Minute)
	switch {
	case cfg.ID == "":
		return nil, errors.New("process registrar: no id")
	case cfg.HeartbeatInterval < 0:
		return nil, fmt.Errorf("process registrar: heartbeat interval %v is negative", cfg.HeartbeatInterval)
	case cfg.PruneAfter < 3*cfg.HeartbeatInterval:
		return nil, fmt.Errorf("process registrar: prune after %v is under 3 heartbeat intervals (%v)", cfg.PruneAfter, cfg.HeartbeatInterval)
	}
	return &Registrar{cfg: cfg, st: st, log: log.With("process", cfg.ID)}, nil
}

// Run registers the process, keeps its row fresh and prunes dead rows
// until ctx ends, then deletes its row (with a deadline of its own). It
// returns nil: write failures are logged and retried.
func (r *Registrar) Run(ctx context.Context) error {
	r.beat(ctx)
	t := time.NewTicker(r.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := r.st.ProcessDelete(dctx, r.cfg.ID); err != nil {
				r.log.WarnContext(dctx, "Process row not deleted; it is pruned after the timeout", logkey.Err, err)
			}
			return nil
		case <-t.C:
			r.beat(ctx)
		}
	}
}

// beat refreshes the row and prunes the dead ones.
func (r *Registrar) beat(ctx context.Context) {
	p := &store.ProcessHeartbeatParams{ID: r.cfg.ID, Roles: r.cfg.Roles, Hostname: r.cfg.Hostname, PID: r.cfg.PID, Version: r.cfg.Version}
	p.InternalCAs = []string{store.NoInternalAPI}
	if r.cfg.Internal != nil {
		p.InternalCAs, p.InternalCertCA = r.cfg.Internal.Trusts(), r.cfg.Internal.Presents()
	}
	if _, err := r.st.ProcessHeartbeat(ctx, p); err != nil {
		if ctx.Err() == nil {
			r.log.WarnContext(ctx, "Process row not refreshed; retrying at the next heartbeat", logkey.Err, err)
		}
		return
	}
	pruned, err := r.st.ProcessPrune(ctx, r.cfg.PruneAfter, nil)
	switch {
	case err != nil && ctx.Err() == nil:
		r.log.WarnContext(ctx, "Dead process rows not pruned; retrying at the next heartbeat", logkey.Err, err)
	case len(pruned) > 0:
		r.log.InfoContext(ctx, "Pruned the rows of processes not heard from", "processes", pruned, "after", r.cfg.PruneAfter.String())
	}
}
