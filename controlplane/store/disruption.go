package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Disruption reasons: why a node is out of service (Node.Disruption; ""
// is in service). DESIGN.md, "The disruption budget (one definition)":
// every node out of service counts against its pool's budget, whatever the
// reason.
const (
	// DisruptionQuarantined is failed hardware, cordoned with its reason
	// kept. Involuntary: the budget never blocks it.
	DisruptionQuarantined = "quarantined"
	// DisruptionDraining is a node whose running commands are finishing
	// before an action (an operator drain, a drain before an upgrade or a
	// remediation).
	DisruptionDraining = "draining"
	// DisruptionRemediating is a quarantined node on which a remediation
	// action (GPU reset, reboot, BMC power cycle) runs; at most the pool's
	// RemediationConcurrency at once.
	DisruptionRemediating = "remediating"
	// DisruptionVerifying is a node whose health is re-read after a
	// remediation action.
	DisruptionVerifying = "verifying"
	// DisruptionUpgrading is a node a rollout upgrades (or rolls back).
	DisruptionUpgrading = "upgrading"
)

// Disruption refusals: DisruptionAdmission.Refusal.
const (
	// RefusalBudget: the pool already has Budget nodes out of service.
	RefusalBudget = "budget"
	// RefusalConcurrency: the pool already runs RemediationConcurrency
	// remediation actions.
	RefusalConcurrency = "concurrency"
	// RefusalHeld: another owner holds the node out of service.
	RefusalHeld = "held"
)

// DefaultDisruptionBudget is a new pool's budget: 10% of its nodes, at
// least one (DESIGN.md).
const DefaultDisruptionBudget = "10%"

// DefaultRemediationConcurrency is a new pool's remediation concurrency.
const DefaultRemediationConcurrency = 2

// KnownDisruption reports whether reason is one of the Disruption* reasons.
func KnownDisruption(reason string) bool {
	switch reason {
	case DisruptionQuarantined, DisruptionDraining, DisruptionRemediating, DisruptionVerifying, DisruptionUpgrading:
		return true
	}
	return false
}

// MaxBudgetNodes is the largest count a budget spec may name: more nodes
// than any pool holds, and far below the integer range it is counted in.
const MaxBudgetNodes = 1_000_000

// ParseBudget checks a budget spec, "N" nodes (0 to MaxBudgetNodes) or "N%"
// of the pool's nodes (1 to 100), and returns it in its canonical form.
func ParseBudget(spec string) (string, error) {
	s := strings.TrimSpace(spec)
	pct := strings.HasSuffix(s, "%")
	n, err := strconv.Atoi(strings.TrimSuffix(s, "%"))
	switch {
	case err != nil || n < 0:
		return "", fmt.Errorf("disruption budget %q: want a count of nodes (3) or a share of the pool (10%%)", spec)
	case pct && (n < 1 || n > 100):
		return "", fmt.Errorf("disruption budget %q: a share must be 1%% to 100%%", spec)
	case !pct && n > MaxBudgetNodes:
		return "", fmt.Errorf("disruption budget %q: at most %d nodes (or give a share, such as 100%%)", spec, MaxBudgetNodes)
	}
	if pct {
		return strconv.Itoa(n) + "%", nil
	}
	return strconv.Itoa(n), nil
}

// ResolveBudget returns how many of nodes spec allows out of service at
// once: N for "N", and for "N%" N% of nodes rounded down but at least one
// (a pool of 5 with 10% may still take one node out). A spec that does not
// parse resolves to one.
func ResolveBudget(spec string, nodes int) int {
	s, err := ParseBudget(spec)
	if err != nil {
		return 1
	}
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		n, _ := strconv.Atoi(pct)
		return max(1, nodes*n/100)
	}
	n, _ := strconv.Atoi(s)
	return n
}

// DisruptionStore keeps the disruption budget: which nodes are out of
// service, held by whom, and admission of new disruptions against the
// pool's budget (DESIGN.md, "The disruption budget (one definition)").
type DisruptionStore interface {
	// DisruptionAdmit takes a node out of service, or moves the hold its
	// owner already has to a new reason, in one transaction that locks the
	// pool's row, so that concurrent admissions (two shards, two
	// reconcilers) never overrun the budget together. Rules:
	//   - not held, Reason quarantined: always admitted (involuntary, the
	//     node is out anyway), and taken over from another owner's hold
	//     (failed hardware wins over an upgrade);
	//   - not held, Reason draining or upgrading: admitted while the pool's
	//     OutOfService count is below its Budget, else Refusal budget;
	//   - held by another owner, a reason other than quarantined: Refusal held;
	//   - held by the same owner: the reason changes; to remediating only
	//     while fewer than the pool's RemediationConcurrency nodes are
	//     remediating (else Refusal concurrency); no budget slot is taken,
	//     the node is out already.
	// A node not held that is out anyway (unreachable, powered-off, drained
	// by state) already counts, so it is admitted as long as the count
	// without it is below the budget. Each change writes
	// node.disruption-changed in its transaction. Errors: ErrNotFound for
	// an unknown node; an error for an unknown reason or an empty owner.
	DisruptionAdmit(ctx context.Context, p *DisruptionAdmitParams) (*DisruptionAdmission, error)
	// DisruptionRelease puts node back in service when owner holds it,
	// writing node.disruption-changed; a no-op (nil) when owner does not
	// hold it. ErrNotFound for an unknown node.
	DisruptionRelease(ctx context.Context, nodeID, owner string) error
	// PoolBudget reads a pool's budget and what counts against it now.
	// ErrNotFound for an unknown pool.
	PoolBudget(ctx context.Context, poolID string) (*PoolBudget, error)
	// PoolSetBudget sets a pool's budget spec and remediation concurrency.
	// Errors: ErrNotFound for an unknown pool; an error for a spec
	// ParseBudget refuses or a concurrency below zero.
	PoolSetBudget(ctx context.Context, p *PoolSetBudgetParams) error
}

// DisruptionAdmitParams are DisruptionAdmit's inputs.
type DisruptionAdmitParams struct {
	NodeID string
	// Reason is a Disruption* constant.
	Reason string
	// Owner holds the slot: "rollout:<id>", "remediation:<id>",
	// "operator:<actor>". Required.
	Owner string
	// Now is the time recorded as DisruptionSince when the node leaves
	// service; nil is the database's clock.
	Now *time.Time
}

// DisruptionAdmission is DisruptionAdmit's answer.
type DisruptionAdmission struct {
	Admitted bool
	// Refusal is "" when admitted, else a Refusal* constant.
	Refusal string
	// Holder is the owner holding the node when Refusal is held.
	Holder string
	// Budget is the pool as the admission left it.
	Budget PoolBudget
}

// PoolBudget is a pool's disruption budget and what counts against it.
type PoolBudget struct {
	PoolID string
	// Nodes is the number of nodes in the pool.
	Nodes int
	// Spec is the budget as set: "10%" or "3".
	Spec string
	// Budget is Spec resolved against Nodes (ResolveBudget).
	Budget int
	// OutOfService counts the nodes held out of service (Disruption not
	// empty) or in state unreachable, powered-off or draining.
	OutOfService int
	// Remediating counts the nodes held as remediating.
	Remediating            int
	RemediationConcurrency int
}

// PoolSetBudgetParams are PoolSetBudget's inputs.
type PoolSetBudgetParams struct {
	PoolID string
	// Spec is "N" or "N%"; "" keeps the current one.
	Spec string
	// RemediationConcurrency is at least one; 0 keeps the current one.
	RemediationConcurrency int
}

// OutByState reports whether a node in state counts against its pool's
// budget by its state alone, held or not: unreachable, powered-off,
// draining or clock-skewed.
func OutByState(state string) bool {
	return state == NodeUnreachable || state == NodePoweredOff || state == NodeDraining || state == NodeClockSkewed
}

// Admission is DisruptionAdmit's rule for one node, apart from its
// transaction, so that what the fleet page previews is what admission
// decides: given the pool's budget b as it stands, the node's hold (held,
// by holder) and its state, whether reason for owner is admitted (refusal
// "" or a Refusal* constant) and whether that takes a new slot of the
// budget (the node was in service).
func Admission(b *PoolBudget, held, holder, state, reason, owner string) (refusal string, takesSlot bool) {
	switch {
	case held == reason && holder == owner:
		return "", false
	case reason == DisruptionQuarantined:
		// Involuntary: never refused.
		takesSlot = held == "" && !OutByState(state)
	case held != "" && holder != owner:
		return RefusalHeld, false
	case held == "" && reason == DisruptionRemediating:
		// A remediation action runs on a node already out; one in
		// service must be quarantined (or drained) first.
		return RefusalBudget, false
	case held == "":
		// Out by its state already counts once; otherwise it takes a slot.
		if OutByState(state) {
			break
		}
		if b.OutOfService >= b.Budget {
			return RefusalBudget, false
		}
		takesSlot = true
	}
	if reason == DisruptionRemediating && held != DisruptionRemediating && b.Remediating >= b.RemediationConcurrency {
		return RefusalConcurrency, false
	}
	return "", takesSlot
}

// OperatorOwner holds the disruption slot of an operator's drain
// (nodes.drain); any operator's nodes.uncordon ends it.
const OperatorOwner = "operator"

// RemediationOwner is the disruption owner of remediation case id's hold:
// "remediation:<id>".
func RemediationOwner(id string) string { return "remediation:" + id }
