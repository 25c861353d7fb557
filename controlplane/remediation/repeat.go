package remediation

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/config"
	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
)

// acts reports whether action is an automatic action, one the repeat rules
// count and limit: a GPU reset, a reboot or a power cycle.
func acts(action string) bool {
	return action == config.ActionGPUReset || action == config.ActionReboot || action == config.ActionPowerCycle
}

// repeat is what the repeat rules make of a finding about to open a case.
type repeat struct {
	// action is the case's action: the policy's, or the catalogue's
	// investigatory resolution's on a repeat whose investigatory
	// resolution names an action the policy carries out.
	action string
	// hold, when not "", holds the node for a person with this reason
	// ("repeated: ..."); history lists the prior cases that made it so,
	// newest first.
	hold    string
	history []*store.Remediation
}

// repeated applies the repeat rules (config.RemediationRepeat;
// docs/remediation.md, "Repeats") to finding f, which the policy maps to
// action, reading the node's cases of the window from the database, so the
// memory survives every restart:
//
//   - a finding whose action acts, on a GPU a case acted on within the
//     window (NVSentinel's RepeatedXIDErrorOnSameGPU): the catalogue's
//     investigatory resolution applies when a policy rule names it with an
//     action that acts (and the node's cap has room); anything else
//     (CONTACT_SUPPORT, INVESTIGATE_*, blank, ...) holds the node;
//   - a finding whose action acts, on a node whose cases took NodeActions
//     or more action commands within the window (NVSentinel's
//     MultipleRemediations; Meta GCM's cap): holds the node.
//
// A finding whose action does not act (cordon, escalate) is left as it is.
func (r *Reconciler) repeated(ctx context.Context, tx store.Store, f *store.RemediationFinding, finding, action string,
	now time.Time) (repeat, error) {
	out := repeat{action: action}
	if !acts(action) {
		return out, nil
	}
	rp := r.cfg.Settings.Repeat
	past, err := tx.RemediationRecent(ctx, f.NodeID, now.Add(-rp.Window.Duration), store.MaxListLimit)
	if err != nil {
		return out, fmt.Errorf("read the node's past cases: %w", err)
	}
	var sameGPU, acted []*store.Remediation
	actions := 0
	for _, c := range past {
		if len(c.CommandIDs) == 0 {
			continue // it took no action
		}
		acted = append(acted, c)
		actions += len(c.CommandIDs)
		if f.GPUUUID != "" && c.GPUUUID == f.GPUUUID {
			sameGPU = append(sameGPU, c)
		}
	}
	what := finding
	if f.XID != 0 {
		what = fmt.Sprintf("XID %d", f.XID)
	}
	if len(sameGPU) > 0 {
		inv := strings.TrimSpace(f.GPUFinding.GetInvestigatoryResolution())
		if a := r.policy.Named(inv); acts(a) && actions < rp.NodeActions {
			out.action = a
			return out, nil
		}
		last := sameGPU[0]
		out.action = config.ActionEscalate
		out.hold = fmt.Sprintf("repeated: %s on GPU %s again within %v of case %s (%s); investigatory resolution %q names no automatic action: held for a person",
			what, f.GPUUUID, rp.Window.Duration, last.ID, last.Action, inv)
		out.history = sameGPU
		return out, nil
	}
	if actions >= rp.NodeActions {
		out.action = config.ActionEscalate
		out.hold = fmt.Sprintf("repeated: %s would be automatic action %d on the node within %v (at most %d): held for a person",
			what, actions+1, rp.Window.Duration, rp.NodeActions)
		out.history = acted
	}
	return out, nil
}

// hold quarantines and cordons c's node and escalates c with reason and
// the prior cases in its event; no automatic action follows. The pool's
// breaker does not stop it: a hold for a person is not an automatic
// action. Should the quarantine be refused (another owner holds the node),
// the case waits and escalates through the policy's path (its action is
// escalate).
func (r *Reconciler) hold(ctx context.Context, tx store.Store, c *store.Remediation, now time.Time, reason string,
	history []*store.Remediation) error {
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
	r.log.WarnContext(ctx, "Remediation held for a person", logkey.NodeID, c.NodeID, "remediation", c.ID, "reason", reason)
	return r.escalate(ctx, tx, m, now, reason, history...)
}
