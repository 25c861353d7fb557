// Package shard splits the 256 shard:<n> leases among the live worker
// processes by rendezvous (highest random weight) hashing, and runs the
// reconcilers over the shards this process holds (DESIGN.md, "Workers").
//
// Every Renew interval a Manager heartbeats its row in workers, lists the
// live workers (heartbeat newer than LiveWithin), computes which shards it
// should own, renews the shard leases it holds, releases those it should no
// longer own, and tries to acquire the ones it should own but does not hold
// yet: a departing owner releases them, a dead one lets them expire. A
// shard's lease is trusted until TTL − margin after its last renewal on the
// monotonic clock; reconcilers get a fence that guards their writes.
package shard

import (
	"cmp"
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/clock"
	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
)

// LeaseName is shard n's lease.
func LeaseName(n int) string { return "shard:" + strconv.Itoa(n) }

// Owner returns the worker that should own shard n: the one with the highest
// weight, the FNV-1a 64 hash of "<worker>/<n>" passed through MurmurHash3's
// 64-bit finaliser (FNV alone spreads near-identical names badly). Every process computes the same answer
// from the same worker list, and a worker joining or leaving moves only
// about 1/W of the shards.
func Owner(n int, workers []string) string {
	var best string
	var bestW uint64
	for _, w := range workers {
		h := fnv.New64a()
		h.Write([]byte(w))
		h.Write([]byte{'/'})
		h.Write([]byte(strconv.Itoa(n)))
		if s := fmix64(h.Sum64()); best == "" || s > bestW || (s == bestW && w < best) {
			best, bestW = w, s
		}
	}
	return best
}

// fmix64 is MurmurHash3's 64-bit finaliser: every input bit affects every
// output bit.
func fmix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// Store is what a Manager needs.
type Store interface {
	WorkerHeartbeat(ctx context.Context, p *store.WorkerHeartbeatParams) (*store.Worker, error)
	WorkerList(ctx context.Context, liveWithin time.Duration, now *time.Time) ([]*store.Worker, error)
	WorkerDelete(ctx context.Context, id string) error
	LeaseAcquire(ctx context.Context, p *store.LeaseAcquireParams) (*store.Lease, bool, error)
	LeaseRenew(ctx context.Context, p *store.LeaseRenewParams) (*store.Lease, bool, error)
	LeaseRelease(ctx context.Context, name, holder string, epoch int64) error
	LeaseList(ctx context.Context, prefix string) ([]*store.Lease, error)
}

// Config configures a Manager.
type Config struct {
	// WorkerID identifies this process. Required.
	WorkerID string
	// Roles are recorded in the workers row.
	Roles []string
	// Version is recorded in the workers row.
	Version string
	// TTL is the shard leases' life. Defaults to 15 s.
	TTL time.Duration
	// Renew is the loop interval. Defaults to 5 s.
	Renew time.Duration
	// LiveWithin is how fresh a worker's heartbeat must be to count.
	// Defaults to TTL.
	LiveWithin time.Duration
	// OnChange, when set, is called after a round that changed the held
	// shards, with their count.
	OnChange func(held int)
	// LeasePrefix names the membership's leases, LeasePrefix + n.
	// Defaults to "shard:" (the controllers role's 256 shards); the
	// scheduler role's membership uses its own (placer.LeasePrefix).
	LeasePrefix string
	// Shards is how many shards the membership splits. Defaults to
	// store.Shards.
	Shards int
	// Role, when set, counts only the live workers whose row names this
	// role: a membership of one role's processes (the scheduler's).
	Role string
	// Clock times the rounds and the trust windows. Defaults to the system
	// clock.
	Clock clock.Clock
}

// Manager holds this process's share of the shards.
type Manager struct {
	cfg   Config
	store Store
	log   *slog.Logger

	mu   sync.Mutex
	held map[int]*held

	ready     chan struct{}
	readyOnce sync.Once
}

type held struct {
	lease      *store.Lease
	trustUntil time.Time // monotonic
}

// New returns a Manager; call Run.
func New(cfg Config, st Store, log *slog.Logger) (*Manager, error) {
	if cfg.WorkerID == "" {
		return nil, fmt.Errorf("shard: worker id is required")
	}
	cfg.TTL = cmp.Or(cfg.TTL, 15*time.Second)
	cfg.Renew = cmp.Or(cfg.Renew, 5*time.Second)
	cfg.LiveWithin = cmp.Or(cfg.LiveWithin, cfg.TTL)
	cfg.LeasePrefix = cmp.Or(cfg.LeasePrefix, "shard:")
	cfg.Shards = cmp.Or(cfg.Shards, store.Shards)
	cfg.Clock = clock.Or(cfg.Clock)
	return &Manager{cfg: cfg, store: st, log: log, held: map[int]*held{}, ready: make(chan struct{})}, nil
}

// Ready is closed after the first round that succeeded: this process is in
// the workers table and has tried for the shards it should own.
func (m *Manager) Ready() <-chan struct{} { return m.ready }

// Held returns the fences of the shards this process holds and trusts now.
func (m *Manager) Held() map[int]store.Fence {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Clock.Now()
	out := make(map[int]store.Fence, len(m.held))
	for n, h := range m.held {
		if now.Before(h.trustUntil) {
			out[n] = store.Fence{Lease: h.lease.Name, Holder: h.lease.Holder, Epoch: h.lease.Epoch}
		}
	}
	return out
}

// Run keeps this process's share until ctx ends, then releases every shard
// and leaves the workers table.
func (m *Manager) Run(ctx context.Context) error {
	host, _ := os.Hostname()
	for {
		if err := m.round(ctx, host); err != nil && ctx.Err() == nil {
			m.log.WarnContext(ctx, "Shard round failed", logkey.Err, err)
		} else if err == nil {
			m.readyOnce.Do(func() { close(m.ready) })
		}
		select {
		case <-ctx.Done():
			m.leave(context.WithoutCancel(ctx))
			return nil
		case <-m.cfg.Clock.After(m.cfg.Renew):
		}
	}
}

// round is one pass of the loop.
func (m *Manager) round(ctx context.Context, host string) error {
	if _, err := m.store.WorkerHeartbeat(ctx, &store.WorkerHeartbeatParams{ID: m.cfg.WorkerID, Roles: m.cfg.Roles,
		Hostname: host, PID: os.Getpid(), Version: m.cfg.Version}); err != nil {
		return fmt.Errorf("worker heartbeat: %w", err)
	}
	live, err := m.store.WorkerList(ctx, m.cfg.LiveWithin, nil)
	if err != nil {
		return fmt.Errorf("list workers: %w", err)
	}
	ids := make([]string, 0, len(live)+1)
	self := false
	for _, w := range live {
		if m.cfg.Role != "" && !slices.Contains(w.Roles, m.cfg.Role) {
			continue
		}
		ids = append(ids, w.ID)
		self = self || w.ID == m.cfg.WorkerID
	}
	if !self {
		ids = append(ids, m.cfg.WorkerID)
	}
	sort.Strings(ids)
	before := len(m.Held())
	for n := range m.cfg.Shards {
		want := Owner(n, ids) == m.cfg.WorkerID
		m.mu.Lock()
		h, have := m.held[n]
		m.mu.Unlock()
		switch {
		case have && !want:
			m.release(ctx, n, h)
		case have:
			m.renew(ctx, n, h)
		case want:
			m.acquire(ctx, n)
		}
	}
	if after := len(m.Held()); after != before {
		m.log.InfoContext(ctx, "Shards moved", "held", after, "workers", len(ids))
		if m.cfg.OnChange != nil {
			m.cfg.OnChange(after)
		}
	}
	return nil
}

func (m *Manager) acquire(ctx context.Context, n int) {
	start := m.cfg.Clock.Now()
	l, ok, err := m.store.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: m.cfg.LeasePrefix + strconv.Itoa(n), Holder: m.cfg.WorkerID, TTL: m.cfg.TTL})
	if err != nil || !ok {
		return // held by its previous owner until released or expired
	}
	m.mu.Lock()
	m.held[n] = &held{lease: l, trustUntil: start.Add(m.cfg.TTL - m.cfg.Renew/2)}
	m.mu.Unlock()
}

func (m *Manager) renew(ctx context.Context, n int, h *held) {
	start := m.cfg.Clock.Now()
	l, ok, err := m.store.LeaseRenew(ctx, &store.LeaseRenewParams{Name: h.lease.Name, Holder: h.lease.Holder, Epoch: h.lease.Epoch, TTL: m.cfg.TTL})
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case err != nil:
		// Keep trusting until trustUntil; the next round retries.
	case !ok:
		delete(m.held, n)
		m.log.WarnContext(ctx, "Shard lease lost", "shard", n, "epoch", h.lease.Epoch)
	default:
		h.lease, h.trustUntil = l, start.Add(m.cfg.TTL-m.cfg.Renew/2)
	}
}

func (m *Manager) release(ctx context.Context, n int, h *held) {
	m.mu.Lock()
	delete(m.held, n)
	m.mu.Unlock()
	if err := m.store.LeaseRelease(ctx, h.lease.Name, h.lease.Holder, h.lease.Epoch); err != nil {
		m.log.WarnContext(ctx, "Shard release failed", "shard", n, logkey.Err, err)
	}
}

// leave releases every shard and removes the workers row.
func (m *Manager) leave(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m.mu.Lock()
	all := m.held
	m.held = map[int]*held{}
	m.mu.Unlock()
	for _, h := range all {
		_ = m.store.LeaseRelease(ctx, h.lease.Name, h.lease.Holder, h.lease.Epoch)
	}
	// An acquire cut short by the cancellation may have taken a shard
	// without this process learning of it: release whatever is still ours.
	if leases, err := m.store.LeaseList(ctx, m.cfg.LeasePrefix); err == nil {
		for _, l := range leases {
			if l.Holder == m.cfg.WorkerID {
				_ = m.store.LeaseRelease(ctx, l.Name, l.Holder, l.Epoch)
			}
		}
	}
	if err := m.store.WorkerDelete(ctx, m.cfg.WorkerID); err != nil {
		m.log.WarnContext(ctx, "Leaving workers failed", logkey.Err, err)
	}
	m.log.InfoContext(ctx, "Released shards and left", "shards", len(all))
}
