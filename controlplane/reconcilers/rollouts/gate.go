package rollouts

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/healthgate"
	"github.com/better-compute/better-compute/controlplane/pkg/inventory"
	"github.com/better-compute/better-compute/controlplane/store"
)

// The health gate (issue 30, item 3; DESIGN.md, "Memory and evidence";
// docs/rollouts.md, "Health gate"). When every node of a wave is upgraded
// or skipped, the wave's upgraded nodes are compared with the pool's
// nodes not yet upgraded over the wave's soak (when none remain, with the
// same nodes over an equal window before their upgrade): bcd restarts and
// session drops per node-hour, new GPU findings per GPU-hour, failed
// commands per command (package healthgate decides). A halt verdict halts
// the rollout (every node it upgraded rolls back); an inconclusive one
// extends the soak once, by Soak (at least Config.MinExtension), and then advances the wave (or halts
// it, with RequireEvidence).

// gate decides the current wave's health gate, and reports whether the
// wave may advance (false: it waits for its extension, or halted).
func (p *plan) gate(ctx context.Context) (bool, error) {
	ro := p.ro
	var up []*store.RolloutNode
	for _, n := range p.wave() {
		if n.State == store.RolloutNodeUpgraded && n.UpgradeCommandID != "" && n.SoakStartedAt != nil {
			up = append(up, n)
		}
	}
	if len(up) == 0 {
		return true, nil // nothing upgraded by the rollout in this wave
	}
	var prev *healthgate.Report
	if i := slices.IndexFunc(ro.Gates, func(g healthgate.Report) bool { return g.Wave == ro.CurrentWave }); i >= 0 {
		prev = &ro.Gates[i]
	}
	extended := prev != nil && prev.Pending && prev.ExtendedUntil != nil
	switch {
	case prev != nil && !extended:
		return prev.Verdict != healthgate.Halt, nil // decided
	case extended && p.now.Before(*prev.ExtendedUntil):
		return false, nil // the extension runs
	}
	rep, err := p.measure(ctx, up)
	if err != nil {
		return false, err
	}
	if extended {
		rep.ExtendedUntil = prev.ExtendedUntil // decided after its extension
	}
	switch rep.Verdict {
	case healthgate.Halt:
		rep.Reason = "halt: the upgraded nodes are worse than the comparison group: " + rep.Summary()
		p.setRollout(&store.RolloutUpdateParams{Gate: rep})
		p.halt(up[0], fmt.Sprintf("health gate of wave %d: %s", ro.CurrentWave, rep.Reason))
		return false, nil
	case healthgate.Inconclusive:
		switch {
		case !extended:
			until := p.now.Add(max(ro.Soak, p.r.cfg.MinExtension))
			rep.ExtendedUntil, rep.Pending = &until, true
			rep.Reason = fmt.Sprintf("inconclusive (too few node-hours to decide): soak extended once, to %s; %s",
				until.Format(time.RFC3339), rep.Summary())
			p.setRollout(&store.RolloutUpdateParams{Gate: rep})
			p.info("Rollout health gate inconclusive: soak extended", "wave", ro.CurrentWave, "until", until)
			return false, nil
		case ro.RequireEvidence:
			rep.Reason = "inconclusive after the extended soak, and the rollout requires evidence (--require-evidence): " + rep.Summary()
			p.setRollout(&store.RolloutUpdateParams{Gate: rep})
			p.halt(up[0], fmt.Sprintf("health gate of wave %d: %s", ro.CurrentWave, rep.Reason))
			return false, nil
		}
		rep.Reason = "inconclusive after the extended soak: the wave advances; " + rep.Summary()
	default:
		rep.Reason = rep.Summary()
	}
	p.setRollout(&store.RolloutUpdateParams{Gate: rep})
	p.ro.Gates = append(slices.DeleteFunc(p.ro.Gates, func(g healthgate.Report) bool { return g.Wave == rep.Wave }), *rep)
	p.info("Rollout health gate", "wave", ro.CurrentWave, "verdict", rep.Verdict)
	return true, nil
}

// halt moves the rollout to rolling-back for the health gate, naming the
// wave's first upgraded node.
func (p *plan) halt(n *store.RolloutNode, reason string) {
	p.setRollout(&store.RolloutUpdateParams{State: store.RolloutRollingBack, FailedNodeID: n.NodeID, Reason: reason})
	p.logs = append(p.logs, func() {
		p.r.log.Warn("Rollout halted by its health gate: rolling back every node it upgraded", attrRollout, p.ro.ID, "reason", reason)
	})
}

// measure computes a wave's health gate now: its upgraded nodes over their
// soak (from each one's soak start), against the pool's connected nodes
// not yet upgraded over the wave's window, or, when none remain, against
// the same nodes over an equal window before each one's upgrade.
func (p *plan) measure(ctx context.Context, up []*store.RolloutNode) (*healthgate.Report, error) {
	ro := p.ro
	rep := &healthgate.Report{Wave: ro.CurrentWave, To: p.now, UpgradedNodes: len(up), Comparison: healthgate.ComparisonNotUpgraded}
	from := *up[0].SoakStartedAt
	for _, n := range up {
		if n.SoakStartedAt.Before(from) {
			from = *n.SoakStartedAt
		}
	}
	rep.From = from
	var upSpans, cmpSpans []store.HealthSpan
	var upGPUh, cmpGPUh float64
	for _, n := range up {
		sp := store.HealthSpan{NodeID: n.NodeID, From: *n.SoakStartedAt, To: p.now}
		upSpans = append(upSpans, sp)
		h := hours(sp)
		rep.UpgradedNodeHours += h
		g, err := p.gpus(ctx, n.NodeID)
		if err != nil {
			return nil, err
		}
		upGPUh += float64(g) * h
	}
	for _, n := range p.nodes {
		if n.Wave != 0 || n.State != store.RolloutNodePending || !n.Connected {
			continue
		}
		cmpSpans = append(cmpSpans, store.HealthSpan{NodeID: n.NodeID, From: from, To: p.now})
	}
	if len(cmpSpans) == 0 {
		// None left to compare with: the same nodes, an equal window
		// before their upgrade was sent.
		rep.Comparison = healthgate.ComparisonBeforeUpgrade
		for i, n := range up {
			c, err := p.r.store.CommandGet(ctx, n.UpgradeCommandID)
			if err != nil {
				return nil, fmt.Errorf("upgrade command of node %s: %w", n.NodeID, err)
			}
			d := upSpans[i].To.Sub(upSpans[i].From)
			cmpSpans = append(cmpSpans, store.HealthSpan{NodeID: n.NodeID, From: c.CreatedAt.Add(-d), To: c.CreatedAt})
		}
	}
	rep.ComparisonNodes = len(cmpSpans)
	for _, sp := range cmpSpans {
		h := hours(sp)
		rep.ComparisonNodeHours += h
		g, err := p.gpus(ctx, sp.NodeID)
		if err != nil {
			return nil, err
		}
		cmpGPUh += float64(g) * h
	}
	owner := store.RolloutOwner(ro.ID)
	uc, err := p.r.store.RolloutHealthCounts(ctx, upSpans, owner)
	if err != nil {
		return nil, err
	}
	cc, err := p.r.store.RolloutHealthCounts(ctx, cmpSpans, owner)
	if err != nil {
		return nil, err
	}
	ms := []healthgate.Measure{
		{Name: "restarts", Unit: "node-hour", Upgraded: healthgate.Group{Count: uc.Restarts, Exposure: rep.UpgradedNodeHours},
			Comparison: healthgate.Group{Count: cc.Restarts, Exposure: rep.ComparisonNodeHours}},
		{Name: "session-drops", Unit: "node-hour", Upgraded: healthgate.Group{Count: uc.Drops, Exposure: rep.UpgradedNodeHours},
			Comparison: healthgate.Group{Count: cc.Drops, Exposure: rep.ComparisonNodeHours}},
		{Name: "findings", Unit: "GPU-hour", Upgraded: healthgate.Group{Count: uc.Findings, Exposure: upGPUh},
			Comparison: healthgate.Group{Count: cc.Findings, Exposure: cmpGPUh}},
		{Name: "failed-commands", Unit: "command", Upgraded: healthgate.Group{Count: uc.FailedCommands, Exposure: float64(uc.Commands)},
			Comparison: healthgate.Group{Count: cc.FailedCommands, Exposure: float64(cc.Commands)}},
	}
	for _, m := range ms {
		rep.Measures = append(rep.Measures, healthgate.Test(m, p.r.cfg.Gate))
	}
	rep.Verdict = healthgate.Decide(rep.Measures, rep.UpgradedNodeHours, rep.ComparisonNodeHours, p.r.cfg.Gate)
	return rep, nil
}

// hours is a span's length in hours.
func hours(sp store.HealthSpan) float64 { return max(0, sp.To.Sub(sp.From).Hours()) }

// gpus counts a node's GPUs in its last inventory.
func (p *plan) gpus(ctx context.Context, nodeID string) (int, error) {
	if n, ok := p.gpuCount[nodeID]; ok {
		return n, nil
	}
	n, err := p.r.store.NodeGet(ctx, nodeID)
	if err != nil {
		return 0, err
	}
	c := len(inventory.Decode(n.Inventory).GetGpus())
	if p.gpuCount == nil {
		p.gpuCount = map[string]int{}
	}
	p.gpuCount[nodeID] = c
	return c, nil
}
