package rollouts

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/healthgate"
	"github.com/better-compute/better-compute/controlplane/pkg/inventory"
	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Defaults of a rollout (rollouts.create fills them in).
const (
	// DefaultCanary is the canary wave's size.
	DefaultCanary = 1
	// DefaultWave is a later wave's size.
	DefaultWave = "10%"
	// DefaultSoak is how long an upgraded node must stay ready.
	DefaultSoak = 5 * time.Minute
	// DefaultTimeout is how long a node has to come back on the new
	// version (and to drain): issue 20.
	DefaultTimeout = 10 * time.Minute
	// DefaultBake is how long the rollout keeps watching every node it
	// upgraded after the last wave: issue 30.
	DefaultBake = 10 * time.Minute
	// drainSlack is how long after a gateway's drain expected a node back
	// (nodes.reconnect_by) its new session still counts as the drain's
	// reconnect, not as a drop.
	drainSlack = 30 * time.Second
	// maxDrops is how many session drops of an upgraded node (not counting
	// reconnects after a gateway's drain) the rollout lets pass: one more
	// halts it (issue 30).
	maxDrops = 1
)

// attrRollout is the log attribute of a rollout's id.
const attrRollout = "rollout_id"

// stepTx is what a step's fenced transaction touches: the rollout and its
// nodes, their disruption and their upgrade and rollback commands.
type stepTx interface {
	RolloutUpdate(ctx context.Context, p *store.RolloutUpdateParams) (*store.Rollout, error)
	RolloutNodeUpdate(ctx context.Context, p *store.RolloutNodeUpdateParams) error
	DisruptionAdmit(ctx context.Context, p *store.DisruptionAdmitParams) (*store.DisruptionAdmission, error)
	DisruptionRelease(ctx context.Context, nodeID, owner string) error
	CommandEnqueue(ctx context.Context, p *store.CommandEnqueueParams) ([]*store.Command, error)
	CommandFinish(ctx context.Context, p *store.CommandFinishParams) (ok bool, err error)
}

// Store is what the reconciler needs.
type Store interface {
	store.FencedTransactor
	RolloutsActive(ctx context.Context) ([]*store.Rollout, error)
	RolloutNodes(ctx context.Context, rolloutID string) ([]*store.RolloutNode, error)
	CommandInFlight(ctx context.Context, nodeID string) ([]*store.Command, error)
	PoolBudget(ctx context.Context, poolID string) (*store.PoolBudget, error)
	NodeGet(ctx context.Context, id string) (*store.Node, error)
	NodeReservedNow(ctx context.Context, nodeID string, now *time.Time) (*store.Reservation, error)
	CommandGet(ctx context.Context, id string) (*store.Command, error)
	RolloutHealthCounts(ctx context.Context, spans []store.HealthSpan, excludeCreatedBy string) (*store.HealthCounts, error)
}

// Waker is told of the nodes that have new commands right after they
// commit, so their gateways dispatch at once (api.Waker's shape).
type Waker interface {
	Wake(ctx context.Context, nodeIDs []string)
}

// Config configures the reconciler.
type Config struct {
	// Interval is how often each shard's rollouts are stepped. Defaults
	// to 1 s.
	Interval time.Duration
	// Now is the clock soaks and timeouts are measured by (and recorded
	// in the rows with). Defaults to time.Now.
	Now func() time.Time
	// Waker, when set, wakes the gateways of nodes given a command.
	Waker Waker
	// Gate is the waves' health gate's thresholds (rollouts.healthGate;
	// zero fields: package healthgate's defaults).
	Gate healthgate.Params
	// MinExtension is the least an inconclusive health gate extends a
	// wave's soak by (the extension is the rollout's soak, or this when
	// the soak is shorter). Defaults to DefaultMinExtension; tests with
	// soaks of milliseconds shorten it.
	MinExtension time.Duration
}

// DefaultMinExtension is Config.MinExtension's default: a soak shorter
// than a second is extended by a second.
const DefaultMinExtension = time.Second

// Reconciler drives rollouts (see the package documentation). It is a
// shard.Reconciler.
type Reconciler struct {
	cfg   Config
	store Store
	log   *slog.Logger

	mu     sync.Mutex
	active map[int][]*store.Rollout // by shard, read by Due for the round
}

// New returns a Reconciler.
func New(cfg Config, st Store, log *slog.Logger) *Reconciler {
	cfg.Interval = cmp.Or(cfg.Interval, time.Second)
	cfg.MinExtension = cmp.Or(cfg.MinExtension, DefaultMinExtension)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Reconciler{cfg: cfg, store: st, log: cmp.Or(log, slog.New(slog.DiscardHandler))}
}

var _ shard.Reconciler = (*Reconciler)(nil)

// Name names the reconciler.
func (r *Reconciler) Name() string { return "rollouts" }

// Interval is how often each held shard is reconciled.
func (r *Reconciler) Interval() time.Duration { return r.cfg.Interval }

// Due reads the active rollouts once for the round and returns the shards
// they are in; the round's passes step them.
func (r *Reconciler) Due(ctx context.Context, _ time.Time, _ []int) ([]int, error) {
	ros, err := r.store.RolloutsActive(ctx)
	if err != nil {
		return nil, err
	}
	by := map[int][]*store.Rollout{}
	for _, ro := range ros {
		n := store.ShardOf(ro.ID)
		by[n] = append(by[n], ro)
	}
	r.mu.Lock()
	r.active = by
	r.mu.Unlock()
	return slices.Collect(maps.Keys(by)), nil
}

// Reconcile steps the active rollouts of shard n that Due read, under
// fence.
func (r *Reconciler) Reconcile(ctx context.Context, n int, fence store.Fence) error {
	r.mu.Lock()
	ros := r.active[n]
	delete(r.active, n)
	r.mu.Unlock()
	var errs []error
	for _, ro := range ros {
		if err := r.Step(ctx, ro, fence); err != nil {
			errs = append(errs, fmt.Errorf("rollout %s: %w", ro.ID, err))
		}
	}
	return errors.Join(errs...)
}

// Step moves one rollout on as far as its rows allow now, in one fenced
// transaction when anything is due. A rollout an operator changed since
// it was read is left for the next round.
func (r *Reconciler) Step(ctx context.Context, ro *store.Rollout, fence store.Fence) error {
	nodes, err := r.store.RolloutNodes(ctx, ro.ID)
	if err != nil {
		return err
	}
	b, err := r.store.PoolBudget(ctx, ro.PoolID)
	if err != nil {
		return err
	}
	read := ro.State // decide moves p.ro on as it plans
	ro = new(*ro)
	p := &plan{r: r, ro: ro, nodes: nodes, now: r.cfg.Now().UTC(), owner: store.RolloutOwner(ro.ID), free: b.Budget - b.OutOfService}
	if err := p.decide(ctx); err != nil {
		return err
	}
	if len(p.ops) == 0 {
		return nil
	}
	err = store.InFencedTx(ctx, r.store, fence, func(tx stepTx) error {
		// Lock the rollout's row and check it is still as read.
		if _, err := tx.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: ro.ID, From: []string{read}, Now: &p.now}); err != nil {
			return err
		}
		for _, op := range p.ops {
			if err := op(ctx, tx); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, store.ErrConflict) || errors.Is(err, errRetry) {
		return nil // changed meanwhile, or the budget moved: next round
	}
	if err != nil {
		return err
	}
	for _, l := range p.logs {
		l()
	}
	if r.cfg.Waker != nil && len(p.woken) > 0 {
		r.cfg.Waker.Wake(ctx, p.woken)
	}
	return nil
}

// errRetry rolls a step back to try again next round.
var errRetry = errors.New("retry next round")

// plan is one step's decisions: the writes (ops, run in order in one
// fenced transaction) and what to log once they commit.
type plan struct {
	r     *Reconciler
	ro    *store.Rollout
	nodes []*store.RolloutNode
	now   time.Time
	owner string
	// free is how many more nodes the pool's budget admits now.
	free int

	ops   []func(ctx context.Context, tx stepTx) error
	logs  []func()
	woken []string
	// gpuCount caches the nodes' GPU counts the health gate read.
	gpuCount map[string]int
}

// op adds a write to the step's transaction; it runs with the step's
// context.
func (p *plan) op(fn func(ctx context.Context, tx stepTx) error) { p.ops = append(p.ops, fn) }

func (p *plan) info(msg string, args ...any) {
	args = append([]any{attrRollout, p.ro.ID}, args...)
	p.logs = append(p.logs, func() { p.r.log.Info(msg, args...) })
}

// setNode moves a node to state with reason (and command ids) in the
// step's transaction.
func (p *plan) setNode(n *store.RolloutNode, state, reason string, cmd func(*store.RolloutNodeUpdateParams)) {
	u := &store.RolloutNodeUpdateParams{RolloutID: p.ro.ID, NodeID: n.NodeID, State: state, Reason: reason, Now: &p.now}
	if cmd != nil {
		cmd(u)
	}
	if n.State == store.RolloutNodePending && state != store.RolloutNodePending {
		u.ClearReason = true // what it waited for is over
		n.Reason = ""
	}
	if reason != "" {
		n.Reason = reason
	}
	n.State = state
	p.op(func(ctx context.Context, tx stepTx) error { return tx.RolloutNodeUpdate(ctx, u) })
}

// release puts a node back in service (if the rollout holds it).
func (p *plan) release(n *store.RolloutNode) {
	id := n.NodeID
	p.op(func(ctx context.Context, tx stepTx) error { return tx.DisruptionRelease(ctx, id, p.owner) })
}

// setRollout changes the rollout in the step's transaction.
func (p *plan) setRollout(u *store.RolloutUpdateParams) {
	u.ID, u.Now = p.ro.ID, &p.now
	if u.State != "" {
		p.ro.State = u.State
	}
	p.op(func(ctx context.Context, tx stepTx) error {
		_, err := tx.RolloutUpdate(ctx, u)
		return err
	})
}

// inFlight reports whether a node state holds a budget slot.
func inFlight(state string) bool {
	switch state {
	case store.RolloutNodeDraining, store.RolloutNodeUpgrading, store.RolloutNodeSoaking, store.RolloutNodeRollingBack:
		return true
	}
	return false
}

// commandFailed reports whether a command state is a terminal failure.
func commandFailed(state string) bool {
	return store.IsTerminal(state) && state != store.CommandSucceeded
}

func (p *plan) decide(ctx context.Context) error {
	ro := p.ro
	switch ro.State {
	case store.RolloutPending:
		p.setRollout(&store.RolloutUpdateParams{State: store.RolloutRunning})
		p.info("Rollout started", "version", ro.Version, "nodes", len(p.nodes))
		return nil
	case store.RolloutRunning, store.RolloutPaused:
		return p.advance(ctx)
	case store.RolloutRollingBack:
		p.rollBack()
		return nil
	}
	return nil
}

// wave returns the current wave's nodes.
func (p *plan) wave() []*store.RolloutNode {
	var out []*store.RolloutNode
	for _, n := range p.nodes {
		if p.ro.CurrentWave > 0 && n.Wave == p.ro.CurrentWave {
			out = append(out, n)
		}
	}
	return out
}

// healthy reports whether a node is connected and ready, and why not.
func healthy(n *store.RolloutNode, owner string) (bool, string) {
	switch {
	case !n.Connected:
		return false, "not connected (state " + n.NodeState + ")"
	case n.NodeState != store.NodeReady:
		return false, "state " + n.NodeState
	case n.Disruption == store.DisruptionQuarantined && n.DisruptionOwner != owner:
		return false, "quarantined (" + n.DisruptionOwner + ")"
	}
	return true, ""
}

// advance runs a running or paused rollout's current wave, and starts the
// next one (running only) when it is done.
func (p *plan) advance(ctx context.Context) error {
	ro := p.ro
	total := len(p.nodes)
	maxOut := store.ResolveCount(ro.MaxUnavailable, total)
	out := 0
	for _, n := range p.nodes {
		if inFlight(n.State) {
			out++
		}
	}
	if p.watch() {
		return nil
	}
	failed := false
	for _, n := range p.wave() {
		if failed {
			break
		}
		switch n.State {
		case store.RolloutNodePending:
			if ro.State != store.RolloutRunning {
				continue
			}
			if ok, why := healthy(n, p.owner); !ok {
				p.setNode(n, store.RolloutNodeSkipped, "offline at its turn: "+why, nil)
				p.info("Rollout skipped a node", logkey.NodeID, n.NodeID, "reason", why)
				continue
			}
			if n.Disruption != "" && n.DisruptionOwner != p.owner {
				p.setNode(n, store.RolloutNodeSkipped, fmt.Sprintf("out of service: %s (held by %s)", n.Disruption, n.DisruptionOwner), nil)
				continue
			}
			if n.BCDVersion == ro.Version {
				p.setNode(n, store.RolloutNodeUpgraded, "already on "+ro.Version, nil)
				continue
			}
			if out >= maxOut {
				continue
			}
			// A node holding capacity for someone waits for the
			// reservation to end (DESIGN.md, "Scheduler"); the rollout
			// goes on with the wave's other nodes meanwhile.
			if r, err := p.r.store.NodeReservedNow(ctx, n.NodeID, &p.now); err != nil {
				return err
			} else if r != nil {
				// Said on the node (rollouts get), once: a reason-only
				// change writes no event.
				if why := fmt.Sprintf("waits for reservation %s (%s) to end at %s", r.ID, r.Owner, r.End.UTC().Format(time.RFC3339)); n.Reason != why {
					p.setNode(n, store.RolloutNodePending, why, nil)
					p.info("Rollout waits for a reservation", logkey.NodeID, n.NodeID, "reservation", r.ID, "owner", r.Owner)
				}
				continue
			}
			reason := store.DisruptionUpgrading
			if ro.Drain {
				reason = store.DisruptionDraining
			}
			if !p.admit(n, reason) {
				continue
			}
			out++
			if ro.Drain {
				p.setNode(n, store.RolloutNodeDraining, "", nil)
				continue
			}
			if err := p.upgrade(ctx, n); err != nil {
				return err
			}
		case store.RolloutNodeDraining:
			running, err := p.running(ctx, n)
			if err != nil {
				return err
			}
			if len(running) == 0 {
				if err := p.upgrade(ctx, n); err != nil {
					return err
				}
				continue
			}
			if p.now.Sub(n.StateSince) > ro.Timeout {
				p.release(n)
				p.setNode(n, store.RolloutNodeSkipped, fmt.Sprintf("still running %d command(s) after %v of draining: %s",
					len(running), ro.Timeout, strings.Join(running, ", ")), nil)
			}
		case store.RolloutNodeUpgrading:
			switch {
			case commandFailed(n.UpgradeState):
				// bcd restored the previous release itself when the trial
				// failed: nothing to roll back on this node.
				p.release(n)
				p.fail(n, store.RolloutNodeFailed, fmt.Sprintf("upgrade %s: %s", n.UpgradeState, cmp.Or(n.UpgradeError, "no error given")))
				failed = true
			case n.UpgradeState == store.CommandSucceeded && rolledBackItself(n, ro):
				p.release(n)
				p.fail(n, store.RolloutNodeFailed, rolledBackReason(n))
				failed = true
			case n.UpgradeState == store.CommandSucceeded && n.BCDVersion == ro.Version && n.Connected && n.NodeState == store.NodeReady:
				// The command's result comes from the restarted bcd (the
				// trial that connected before it runs no command), so the
				// soak starts on the bcd that stays; its watch starts here
				// too (its starts and session so far).
				w := &store.RolloutNodeWatch{Starts: n.BCDStarts, SessionSince: n.SessionSince}
				p.setNode(n, store.RolloutNodeSoaking, "", func(u *store.RolloutNodeUpdateParams) { u.Watch = w })
				p.info("Rollout node back on the new version; soaking", logkey.NodeID, n.NodeID, "soak", ro.Soak)
			case p.now.Sub(n.StateSince) > ro.Timeout:
				p.release(n)
				p.fail(n, store.RolloutNodeFailed, fmt.Sprintf("did not come back on %s within %v (version %s, state %s)",
					ro.Version, ro.Timeout, n.BCDVersion, n.NodeState))
				failed = true
			}
		case store.RolloutNodeSoaking:
			if rolledBackItself(n, ro) {
				p.release(n)
				p.fail(n, store.RolloutNodeFailed, rolledBackReason(n))
				failed = true
				continue
			}
			ok, why := healthy(n, p.owner)
			if ok && n.BCDVersion != ro.Version {
				ok, why = false, "runs "+n.BCDVersion
			}
			if ok && n.BCDStarts > n.WatchStarts {
				ok, why = false, fmt.Sprintf("bcd restarted (%d start(s) since it came back on %s)", n.BCDStarts-n.WatchStarts, ro.Version)
			}
			if ok {
				// Its GPUs, as its last inventory tells them (read for the
				// few nodes soaking only).
				gpu, err := p.failedGPU(ctx, n.NodeID)
				if err != nil {
					return err
				}
				if gpu != "" {
					ok, why = false, "GPU "+gpu+" failed"
				}
			}
			switch {
			case !ok:
				// It runs the new version: it rolls back with the wave.
				p.fail(n, "", "turned unhealthy during the soak: "+why)
				failed = true
			case p.now.Sub(n.StateSince) >= ro.Soak:
				p.release(n)
				p.setNode(n, store.RolloutNodeUpgraded, "", nil)
				p.info("Rollout node upgraded", logkey.NodeID, n.NodeID, "version", ro.Version)
			}
		}
	}
	if failed {
		return nil
	}
	// The wave is done when every node of it upgraded or was skipped.
	for _, n := range p.wave() {
		if n.State != store.RolloutNodeUpgraded && n.State != store.RolloutNodeSkipped {
			return nil
		}
	}
	if ro.State != store.RolloutRunning {
		return nil
	}
	// The wave's health gate: the wave advances once it passed, or was
	// inconclusive after its extension.
	if ok, err := p.gate(ctx); err != nil || !ok {
		return err
	}
	var pending []*store.RolloutNode
	for _, n := range p.nodes {
		if n.Wave == 0 && n.State == store.RolloutNodePending {
			pending = append(pending, n)
		}
	}
	if len(pending) == 0 {
		// The bake: every node the rollout upgraded is watched for Bake
		// more (its clock stopped while paused) before the rollout ends.
		switch {
		case ro.Bake > 0 && !ro.Baking():
			p.setRollout(&store.RolloutUpdateParams{StartBake: true})
			p.info("Rollout baking: watching every node it upgraded", "bake", ro.Bake)
			return nil
		case ro.Bake > 0 && ro.BakeDone(p.now) < ro.Bake:
			return nil
		}
		p.setRollout(&store.RolloutUpdateParams{State: store.RolloutCompleted})
		p.info("Rollout completed", "version", ro.Version)
		return nil
	}
	// Nodes that can be upgraded now first (the canary must be one of
	// them), then by id.
	slices.SortStableFunc(pending, func(a, b *store.RolloutNode) int {
		ha, _ := healthy(a, p.owner)
		hb, _ := healthy(b, p.owner)
		ha = ha && a.Disruption == ""
		hb = hb && b.Disruption == ""
		switch {
		case ha && !hb:
			return -1
		case hb && !ha:
			return 1
		}
		return strings.Compare(a.NodeID, b.NodeID)
	})
	size := store.ResolveCount(ro.Wave, total)
	if ro.CurrentWave == 0 {
		size = ro.Canary
	}
	next := ro.CurrentWave + 1
	var ids []string
	for _, n := range pending[:min(size, len(pending))] {
		ids = append(ids, n.NodeID)
	}
	p.setRollout(&store.RolloutUpdateParams{Wave: &next, WaveNodes: ids})
	p.info("Rollout wave started", "wave", next, "nodes", len(ids))
	return nil
}

// watch checks every node the rollout upgraded, of every wave, until the
// rollout ends (issue 30; DESIGN.md, "Memory and evidence"): one that
// restarted bcd, left ready, was quarantined, runs another version or
// dropped its session more than maxDrops times (reconnects after a
// gateway's drain not counted) halts the rollout, naming each such node
// and why. It records the drops it counts, and reports whether it halted.
func (p *plan) watch() bool {
	ro := p.ro
	var why []string
	var first *store.RolloutNode
	for _, n := range p.nodes {
		if n.State != store.RolloutNodeUpgraded || n.UpgradeCommandID == "" {
			continue // not upgraded, or not by the rollout ("already on")
		}
		reason, drops := p.watched(n)
		if drops != n.Drops || (n.Connected && n.SessionSince != nil && !sameTime(n.SessionSince, n.SeenSessionSince)) {
			w := &store.RolloutNodeWatch{Starts: n.WatchStarts, SessionSince: n.SessionSince, Drops: drops}
			p.setNode(n, n.State, reason, func(u *store.RolloutNodeUpdateParams) { u.Watch = w })
			n.Drops, n.SeenSessionSince = drops, n.SessionSince
		} else if reason != "" {
			p.setNode(n, n.State, reason, nil)
		}
		if reason == "" {
			continue
		}
		if first == nil {
			first = n
		}
		why = append(why, fmt.Sprintf("node %s (%s, wave %d): %s", n.NodeID, n.Hostname, n.Wave, reason))
		p.logs = append(p.logs, func() {
			p.r.log.Warn("Rollout watch: an upgraded node failed", attrRollout, ro.ID, logkey.NodeID, n.NodeID, "wave", n.Wave, "reason", reason)
		})
	}
	if first == nil {
		return false
	}
	for _, n := range p.nodes {
		if n.State == store.RolloutNodeUpgraded && rolledBackItself(n, ro) {
			// Back on its previous release already: nothing to send it.
			p.setNode(n, store.RolloutNodeFailed, rolledBackReason(n), nil)
		}
	}
	phase := "after its wave"
	if ro.Baking() {
		phase = "during the bake"
	}
	p.setRollout(&store.RolloutUpdateParams{State: store.RolloutRollingBack, FailedNodeID: first.NodeID,
		Reason: fmt.Sprintf("%d upgraded node(s) failed %s: %s", len(why), phase, strings.Join(why, "; "))})
	return true
}

// watched says why an upgraded node fails its watch ("" when it does not)
// and counts its session drops.
func (p *plan) watched(n *store.RolloutNode) (reason string, drops int) {
	ro := p.ro
	drops = n.Drops
	if n.Connected && n.SessionSince != nil && n.SeenSessionSince != nil && !sameTime(n.SessionSince, n.SeenSessionSince) &&
		n.BCDStarts == n.WatchStarts {
		// A new session of the same bcd: a drop, unless it follows a
		// gateway's drain (it came back by when the drain expected it).
		if n.ReconnectBy == nil || n.SessionSince.After(n.ReconnectBy.Add(drainSlack)) {
			drops++
		}
	}
	switch {
	case rolledBackItself(n, ro):
		return rolledBackReason(n), drops
	case n.BCDStarts > n.WatchStarts:
		return fmt.Sprintf("bcd restarted (%d start(s) since it came back on %s)", n.BCDStarts-n.WatchStarts, ro.Version), drops
	case n.Connected && n.BCDVersion != ro.Version:
		return "runs " + n.BCDVersion, drops
	case n.NodeState != store.NodeReady:
		return "left ready (state " + n.NodeState + ")", drops
	case n.Disruption == store.DisruptionQuarantined:
		return "quarantined (" + n.DisruptionOwner + ")", drops
	case drops > maxDrops:
		return fmt.Sprintf("its session dropped %d times since its upgrade (reconnects after a gateway's drain not counted)", drops), drops
	}
	return "", drops
}

// sameTime reports whether two optional times are the same instant.
func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

// rolledBackItself reports whether a node the rollout upgraded runs its
// previous release again without a rollback command: bcd restored it
// itself after a crash loop (node.rolled-back-locally; issue 30).
func rolledBackItself(n *store.RolloutNode, ro *store.Rollout) bool {
	return n.Connected && n.PreviousVersion != "" && n.PreviousVersion != ro.Version && n.BCDVersion == n.PreviousVersion &&
		n.RollbackCommandID == ""
}

// rolledBackReason says why a node that rolled itself back failed.
func rolledBackReason(n *store.RolloutNode) string {
	return "bcd rolled itself back to " + n.PreviousVersion + " (the new release crash-looped): back on " + n.PreviousVersion
}

// failedGPU returns the UUID of a GPU the node's last inventory reports
// failed, "" when none.
func (p *plan) failedGPU(ctx context.Context, nodeID string) (string, error) {
	n, err := p.r.store.NodeGet(ctx, nodeID)
	if err != nil {
		return "", err
	}
	for _, g := range inventory.Decode(n.Inventory).GetGpus() {
		if inventory.HealthName(g.GetHealth()) == "failed" {
			return cmp.Or(g.GetUuid(), g.GetPciBusId(), "?"), nil
		}
	}
	return "", nil
}

// admit takes a node out of service for the rollout, in the step's
// transaction; false, with nothing written, when the pool's budget (as
// the step read it, less what the step already took) has no slot now. The
// transaction's own admission decides: one refused there (another
// reconciler took the slot meanwhile) rolls the step back for the next
// round.
func (p *plan) admit(n *store.RolloutNode, reason string) bool {
	if p.free <= 0 {
		return false
	}
	p.free--
	id := n.NodeID
	p.op(func(ctx context.Context, tx stepTx) error {
		res, err := tx.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: id, Reason: reason, Owner: p.owner, Now: &p.now})
		if err != nil {
			return err
		}
		if !res.Admitted {
			return errRetry
		}
		return nil
	})
	return true
}

// running returns the ids of a node's in-flight commands other than the
// rollout's own.
func (p *plan) running(ctx context.Context, n *store.RolloutNode) ([]string, error) {
	cmds, err := p.r.store.CommandInFlight(ctx, n.NodeID)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, c := range cmds {
		if c.ID != n.UpgradeCommandID && c.ID != n.RollbackCommandID {
			ids = append(ids, c.ID)
		}
	}
	return ids, nil
}

// upgradeKey and rollbackKey are the idempotency keys of a rollout's
// commands (one of each per node).
func upgradeKey(id string) string  { return store.RolloutOwner(id) + ":upgrade" }
func rollbackKey(id string) string { return store.RolloutOwner(id) + ":rollback" }

// upgrade sends a node its upgrade command (moving its hold to upgrading),
// in the step's transaction. Without Drain the commands still running are
// finished first, as ended by the restart.
func (p *plan) upgrade(ctx context.Context, n *store.RolloutNode) error {
	ro := p.ro
	spec, err := sessionv1.MarshalSpec(&sessionv1.Command{Spec: &sessionv1.Command_Upgrade{Upgrade: &sessionv1.UpgradeSpec{
		Version: ro.Version, BaseUrl: ro.BaseURL}}})
	if err != nil {
		return err
	}
	var ended []string
	if !ro.Drain {
		if ended, err = p.running(ctx, n); err != nil {
			return err
		}
	}
	id := n.NodeID
	reason := ""
	if len(ended) > 0 {
		reason = fmt.Sprintf("%d command(s) still running ended by the restart of bcd: %s", len(ended), strings.Join(ended, ", "))
	}
	var cmdID string
	from := n.State // the ops run after the plan, when n.State has moved on
	p.op(func(ctx context.Context, tx stepTx) error {
		if from == store.RolloutNodeDraining {
			a, err := tx.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: id, Reason: store.DisruptionUpgrading, Owner: p.owner, Now: &p.now})
			if err != nil {
				return err
			}
			if !a.Admitted {
				return errRetry
			}
		}
		for _, c := range ended {
			if _, err := tx.CommandFinish(ctx, &store.CommandFinishParams{ID: c, State: store.CommandFailed,
				Error: "ended by the restart of bcd for rollout " + ro.ID + " (--drain=false)", Now: &p.now}); err != nil {
				return err
			}
		}
		cmds, err := tx.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{id}, Kind: sessionv1.KindUpgrade,
			SessionSpec: spec, IdempotencyKey: upgradeKey(ro.ID), CreatedBy: p.owner, Timeout: ro.Timeout, Now: &p.now})
		if err != nil {
			return err
		}
		cmdID = cmds[0].ID
		return tx.RolloutNodeUpdate(ctx, &store.RolloutNodeUpdateParams{RolloutID: ro.ID, NodeID: id, State: store.RolloutNodeUpgrading,
			UpgradeCommandID: cmdID, Reason: reason, ClearReason: from == store.RolloutNodePending, Now: &p.now})
	})
	n.State = store.RolloutNodeUpgrading
	p.woken = append(p.woken, id)
	p.logs = append(p.logs, func() {
		p.r.log.Info("Rollout node upgrading", attrRollout, ro.ID, logkey.NodeID, id, logkey.CommandID, cmdID, "version", ro.Version)
	})
	return nil
}

// rollbackCommand sends a node the rollback command, in the step's
// transaction, taking it out of service again when the rollout released
// it (an upgraded node of the wave).
func (p *plan) rollbackCommand(n *store.RolloutNode, reason string) bool {
	ro := p.ro
	id := n.NodeID
	// A node out of service already (held by the rollout, or quarantined
	// meanwhile) needs no slot; an upgraded one back in service does.
	if n.Disruption == "" && !p.admit(n, store.DisruptionUpgrading) {
		return false // no slot now: next round
	}
	p.op(func(ctx context.Context, tx stepTx) error {
		cmds, err := tx.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{id}, Kind: sessionv1.KindRollback,
			IdempotencyKey: rollbackKey(ro.ID), CreatedBy: p.owner, Timeout: ro.Timeout, Now: &p.now})
		if err != nil {
			return err
		}
		return tx.RolloutNodeUpdate(ctx, &store.RolloutNodeUpdateParams{RolloutID: ro.ID, NodeID: id, State: store.RolloutNodeRollingBack,
			RollbackCommandID: cmds[0].ID, Reason: reason, Now: &p.now})
	})
	n.State = store.RolloutNodeRollingBack
	p.woken = append(p.woken, id)
	p.info("Rollout rolling back a node", logkey.NodeID, id, "to", n.PreviousVersion)
	return true
}

// fail halts the rollout for node n: state (failed) when given, or a
// rollback right away for a node on the new version (state "").
func (p *plan) fail(n *store.RolloutNode, state, reason string) {
	if state != "" {
		p.setNode(n, state, reason, nil)
	} else {
		// Still held by the rollout: no slot is needed.
		p.rollbackCommand(n, reason)
	}
	p.setRollout(&store.RolloutUpdateParams{State: store.RolloutRollingBack, FailedNodeID: n.NodeID,
		Reason: fmt.Sprintf("node %s (%s): %s", n.NodeID, n.Hostname, reason)})
	p.logs = append(p.logs, func() {
		p.r.log.Warn("Rollout halted: rolling back the wave", attrRollout, p.ro.ID, logkey.NodeID, n.NodeID, "reason", reason)
	})
}

// rollBack drives every node a rolling-back rollout upgraded, of every
// wave, back to the previous release, within the pool's disruption budget
// (a node back in service takes a slot again for its rollback, so they go
// in waves the budget sizes), and halts it (or fails it) once nothing is
// left in flight, naming each node rolled back or failed and why.
func (p *plan) rollBack() {
	ro := p.ro
	busy, broken := false, false
	for _, n := range p.nodes {
		if n.Wave == 0 {
			continue
		}
		switch n.State {
		case store.RolloutNodeDraining:
			p.release(n)
			p.setNode(n, store.RolloutNodePending, "rollout halted before its upgrade", nil)
		case store.RolloutNodeUpgrading:
			switch {
			case commandFailed(n.UpgradeState):
				p.release(n)
				p.setNode(n, store.RolloutNodeRolledBack, "its upgrade failed: bcd kept "+n.PreviousVersion, nil)
			case n.UpgradeState == store.CommandSucceeded || (n.BCDVersion == ro.Version && n.Connected):
				p.rollbackCommand(n, "rollout halted")
				busy = true
			case p.now.Sub(n.StateSince) > ro.Timeout:
				p.release(n)
				p.setNode(n, store.RolloutNodeFailed, fmt.Sprintf("did not come back within %v while the rollout rolled back", ro.Timeout), nil)
				broken = true
			default:
				busy = true
			}
		case store.RolloutNodeSoaking:
			p.rollbackCommand(n, cmp.Or(n.Reason, "rollout halted"))
			busy = true
		case store.RolloutNodeUpgraded:
			if n.UpgradeCommandID == "" {
				continue // it was on the version before the rollout
			}
			if rolledBackItself(n, ro) {
				p.setNode(n, store.RolloutNodeFailed, rolledBackReason(n), nil)
				continue
			}
			why := "rollout halted"
			if n.Reason != "" {
				why = n.Reason + "; rollout halted"
			}
			p.rollbackCommand(n, why)
			busy = true
		case store.RolloutNodeRollingBack:
			switch {
			case n.BCDVersion == n.PreviousVersion && n.Connected && n.NodeState == store.NodeReady:
				// Back on its release, whatever the command says (an older
				// bcd may not know the kind it restored itself with).
				p.release(n)
				why := "back on " + n.PreviousVersion
				if n.Reason != "" {
					why = n.Reason + ": " + why // why it was rolled back, kept
				}
				p.setNode(n, store.RolloutNodeRolledBack, why, nil)
				p.info("Rollout node rolled back", logkey.NodeID, n.NodeID, "version", n.PreviousVersion)
			case commandFailed(n.RollbackState):
				p.release(n)
				p.setNode(n, store.RolloutNodeFailed, fmt.Sprintf("rollback %s: %s", n.RollbackState, cmp.Or(n.RollbackError, "no error given")), nil)
				broken = true
			case p.now.Sub(n.StateSince) > ro.Timeout:
				p.release(n)
				p.setNode(n, store.RolloutNodeFailed, fmt.Sprintf("did not come back on %s within %v of its rollback", n.PreviousVersion, ro.Timeout), nil)
				broken = true
			default:
				busy = true
			}
		case store.RolloutNodeFailed:
			if n.RollbackCommandID != "" {
				broken = true
			}
		}
	}
	if busy {
		return
	}
	var named []store.RolloutHaltedNode
	for _, n := range p.nodes {
		if n.Wave > 0 && (n.State == store.RolloutNodeRolledBack || n.State == store.RolloutNodeFailed) {
			named = append(named, store.RolloutHaltedNode{NodeID: n.NodeID, Hostname: n.Hostname, Wave: n.Wave, State: n.State, Reason: n.Reason})
		}
	}
	if broken {
		p.setRollout(&store.RolloutUpdateParams{State: store.RolloutFailed, Halted: named})
		p.logs = append(p.logs, func() { p.r.log.Error("Rollout failed: a rollback did not finish", attrRollout, ro.ID) })
		return
	}
	p.setRollout(&store.RolloutUpdateParams{State: store.RolloutHalted, Halted: named})
	p.logs = append(p.logs, func() { p.r.log.Warn("Rollout halted", attrRollout, ro.ID, "reason", ro.Reason) })
}
