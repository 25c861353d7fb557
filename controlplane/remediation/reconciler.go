package remediation

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpudiag"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Store is what the reconciler needs outside its transactions; inside them
// each callback receives the small interface of what it touches (caseTx,
// findingTx, silentTx, openCasesTx).
type Store interface {
	store.FencedTransactor
	RemediationDue(ctx context.Context, shards []int, now *time.Time) ([]int, error)
	RemediationSilentDue(ctx context.Context, shards []int) ([]int, error)
}

// caseTx is what advancing one case touches in its fenced transaction:
// the case, its node's commands, cordon and disruption, the pool's
// breaker, and the site's BMC agent (bmcAgent) with the grant of the
// node's BMC secret.
type caseTx interface {
	CommandEnqueue(ctx context.Context, p *store.CommandEnqueueParams) ([]*store.Command, error)
	CommandGet(ctx context.Context, id string) (*store.Command, error)
	CommandInFlight(ctx context.Context, nodeID string) ([]*store.Command, error)
	CommandRequestCancel(ctx context.Context, id string) (*store.Command, error)
	DisruptionAdmit(ctx context.Context, p *store.DisruptionAdmitParams) (*store.DisruptionAdmission, error)
	DisruptionRelease(ctx context.Context, nodeID, owner string) error
	NodeGet(ctx context.Context, id string) (*store.Node, error)
	NodeList(ctx context.Context, p *store.NodeListParams) ([]*store.Node, error)
	NodeSetCordoned(ctx context.Context, id string, cordoned bool) error
	NodeSetState(ctx context.Context, id, state string) error
	PoolGPUNodes(ctx context.Context, poolID string) (int, error)
	PoolGet(ctx context.Context, idOrName string) (*store.Pool, error)
	PoolList(ctx context.Context, p *store.ListParams) ([]*store.Pool, error)
	RemediationBreakerAdmit(ctx context.Context, p *store.RemediationBreakerAdmitParams) (admitted, tripped bool, err error)
	RemediationCreate(ctx context.Context, r *store.Remediation, actor string) (*store.Remediation, error)
	RemediationMove(ctx context.Context, p *store.RemediationMoveParams) (*store.Remediation, error)
	RemediationRecent(ctx context.Context, nodeID string, since time.Time, limit int) ([]*store.Remediation, error)
	SecretGet(ctx context.Context, name string) (*store.Secret, error)
	SecretGrant(ctx context.Context, p *store.SecretGrantParams) error
	SessionGet(ctx context.Context, nodeID string) (*store.Session, error)
}

// findingTx is what taking a shard's findings touches in one fenced
// transaction: the findings, and each new case advanced at once (caseTx).
type findingTx interface {
	caseTx
	RemediationFindingsTake(ctx context.Context, shard, limit int) ([]*store.RemediationFinding, error)
	RemediationFindingKeep(ctx context.Context, r *store.GPUFindingRecord) error
	RemediationOpenFor(ctx context.Context, nodeID string) (*store.Remediation, error)
	RemediationFindingCount(ctx context.Context, nodeID, gpuUUID, kind string, xid int, since time.Time) (int, error)
}

// silentTx is what opening probe cases for silent nodes touches.
type silentTx interface {
	RemediationSilentNodes(ctx context.Context, shard int) ([]string, error)
	RemediationCreate(ctx context.Context, r *store.Remediation, actor string) (*store.Remediation, error)
}

// openCasesTx is what reading a shard's open cases touches.
type openCasesTx interface {
	RemediationOpenInShard(ctx context.Context, shard int, now *time.Time, withPaused bool) ([]*store.Remediation, error)
}

// Config configures the reconciler.
type Config struct {
	// Settings are the configuration's remediation key, defaults filled
	// (config.Load fills them; zero fields here take the same defaults).
	Settings config.Remediation
	// Holder names this worker in audit rows ("remediation:<holder>").
	// Required.
	Holder string
	// Now is the clock that times the cases (their next times, the drain,
	// verification and breaker windows). Defaults to time.Now.
	Now func() time.Time
}

// Reconciler advances remediation cases shard by shard (a
// shard.Reconciler).
type Reconciler struct {
	cfg    Config
	store  Store
	policy *Policy
	log    *slog.Logger

	mu sync.Mutex // guards gpuNodes
	// gpuNodes caches each pool's count of GPU nodes for the breaker's
	// limit (gpuNodesTTL): counting reads every inventory of the pool, and
	// a pool's size changes slowly next to a burst of admissions.
	gpuNodes map[string]gpuCount
}

// gpuCount is a pool's GPU nodes as counted at a time.
type gpuCount struct {
	n  int
	at time.Time
}

// gpuNodesTTL is how long a pool's count of GPU nodes is reused.
const gpuNodesTTL = 30 * time.Second

// breakerLimit is the breaker's limit in pool: max(minNodes, share of its
// GPU nodes), under the absolute cap when set.
func (r *Reconciler) breakerLimit(ctx context.Context, tx caseTx, pool string, now time.Time) (int, error) {
	r.mu.Lock()
	c, ok := r.gpuNodes[pool]
	r.mu.Unlock()
	if !ok || now.Sub(c.at) >= gpuNodesTTL || now.Before(c.at) {
		n, err := tx.PoolGPUNodes(ctx, pool)
		if err != nil {
			return 0, err
		}
		c = gpuCount{n: n, at: now}
		r.mu.Lock()
		if r.gpuNodes == nil {
			r.gpuNodes = map[string]gpuCount{}
		}
		r.gpuNodes[pool] = c
		r.mu.Unlock()
	}
	return r.cfg.Settings.Breaker.Limit(c.n), nil
}

var _ shard.Reconciler = (*Reconciler)(nil)

// New returns a Reconciler; an error for a policy that does not validate or
// a missing Holder.
func New(cfg Config, st Store, log *slog.Logger) (*Reconciler, error) {
	if cfg.Holder == "" {
		return nil, errors.New("remediation: Config.Holder is required")
	}
	s := &cfg.Settings
	s.Interval.Duration = cmp.Or(s.Interval.Duration, 2*time.Second)
	s.MaxAttempts = cmp.Or(s.MaxAttempts, 3)
	s.DrainTimeout.Duration = cmp.Or(s.DrainTimeout.Duration, 10*time.Minute)
	s.ActionTimeout.Duration = cmp.Or(s.ActionTimeout.Duration, 10*time.Minute)
	s.VerifySettle.Duration = cmp.Or(s.VerifySettle.Duration, 30*time.Second)
	s.VerifyTimeout.Duration = cmp.Or(s.VerifyTimeout.Duration, 10*time.Minute)
	s.Breaker.Share = cmp.Or(s.Breaker.Share, 10)
	s.Breaker.MinNodes = cmp.Or(s.Breaker.MinNodes, 1)
	s.Breaker.Window.Duration = cmp.Or(s.Breaker.Window.Duration, 10*time.Minute)
	s.Repeat.Window.Duration = cmp.Or(s.Repeat.Window.Duration, 24*time.Hour)
	s.Repeat.NodeActions = cmp.Or(s.Repeat.NodeActions, 3)
	s.Repeat.Spacing.Duration = cmp.Or(s.Repeat.Spacing.Duration, 10*time.Minute)
	s.Repeat.ContactSupport = cmp.Or(s.Repeat.ContactSupport, 5)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p, err := NewPolicy(s.Policy)
	if err != nil {
		return nil, err
	}
	return &Reconciler{cfg: cfg, store: st, policy: p, log: log.With("reconciler", "remediation")}, nil
}

// Name names the reconciler.
func (r *Reconciler) Name() string { return "remediation" }

// Interval is how often each shard is reconciled.
func (r *Reconciler) Interval() time.Duration { return r.cfg.Settings.Interval.Duration }

// actor is the audit rows' actor.
func (r *Reconciler) actor() string { return "remediation:" + r.cfg.Holder }

// Due reads which of shards have work at now: findings waiting, cases
// due, or a silent node with BMC credentials and no case.
func (r *Reconciler) Due(ctx context.Context, now time.Time, shards []int) ([]int, error) {
	due, err := r.store.RemediationDue(ctx, shards, &now)
	if err != nil {
		return nil, err
	}
	silent, err := r.store.RemediationSilentDue(ctx, shards)
	if err != nil {
		return nil, err
	}
	return append(due, silent...), nil
}

// Reconcile does one pass over shard n: takes its findings and advances
// its due cases, each in a fenced transaction of its own.
func (r *Reconciler) Reconcile(ctx context.Context, n int, fence store.Fence) error {
	if err := r.takeFindings(ctx, n, fence); err != nil {
		return err
	}
	if err := r.openSilent(ctx, n, fence); err != nil {
		return err
	}
	now := r.cfg.Now()
	var cases []*store.Remediation
	err := store.InFencedTx(ctx, r.store, fence, func(tx openCasesTx) error {
		var err error
		cases, err = tx.RemediationOpenInShard(ctx, n, &now, false)
		return err
	})
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range cases {
		err := store.InFencedTx(ctx, r.store, fence, func(tx caseTx) error { return r.advance(ctx, tx, c) })
		if errors.Is(err, store.ErrFenced) {
			return err
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remediation %s of node %s: %w", c.ID, c.NodeID, err))
		}
	}
	return errors.Join(errs...)
}

// takeFindings turns shard n's findings into cases, in one transaction:
// a finding whose action is none is dropped (its event was the answer);
// one for a node whose case is verifying fails the verification when it is
// on the case's GPU (or either names none); one on another GPU never fails
// it: that GPU is read again from the inventory when the case returns and
// opens its own case then (reread; issue 32, "a verification judges its
// own case"); one for a node with another open case adds nothing.
func (r *Reconciler) takeFindings(ctx context.Context, n int, fence store.Fence) error {
	return store.InFencedTx(ctx, r.store, fence, func(tx findingTx) error {
		fs, err := tx.RemediationFindingsTake(ctx, n, 500)
		if err != nil {
			return err
		}
		now := r.cfg.Now()
		for _, f := range fs {
			if err := r.takeFinding(ctx, tx, f, now); err != nil {
				return err
			}
		}
		return nil
	})
}

// takeFinding acts on one finding (takeFindings) and keeps it, with what
// was made of it, in the node's and GPU's history (store.GPUFindingRecord).
func (r *Reconciler) takeFinding(ctx context.Context, tx findingTx, f *store.RemediationFinding, now time.Time) error {
	kept := &store.GPUFindingRecord{NodeID: f.NodeID, GPUUUID: f.GPUUUID, BoardSerial: f.GPUFinding.GetBoardSerial(),
		Kind: f.Kind, Severity: f.Severity, Resolution: f.Resolution,
		Investigatory: strings.TrimSpace(f.GPUFinding.GetInvestigatoryResolution()), XID: f.XID, XIDMnemonic: f.XIDMnemonic,
		Message: f.Message, EventID: f.EventID, CreatedAt: f.CreatedAt, TakenAt: now}
	keep := func(outcome, caseID string) error {
		kept.Outcome, kept.RemediationID = outcome, caseID
		if err := tx.RemediationFindingKeep(ctx, kept); err != nil {
			return fmt.Errorf("keep the finding: %w", err)
		}
		return nil
	}
	finding := FindingOf(f.GPUFinding)
	action := r.policy.Action(finding, f.GPUFinding.GetResolution())
	open, err := tx.RemediationOpenFor(ctx, f.NodeID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if action == config.ActionNone {
		r.log.DebugContext(ctx, "Finding needs no action", logkey.NodeID, f.NodeID, "kind", f.Kind, "resolution", f.Resolution)
		if open != nil {
			return keep(store.FindingOutcomeNone, "") // the node's case is under way: the count goes on
		}
		hold, history, err := r.repeatedNoAction(ctx, tx, f, kept.Investigatory, now)
		if err != nil {
			return err
		}
		if hold == "" {
			return keep(store.FindingOutcomeNone, "")
		}
		c, err := r.open(ctx, tx, f, finding, config.ActionEscalate, now)
		if c == nil || err != nil {
			return err
		}
		if err := keep(store.FindingOutcomeHeld, c.ID); err != nil {
			return err
		}
		return r.hold(ctx, tx, c, now, hold, history)
	}
	if open != nil {
		if open.State == store.RemediationVerifying && !open.Paused {
			if otherGPU(open, f.GPUUUID) {
				r.log.InfoContext(ctx, "Finding on another GPU than the verifying case's: read again when the case ends",
					logkey.NodeID, f.NodeID, "remediation", open.ID, "gpu", f.GPUUUID, "kind", f.Kind, "resolution", f.Resolution)
				return keep(store.FindingOutcomeOtherGPU, open.ID)
			}
			if err := keep(store.FindingOutcomeFailed, open.ID); err != nil {
				return err
			}
			return r.fail(ctx, tx, open, fmt.Sprintf("new finding while verifying: %s %s", f.Kind, f.Resolution), now)
		}
		return keep(store.FindingOutcomeJoined, open.ID)
	}
	rep, err := r.repeated(ctx, tx, f, finding, action, now)
	if err != nil {
		return err
	}
	c, err := r.open(ctx, tx, f, finding, rep.action, now)
	if c == nil || err != nil {
		return err
	}
	if rep.hold != "" {
		if err := keep(store.FindingOutcomeHeld, c.ID); err != nil {
			return err
		}
		return r.hold(ctx, tx, c, now, rep.hold, rep.history)
	}
	if err := keep(store.FindingOutcomeOpened, c.ID); err != nil {
		return err
	}
	// Quarantine at once, in the same transaction: the time from the XID
	// to quarantine is one round.
	return r.advance(ctx, tx, c)
}

// open opens finding f's case with action; nil when its node was deleted
// since.
func (r *Reconciler) open(ctx context.Context, tx caseTx, f *store.RemediationFinding, finding, action string,
	now time.Time) (*store.Remediation, error) {
	c, err := tx.RemediationCreate(ctx, &store.Remediation{NodeID: f.NodeID, State: store.RemediationDetected,
		Finding: finding, Kind: f.Kind, Resolution: f.Resolution, XID: f.XID, XIDMnemonic: f.XIDMnemonic,
		GPUUUID: f.GPUUUID, Message: f.Message, Action: action, NextAt: now, CreatedAt: now}, r.actor())
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r.log.InfoContext(ctx, "Remediation opened", logkey.NodeID, c.NodeID, "remediation", c.ID, "finding", finding,
		"resolution", f.Resolution, "xid", f.XID, "action", action)
	return c, nil
}

// later is the next time a waiting case is looked at.
func (r *Reconciler) later(now time.Time) *time.Time {
	t := now.Add(r.cfg.Settings.Interval.Duration)
	return &t
}

// never is the next time of a case only a person moves (escalated,
// cordoned): a year on; an operator's move sets it again.
func never(now time.Time) *time.Time {
	t := now.Add(365 * 24 * time.Hour)
	return &t
}

// owner is the disruption hold's owner of a case.
func owner(c *store.Remediation) string { return store.RemediationOwner(c.ID) }

// move moves c to state with p's other fields.
func (r *Reconciler) move(ctx context.Context, tx caseTx, c *store.Remediation, to string, now time.Time,
	p store.RemediationMoveParams) (*store.Remediation, error) {
	p.ID, p.From, p.To, p.Actor, p.Now = c.ID, []string{c.State}, to, r.actor(), &now
	m, err := tx.RemediationMove(ctx, &p)
	if err != nil {
		return nil, err
	}
	if m.State != c.State {
		r.log.InfoContext(ctx, "Remediation moved", logkey.NodeID, m.NodeID, "remediation", m.ID, "from", c.State,
			"to", m.State, "action", m.Action, "attempts", m.Attempts, "reason", m.Reason)
	}
	return m, nil
}

// wait leaves c in its state, to be looked at again later.
func (r *Reconciler) wait(ctx context.Context, tx caseTx, c *store.Remediation, now time.Time, reason string) error {
	_, err := r.move(ctx, tx, c, c.State, now, store.RemediationMoveParams{NextAt: r.later(now), Reason: reason})
	return err
}

// advance takes c one or more steps along its way, in tx.
func (r *Reconciler) advance(ctx context.Context, tx caseTx, c *store.Remediation) error {
	now := r.cfg.Now()
	switch c.State {
	case store.RemediationDetected, store.RemediationHeld:
		if c.Action == ActionProbe {
			return r.probe(ctx, tx, c, now)
		}
		return r.quarantine(ctx, tx, c, now)
	case store.RemediationQuarantined:
		switch c.Action {
		case config.ActionCordon:
			_, err := r.move(ctx, tx, c, c.State, now, store.RemediationMoveParams{NextAt: never(now),
				Reason: "the policy cordons only: return it with remediation return"})
			return err
		case config.ActionEscalate:
			return r.escalate(ctx, tx, c, now, "the policy escalates "+describe(c))
		}
		m, err := r.move(ctx, tx, c, store.RemediationDraining, now, store.RemediationMoveParams{})
		if err != nil {
			return err
		}
		return r.drain(ctx, tx, m, now)
	case store.RemediationDraining:
		return r.drain(ctx, tx, c, now)
	case store.RemediationRemediating:
		return r.watch(ctx, tx, c, now)
	case store.RemediationVerifying:
		return r.verify(ctx, tx, c, now)
	case store.RemediationEscalated:
		_, err := r.move(ctx, tx, c, c.State, now, store.RemediationMoveParams{NextAt: never(now)})
		return err
	}
	return fmt.Errorf("unknown state %q", c.State)
}

// describe names a case's finding for reasons.
func describe(c *store.Remediation) string {
	s := c.Finding
	if c.XID != 0 {
		s += fmt.Sprintf(" %d", c.XID)
		if c.XIDMnemonic != "" {
			s += " (" + c.XIDMnemonic + ")"
		}
	}
	if c.Resolution != "" {
		s += " resolution " + c.Resolution
	}
	return s
}

// quarantine cordons the node and takes its hold, when the pool's breaker
// admits one more node acted on; else the node is still cordoned and
// held out of service (quarantined without any other action) and the case
// held, acted on in order when the breaker closes.
func (r *Reconciler) quarantine(ctx context.Context, tx caseTx, c *store.Remediation, now time.Time) error {
	if c.State == store.RemediationHeld {
		if done, err := r.clearedWhileHeld(ctx, tx, c, now); done || err != nil {
			return err
		}
	}
	b := r.cfg.Settings.Breaker
	limit, err := r.breakerLimit(ctx, tx, c.PoolID, now)
	if err != nil {
		return err
	}
	ok, tripped, err := tx.RemediationBreakerAdmit(ctx, &store.RemediationBreakerAdmitParams{PoolID: c.PoolID,
		Limit: limit, Window: b.Window.Duration, NodeID: c.NodeID, CaseID: c.ID, CreatedAt: c.CreatedAt, Now: &now})
	if err != nil {
		return err
	}
	if !ok {
		if tripped {
			r.log.WarnContext(ctx, "Remediation breaker tripped: new cases are cordoned and held until it closes",
				"pool_id", c.PoolID, "share", float64(b.Share), "min_nodes", b.MinNodes, "window", b.Window.Duration)
		}
		if c.State == store.RemediationHeld {
			return r.wait(ctx, tx, c, now, c.Reason)
		}
		adm, err := tx.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: c.NodeID, Reason: store.DisruptionQuarantined,
			Owner: owner(c), Now: &now})
		if err != nil {
			return err
		}
		if adm.Admitted {
			if err := tx.NodeSetCordoned(ctx, c.NodeID, true); err != nil {
				return err
			}
		}
		_, err = r.move(ctx, tx, c, store.RemediationHeld, now, store.RemediationMoveParams{NextAt: r.later(now),
			Reason: "cordoned, not acted on: the pool's remediation breaker holds it (it closes by itself " +
				b.Window.Duration.String() + " after it tripped, or better-compute remediation reset-breaker " + c.PoolID + ")"})
		return err
	}
	adm, err := tx.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: c.NodeID, Reason: store.DisruptionQuarantined,
		Owner: owner(c), Now: &now})
	if err != nil {
		return err
	}
	if !adm.Admitted {
		return r.wait(ctx, tx, c, now, "quarantine refused: "+adm.Refusal)
	}
	if err := tx.NodeSetCordoned(ctx, c.NodeID, true); err != nil {
		return err
	}
	m, err := r.move(ctx, tx, c, store.RemediationQuarantined, now, store.RemediationMoveParams{Reason: describe(c)})
	if err != nil {
		return err
	}
	return r.advance(ctx, tx, m)
}

// clearedWhileHeld returns case c, held by the breaker, without an action
// when its cause has ended meanwhile, and reports whether it did: a GPU
// found missing (gpu.missing) that the node, ready, lists again and reads
// ok. The node is uncordoned and its disruption released only where this
// case holds it. Other findings are events (an XID does not end by being
// read again) and wait for their action.
func (r *Reconciler) clearedWhileHeld(ctx context.Context, tx caseTx, c *store.Remediation, now time.Time) (bool, error) {
	if c.Kind != gpufinding.KindGPUMissing || c.GPUUUID == "" {
		return false, nil
	}
	n, err := tx.NodeGet(ctx, c.NodeID)
	if err != nil {
		return false, err
	}
	if n.State != store.NodeReady || !slices.ContainsFunc(inventoryGPUs(n.Inventory), func(g inventoryGPU) bool {
		return g.UUID == c.GPUUUID && g.Health.State == sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK.String()
	}) {
		return false, nil
	}
	if n.DisruptionOwner == owner(c) {
		if err := tx.NodeSetCordoned(ctx, c.NodeID, false); err != nil {
			return false, err
		}
		if err := tx.DisruptionRelease(ctx, c.NodeID, owner(c)); err != nil {
			return false, err
		}
	}
	_, err = r.move(ctx, tx, c, store.RemediationReturned, now, store.RemediationMoveParams{ClearCommand: true,
		Reason: "cleared while held: GPU " + c.GPUUUID + " is listed again and reads ok; no action taken"})
	return err == nil, err
}

// drain waits for the node's running commands (at most DrainTimeout) and
// for a remediation slot, then starts the action.
func (r *Reconciler) drain(ctx context.Context, tx caseTx, c *store.Remediation, now time.Time) error {
	running, err := tx.CommandInFlight(ctx, c.NodeID)
	if err != nil {
		return err
	}
	node, err := tx.NodeGet(ctx, c.NodeID)
	if err != nil {
		return err
	}
	// A node that is not ready runs nothing to wait for.
	if len(running) > 0 && node.State == store.NodeReady && now.Before(c.StateSince.Add(r.cfg.Settings.DrainTimeout.Duration)) {
		return r.wait(ctx, tx, c, now, fmt.Sprintf("waiting for %d running commands", len(running)))
	}
	target, spec, kind, err := r.command(ctx, tx, c)
	if err != nil {
		return err
	}
	if target == "" {
		return r.escalate(ctx, tx, c, now, fmt.Sprintf("%s is not possible: %s", c.Action, spec))
	}
	if c.Attempts == 0 {
		at, why, err := r.spaced(ctx, tx, c, now)
		if err != nil {
			return err
		}
		if now.Before(at) {
			_, err := r.move(ctx, tx, c, c.State, now, store.RemediationMoveParams{NextAt: &at, Reason: why})
			return err
		}
	}
	adm, err := tx.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: c.NodeID, Reason: store.DisruptionRemediating,
		Owner: owner(c), Now: &now})
	if err != nil {
		return err
	}
	if !adm.Admitted {
		return r.wait(ctx, tx, c, now, fmt.Sprintf("waiting for a remediation slot (%s: %d of %d remediating)",
			adm.Refusal, adm.Budget.Remediating, adm.Budget.RemediationConcurrency))
	}
	boot, err := bootMarker(ctx, tx, c.NodeID)
	if err != nil {
		return err
	}
	attempt := c.Attempts + 1
	cmds, err := tx.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{target}, Kind: kind,
		SessionSpec: []byte(spec), IdempotencyKey: fmt.Sprintf("remediation:%s:%d", c.ID, attempt),
		CreatedBy: owner(c), Timeout: r.cfg.Settings.ActionTimeout.Duration, Now: &now})
	if err != nil {
		return err
	}
	if c.Action == config.ActionPowerCycle {
		if err := r.grant(ctx, tx, c.NodeID, target, cmds[0].ID, now); err != nil {
			return err
		}
	}
	_, err = r.move(ctx, tx, c, store.RemediationRemediating, now, store.RemediationMoveParams{Attempts: &attempt,
		CommandID: cmds[0].ID, BootID: boot, NextAt: r.later(now),
		Reason: fmt.Sprintf("attempt %d: %s on %s", attempt, kind, target)})
	return err
}

// command returns the node the action's command goes to, its spec
// (sessionv1.MarshalSpec) and kind; an empty target with the reason in
// spec when the action cannot be taken.
func (r *Reconciler) command(ctx context.Context, tx caseTx, c *store.Remediation) (target, spec, kind string, err error) {
	var cmd *sessionv1.Command
	switch c.Action {
	case config.ActionGPUReset:
		if c.GPUUUID == "" {
			return "", "the finding names no GPU", "", nil
		}
		kind, target = sessionv1.KindGPUReset, c.NodeID
		cmd = &sessionv1.Command{Spec: &sessionv1.Command_GpuReset{GpuReset: &sessionv1.GPUResetSpec{GpuUuid: c.GPUUUID}}}
	case config.ActionReboot:
		kind, target = sessionv1.KindReboot, c.NodeID
		cmd = &sessionv1.Command{}
	case config.ActionPowerCycle:
		agent, why, err := bmcAgent(ctx, tx, c.NodeID)
		if err != nil || agent == "" {
			return "", why, "", err
		}
		kind, target = sessionv1.KindPowerCycle, agent
		cmd = powerCommand(c.NodeID, "cycle")
	default:
		return "", "no command for action " + c.Action, "", nil
	}
	b, err := sessionv1.MarshalSpec(cmd)
	if err != nil {
		return "", "", "", err
	}
	return target, string(b), kind, nil
}

// watch follows the action's command: done, the node is verified; failed,
// the next action is tried.
func (r *Reconciler) watch(ctx context.Context, tx caseTx, c *store.Remediation, now time.Time) error {
	cmd, err := tx.CommandGet(ctx, c.CommandID)
	if errors.Is(err, store.ErrNotFound) {
		return r.fail(ctx, tx, c, "the action's command "+c.CommandID+" is gone", now)
	}
	if err != nil {
		return err
	}
	ok := cmd.State == store.CommandSucceeded
	switch cmd.State {
	case store.CommandSucceeded:
	case store.CommandFailed, store.CommandCancelled:
	case store.CommandExpired, store.CommandLost:
		// A node that reboots may never report its reboot command done:
		// whether it came back is for verification to say.
		ok = c.Action == config.ActionReboot || c.Action == config.ActionPowerCycle
	default:
		// A node that went down for its reboot and stays down never
		// answers (its idempotent command goes back to the queue): past
		// the verify timeout the reboot failed, and is not to be
		// delivered should the node come back later.
		rebooting := c.Action == config.ActionReboot || c.Action == config.ActionPowerCycle
		if rebooting && now.After(c.StateSince.Add(r.cfg.Settings.VerifyTimeout.Duration)) {
			if _, err := tx.CommandRequestCancel(ctx, cmd.ID); err != nil {
				return err
			}
			return r.fail(ctx, tx, c, fmt.Sprintf("%s: the node did not come back within %v", cmd.Kind,
				r.cfg.Settings.VerifyTimeout.Duration), now)
		}
		_, err := r.move(ctx, tx, c, c.State, now, store.RemediationMoveParams{NextAt: r.later(now)})
		return err
	}
	if !ok {
		return r.fail(ctx, tx, c, fmt.Sprintf("%s ended %s: %s", cmd.Kind, cmd.State, cmd.Error), now)
	}
	adm, err := tx.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: c.NodeID, Reason: store.DisruptionVerifying,
		Owner: owner(c), Now: &now})
	if err != nil {
		return err
	}
	if !adm.Admitted {
		return r.wait(ctx, tx, c, now, "verification hold refused: "+adm.Refusal)
	}
	_, err = r.move(ctx, tx, c, store.RemediationVerifying, now, store.RemediationMoveParams{NextAt: r.later(now),
		Reason: fmt.Sprintf("%s ended %s", cmd.Kind, cmd.State)})
	return err
}

// verify returns the node to service once it has been ready, with a new
// boot after a reboot or power cycle and no failed GPU, for VerifySettle.
func (r *Reconciler) verify(ctx context.Context, tx caseTx, c *store.Remediation, now time.Time) error {
	node, err := tx.NodeGet(ctx, c.NodeID)
	if err != nil {
		return err
	}
	boot, err := bootMarker(ctx, tx, c.NodeID)
	if err != nil {
		return err
	}
	s := r.cfg.Settings
	healthy, why := nodeHealthy(node, c, boot)
	if healthy && !now.Before(c.StateSince.Add(s.VerifySettle.Duration)) {
		passed, done, err := r.diagnose(ctx, tx, c, node, now)
		if !done || err != nil {
			return err
		}
		if err := tx.NodeSetCordoned(ctx, c.NodeID, false); err != nil {
			return err
		}
		if err := tx.DisruptionRelease(ctx, c.NodeID, owner(c)); err != nil {
			return err
		}
		reason := "verified: ready with healthy GPUs after " + c.Action
		if passed != "" {
			reason += "; " + passed
		}
		if _, err := r.move(ctx, tx, c, store.RemediationReturned, now, store.RemediationMoveParams{ClearCommand: true,
			Reason: reason}); err != nil {
			return err
		}
		return r.reread(ctx, tx, c, node, now)
	}
	if now.After(c.StateSince.Add(s.VerifyTimeout.Duration)) {
		return r.fail(ctx, tx, c, fmt.Sprintf("not healthy %v after %s: %s", s.VerifyTimeout.Duration, c.Action, why), now)
	}
	return r.wait(ctx, tx, c, now, "verifying: "+why)
}

// diagnose runs the diagnostic of remediation.verify on c's node, once it
// reads healthy and settled (docs/remediation.md, "Diagnostic before
// return"): it enqueues a gpu.diag command (the case's current command, not
// one of its actions) and follows it. done is true once the node may
// return, with passed saying what passed ("" when no diagnostic is
// configured, or when the case names no GPU and node's inventory lists
// none: a machine without GPUs, such as a silent node power-cycled, has
// none to diagnose; a case of a GPU always diagnoses); a
// diagnostic that failed, expired or could not run escalates the case,
// which keeps the node out of service, and names the failed tests in its
// reason.
func (r *Reconciler) diagnose(ctx context.Context, tx caseTx, c *store.Remediation, node *store.Node, now time.Time) (passed string, done bool, err error) {
	v := r.cfg.Settings.Verify
	level, run := v.DiagLevel()
	if !run || c.GPUUUID == "" && len(inventoryGPUs(node.Inventory)) == 0 {
		return "", true, nil
	}
	var cmd *store.Command
	if c.CommandID != "" {
		switch got, err := tx.CommandGet(ctx, c.CommandID); {
		case err == nil:
			cmd = got
		case !errors.Is(err, store.ErrNotFound):
			return "", false, err
		}
	}
	if cmd == nil || cmd.Kind != sessionv1.KindGPUDiag {
		spec, err := sessionv1.MarshalSpec(&sessionv1.Command{Spec: &sessionv1.Command_GpuDiag{GpuDiag: &sessionv1.GPUDiagSpec{
			Level: level, GpuUuid: c.GPUUUID}}})
		if err != nil {
			return "", false, err
		}
		cmds, err := tx.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{c.NodeID}, Kind: sessionv1.KindGPUDiag,
			SessionSpec: spec, IdempotencyKey: fmt.Sprintf("remediation:%s:%d:diag", c.ID, c.Attempts),
			CreatedBy: owner(c), Timeout: cmp.Or(v.DiagTimeout.Duration, 10*time.Minute), Now: &now})
		if err != nil {
			return "", false, err
		}
		what := "the built-in NVML check"
		if level > 0 {
			what = fmt.Sprintf("dcgmi diag -r %d (the built-in NVML check where the node has no dcgmi)", level)
		}
		_, err = r.move(ctx, tx, c, c.State, now, store.RemediationMoveParams{CommandID: cmds[0].ID, Check: true,
			NextAt: r.later(now), Reason: "diagnostic before return: " + what})
		return "", false, err
	}
	switch cmd.State {
	case store.CommandSucceeded:
		return "diagnostic passed: " + diagSummary(cmd), true, nil
	case store.CommandFailed, store.CommandCancelled, store.CommandExpired, store.CommandLost:
		why := cmd.Error
		if why == "" {
			why = "the command ended " + cmd.State
		}
		return "", false, r.escalate(ctx, tx, c, now, "diagnostic failed after "+c.Action+": "+why)
	}
	_, err = r.move(ctx, tx, c, c.State, now, store.RemediationMoveParams{NextAt: r.later(now)})
	return "", false, err
}

// diagSummary says what a passed gpu.diag command ran ("dcgmi diag -r 1:
// passed 12 tests"), from its result detail (gpudiag.Result).
func diagSummary(cmd *store.Command) string {
	var res gpudiag.Result
	if json.Unmarshal(cmd.Result, &res) != nil || res.Tool == "" {
		return "gpu.diag " + cmd.ID
	}
	return res.Name() + ": " + res.Summary()
}

// bootMarker names the node's boot and session ("<boot id>|<session
// id>"): the boot id the node reported when its current (or, without one,
// its last) session opened, empty when it reported none, and its current
// session, empty when it has none.
func bootMarker(ctx context.Context, tx caseTx, nodeID string) (string, error) {
	node, err := tx.NodeGet(ctx, nodeID)
	if err != nil {
		return "", err
	}
	sess := ""
	switch s, err := tx.SessionGet(ctx, nodeID); {
	case err == nil:
		sess = s.SessionID
	case !errors.Is(err, store.ErrNotFound):
		return "", err
	}
	return node.BootID + "|" + sess, nil
}

// rebooted reports whether marker, the boot marker now, names another boot
// than before, the one recorded at the action, and why not. The node must
// hold a session it did not hold at the action; where it reported a boot
// id at the action and reports one now, that must have changed too: a new
// session with the same boot id is bcd restarted on a machine that did
// not reboot. Where either is missing (an older bcd, which reports none),
// the new session is all there is to go by.
func rebooted(before, marker string) (bool, string) {
	bb, bs, _ := strings.Cut(before, "|")
	nb, ns, _ := strings.Cut(marker, "|")
	switch {
	case ns == "" || ns == bs:
		return false, "the node has not connected again since the action"
	case bb != "" && nb != "" && bb == nb:
		return false, "the node connected again with the boot id it had before the action (" + nb +
			"): its bcd restarted, the machine did not reboot"
	}
	return true, ""
}

// otherGPU reports whether a finding on GPU uuid is on another GPU than
// case c's: both name one and they differ.
func otherGPU(c *store.Remediation, uuid string) bool {
	return c.GPUUUID != "" && uuid != "" && uuid != c.GPUUUID
}

// reread reads the other GPUs of returned case c's node again from its
// inventory: the first that is not healthy and whose reading the policy
// acts on opens its own case, at once (one open case per node; the next
// one's turn comes when that one ends). A finding on another GPU while c
// was verifying was left for this (takeFindings).
func (r *Reconciler) reread(ctx context.Context, tx caseTx, c *store.Remediation, node *store.Node, now time.Time) error {
	for _, g := range inventoryGPUs(node.Inventory) {
		if g.UUID == "" || g.UUID == c.GPUUUID || g.Health.State == "" ||
			g.Health.State == sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK.String() {
			continue
		}
		finding := config.FindingHealth
		if g.Health.XID != 0 {
			finding = config.FindingXID
		}
		action := r.policy.Action(finding, g.Health.Resolution)
		if action == config.ActionNone {
			continue
		}
		msg := fmt.Sprintf("GPU %s reads %s after case %s: %s", g.UUID, strings.ToLower(strings.TrimPrefix(g.Health.State,
			"GPU_HEALTH_STATE_")), c.ID, strings.Join(g.Health.Reasons, "; "))
		nc, err := tx.RemediationCreate(ctx, &store.Remediation{NodeID: c.NodeID, State: store.RemediationDetected,
			Finding: finding, Kind: kindInventory, Resolution: g.Health.Resolution, XID: int(g.Health.XID),
			XIDMnemonic: g.Health.XIDMnemonic, GPUUUID: g.UUID, Message: msg, Action: action, NextAt: now, CreatedAt: now}, r.actor())
		if err != nil {
			return fmt.Errorf("open the case of GPU %s: %w", g.UUID, err)
		}
		r.log.InfoContext(ctx, "Remediation opened for another GPU read again", logkey.NodeID, c.NodeID, "remediation", nc.ID,
			"after", c.ID, "gpu", g.UUID, "resolution", g.Health.Resolution, "action", action)
		return r.advance(ctx, tx, nc)
	}
	return nil
}

// kindInventory is the kind of a case opened from a GPU's health in the
// node's inventory (reread) rather than from a node event.
const kindInventory = "gpu.inventory"

// inventoryGPU is the part of an inventory GPU (protojson of session.v1
// GPU) that verification reads.
type inventoryGPU struct {
	UUID   string `json:"uuid"`
	Health struct {
		State       string   `json:"state"`
		Reasons     []string `json:"reasons"`
		XID         uint32   `json:"xid"`
		XIDMnemonic string   `json:"xidMnemonic"`
		Resolution  string   `json:"resolution"`
	} `json:"health"`
}

// inventoryGPUs returns the GPUs of an inventory (protojson of session.v1
// Inventory); none when it is empty or unreadable.
func inventoryGPUs(inv []byte) []inventoryGPU {
	if len(inv) == 0 {
		return nil
	}
	var doc struct {
		GPUs []inventoryGPU `json:"gpus"`
	}
	if json.Unmarshal(inv, &doc) != nil {
		return nil
	}
	return doc.GPUs
}

// nodeHealthy reports whether node reads healthy for c's verification
// (boot its boot marker now), and why not. Only the case's GPU is judged
// when it names one (every GPU when it names none): a GPU left failed by
// another case, or failing anew, is that GPU's case (reread).
func nodeHealthy(n *store.Node, c *store.Remediation, boot string) (bool, string) {
	if n.State != store.NodeReady {
		return false, "node is " + n.State
	}
	if n.LastSeenAt == nil || n.LastSeenAt.Before(c.StateSince) {
		return false, "no heartbeat since the action"
	}
	if c.Action == config.ActionReboot || c.Action == config.ActionPowerCycle {
		if ok, why := rebooted(c.BootID, boot); !ok {
			return false, why
		}
	}
	if uuid := failedGPU(n.Inventory, c.GPUUUID); uuid != "" {
		return false, "GPU " + uuid + " reads failed"
	}
	// The case's own GPU must read ok: a repair that leaves it degraded
	// did not clear its fault (health that clears, issue 33).
	if c.GPUUUID != "" {
		for _, g := range inventoryGPUs(n.Inventory) {
			if g.UUID == c.GPUUUID && g.Health.State == sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED.String() {
				return false, "GPU " + g.UUID + " reads degraded: " + strings.Join(g.Health.Reasons, "; ")
			}
		}
	}
	// A GPU found missing (gpucount) is healthy only once listed again.
	if c.Kind == gpufinding.KindGPUMissing && c.GPUUUID != "" && !slices.ContainsFunc(inventoryGPUs(n.Inventory),
		func(g inventoryGPU) bool { return g.UUID == c.GPUUUID }) {
		return false, "GPU " + c.GPUUUID + " is still missing"
	}
	return true, ""
}

// failedGPU returns the UUID of a GPU the inventory (protojson of
// session.v1 Inventory) says failed, "" when none; only GPU only when it
// is not "".
func failedGPU(inv []byte, only string) string {
	for _, g := range inventoryGPUs(inv) {
		if only != "" && g.UUID != only {
			continue
		}
		if g.Health.State == sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED.String() {
			return g.UUID
		}
	}
	return ""
}

// fail records a failed action: the next action of the ladder when
// attempts remain, else escalation.
func (r *Reconciler) fail(ctx context.Context, tx caseTx, c *store.Remediation, reason string, now time.Time) error {
	if c.Attempts >= r.cfg.Settings.MaxAttempts {
		return r.escalate(ctx, tx, c, now, fmt.Sprintf("%s; %d attempts spent", reason, c.Attempts))
	}
	_, hasBMC, err := bmcAgentFor(ctx, tx, c.NodeID)
	if err != nil {
		return err
	}
	next := nextAction(c.Action, hasBMC)
	if next == "" {
		return r.escalate(ctx, tx, c, now, reason+"; no further action")
	}
	// Back to draining: the remediating slot is given up while the next
	// action waits for one.
	adm, err := tx.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: c.NodeID, Reason: store.DisruptionDraining,
		Owner: owner(c), Now: &now})
	if err != nil {
		return err
	}
	if !adm.Admitted {
		return r.escalate(ctx, tx, c, now, reason+"; hold refused: "+adm.Refusal)
	}
	_, err = r.move(ctx, tx, c, store.RemediationDraining, now, store.RemediationMoveParams{Action: next, ClearCommand: true,
		Reason: reason + "; next: " + next})
	return err
}

// escalate leaves the case to a person: the node stays cordoned and
// quarantined (its remediation slot given back).
// history, the prior cases of a repeat rule, goes into its event.
func (r *Reconciler) escalate(ctx context.Context, tx caseTx, c *store.Remediation, now time.Time, reason string,
	history ...*store.Remediation) error {
	if _, err := tx.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: c.NodeID, Reason: store.DisruptionQuarantined,
		Owner: owner(c), Now: &now}); err != nil {
		return err
	}
	_, err := r.move(ctx, tx, c, store.RemediationEscalated, now, store.RemediationMoveParams{Action: config.ActionEscalate,
		ClearCommand: true, NextAt: never(now), Reason: reason, History: history})
	return err
}
