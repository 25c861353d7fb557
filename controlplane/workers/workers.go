// Package workers runs the worker roles of one process (DESIGN.md, "The
// control plane roles"):
//
//   - controllers: the shard membership (256 shard:<n> leases by rendezvous
//     hashing), the node liveness reconciler over the held shards, the
//     remediation reconciler (unless remediation.disabled), the
//     CommandSweeper (singleton:command-sweeper) and retention
//     (singleton:retention), and the rollout reconciler over the held
//     shards (package rollouts);
//   - sinks: one outbox dispatcher per configured sink
//     (singleton:outbox-dispatch:<sink>);
//   - iam: token expiry (singleton:iam:token-expiry);
//   - scheduler: the capacity placer capacity.placer (package placer),
//     under the scheduler role's own shard membership
//     (placer.Shards scheduler-shard:<n> leases split among the processes
//     running the role), so several scheduler processes split the pools.
//
// Every job stops on cancellation and releases its leases; the shard
// manager also leaves the workers table.
package workers

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/better-compute/better-compute/controlplane/internal/clock"
	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/lease"
	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/reconcilers/drift"
	"github.com/better-compute/better-compute/controlplane/reconcilers/liveness"
	"github.com/better-compute/better-compute/controlplane/reconcilers/placer"
	"github.com/better-compute/better-compute/controlplane/reconcilers/reaper"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rollouts"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rotation"
	"github.com/better-compute/better-compute/controlplane/reconcilers/sinks"
	"github.com/better-compute/better-compute/controlplane/reconcilers/sweeper"
	"github.com/better-compute/better-compute/controlplane/remediation"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Roles are the worker roles.
var Roles = []string{"controllers", "scheduler", "sinks", "iam"}

// Options tune the jobs; zero values take the production defaults.
type Options struct {
	// WorkerID names this process. Defaults to <hostname>-<pid>-<random>.
	WorkerID string
	// Version is recorded in the workers table.
	Version string
	// ShardTTL and ShardRenew tune the shard leases (15 s, 5 s).
	ShardTTL, ShardRenew time.Duration
	// LivenessInterval is how often each shard's nodes are checked.
	// Defaults to the heartbeat interval, at most 5 s.
	LivenessInterval time.Duration
	// SweepInterval is the CommandSweeper's interval (1 s).
	SweepInterval time.Duration
	// LostAfter is how long a node may lack a session before its in-flight
	// commands are lost (30 s).
	LostAfter time.Duration
	// Metrics, when set, counts the commands the CommandSweeper ends
	// expired or lost (a *metrics.Metrics).
	Metrics CommandMetrics
	// OutboxWakeups, when set, subscribes to outbox writes of other
	// processes (serve's LISTEN on the outbox channel): the sinks deliver
	// right after such a write instead of at their next poll. Writes
	// through this process's store wake them without it.
	OutboxWakeups func() (<-chan struct{}, func())
	// SchedulerTTL and SchedulerRenew tune the scheduler membership's
	// leases (10 s, 3 s): a killed scheduler's pools are placed by another
	// within about TTL + Renew + PlacerInterval.
	SchedulerTTL, SchedulerRenew time.Duration
	// PlacerInterval is the placer's round interval (1 s).
	PlacerInterval time.Duration
	// Waker, when set, wakes the gateways of nodes a reconciler gave a
	// command (the rollouts' upgrades and rollbacks); without it they wait
	// for the gateways' 1 s dispatch poll.
	Waker rollouts.Waker
	// Clock is every job's clock: the leases, the shard memberships, the
	// reconcilers' rounds and the times they act at, the sweeper and the
	// reaper. Defaults to the system clock; tests pass a fake one
	// (controlplane/internal/clocktest).
	Clock clock.Clock
	// Ready, when set, is called once, when every job has started and,
	// with the controllers role, this process is in the workers table (the
	// shard manager's first round succeeded); at once when no worker role
	// runs. serve tells systemd READY=1 after it.
	Ready func()
}

// CommandMetrics counts commands that reached a terminal state.
type CommandMetrics interface {
	CommandFinished(kind, state string)
}

// NewWorkerID returns a unique worker id for this process.
func NewWorkerID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), strings.ToLower(rand.Text()[:6]))
}

// Store is what the worker roles need: the stores of the components they
// run, and what the retention and token jobs write.
type Store interface {
	shard.Store
	lease.Store
	liveness.Store
	rollouts.Store
	remediation.Store
	sweeper.Store
	reaper.Store
	drift.Store
	placer.Store
	sinks.Store
	rotation.Store
	store.FencedTransactor
	OutboxWritten() (<-chan struct{}, func())
}

// joinTokenExpiryTx is what the iam role's minutely token job writes.
type joinTokenExpiryTx interface {
	JoinTokensExpire(ctx context.Context, now *time.Time) ([]string, error)
	APITokensWarnExpiring(ctx context.Context, p *store.APITokenExpiryParams) ([]string, error)
}

// tokenPruneTx is what the iam role's hourly token job writes.
type tokenPruneTx interface {
	TokensPrune(ctx context.Context, before time.Time) (int64, error)
}

// retentionTx is what retention prunes, in one transaction.
type retentionTx interface {
	CommandPrune(ctx context.Context, before time.Time) (int64, error)
	EventPrune(ctx context.Context, before time.Time) (int64, error)
	AuditPrune(ctx context.Context, before time.Time) (int64, error)
	OutboxPrune(ctx context.Context, before time.Time) (int64, error)
	ReservationPrune(ctx context.Context, before time.Time) (int64, error)
	RolloutPrune(ctx context.Context, before time.Time) (int64, error)
	RemediationPrune(ctx context.Context, before time.Time) (int64, error)
	RecordingPrune(ctx context.Context, before time.Time) (int64, error)
}

// Run runs the worker roles cfg names until ctx ends.
func Run(ctx context.Context, cfg *config.Config, st Store, opts Options, log *slog.Logger) error {
	if opts.WorkerID == "" {
		opts.WorkerID = NewWorkerID()
	}
	clk := clock.Or(opts.Clock)
	log = log.With("worker", opts.WorkerID)
	var roles []string
	for _, r := range Roles {
		if cfg.Runs(r) {
			roles = append(roles, r)
		}
	}
	if len(roles) == 0 {
		if opts.Ready != nil {
			opts.Ready()
		}
		return nil
	}
	g, ctx := errgroup.WithContext(ctx)
	none := make(chan struct{})
	close(none)
	var registered <-chan struct{} = none // the controllers role waits for the shard manager
	if cfg.Runs("controllers") {
		m, err := shard.New(shard.Config{WorkerID: opts.WorkerID, Roles: roles, Version: opts.Version,
			TTL: opts.ShardTTL, Renew: opts.ShardRenew, Clock: clk}, st, log)
		if err != nil {
			return err
		}
		g.Go(func() error { return m.Run(ctx) })
		registered = m.Ready()
		hb := cmp.Or(cfg.Host.Gateway.HeartbeatInterval.Duration, sessionv1.DefaultHeartbeatInterval)
		live := liveness.New(liveness.Config{HeartbeatInterval: hb, Missed: cfg.Host.Gateway.MissedHeartbeats,
			Interval: cmp.Or(opts.LivenessInterval, min(hb, 5*time.Second))}, st, log)
		ro := rollouts.New(rollouts.Config{Interval: cfg.Rollouts.Interval.Duration, Now: clk.Now, Waker: opts.Waker,
			Gate: cfg.Rollouts.HealthGate.Params()}, st, log)
		recs := []shard.Reconciler{live, ro}
		if !cfg.Remediation.Disabled {
			rem, err := remediation.New(remediation.Config{Settings: cfg.Remediation, Holder: opts.WorkerID, Now: clk.Now}, st, log)
			if err != nil {
				return err
			}
			recs = append(recs, rem)
		}
		g.Go(func() error { shard.RunReconcilers(ctx, m, clk, log, recs...); return nil })
		sw, err := sweeper.New(sweeper.Config{Holder: opts.WorkerID, Interval: opts.SweepInterval, LostAfter: opts.LostAfter,
			Metrics: opts.Metrics, Clock: clk}, st, log)
		if err != nil {
			return err
		}
		g.Go(func() error { return sw.Run(ctx) })
		rp, err := reaper.New(reaper.Config{Holder: opts.WorkerID, Clock: clk}, st, log)
		if err != nil {
			return err
		}
		g.Go(func() error { return rp.Run(ctx) })
		driftMetrics, _ := opts.Metrics.(drift.Metrics) // a *metrics.Metrics counts drifting nodes too
		dj := drift.NewJob(st, driftMetrics, log.With("job", "drift"))
		g.Go(func() error {
			return every(ctx, clk, drift.LeaseName, opts.WorkerID, cfg.GPUHealth.DriftInterval.Duration, st, log,
				func(ctx context.Context, fence store.Fence) error {
					_, err := dj.Round(ctx, fence, clk.Now())
					return err
				})
		})
		// The node-CA rotation reconciler advances an open rotation on
		// proof (docs/pki.md, "Rotating the node CA"); it needs the secret
		// the bundle is sealed under.
		if cfg.Secret != "" {
			if err := runRotation(ctx, g, clk, cfg, st, opts.WorkerID, log); err != nil {
				return err
			}
		}
		g.Go(func() error {
			return every(ctx, clk, "singleton:retention", opts.WorkerID, time.Hour, st, log, func(ctx context.Context, fence store.Fence) error {
				return retain(ctx, st, fence, clk.Now(), cfg.Retention, log)
			})
		})
	}
	if cfg.Runs("scheduler") {
		m, err := shard.New(shard.Config{WorkerID: opts.WorkerID, Roles: roles, Version: opts.Version,
			TTL: cmp.Or(opts.SchedulerTTL, 10*time.Second), Renew: cmp.Or(opts.SchedulerRenew, 3*time.Second),
			LeasePrefix: placer.LeasePrefix, Shards: placer.Shards, Role: "scheduler", Clock: clk}, st, log.With("membership", "scheduler"))
		if err != nil {
			return err
		}
		g.Go(func() error { return m.Run(ctx) })
		pl := placer.New(placer.Config{Interval: opts.PlacerInterval, Clock: clk}, st, log)
		g.Go(func() error { shard.RunReconcilers(ctx, m, clk, log, pl); return nil })
	}
	if cfg.Runs("sinks") {
		for _, sink := range configuredSinks(cfg) {
			wake := make(chan struct{}, 1)
			d, err := sinks.NewDispatcher(sinks.Config{Holder: opts.WorkerID, Types: sink.types, Tenant: sink.tenant, Wake: wake, Clock: clk}, sink, st, log)
			if err != nil {
				return err
			}
			g.Go(func() error { forwardWakeups(ctx, wake, st.OutboxWritten, opts.OutboxWakeups); return nil })
			g.Go(func() error { return d.Run(ctx) })
		}
	}
	if cfg.Runs("iam") {
		g.Go(func() error {
			return every(ctx, clk, "singleton:iam:join-token-expiry", opts.WorkerID, time.Minute, st, log, func(ctx context.Context, fence store.Fence) error {
				return store.InFencedTx(ctx, st, fence, func(tx joinTokenExpiryTx) error {
					if _, err := tx.JoinTokensExpire(ctx, nil); err != nil {
						return err
					}
					// API tokens within a week of their end: token.expiring,
					// once per token.
					ids, err := tx.APITokensWarnExpiring(ctx, &store.APITokenExpiryParams{Within: iam.TokenExpiryWarning})
					if len(ids) > 0 {
						log.InfoContext(ctx, "API tokens expire within a week", "tokens", strings.Join(ids, ","))
					}
					return err
				})
			})
		})
		g.Go(func() error {
			return every(ctx, clk, "singleton:iam:token-expiry", opts.WorkerID, time.Hour, st, log, func(ctx context.Context, fence store.Fence) error {
				return store.InFencedTx(ctx, st, fence, func(tx tokenPruneTx) error {
					n, err := tx.TokensPrune(ctx, clk.Now().Add(-TokenGrace))
					if n > 0 {
						log.InfoContext(ctx, "Pruned expired and revoked tokens", "tokens", n)
					}
					return err
				})
			})
		})
	}
	log.InfoContext(ctx, "Worker roles running", "roles", strings.Join(roles, ","))
	if opts.Ready != nil {
		g.Go(func() error {
			select {
			case <-registered:
				opts.Ready()
			case <-ctx.Done():
			}
			return nil
		})
	}
	return g.Wait()
}

// TokenGrace is how long expired or revoked tokens are kept (so an operator
// can still see why a join was refused) before token expiry deletes them.
const TokenGrace = 7 * 24 * time.Hour

// configuredSink is a configured sink, the type prefixes it takes and
// its tenant ("": every tenant's events).
type configuredSink struct {
	sinks.Sink
	types  []string
	tenant string
}

// configuredSinks builds the configured sinks.
func configuredSinks(cfg *config.Config) []configuredSink {
	var out []configuredSink
	for _, w := range cfg.Sinks.Webhooks {
		out = append(out, configuredSink{&sinks.Webhook{SinkName: w.Name, URL: w.URL, Secret: []byte(w.Secret)}, w.Types, w.Tenant})
	}
	for _, f := range cfg.Sinks.Files {
		out = append(out, configuredSink{&sinks.File{SinkName: f.Name, Path: f.Path}, f.Types, f.Tenant})
	}
	return out
}

// runRotation starts the rotation reconciler of the node CA, the gateway
// serving CA and the internal CA in g: every
// rotation.DefaultInterval, under rotation.LeaseName, it advances an open
// rotation whose phase's condition holds and, with pki.autoRotate, starts
// one when the node CA in force is due; its writes are fenced by the lease.
func runRotation(ctx context.Context, g *errgroup.Group, clk clock.Clock, cfg *config.Config, st Store, holder string, log *slog.Logger) error {
	rot, err := rotation.New(rotation.Config{Secret: cfg.Secret, RetireGrace: cfg.PKI.ReattestGrace.Duration,
		CAValidity: cfg.PKI.NodeCAValidity.Duration, AutoRotate: cfg.PKI.AutoRotates(),
		NodeCertTTL: cfg.Host.Gateway.NodeCertTTL.Duration, Now: clk.Now}, st)
	if err != nil {
		return err
	}
	gwRot, err := rotation.New(rotation.Config{Secret: cfg.Secret, CA: store.RotationCAGateway, RetireGrace: cfg.PKI.ReattestGrace.Duration,
		Now: clk.Now}, st)
	if err != nil {
		return err
	}
	inRot, err := rotation.New(rotation.Config{Secret: cfg.Secret, CA: store.RotationCAInternal, Now: clk.Now}, st)
	if err != nil {
		return err
	}
	g.Go(func() error {
		return every(ctx, clk, rotation.LeaseName, holder, rotation.DefaultInterval, st, log, func(ctx context.Context, fence store.Fence) error {
			// Fenced: a worker that lost the lease writes nothing.
			moved, err := rot.Reconcile(ctx, &fence)
			switch moved {
			case "":
			case store.RotationPropagating:
				log.InfoContext(ctx, "Node CA rotation started by the reconciler: the node CA in force is due (half its life, or the wait after a rollback, passed)", "phase", moved)
			default:
				log.InfoContext(ctx, "Node CA rotation advanced by the reconciler", "phase", moved)
			}
			gwMoved, gwErr := gwRot.Reconcile(ctx, &fence)
			if gwMoved != "" {
				log.InfoContext(ctx, "Gateway CA rotation advanced by the reconciler", "phase", gwMoved)
			}
			inMoved, inErr := inRot.Reconcile(ctx, &fence)
			if inMoved != "" {
				log.InfoContext(ctx, "Internal CA rotation advanced by the reconciler", "phase", inMoved)
			}
			return errors.Join(err, gwErr, inErr)
		})
	})
	return nil
}

// every runs fn every interval on clk while holding the singleton lease
// name.
func every(ctx context.Context, clk clock.Clock, name, holder string, interval time.Duration, st lease.Store, log *slog.Logger,
	fn func(context.Context, store.Fence) error) error {
	h, err := lease.New(lease.Config{Name: name, Holder: holder, Clock: clk}, st, log)
	if err != nil {
		return err
	}
	return h.Run(ctx, lease.Every(interval, clk, func(ctx context.Context, fence store.Fence) error {
		if err := fn(ctx, fence); err != nil && ctx.Err() == nil {
			log.WarnContext(ctx, "Job failed", "job", name, logkey.Err, err)
		}
		return nil
	}))
}

// retain prunes rows older than the retention windows at now, in one
// fenced transaction, and logs what went.
func retain(ctx context.Context, st store.FencedTransactor, fence store.Fence, now time.Time, r config.Retention, log *slog.Logger) error {
	return store.InFencedTx(ctx, st, fence, func(tx retentionTx) error {
		prunes := []struct {
			what   string
			window time.Duration
			prune  func(context.Context, time.Time) (int64, error)
		}{
			{"commands", r.Commands.Duration, tx.CommandPrune},
			{"events", r.Events.Duration, tx.EventPrune},
			{"audit", r.Audit.Duration, tx.AuditPrune},
			// The outbox keeps what sinks and event readers read for as
			// long as events: a reader resuming after a pruned id gets a
			// gap error.
			{"outbox", r.Events.Duration, tx.OutboxPrune},
			{"reservations", r.History.Duration, tx.ReservationPrune},
			{"rollouts", r.History.Duration, tx.RolloutPrune},
			{"remediations", r.History.Duration, tx.RemediationPrune},
			{"recordings", r.Recordings.Duration, tx.RecordingPrune},
		}
		var total int64
		attrs := make([]any, 0, 2*len(prunes))
		for _, p := range prunes {
			n, err := p.prune(ctx, now.Add(-p.window))
			if err != nil {
				return err
			}
			total += n
			attrs = append(attrs, p.what, n)
		}
		if total > 0 {
			log.InfoContext(ctx, "Retention pruned", attrs...)
		}
		return nil
	})
}

// forwardWakeups passes a value to wake, without blocking (one pending is
// enough), each time one of the subscriptions fires, until ctx ends.
func forwardWakeups(ctx context.Context, wake chan<- struct{}, subscribe ...func() (<-chan struct{}, func())) {
	var wg sync.WaitGroup
	for _, sub := range subscribe {
		if sub == nil {
			continue
		}
		ch, stop := sub()
		wg.Go(func() {
			defer stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-ch:
					select {
					case wake <- struct{}{}:
					default:
					}
				}
			}
		})
	}
	wg.Wait()
}
