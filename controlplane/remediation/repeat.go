package remediation

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
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
func (r *Reconciler) repeated(ctx context.Context, tx caseTx, f *store.RemediationFinding, finding, action string,
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
		if len(c.CommandIDs) == 0 || c.Finding == FindingOrdered {
			continue // it took no action, or no automatic one (an operator's order)
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
func (r *Reconciler) hold(ctx context.Context, tx caseTx, c *store.Remediation, now time.Time, reason string,
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

// contactSupport is the investigatory resolution that makes a code that
// does not act hold its node once it comes back often enough
// (repeatedNoAction).
const contactSupport = "CONTACT_SUPPORT"

// repeatedNoAction applies the repeat rule of codes that do not act
// (docs/remediation.md, "Repeats"): finding f, whose action is none, on a
// GPU, with investigatory resolution CONTACT_SUPPORT (XID 92, say, whose
// immediate resolution is IGNORE), that comes to Repeat.ContactSupport
// findings of its code on that GPU within Repeat.Window (NVSentinel's
// RepeatedXIDErrorOnSameGPU figure, 5 in 24 h), counting from the later
// of the window's start and the last case this rule (or any) opened for
// that GPU and code, holds the node for a person: hold is the reason, ""
// when the rule does not apply; history the GPU's prior cases of that
// code within the window, newest first. The count is read from the kept
// findings (store.GPUFindingRecord), so it survives every restart; f
// itself is not kept yet and counts as one.
func (r *Reconciler) repeatedNoAction(ctx context.Context, tx findingTx, f *store.RemediationFinding, investigatory string,
	now time.Time) (hold string, history []*store.Remediation, err error) {
	rp := r.cfg.Settings.Repeat
	if investigatory != contactSupport || f.GPUUUID == "" {
		return "", nil, nil
	}
	since := now.Add(-rp.Window.Duration)
	past, err := tx.RemediationRecent(ctx, f.NodeID, since, store.MaxListLimit)
	if err != nil {
		return "", nil, fmt.Errorf("read the node's past cases: %w", err)
	}
	for _, c := range past {
		if c.GPUUUID == f.GPUUUID && c.Kind == f.Kind && c.XID == f.XID {
			history = append(history, c)
		}
	}
	from := since
	if len(history) > 0 && history[0].CreatedAt.After(from) {
		from = history[0].CreatedAt
	}
	n, err := tx.RemediationFindingCount(ctx, f.NodeID, f.GPUUUID, f.Kind, f.XID, from)
	if err != nil {
		return "", nil, err
	}
	n++ // f
	if n < rp.ContactSupport {
		return "", nil, nil
	}
	what := f.Kind
	if f.XID != 0 {
		what = fmt.Sprintf("XID %d", f.XID)
		if f.XIDMnemonic != "" {
			what += " (" + f.XIDMnemonic + ")"
		}
	}
	return fmt.Sprintf("repeated: %s %d times on GPU %s within %v (at least %d); resolution %s does not act, investigatory resolution %s: held for a person",
		what, n, f.GPUUUID, rp.Window.Duration, rp.ContactSupport, f.Resolution, investigatory), history, nil
}

// maxSpacingDoublings bounds the doubling of the spacing (2^20 times the
// spacing is years: past the window either way).
const maxSpacingDoublings = 20

// spaced applies the spacing rule (config.RemediationRepeat.Spacing;
// docs/remediation.md, "Repeats"; after Meta GCM's cooldown per node) to
// case c, about to take its first action: when the node's other cases took
// n automatic actions within Repeat.Window, the last at t, c's first may
// not start before t + Spacing·2^(n-1): 10 min after the first, 20 after
// the second, and so on. at is that time (zero when nothing came before)
// and why the reason the case waits with. A case's own ladder (a failed
// reset, then a reboot) is one remediation and does not wait; an
// operator's order (FindingOrdered) neither waits nor counts.
func (r *Reconciler) spaced(ctx context.Context, tx caseTx, c *store.Remediation, now time.Time) (at time.Time, why string, err error) {
	if c.Finding == FindingOrdered {
		return time.Time{}, "", nil // an operator's order waits for no automatic spacing
	}
	rp := r.cfg.Settings.Repeat
	past, err := tx.RemediationRecent(ctx, c.NodeID, now.Add(-rp.Window.Duration), store.MaxListLimit)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("read the node's past cases: %w", err)
	}
	n := 0
	var last time.Time
	for _, p := range past {
		if p.ID == c.ID || p.Finding == FindingOrdered {
			continue // itself, or an operator's order (not automatic)
		}
		for _, id := range p.CommandIDs {
			cmd, err := tx.CommandGet(ctx, id)
			if errors.Is(err, store.ErrNotFound) {
				n++ // pruned: counted, its time unknown
				continue
			}
			if err != nil {
				return time.Time{}, "", err
			}
			if cmd.Kind == sessionv1.KindPowerStatus {
				continue // a BMC asked, not an action
			}
			n++
			if cmd.CreatedAt.After(last) {
				last = cmd.CreatedAt
			}
		}
	}
	if n == 0 || last.IsZero() {
		return time.Time{}, "", nil
	}
	gap := rp.Spacing.Duration << min(n-1, maxSpacingDoublings)
	at = last.Add(gap)
	return at, fmt.Sprintf("spacing: automatic action %d on the node within %v waits until %s (%v after the last, doubling after each)",
		n+1, rp.Window.Duration, at.UTC().Format(time.RFC3339), gap), nil
}
