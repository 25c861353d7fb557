package tests

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// TestRemediationMemoryOverRealProcesses (issue 32, items 1, 3 and the
// kill -9 "Done when"): on the split deployment (PostgreSQL, api, gateway
// and worker processes), two FakeDaemons:
//
//   - node A: XID 13 (RESTART_APP, investigatory WORKFLOW_XID_13) ten times
//     on GPU 4: no case, no hold, the count (10) in the GPU's history; then
//     XID 92 (EXCESSIVE_SBE_INTERRUPTS: IGNORE, investigatory
//     CONTACT_SUPPORT) five times on GPU 2: one case, held for a person
//     (escalated, reason repeated; the node cordoned and quarantined);
//   - node B: XID 95 (RESET_GPU) on GPU 0, a reset that takes 20 s and a
//     verification that settles for 20 s; the worker holding the node's
//     shard is killed with SIGKILL right after the XID (the finding's take:
//     detected, quarantined and draining commit in one transaction), while
//     the case rests in draining behind a long job, while it is remediating
//     and while it is verifying (a fresh
//     worker started after each kill, so one always survives): one gpu.reset
//     carried out once, the case returned, every step evented once in order,
//     and the GPU's history complete (its finding, its case, its action);
//   - `remediation history --gpu UUID -o json` lists the findings and
//     actions of that GPU only.
func TestRemediationMemoryOverRealProcesses(t *testing.T) {
	t.Parallel()
	d := newSplitDeploymentWith(t, 1, 2, func([]string) string {
		return "remediation:\n  interval: 500ms\n  verifySettle: 20s\n  verifyTimeout: 120s\n  actionTimeout: 120s\n"
	})
	ctx := t.Context()
	f := d.joinFleet(ctx, 2)
	a, b := f.daemons[0], f.daemons[1]
	nodeA, nodeB := a.NodeID(), b.NodeID()
	uuid := func(dm *sim.FakeDaemon, i int) string { return dm.Inventory().GetGpus()[i].GetUuid() }
	history := func(args ...string) *apiv1.RemediationHistory {
		t.Helper()
		out := d.cli(t, append([]string{"remediation", "history", "-o", "json"}, args...)...)
		h := &apiv1.RemediationHistory{}
		if err := protojson.Unmarshal([]byte(out), h); err != nil {
			t.Fatalf("remediation history %v -o json: %v\n%s", args, err, out)
		}
		return h
	}
	cases := func(node string) []*store.Remediation {
		list, err := d.st.RemediationList(ctx, &store.RemediationListParams{NodeID: node})
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(list, func(x, y *store.Remediation) int { return x.CreatedAt.Compare(y.CreatedAt) })
		return list
	}
	countOf := func(h *apiv1.RemediationHistory, gpu string, xid int32) int32 {
		for _, c := range h.GetCounts() {
			if c.GetGpuUuid() == gpu && c.GetXid() == xid {
				return c.GetCount()
			}
		}
		return 0
	}

	// Node B's XID 95 first (its reset and verification take a while),
	// the worker holding its shard killed at once: the take.
	// A long job runs on node B first: its case rests in draining until
	// the job ends, and the worker is killed there too.
	b.SetRecovery(sim.Recovery{ResetDelay: 20 * time.Second})
	b.SetExecDelay(45 * time.Second)
	if _, err := d.admin.CommandsCreate(ctx, &apiv1.CreateCommandsRequest{NodeIds: []string{nodeB}, Kind: "exec",
		Exec: &apiv1.ExecSpec{Argv: []string{"sleep", "45"}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() bool {
		list, err := d.st.CommandList(ctx, &store.CommandListParams{NodeID: nodeB})
		return err == nil && len(list) == 1 && list[0].State == store.CommandRunning
	}, func() string { return "node B's long job is not running" })
	if err := b.RaiseXID(0, 95); err != nil {
		t.Fatal(err)
	}
	killed := map[string]bool{}
	kill := func(step string) {
		t.Helper()
		holder := ""
		eventually(t, 90*time.Second, func() bool {
			holder, _ = d.leaseHolder(shard.LeaseName(store.ShardOf(nodeB)))
			return holder != "" && !killed[holder]
		}, func() string { return "no live worker holds node B's shard (holder " + holder + ")" })
		var w *splitProc
		for _, x := range d.workers {
			if x.id == holder && !killed[x.id] {
				w = x
			}
		}
		if w == nil {
			t.Fatalf("%s: shard holder %q is not a live worker", step, holder)
		}
		w.p.Kill()
		killed[w.id] = true
		name := fmt.Sprintf("worker-%d", len(d.workers)+1)
		nw := &splitProc{name: name, p: d.start(name, workerRoles)}
		nw.id = nw.p.WaitLine(`msg="Worker roles running".* worker=(\S+)`, 60*time.Second)[1]
		d.workers = append(d.workers, nw)
		t.Logf("killed worker %s (%s) at %s; started %s", w.id, w.name, step, nw.id)
	}
	kill("take")
	stateB := func(state string) func() bool {
		return func() bool { cs := cases(nodeB); return len(cs) == 1 && cs[0].State == state }
	}
	describeB := func() string {
		var s []string
		for _, c := range cases(nodeB) {
			s = append(s, c.State+" "+c.Action+": "+c.Reason)
		}
		return "node B cases: " + strings.Join(s, " | ")
	}
	eventually(t, 60*time.Second, func() bool {
		cs := cases(nodeB)
		return len(cs) == 1 && cs[0].State == store.RemediationDraining && strings.Contains(cs[0].Reason, "waiting for")
	}, describeB)
	kill("draining")
	eventually(t, 150*time.Second, stateB(store.RemediationRemediating), describeB)
	kill("remediating")
	eventually(t, 120*time.Second, stateB(store.RemediationVerifying), describeB)
	kill("verifying")

	// Meanwhile node A: XID 13 ten times on GPU 4.
	for range 10 {
		if err := a.RaiseXID(4, 13); err != nil {
			t.Fatal(err)
		}
	}
	gpu4, gpu2 := uuid(a, 4), uuid(a, 2)
	eventually(t, 90*time.Second, func() bool { return countOf(history("--gpu", gpu4), gpu4, 13) == 10 },
		func() string { return fmt.Sprintf("GPU 4's history: %v", history("--gpu", gpu4).GetCounts()) })
	if cs := cases(nodeA); len(cs) != 0 {
		t.Fatalf("node A has %d cases after XID 13 ten times, want none: %s", len(cs), cs[0].Reason)
	}
	// XID 92 five times on GPU 2.
	for range 5 {
		if err := a.RaiseXID(2, 92); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 90*time.Second, func() bool {
		cs := cases(nodeA)
		return len(cs) == 1 && cs[0].State == store.RemediationEscalated && countOf(history(nodeA), gpu2, 92) == 5
	}, func() string {
		return fmt.Sprintf("node A: %d cases, counts %v", len(cases(nodeA)), history(nodeA).GetCounts())
	})
	held := cases(nodeA)[0]
	if !strings.HasPrefix(held.Reason, "repeated:") || held.GPUUUID != gpu2 || held.XID != 92 || len(held.CommandIDs) != 0 {
		t.Errorf("XID 92's case: reason %q, gpu %s, xid %d, %d actions; want repeated, GPU 2, 92, none",
			held.Reason, held.GPUUUID, held.XID, len(held.CommandIDs))
	}
	if n, err := d.st.NodeGet(ctx, nodeA); err != nil || !n.Cordoned || n.Disruption != store.DisruptionQuarantined {
		t.Errorf("node A held for a person: %+v, %v", n, err)
	}
	h4 := history("--gpu", gpu4)
	if len(h4.GetCases()) != 0 || len(h4.GetActions()) != 0 || len(h4.GetFindings()) != 10 {
		t.Errorf("GPU 4's history: %d findings, %d cases, %d actions; want 10, 0, 0",
			len(h4.GetFindings()), len(h4.GetCases()), len(h4.GetActions()))
	}
	for _, fd := range h4.GetFindings() {
		if fd.GetGpuUuid() != gpu4 || fd.GetOutcome() != store.FindingOutcomeNone || fd.GetXid() != 13 {
			t.Errorf("GPU 4's history holds %v", fd)
		}
	}

	// Node B's case ends; one reset, carried out once, every step once.
	eventually(t, 120*time.Second, stateB(store.RemediationReturned), describeB)
	c := cases(nodeB)[0]
	cmds, err := d.st.CommandList(ctx, &store.CommandListParams{NodeID: nodeB})
	if err != nil {
		t.Fatal(err)
	}
	cmds, diags := splitDiag(cmds)
	if len(diags) != 1 {
		t.Errorf("node B: %d diagnostics before return, want one across the worker kills", len(diags))
	}
	var resets []*store.Command
	for _, cmd := range cmds {
		if cmd.Kind != "exec" {
			resets = append(resets, cmd)
		}
	}
	if len(cmds) != 2 || len(resets) != 1 || resets[0].Kind != "gpu.reset" || c.Attempts != 1 || len(c.CommandIDs) != 1 {
		t.Errorf("node B: %d commands (the long job and %d others), case attempts %d, command ids %v; want one gpu.reset",
			len(cmds), len(resets), c.Attempts, c.CommandIDs)
	}
	if s := b.FaultStats(); s.Resets != 1 {
		t.Errorf("node B's daemon reset %d times, want once", s.Resets)
	}
	es, err := d.st.OutboxQuery(ctx, &store.OutboxQueryParams{Key: nodeB, TopicPrefix: "com.better-compute.remediation.", Ascending: true})
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, e := range es {
		steps = append(steps, strings.TrimPrefix(e.Topic, "com.better-compute.remediation."))
	}
	if want := []string{"detected", "quarantined", "draining", "remediating", "verifying", "returned"}; !slices.Equal(steps, want) {
		t.Errorf("node B's steps %v, want %v", steps, want)
	}
	gpu0 := uuid(b, 0)
	h0 := history("--gpu", gpu0)
	if len(h0.GetFindings()) != 1 || h0.GetFindings()[0].GetOutcome() != store.FindingOutcomeOpened ||
		h0.GetFindings()[0].GetRemediationId() != c.ID || h0.GetFindings()[0].GetXid() != 95 {
		t.Errorf("GPU 0's findings: %v; want the XID 95 that opened %s", h0.GetFindings(), c.ID)
	}
	if len(h0.GetCases()) != 1 || h0.GetCases()[0].GetId() != c.ID || len(h0.GetActions()) != 1 ||
		h0.GetActions()[0].GetKind() != "gpu.reset" || h0.GetActions()[0].GetState() != store.CommandSucceeded ||
		len(resets) != 1 || h0.GetActions()[0].GetCommandId() != resets[0].ID {
		t.Errorf("GPU 0's cases %v, actions %v; want case %s with its one gpu.reset", h0.GetCases(), h0.GetActions(), c.ID)
	}
	for _, fd := range h0.GetFindings() {
		if fd.GetGpuUuid() != gpu0 {
			t.Errorf("GPU 0's history holds a finding of %s", fd.GetGpuUuid())
		}
	}
	for _, x := range h0.GetActions() {
		if x.GetGpuUuid() != gpu0 || x.GetNodeId() != nodeB {
			t.Errorf("GPU 0's history holds an action of %s on %s", x.GetGpuUuid(), x.GetNodeId())
		}
	}
	text := d.cli(t, "remediation", "history", nodeA)
	if !strings.Contains(text, "CONTACT_SUPPORT") || !strings.Contains(text, held.ID) {
		t.Errorf("remediation history %s lacks the XID 92s and their case:\n%s", nodeA, text)
	}
	t.Logf("node A held: %s\nnode B: %v; remediation history %s:\n%s", held.Reason, steps, nodeA, text)
}
