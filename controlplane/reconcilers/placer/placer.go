package placer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/clock"
	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Name is the reconciler's name in logs (DESIGN.md: capacity.placer).
const Name = "capacity.placer"

// LeasePrefix names the scheduler role's shard leases,
// scheduler-shard:<n>: a membership of its own, apart from the controllers'
// shard:<n>.
const LeasePrefix = "scheduler-shard:"

// Shards is how many shards the scheduler role splits the pools into:
// pools are few (tens to hundreds), so a few shards spread them over the
// scheduler processes with few leases to renew.
const Shards = 16

// ShardOf returns the scheduler shard of a pool: store.ShardOf(poolID)
// mod Shards.
func ShardOf(poolID string) int { return store.ShardOf(poolID) % Shards }

// LeaseName is scheduler shard n's lease.
func LeaseName(n int) string { return LeasePrefix + strconv.Itoa(n) }

// Store is what the placer reads and writes.
type Store interface {
	FactsStore
	store.FencedTransactor
	PoolList(ctx context.Context, p *store.ListParams) ([]*store.Pool, error)
	ReservationPoolsOpen(ctx context.Context, poolIDs []string) ([]string, error)
	ReservationPoolsDue(ctx context.Context, poolIDs []string, now time.Time) ([]string, error)
}

// PoolTx is what one pool's round (PlacePool) reads and writes in its
// transaction: the pool's nodes and its reservations.
type PoolTx interface {
	FactsStore
	ReservationsOpen(ctx context.Context, poolIDs []string) ([]*store.Reservation, error)
	ReservationSlots(ctx context.Context, p *store.ReservationSlotsParams) ([]*store.ReservationSlot, error)
	ReservationTransition(ctx context.Context, p *store.ReservationTransitionParams) (*store.Reservation, error)
	ReservationNodeFailed(ctx context.Context, p *store.ReservationNodeFailedParams) (reported bool, err error)
	ReservationPlace(ctx context.Context, p *store.ReservationPlaceParams) (*store.Reservation, error)
}

// Clock is the placer's time source; reservations start and end by it (a
// clock.Clock is one).
type Clock interface{ Now() time.Time }

// Config configures a Placer.
type Config struct {
	// Interval is how often each held shard's pools are placed. Defaults
	// to 1 s.
	Interval time.Duration
	// MaxPlacements bounds the pending reservations one pool's round
	// places, so that a round's transaction stays short; the rest wait
	// for the next round. Defaults to 1,000.
	MaxPlacements int
	// Clock defaults to the system clock.
	Clock Clock
}

// Placer is the capacity.placer reconciler: a shard.Reconciler over the
// scheduler shards.
type Placer struct {
	cfg   Config
	store Store
	log   *slog.Logger
	facts *Facts

	mu   sync.Mutex
	work map[int][]string // shard -> pools with open reservations, read by Due for the round
	due  map[string]bool  // pools with a reservation due to move, read by Due for the round
	// seen is, per pool, the fingerprint of its nodes at its last full
	// round: a pool with nothing due is placed again only when its nodes
	// changed (health, state, cordon, disruption, inventory, labels).
	seen map[string]string
}

// New returns a Placer; a nil log discards.
func New(cfg Config, st Store, log *slog.Logger) *Placer {
	cfg.Interval = cmp.Or(cfg.Interval, time.Second)
	cfg.MaxPlacements = cmp.Or(cfg.MaxPlacements, 1000)
	if cfg.Clock == nil {
		cfg.Clock = clock.System
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Placer{cfg: cfg, store: st, log: log, facts: NewFacts(), work: map[int][]string{}, due: map[string]bool{}, seen: map[string]string{}}
}

// Name names the reconciler.
func (p *Placer) Name() string { return Name }

// Interval is the round interval.
func (p *Placer) Interval() time.Duration { return p.cfg.Interval }

// Due finds, with one read of the pools and one grouped read of the
// reservations, the pools of shards that have open reservations (those
// due to start or end at now first of all), and returns their shards.
func (p *Placer) Due(ctx context.Context, now time.Time, shards []int) ([]int, error) {
	var pools []string
	lp := store.ListParams{Limit: store.MaxListLimit}
	for {
		page, err := p.store.PoolList(ctx, &lp)
		if err != nil {
			return nil, fmt.Errorf("list pools: %w", err)
		}
		for _, pl := range page {
			if slices.Contains(shards, ShardOf(pl.ID)) {
				pools = append(pools, pl.ID)
			}
		}
		if len(page) < lp.Limit {
			break
		}
		lp.Cursor = page[len(page)-1].ID
	}
	busy, err := p.store.ReservationPoolsOpen(ctx, pools)
	if err != nil {
		return nil, err
	}
	dueList, err := p.store.ReservationPoolsDue(ctx, busy, now)
	if err != nil {
		return nil, err
	}
	work := map[int][]string{}
	for _, pool := range busy {
		n := ShardOf(pool)
		work[n] = append(work[n], pool)
	}
	due := map[string]bool{}
	for _, pool := range dueList {
		due[pool] = true
	}
	p.mu.Lock()
	p.work, p.due = work, due
	for pool := range p.seen {
		if !slices.Contains(busy, pool) {
			delete(p.seen, pool)
		}
	}
	p.mu.Unlock()
	return slices.Collect(maps.Keys(work)), nil
}

// fingerprint sums up what of a pool's nodes placement reads.
func fingerprint(nodes []*Node) string {
	h := fnv.New64a()
	for _, n := range nodes {
		fmt.Fprintf(h, "%s|%s|%v|", n.ID, n.Unavailable, n.Labels)
		for _, g := range n.GPUs {
			fmt.Fprintf(h, "%d,%s,%d,%v;", g.Index, g.Model, g.MemoryMiB, g.Healthy)
		}
	}
	return strconv.FormatUint(h.Sum64(), 16)
}

// Reconcile places the pools of shard that Due found with work,
// each in one transaction fenced on the shard's lease.
func (p *Placer) Reconcile(ctx context.Context, shard int, fence store.Fence) error {
	p.mu.Lock()
	pools := p.work[shard]
	delete(p.work, shard)
	p.mu.Unlock()
	var errs []error
	for _, pool := range pools {
		// Nothing due and the nodes as they were: the round would change
		// nothing (one light read instead of the pool's reservations).
		nodes, err := p.facts.Nodes(ctx, p.store, pool)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		fp := fingerprint(nodes)
		p.mu.Lock()
		skip := !p.due[pool] && p.seen[pool] == fp
		p.mu.Unlock()
		if skip {
			continue
		}
		err = store.InFencedTx(ctx, p.store, fence, func(tx store.Transactor) error {
			_, err := p.PlacePool(ctx, tx, pool)
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("pool %s: %w", pool, err))
			continue
		}
		p.mu.Lock()
		p.seen[pool] = fp
		p.mu.Unlock()
	}
	return errors.Join(errs...)
}

// Result counts what one PlacePool did.
type Result struct {
	Placed, Moved, Failed, Activated, Ended, NodeFailed int
	// Conflicts counts placements the store refused because another
	// writer booked a GPU first; they are tried again next round.
	Conflicts int
}

// PlacePool does one round of a pool in st's transaction (its own when
// st is not in one; the reconciler passes its fenced one): it ends,
// activates, swaps or fails placed and active reservations that are due,
// then places pending ones, oldest first, up to MaxPlacements.
func (p *Placer) PlacePool(ctx context.Context, st store.Transactor, poolID string) (*Result, error) {
	res := &Result{}
	err := store.InTx(ctx, st, func(tx PoolTx) error {
		*res = Result{}
		return p.placePool(ctx, tx, poolID, res)
	})
	return res, err
}

func (p *Placer) placePool(ctx context.Context, tx PoolTx, poolID string, res *Result) error {
	now := p.cfg.Clock.Now()
	open, err := tx.ReservationsOpen(ctx, []string{poolID})
	if err != nil || len(open) == 0 {
		return err
	}
	nodes, err := p.facts.Nodes(ctx, tx, poolID)
	if err != nil {
		return err
	}
	byID := make(map[string]*Node, len(nodes))
	for _, n := range nodes {
		byID[n.ID] = n
	}
	from, to := now, now
	for _, r := range open {
		from, to = minTime(from, r.Start), maxTime(to, r.End)
	}
	slots, err := tx.ReservationSlots(ctx, &store.ReservationSlotsParams{PoolID: poolID, From: from, To: to})
	if err != nil {
		return err
	}
	book := NewBookings(slots)
	// Held reservations first (they may free or need GPUs), then pending
	// ones first come, first served.
	slices.SortStableFunc(open, func(a, b *store.Reservation) int {
		if c := cmp.Compare(rank(a.State), rank(b.State)); c != 0 {
			return c
		}
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	for _, r := range open {
		var err error
		switch r.State {
		case store.ReservationActive:
			err = p.active(ctx, tx, r, byID, now, res)
		case store.ReservationPlaced:
			err = p.placed(ctx, tx, r, nodes, byID, book, now, res)
		case store.ReservationPending:
			if res.Placed+res.Failed >= p.cfg.MaxPlacements {
				continue
			}
			err = p.pending(ctx, tx, r, nodes, book, now, res)
		}
		if err != nil {
			return fmt.Errorf("reservation %s: %w", r.ID, err)
		}
	}
	return nil
}

// rank orders states for a round: active, placed, then pending.
func rank(state string) int {
	switch state {
	case store.ReservationActive:
		return 0
	case store.ReservationPlaced:
		return 1
	}
	return 2
}

func (p *Placer) active(ctx context.Context, tx PoolTx, r *store.Reservation, byID map[string]*Node, now time.Time, res *Result) error {
	if !now.Before(r.End) {
		_, err := tx.ReservationTransition(ctx, &store.ReservationTransitionParams{ID: r.ID, From: store.ReservationActive,
			To: store.ReservationEnded, Now: &now})
		if err == nil {
			res.Ended++
		}
		return err
	}
	for _, id := range r.NodeIDs() {
		why := unhealthy(r, id, byID[id])
		if why == "" || slices.Contains(r.FailedNodes, id) {
			continue
		}
		reported, err := tx.ReservationNodeFailed(ctx, &store.ReservationNodeFailedParams{ID: r.ID, NodeID: id, Reason: why, Now: &now})
		if err != nil {
			return err
		}
		if reported {
			res.NodeFailed++
			p.log.WarnContext(ctx, "Reserved node failed", "reservation", r.ID, "owner", r.Owner, logkey.NodeID, id, "reason", why)
		}
	}
	return nil
}

func (p *Placer) placed(ctx context.Context, tx PoolTx, r *store.Reservation, nodes []*Node, byID map[string]*Node,
	book *Bookings, now time.Time, res *Result) error {
	if !now.Before(r.Start) {
		if _, err := tx.ReservationTransition(ctx, &store.ReservationTransitionParams{ID: r.ID, From: store.ReservationPlaced,
			To: store.ReservationActive, Now: &now}); err != nil {
			return err
		}
		res.Activated++
		r.State = store.ReservationActive
		return p.active(ctx, tx, r, byID, now, res)
	}
	bad := map[string]bool{}
	var why []string
	for _, id := range r.NodeIDs() {
		if w := unhealthy(r, id, byID[id]); w != "" {
			bad[id] = true
			why = append(why, "node "+id+" "+w)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	book.remove(r.ID)
	req := RequestOf(r)
	req.Exclude = bad
	slots, reason := Fit(nodes, book, req)
	if slots == nil {
		_, err := tx.ReservationTransition(ctx, &store.ReservationTransitionParams{ID: r.ID, From: store.ReservationPlaced,
			To: store.ReservationFailed, Reason: strings.Join(why, "; ") + " before the start, and no other node fits: no " + reason, Now: &now})
		if err == nil {
			res.Failed++
			p.log.WarnContext(ctx, "Reservation failed", "reservation", r.ID, "owner", r.Owner, "reason", strings.Join(why, "; "))
		}
		return err
	}
	placed, err := tx.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: r.ID, Slots: slots,
		Reason: "moved: " + strings.Join(why, "; "), Now: &now})
	if errors.Is(err, store.ErrConflict) {
		res.Conflicts++
		return nil
	}
	if err != nil {
		return err
	}
	for _, s := range placed.Slots {
		book.add(s)
	}
	res.Moved++
	p.log.InfoContext(ctx, "Reservation moved off an unhealthy node", "reservation", r.ID, "nodes", strings.Join(placed.NodeIDs(), ","))
	return nil
}

func (p *Placer) pending(ctx context.Context, tx PoolTx, r *store.Reservation, nodes []*Node, book *Bookings, now time.Time, res *Result) error {
	reason := ""
	var slots []*store.ReservationSlot
	if !now.Before(r.End) {
		reason = "its window ended before it could be placed"
	} else if slots, reason = Fit(nodes, book, RequestOf(r)); slots == nil {
		reason = "no capacity: no " + reason
	}
	if slots == nil {
		_, err := tx.ReservationTransition(ctx, &store.ReservationTransitionParams{ID: r.ID, From: store.ReservationPending,
			To: store.ReservationFailed, Reason: reason, Now: &now})
		if err == nil {
			res.Failed++
		}
		return err
	}
	placed, err := tx.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: r.ID, Slots: slots, Now: &now})
	if errors.Is(err, store.ErrConflict) {
		res.Conflicts++
		return nil
	}
	if err != nil {
		return err
	}
	for _, s := range placed.Slots {
		book.add(s)
	}
	res.Placed++
	return nil
}

// unhealthy says why node id no longer serves r ("" when it does): gone,
// out of service, or a GPU r holds there missing or not healthy.
func unhealthy(r *store.Reservation, id string, n *Node) string {
	if n == nil {
		return "was deleted"
	}
	if n.Unavailable != "" {
		return "is " + n.Unavailable
	}
	for _, s := range r.Slots {
		if s.NodeID != id {
			continue
		}
		i := slices.IndexFunc(n.GPUs, func(g GPU) bool { return g.Index == s.GPU })
		switch {
		case i < 0:
			return fmt.Sprintf("no longer reports GPU %d", s.GPU)
		case !n.GPUs[i].Healthy:
			return fmt.Sprintf("has GPU %d unhealthy", s.GPU)
		}
	}
	return ""
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
