package remediation

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/bmcsecret"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// ActionProbe is the action of a case opened for a silent node: its BMC is
// asked, through its site's BMC agent, whether it is on (unresponsive) or
// off (powered-off); the answer is the finding the policy acts on.
const ActionProbe = "power-status"

// AgentPlugin is the bcd plugin a site's BMC agent runs (bcx-ipmi).
const AgentPlugin = "ipmi"

// powerCommand is a power command driving node target's BMC as its site's
// agent.
func powerCommand(target, action string) *sessionv1.Command {
	return &sessionv1.Command{Spec: &sessionv1.Command_Power{Power: &sessionv1.PowerSpec{Action: action, NodeId: target}}}
}

// bmcAgent returns the node that drives nodeID's BMC: another node of the
// same site, ready, whose inventory lists the ipmi plugin healthy (the
// first by id), in a pool of nodeID's own tenant or of the root tenant
// (the deployment's); "" with the reason when nodeID has no sealed BMC
// credentials or its site no such agent. The agent is granted nodeID's
// BMC credentials, so it is never a node of another tenant, whose
// people may run commands on it and read them (docs/tenants.md, "BMC
// agents").
func bmcAgent(ctx context.Context, tx decideTx, nodeID string) (agent, why string, err error) {
	if _, err := tx.SecretGet(ctx, bmcsecret.Name(nodeID)); errors.Is(err, store.ErrNotFound) {
		return "", "the node has no BMC credentials (bmc set-credentials)", nil
	} else if err != nil {
		return "", "", err
	}
	node, err := tx.NodeGet(ctx, nodeID)
	if err != nil {
		return "", "", err
	}
	pool, err := tx.PoolGet(ctx, node.PoolID)
	if err != nil {
		return "", "", err
	}
	var pools []string
	for cursor := ""; ; {
		ps, err := tx.PoolList(ctx, &store.ListParams{Cursor: cursor, Limit: store.MaxListLimit})
		if err != nil {
			return "", "", err
		}
		for _, p := range ps {
			if p.SiteID == pool.SiteID && agentTenant(p.TenantID, pool.TenantID) {
				pools = append(pools, p.ID)
			}
		}
		if len(ps) < store.MaxListLimit {
			break
		}
		cursor = ps[len(ps)-1].ID
	}
	var candidates []string
	for _, pid := range pools {
		for cursor := ""; ; {
			ns, err := tx.NodeList(ctx, &store.NodeListParams{ListParams: store.ListParams{Cursor: cursor, Limit: store.MaxListLimit},
				PoolID: pid, State: store.NodeReady})
			if err != nil {
				return "", "", err
			}
			for _, n := range ns {
				if n.ID != nodeID && runsPlugin(n.Inventory, AgentPlugin) {
					candidates = append(candidates, n.ID)
				}
			}
			if len(ns) < store.MaxListLimit {
				break
			}
			cursor = ns[len(ns)-1].ID
		}
	}
	if len(candidates) == 0 {
		return "", "no ready node of site " + pool.SiteID + " in the node's tenant or the root's runs bcx-ipmi to drive the BMC", nil
	}
	slices.Sort(candidates)
	return candidates[0], "", nil
}

// agentTenant reports whether a node of a pool of tenant agent may drive
// the BMC of a node of a pool of tenant target: the same tenant, or the
// root's (the deployment's own nodes). "" is the root (a pool made before
// tenants).
func agentTenant(agent, target string) bool {
	agent, target = cmp.Or(agent, store.RootTenant), cmp.Or(target, store.RootTenant)
	return agent == target || agent == store.RootTenant
}

// runsPlugin reports whether an inventory (protojson of session.v1
// Inventory) lists plugin name as healthy.
func runsPlugin(inv []byte, name string) bool {
	if len(inv) == 0 {
		return false
	}
	var doc struct {
		Plugins []struct {
			Name    string `json:"name"`
			Healthy bool   `json:"healthy"`
		} `json:"plugins"`
	}
	if json.Unmarshal(inv, &doc) != nil {
		return false
	}
	return slices.ContainsFunc(doc.Plugins, func(p struct {
		Name    string `json:"name"`
		Healthy bool   `json:"healthy"`
	}) bool {
		return p.Name == name && p.Healthy
	})
}

// grant lets agent open nodeID's BMC secret for command cmdID, until the
// command's deadline.
func (r *Reconciler) grant(ctx context.Context, tx caseTx, nodeID, agent, cmdID string, now time.Time) error {
	return tx.SecretGrant(ctx, &store.SecretGrantParams{Name: bmcsecret.Name(nodeID), NodeID: agent, CommandID: cmdID,
		ExpiresAt: now.Add(r.cfg.Settings.ActionTimeout.Duration)})
}

// openSilent opens a probe case for each silent node of shard n that has
// BMC credentials and no case.
func (r *Reconciler) openSilent(ctx context.Context, n int, fence store.Fence) error {
	return store.InFencedTx(ctx, r.store, fence, func(tx silentTx) error {
		ids, err := tx.RemediationSilentNodes(ctx, n)
		if err != nil {
			return err
		}
		now := r.cfg.Now()
		for _, id := range ids {
			c, err := tx.RemediationCreate(ctx, &store.Remediation{NodeID: id, State: store.RemediationDetected,
				Finding: "silent", Action: ActionProbe, NextAt: now, CreatedAt: now,
				Message: "silent past the liveness window: asking its BMC through the site's agent"}, r.actor())
			if errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			r.log.InfoContext(ctx, "Silent node: asking its BMC", logkey.NodeID, id, "remediation", c.ID)
		}
		return nil
	})
}

// probe asks a silent node's BMC whether it is on, through its site's
// agent, and turns the answer into the case's finding: on is
// unresponsive, off powered-off (the node's state too).
func (r *Reconciler) probe(ctx context.Context, tx caseTx, c *store.Remediation, now time.Time) error {
	node, err := tx.NodeGet(ctx, c.NodeID)
	if err != nil {
		return err
	}
	if node.State == store.NodeReady {
		_, err := r.move(ctx, tx, c, store.RemediationReturned, now, store.RemediationMoveParams{ClearCommand: true,
			Reason: "the node answers again"})
		return err
	}
	if c.CommandID == "" {
		if c.Attempts >= r.cfg.Settings.MaxAttempts {
			return r.escalateProbe(ctx, tx, c, now, fmt.Sprintf("its BMC did not answer %d times", c.Attempts))
		}
		agent, why, err := bmcAgent(ctx, tx, c.NodeID)
		if err != nil {
			return err
		}
		if agent == "" {
			_, err := r.move(ctx, tx, c, c.State, now, store.RemediationMoveParams{NextAt: r.laterProbe(now), Reason: why})
			return err
		}
		attempt := c.Attempts + 1
		spec, err := sessionv1.MarshalSpec(powerCommand(c.NodeID, "status"))
		if err != nil {
			return err
		}
		cmds, err := tx.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{agent}, Kind: sessionv1.KindPowerStatus,
			SessionSpec: spec, IdempotencyKey: fmt.Sprintf("remediation:%s:probe:%d", c.ID, attempt), CreatedBy: owner(c),
			Timeout: r.cfg.Settings.ActionTimeout.Duration, Now: &now})
		if err != nil {
			return err
		}
		if err := r.grant(ctx, tx, c.NodeID, agent, cmds[0].ID, now); err != nil {
			return err
		}
		_, err = r.move(ctx, tx, c, c.State, now, store.RemediationMoveParams{Attempts: &attempt, CommandID: cmds[0].ID,
			NextAt: r.later(now), Reason: "asking its BMC through " + agent})
		return err
	}
	cmd, err := tx.CommandGet(ctx, c.CommandID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if err == nil && !terminal(cmd.State) {
		return r.wait(ctx, tx, c, now, "asking its BMC")
	}
	power := ""
	if err == nil && cmd.State == store.CommandSucceeded {
		var res struct {
			Power string `json:"power"`
		}
		_ = json.Unmarshal(cmd.Result, &res)
		power = res.Power
	}
	var finding string
	switch power {
	case "on":
		finding = config.FindingUnresponsive
	case "off":
		finding = config.FindingPoweredOff
		if err := tx.NodeSetState(ctx, c.NodeID, store.NodePoweredOff); err != nil {
			return err
		}
	default:
		_, err := r.move(ctx, tx, c, c.State, now, store.RemediationMoveParams{ClearCommand: true, NextAt: r.laterProbe(now),
			Reason: "its BMC gave no power state"})
		return err
	}
	action := r.policy.Action(finding, "")
	if action == config.ActionNone {
		_, err := r.move(ctx, tx, c, store.RemediationReturned, now, store.RemediationMoveParams{Finding: finding,
			Action: action, ClearCommand: true, Reason: "its BMC says " + power + "; the policy takes no action"})
		return err
	}
	zero := 0
	m, err := r.move(ctx, tx, c, c.State, now, store.RemediationMoveParams{Finding: finding, Action: action, Attempts: &zero,
		ClearCommand: true, Reason: "its BMC says " + power})
	if err != nil {
		return err
	}
	return r.quarantine(ctx, tx, m, now)
}

// escalateProbe gives a probe up to a person: the node is quarantined (it
// is out anyway) and escalated.
func (r *Reconciler) escalateProbe(ctx context.Context, tx caseTx, c *store.Remediation, now time.Time, reason string) error {
	zero := 0
	m, err := r.move(ctx, tx, c, c.State, now, store.RemediationMoveParams{Finding: config.FindingUnresponsive,
		Action: config.ActionEscalate, Attempts: &zero, ClearCommand: true, Reason: reason})
	if err != nil {
		return err
	}
	return r.quarantine(ctx, tx, m, now)
}

// laterProbe is when a probe without an answer is tried again: ten
// rounds on.
func (r *Reconciler) laterProbe(now time.Time) *time.Time {
	t := now.Add(10 * r.cfg.Settings.Interval.Duration)
	return &t
}

// terminal reports whether a command state is terminal.
func terminal(state string) bool {
	switch state {
	case store.CommandSucceeded, store.CommandFailed, store.CommandCancelled, store.CommandExpired, store.CommandLost:
		return true
	}
	return false
}

// bmcAgentFor reports whether nodeID's BMC can be driven now (a power
// cycle may follow).
func bmcAgentFor(ctx context.Context, tx decideTx, nodeID string) (string, bool, error) {
	agent, _, err := bmcAgent(ctx, tx, nodeID)
	return agent, agent != "", err
}
