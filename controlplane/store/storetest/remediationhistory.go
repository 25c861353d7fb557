package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// testRemediationHistory: kept findings (migration 0020) come back per node
// and per GPU, newest first, with their outcome; the count of a GPU's code
// reads only what was taken after its since; cases and their actions join
// the history of their node and GPU; the counts group a GPU's code; a GPU's
// history never holds another GPU's rows; prune ages the findings out.
func testRemediationHistory(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	pool := fixture(ctx, t, h)
	addNode(ctx, t, h, pool, "node_rh1")
	addNode(ctx, t, h, pool, "node_rh2")
	if _, err := st.RemediationHistory(ctx, &store.RemediationHistoryParams{}); err == nil {
		t.Fatal("history of nothing: no error")
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	keep := func(node, gpu string, xid int, outcome, rem string, at time.Time) *store.GPUFindingRecord {
		r := &store.GPUFindingRecord{NodeID: node, GPUUUID: gpu, BoardSerial: "serial-" + gpu, Kind: "gpu.xid",
			Severity: "warning", Resolution: "IGNORE", Investigatory: "CONTACT_SUPPORT", XID: xid,
			XIDMnemonic: "EXCESSIVE_SBE_INTERRUPTS", Message: "XID", EventID: 7, Outcome: outcome, RemediationID: rem,
			CreatedAt: at, TakenAt: at}
		if err := st.RemediationFindingKeep(ctx, r); err != nil || r.ID == 0 {
			t.Fatalf("keep: id %d, %v", r.ID, err)
		}
		return r
	}
	for i := range 3 {
		keep("node_rh1", "GPU-a", 92, store.FindingOutcomeNone, "", now.Add(time.Duration(i-3)*time.Minute))
	}
	keep("node_rh1", "GPU-b", 13, store.FindingOutcomeNone, "", now.Add(-2*time.Minute))
	keep("node_rh2", "GPU-c", 92, store.FindingOutcomeNone, "", now.Add(-time.Minute))
	if n := must(st.RemediationFindingCount(ctx, "node_rh1", "GPU-a", "gpu.xid", 92, now.Add(-time.Hour))); n != 3 {
		t.Fatalf("count over 1h = %d, want 3", n)
	}
	if n := must(st.RemediationFindingCount(ctx, "node_rh1", "GPU-a", "gpu.xid", 92, now.Add(-2*time.Minute))); n != 1 {
		t.Fatalf("count after the second = %d, want 1 (strictly after)", n)
	}
	if n := must(st.RemediationFindingCount(ctx, "node_rh1", "GPU-a", "gpu.xid", 13, now.Add(-time.Hour))); n != 0 {
		t.Fatalf("count of another code = %d, want 0", n)
	}
	c := must(st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_rh1", State: store.RemediationDetected,
		Finding: "xid", XID: 92, GPUUUID: "GPU-a", Action: "gpu.reset", CreatedAt: now}, "remediation:w1"))
	cmds := must(st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_rh1"}, Kind: "gpu.reset",
		IdempotencyKey: "remediation:" + c.ID + ":1", CreatedBy: "remediation:" + c.ID, Timeout: time.Minute, Now: &now}))
	must(st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationRemediating,
		CommandID: cmds[0].ID, Actor: "remediation:w1", Now: &now}))
	last := keep("node_rh1", "GPU-a", 92, store.FindingOutcomeJoined, c.ID, now.Add(time.Second))

	g := must(st.RemediationHistory(ctx, &store.RemediationHistoryParams{GPUUUID: "GPU-a"}))
	if len(g.Findings) != 4 || g.Findings[0].ID != last.ID || g.Findings[0].Outcome != store.FindingOutcomeJoined ||
		g.Findings[0].RemediationID != c.ID || g.Findings[0].BoardSerial != "serial-GPU-a" ||
		g.Findings[0].Investigatory != "CONTACT_SUPPORT" || !g.Findings[0].TakenAt.Equal(last.TakenAt) {
		t.Fatalf("GPU-a's findings = %d, newest %+v", len(g.Findings), g.Findings[0])
	}
	for _, f := range g.Findings {
		if f.GPUUUID != "GPU-a" {
			t.Fatalf("GPU-a's history holds %s's finding", f.GPUUUID)
		}
	}
	if len(g.Cases) != 1 || g.Cases[0].ID != c.ID || len(g.Actions) != 1 || g.Actions[0].CommandID != cmds[0].ID ||
		g.Actions[0].Kind != "gpu.reset" || g.Actions[0].RemediationID != c.ID {
		t.Fatalf("GPU-a's cases %d, actions %+v", len(g.Cases), g.Actions)
	}
	if len(g.Counts) != 1 || g.Counts[0].Count != 4 || g.Counts[0].XID != 92 || g.Counts[0].GPUUUID != "GPU-a" {
		t.Fatalf("GPU-a's counts = %+v", g.Counts)
	}
	n := must(st.RemediationHistory(ctx, &store.RemediationHistoryParams{NodeID: "node_rh1", Limit: 2}))
	if len(n.Findings) != 2 || n.Findings[0].ID != last.ID || len(n.Counts) != 2 || n.Counts[0].Count != 4 {
		t.Fatalf("node_rh1's history, limit 2: %d findings, counts %+v", len(n.Findings), n.Counts)
	}
	w := must(st.RemediationHistory(ctx, &store.RemediationHistoryParams{NodeID: "node_rh1", Since: now.Add(-90 * time.Second)}))
	if len(w.Findings) != 2 || len(w.Cases) != 1 {
		t.Fatalf("node_rh1's history of the last 90 s: %d findings, %d cases; want 2, 1", len(w.Findings), len(w.Cases))
	}
	o := must(st.RemediationHistory(ctx, &store.RemediationHistoryParams{NodeID: "node_rh2", GPUUUID: "GPU-a"}))
	if len(o.Findings)+len(o.Cases)+len(o.Counts) != 0 {
		t.Fatalf("GPU-a on node_rh2: %+v, want nothing", o)
	}
	must(st.RemediationPrune(ctx, now.Add(-90*time.Second)))
	if n := must(st.RemediationFindingCount(ctx, "node_rh1", "GPU-a", "gpu.xid", 92, now.Add(-time.Hour))); n != 2 {
		t.Fatalf("count after prune = %d, want 2", n)
	}
}
