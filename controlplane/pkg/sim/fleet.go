package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/internal/logkey"
)

// DefaultJoinConcurrency bounds the joins a Fleet makes at once.
const DefaultJoinConcurrency = 32

// FleetConfig configures a Fleet.
type FleetConfig struct {
	// GatewayURL is the gateway to join through, "https://host:port".
	// Required.
	GatewayURL string
	// Token is a join token that admits at least N joins. Required.
	Token string
	// N is the number of daemons, at least 1. Required.
	N int
	// JoinConcurrency bounds concurrent joins. Defaults to
	// DefaultJoinConcurrency.
	JoinConcurrency int
	// NamePrefix starts each daemon's hostname, "<prefix>-00042". Defaults
	// to "sim".
	NamePrefix string
	// Labels are sent in every daemon's join facts. Defaults to none.
	Labels map[string]string
	// Trust overrides how gateways are authenticated. Defaults to the
	// token's pin.
	Trust session.Trust
	// Session is the client settings template of every daemon (see
	// DaemonConfig.Session). Its OnEvent, if any, is called too, from each
	// daemon's goroutine.
	Session session.Config
	// NoInventory skips sending inventories (see DaemonConfig).
	NoInventory bool
	// StateDir, when set, keeps each daemon's identity in StateDir/<name>
	// (DaemonConfig.StateDir): a fleet made again with it is the same
	// nodes. Defaults to none.
	StateDir string
	// Logger receives the fleet's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// FleetStats are a Fleet's counters at one moment.
type FleetStats struct {
	// Daemons is N.
	Daemons int
	// Joined counts daemons that have joined.
	Joined int
	// Running counts daemons whose Run has not returned.
	Running int
	// Connected counts daemons holding a session now.
	Connected int
	// Connects counts Welcomes received, over all daemons.
	Connects int64
	// Reconnects counts Welcomes after a daemon's first.
	Reconnects int64
	// Disconnects counts sessions that ended.
	Disconnects int64
	// Stopped counts daemons whose Run returned an error (revoked,
	// certificate expired).
	Stopped int
}

// Fleet is N FakeDaemons joined and run together.
type Fleet struct {
	cfg     FleetConfig
	log     *slog.Logger
	daemons []*FakeDaemon
	joined  []atomic.Bool

	joinedN, running, connected, stopped atomic.Int64
	connects, reconnects, disconnects    atomic.Int64

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	// stops ends each running daemon's Run alone (StopDaemon), by index;
	// nil until Run starts it.
	stops []context.CancelFunc
}

// NewFleet makes the daemons of cfg (keys and simulated hosts; nothing is
// dialled yet).
func NewFleet(cfg FleetConfig) (*Fleet, error) {
	if cfg.GatewayURL == "" || cfg.Token == "" || cfg.N < 1 {
		return nil, errors.New("new fleet: gateway URL, token and N ≥ 1 are required")
	}
	cfg.JoinConcurrency = cmp.Or(cfg.JoinConcurrency, DefaultJoinConcurrency)
	cfg.NamePrefix = cmp.Or(cfg.NamePrefix, "sim")
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Fleet{cfg: cfg, log: cfg.Logger, joined: make([]atomic.Bool, cfg.N), changed: make(chan struct{})}
	for i := range cfg.N {
		d, err := f.newDaemon(i)
		if err != nil {
			return nil, fmt.Errorf("new fleet: %w", err)
		}
		f.daemons = append(f.daemons, d)
	}
	return f, nil
}

func (f *Fleet) newDaemon(i int) (*FakeDaemon, error) {
	sc := f.cfg.Session
	user := sc.OnEvent
	var seen atomic.Bool // the daemon has had a session before
	var up atomic.Bool   // the daemon holds a session now
	sc.OnEvent = func(ev session.Event) {
		switch ev.Kind {
		case session.EventConnected:
			f.connects.Add(1)
			if seen.Swap(true) {
				f.reconnects.Add(1)
			}
			if !up.Swap(true) {
				f.connected.Add(1)
			}
			f.notify()
		case session.EventDisconnected:
			if up.Swap(false) {
				f.connected.Add(-1)
				f.disconnects.Add(1)
				f.notify()
			}
		}
		if user != nil {
			user(ev)
		}
	}
	if sc.Logger == nil {
		sc.Logger = f.log
	}
	name := fmt.Sprintf("%s-%05d", f.cfg.NamePrefix, i)
	stateDir := ""
	if f.cfg.StateDir != "" {
		stateDir = filepath.Join(f.cfg.StateDir, name)
	}
	return NewFakeDaemon(DaemonConfig{
		StateDir:    stateDir,
		Name:        name,
		Labels:      f.cfg.Labels,
		Trust:       f.cfg.Trust,
		Session:     sc,
		NoInventory: f.cfg.NoInventory,
		Logger:      f.log,
	})
}

// Daemons returns the fleet's daemons.
func (f *Fleet) Daemons() []*FakeDaemon { return f.daemons }

// Join joins every daemon that has not joined yet, at most
// JoinConcurrency at a time. It stops at the first failure and returns it;
// the daemons joined so far stay joined, and calling Join again joins the
// rest.
func (f *Fleet) Join(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(f.cfg.JoinConcurrency)
	for i, d := range f.daemons {
		if f.joined[i].Load() {
			continue
		}
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			if err := d.Join(gctx, f.cfg.GatewayURL, f.cfg.Token); err != nil {
				return err
			}
			f.joined[i].Store(true)
			f.joinedN.Add(1)
			f.notify()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("join fleet: %w", err)
	}
	return ctx.Err()
}

// Run runs every joined daemon until ctx ends and returns nil then. A
// daemon whose Run fails (revoked, certificate expired) is logged and
// counted in Stopped; the others keep running.
func (f *Fleet) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	f.mu.Lock()
	f.stops = make([]context.CancelFunc, len(f.daemons))
	f.mu.Unlock()
	for i, d := range f.daemons {
		if !f.joined[i].Load() {
			continue
		}
		f.running.Add(1)
		dctx, stop := context.WithCancel(ctx)
		f.mu.Lock()
		f.stops[i] = stop
		f.mu.Unlock()
		wg.Go(func() {
			defer func() {
				f.mu.Lock()
				f.stops[i] = nil
				f.mu.Unlock()
				stop()
			}()
			defer func() {
				f.running.Add(-1)
				f.notify()
			}()
			if err := d.Run(dctx); err != nil {
				f.stopped.Add(1)
				f.log.WarnContext(ctx, "Simulated daemon stopped", "sim_daemon", d.Name(), logkey.NodeID, d.NodeID(), logkey.Err, err)
			}
		})
	}
	f.notify()
	wg.Wait()
	return nil
}

// StopDaemon ends the session of the last daemon still running, as if its
// machine had stopped answering (DESIGN.md, "The simulator": a node that
// stops answering), and returns it; nil when none runs. The daemon's node
// goes unreachable once the liveness window passes; the others keep
// running.
func (f *Fleet) StopDaemon() *FakeDaemon {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.stops) - 1; i >= 0; i-- {
		if stop := f.stops[i]; stop != nil {
			f.stops[i] = nil
			stop()
			return f.daemons[i]
		}
	}
	return nil
}

// Stats returns the current counters.
func (f *Fleet) Stats() FleetStats {
	return FleetStats{
		Daemons:     len(f.daemons),
		Joined:      int(f.joinedN.Load()),
		Running:     int(f.running.Load()),
		Connected:   int(f.connected.Load()),
		Connects:    f.connects.Load(),
		Reconnects:  f.reconnects.Load(),
		Disconnects: f.disconnects.Load(),
		Stopped:     int(f.stopped.Load()),
	}
}

// WaitFor waits until cond holds for the fleet's Stats, checking after
// every change, or until ctx ends.
func (f *Fleet) WaitFor(ctx context.Context, cond func(FleetStats) bool) error {
	for {
		f.mu.Lock()
		ch := f.changed
		f.mu.Unlock()
		if cond(f.Stats()) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for fleet: %w (now %+v)", ctx.Err(), f.Stats())
		}
	}
}

// notify wakes WaitFor.
func (f *Fleet) notify() {
	f.mu.Lock()
	close(f.changed)
	f.changed = make(chan struct{})
	f.mu.Unlock()
}
