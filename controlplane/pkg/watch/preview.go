package watch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// preview is what an action would do, shown before the page asks to
// confirm it (GET /watch/actions/{name}/preview).
type preview struct {
	Action string `json:"action"`
	Target string `json:"target"`
	// Title names the action and its target; Effect says what it does.
	Title  string `json:"title"`
	Effect string `json:"effect"`
	// Pool is the pool whose disruption budget the action touches.
	Pool   string         `json:"pool,omitempty"`
	Budget *budgetPreview `json:"budget,omitempty"`
	// Waits are what waits because of the action, or waits already.
	Waits []string `json:"waits,omitempty"`
	// Allowed is false when the page's session cannot do it now; Why says
	// why (its role, the budget, the breaker, the target's state).
	Allowed bool   `json:"allowed"`
	Why     string `json:"why,omitempty"`

	breakerTripped bool // the pool's remediation breaker is tripped
}

// budgetPreview is a pool's disruption budget before and after an action
// (store.PoolBudget; DESIGN.md, "The disruption budget").
type budgetPreview struct {
	// Spec is the budget as set ("10%", "3"), Budget its slots resolved
	// against Nodes, the pool's nodes.
	Spec   string `json:"spec"`
	Nodes  int    `json:"nodes"`
	Budget int    `json:"budget"`
	// Before and After are the slots used (nodes out of service) now and
	// once the action is admitted.
	Before int `json:"before"`
	After  int `json:"after"`
}

// targetRE is what a target id or pool name may look like.
var targetRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

// previewAction serves GET /watch/actions/{name}/preview?target=...: what
// the action would do to the pool's disruption budget, what waits, and
// whether the session may do it now. It changes nothing.
func (h *Handler) previewAction(w http.ResponseWriter, r *http.Request) {
	a, ok := actionNamed(r.PathValue("name"))
	if !ok {
		writeJSON(w, http.StatusNotFound, refusal{apiv1.CodeNotFound, "no page action " + r.PathValue("name")})
		return
	}
	s, _ := h.current(r)
	if s == nil {
		writeJSON(w, http.StatusUnauthorized, refusal{apiv1.CodeUnauthenticated, "no page session: log in on " + Path})
		return
	}
	target, gpu := r.URL.Query().Get("target"), r.URL.Query().Get("gpu")
	if !targetRE.MatchString(target) || (gpu != "" && !gpuUUIDRE.MatchString(gpu)) {
		writeJSON(w, http.StatusBadRequest, refusal{apiv1.CodeInvalidArgument, "target is an id or a pool's name; gpu a GPU's UUID or index"})
		return
	}
	sc, err := h.scopeOf(r.Context(), s)
	var p *preview
	if err == nil {
		p, err = h.preview(r.Context(), sc, a, target, gpu)
	}
	switch {
	case errors.Is(err, errNoSuch):
		writeJSON(w, http.StatusNotFound, refusal{apiv1.CodeNotFound, "no " + a.Target + " " + target})
		return
	case err != nil:
		h.log.ErrorContext(r.Context(), "Preview a page action", "action", a.Name, logkey.Err, err)
		writeJSON(w, http.StatusServiceUnavailable, refusal{apiv1.CodeUnavailable, "the fleet could not be read now"})
		return
	}
	switch {
	case h.cfg.Actions == nil:
		p.Allowed, p.Why = false, "This page only shows: its process takes no actions."
	case !h.cfg.Actions.Allows(s.role, a.Method):
		p.Allowed, p.Why = false, fmt.Sprintf("Your token's role, %s, may not do this: it is the API's %s, which needs a higher role.", s.role, a.Method)
	}
	writeJSON(w, http.StatusOK, p)
}

// preview works out what action a on target would do; a target outside sc
// is errNoSuch, as one that does not exist.
func (h *Handler) preview(ctx context.Context, sc *scope, a action, target, gpu string) (*preview, error) {
	p := &preview{Action: a.Name, Target: target, Allowed: true}
	switch a.Target {
	case targetNode:
		return p, h.previewNode(ctx, sc, p, a, target, gpu)
	case targetCase:
		c, err := h.store.RemediationGet(ctx, target)
		if err != nil {
			return nil, notFound(err)
		}
		if !sc.pool(c.PoolID) {
			return nil, errNoSuch
		}
		n, err := h.store.NodeGet(ctx, c.NodeID)
		if err != nil {
			return nil, notFound(err)
		}
		if err := h.budgetOf(ctx, p, n.PoolID); err != nil {
			return nil, err
		}
		switch a.Name {
		case "return":
			p.Title = "Return node " + n.Hostname + " from remediation case " + c.ID
			p.Effect = "The case closes and its node goes back in service: its command cancelled, uncordoned, its slot of the budget free."
			if n.DisruptionOwner == store.RemediationOwner(c.ID) {
				p.Budget.After = p.Budget.Before - 1
			}
		case "case-pause":
			p.Title = "Pause remediation case " + c.ID + " of node " + n.Hostname
			p.Effect = "The reconciler takes no next step of the case until it is resumed; the node stays out of service, holding its slot of the budget."
			if c.Paused {
				p.Allowed, p.Why = false, "The case is paused already."
			}
		case "case-resume":
			p.Title = "Resume remediation case " + c.ID + " of node " + n.Hostname
			p.Effect = "The reconciler takes the case's next step again (" + c.State + ", action " + c.Action + "). It takes no new slot: the node is out already."
			if !c.Paused {
				p.Allowed, p.Why = false, "The case is not paused."
			}
		}
		if c.ClosedAt != nil {
			p.Allowed, p.Why = false, "The case is closed already."
		}
		return p, nil
	case targetRollout:
		return p, h.previewRollout(ctx, sc, p, a, target)
	case targetPool:
		pool, err := h.store.PoolGet(ctx, target)
		if err != nil {
			return nil, notFound(err)
		}
		if !sc.pool(pool.ID) {
			return nil, errNoSuch
		}
		p.Title = "Reset the remediation breaker of pool " + pool.Name
		if err := h.budgetOf(ctx, p, pool.ID); err != nil {
			return nil, err
		}
		p.Effect = "Automatic remediation in the pool starts new actions again. Quarantines are involuntary: they take no slot of the budget, the breaker caps them."
		if !p.breakerTripped {
			p.Allowed, p.Why = false, "The breaker of pool "+pool.Name+" is closed: there is nothing to reset."
		}
		return p, nil
	}
	return nil, fmt.Errorf("action %s: unknown target kind %s", a.Name, a.Target)
}

// notFound maps the store's ErrNotFound to errNoSuch.
func notFound(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return errNoSuch
	}
	return err
}

// budgetOf fills p's pool and budget as they stand (After the same as
// Before until the caller changes it).
func (h *Handler) budgetOf(ctx context.Context, p *preview, poolID string) error {
	b, err := h.store.PoolBudget(ctx, poolID)
	if err != nil {
		return fmt.Errorf("read budget of pool %s: %w", poolID, err)
	}
	p.Pool = poolID
	if pool, err := h.store.PoolGet(ctx, poolID); err == nil {
		p.Pool = pool.Name
	}
	p.Budget = &budgetPreview{Spec: b.Spec, Nodes: b.Nodes, Budget: b.Budget, Before: b.OutOfService, After: b.OutOfService}
	if b.OutOfService >= b.Budget {
		p.Waits = append(p.Waits, fmt.Sprintf("The budget is full (%d of %d slots used): drains, repairs on order and rollout waves in pool %s wait for a node to come back.",
			b.OutOfService, b.Budget, p.Pool))
	}
	bs, err := h.store.RemediationBreakers(ctx)
	if err != nil {
		return fmt.Errorf("read breakers: %w", err)
	}
	for _, br := range bs {
		if br.PoolID == poolID && br.TrippedAt != nil {
			p.breakerTripped = true
			p.Waits = append(p.Waits, fmt.Sprintf("The remediation breaker of pool %s tripped at %s: automatic remediation starts nothing in the pool until an operator resets it (repairs on order still run).",
				p.Pool, br.TrippedAt.UTC().Format("2006-01-02 15:04:05Z")))
		}
	}
	return nil
}

// previewNode fills p for a node action: the budget by the admission rule
// the API's handler will meet (store.Admission).
func (h *Handler) previewNode(ctx context.Context, sc *scope, p *preview, a action, nodeID, gpu string) error {
	n, err := h.store.NodeGet(ctx, nodeID)
	if err != nil {
		return notFound(err)
	}
	if !sc.pool(n.PoolID) {
		return errNoSuch
	}
	b, err := h.store.PoolBudget(ctx, n.PoolID)
	if err != nil {
		return fmt.Errorf("read budget of pool %s: %w", n.PoolID, err)
	}
	if err := h.budgetOf(ctx, p, n.PoolID); err != nil {
		return err
	}
	name := n.Hostname
	if name == "" {
		name = n.ID
	}
	refuse := func(why string) { p.Allowed, p.Why = false, why }
	admit := func(owner string) {
		why, takes := store.Admission(b, n.Disruption, n.DisruptionOwner, n.State, store.DisruptionDraining, owner)
		switch why {
		case store.RefusalBudget:
			refuse(fmt.Sprintf("Pool %s has %d of its %d nodes out of service, its whole disruption budget (%s: %d): this would be refused. Wait for a node to come back, or raise the budget.",
				p.Pool, b.OutOfService, b.Nodes, b.Spec, b.Budget))
		case store.RefusalHeld:
			refuse(fmt.Sprintf("Node %s is out of service already, held by %s.", name, n.DisruptionOwner))
		case "":
			if takes {
				p.Budget.After = p.Budget.Before + 1
			}
		}
	}
	switch a.Name {
	case "cordon":
		p.Title = "Cordon node " + name
		p.Effect = "No new commands reach the node; the ones running finish. A cordon takes no slot of the disruption budget: the node stays in service."
		if n.Cordoned {
			p.Waits = append(p.Waits, "The node is cordoned already.")
		}
	case "uncordon":
		p.Title = "Uncordon node " + name
		p.Effect = "New commands reach the node again. An operator's drain ends with it, freeing its slot of the budget; holds of remediation and rollouts stay theirs."
		if n.DisruptionOwner == store.OperatorOwner {
			p.Budget.After = p.Budget.Before - 1
		} else if n.Disruption == "" && n.State == store.NodeDraining {
			p.Budget.After = p.Budget.Before - 1
		}
	case "drain":
		p.Title = "Drain node " + name
		p.Effect = "The node is cordoned and marked draining: its running commands finish, no new ones reach it. It takes a slot of the pool's disruption budget until it is uncordoned."
		if res, err := h.store.NodeReservedNow(ctx, n.ID, nil); err != nil {
			return fmt.Errorf("read reservations of node %s: %w", n.ID, err)
		} else if res != nil {
			refuse(fmt.Sprintf("Node %s is reserved by %s (owner %s) until %s: drain it after the reservation ends.", name, res.ID, res.Owner,
				res.End.UTC().Format("2006-01-02 15:04:05Z")))
			return nil
		}
		admit(store.OperatorOwner)
	case "gpu-reset", "reboot":
		if a.Name == "reboot" {
			p.Title = "Reboot node " + name
			p.Effect = "A remediation case is opened on order: the node is cordoned and drained, rebooted, its health read again, then returned to service."
		} else {
			p.Title = "Reset GPU " + gpu + " of node " + name
			p.Effect = "A remediation case is opened on order: the node is cordoned and drained, the GPU reset, its health read again, then returned to service."
			if gpu == "" {
				refuse("Choose the GPU to reset.")
			}
		}
		if c, err := h.store.RemediationOpenFor(ctx, n.ID); err == nil {
			refuse(fmt.Sprintf("Node %s has open remediation case %s (%s): return it with a repair instead.", name, c.ID, c.State))
			return nil
		} else if !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("read open case of node %s: %w", n.ID, err)
		}
		admit(store.RemediationOwner("new"))
		p.Waits = append(p.Waits, fmt.Sprintf("At most %d remediation actions run at once in the pool (%d running now); more wait.", b.RemediationConcurrency, b.Remediating))
	case "power-on":
		p.Title = "Power on node " + name
		p.Effect = "Its BMC powers the machine on (as `bmc on --node`). It takes no slot of the budget; the node comes back into service when its bcd connects and it is uncordoned."
	case "power-off", "power-cycle":
		verb := map[string]string{"power-off": "off", "power-cycle": "off and on again"}[a.Name]
		p.Title = "Power " + strings.TrimPrefix(a.Name, "power-") + " node " + name
		p.Effect = "Its BMC powers the machine " + verb + " at once (as `bmc " + strings.TrimPrefix(a.Name, "power-") +
			" --node`): whatever runs on it stops."
		if n.Disruption == "" {
			refuse(fmt.Sprintf("Drain node %s first: a BMC power command reaches the machine at once and is not admitted through the pool's disruption budget, so the page sends it only to a node already out of service (its slot taken).", name))
		}
	case "shell":
		p.Title = "Open a shell on node " + name
		p.Effect = "An interactive shell as the node user, through the node's own connection, audited (start, end, bytes, exit status). It changes nothing of the budget."
		if n.State != store.NodeReady && n.State != store.NodeDraining {
			p.Waits = append(p.Waits, "The node is "+n.State+": the shell may not open.")
		}
	}
	return nil
}

// previewRollout fills p for a rollout action.
func (h *Handler) previewRollout(ctx context.Context, sc *scope, p *preview, a action, id string) error {
	ro, err := h.store.RolloutGet(ctx, id)
	if err != nil {
		return notFound(err)
	}
	if !sc.pool(ro.PoolID) {
		return errNoSuch
	}
	nodes, err := h.store.RolloutNodes(ctx, ro.ID)
	if err != nil {
		return fmt.Errorf("read rollout %s: %w", ro.ID, err)
	}
	if err := h.budgetOf(ctx, p, ro.PoolID); err != nil {
		return err
	}
	pending, held := 0, 0
	for _, n := range nodes {
		if n.State == store.RolloutNodePending {
			pending++
		}
		if n.DisruptionOwner == store.RolloutOwner(ro.ID) {
			held++
		}
	}
	want := func(states ...string) {
		for _, s := range states {
			if ro.State == s {
				return
			}
		}
		p.Allowed, p.Why = false, fmt.Sprintf("Rollout %s is %s: this needs it %v.", ro.ID, ro.State, states)
	}
	switch a.Name {
	case "rollout-pause":
		want(store.RolloutRunning)
		p.Title = fmt.Sprintf("Pause rollout %s (bcd %s, wave %d)", ro.ID, ro.Version, ro.CurrentWave)
		p.Effect = "No next wave starts. Nodes upgrading now finish and keep their slots of the budget until they are back."
		p.Waits = append(p.Waits, fmt.Sprintf("%d nodes waiting for a wave wait until the rollout is resumed.", pending))
	case "rollout-resume":
		want(store.RolloutPaused)
		p.Title = fmt.Sprintf("Resume rollout %s (bcd %s)", ro.ID, ro.Version)
		p.Effect = fmt.Sprintf("The next wave starts, sized by the pool's free slots of the budget (%d free now).", max(0, p.Budget.Budget-p.Budget.Before))
		p.Waits = append(p.Waits, fmt.Sprintf("%d nodes wait for a wave.", pending))
	case "rollout-abort":
		want(store.RolloutPending, store.RolloutRunning, store.RolloutPaused, store.RolloutRollingBack, store.RolloutHalted)
		p.Title = fmt.Sprintf("Abort rollout %s (bcd %s)", ro.ID, ro.Version)
		p.Effect = "The rollout ends: no node is upgraded any more and its slots of the budget go back; nodes mid-upgrade finish on their own."
		p.Budget.After = p.Budget.Before - held
	}
	return nil
}
