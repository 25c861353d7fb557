package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// remediationFleet joins n FakeDaemons (with their simulated DGX
// inventory) to d's pool default and runs them until the test ends.
func remediationFleet(t *testing.T, d *deployment, n int, recovery sim.Recovery) []*sim.FakeDaemon {
	t.Helper()
	file, _ := d.joinToken(n, time.Hour)
	token := strings.TrimSpace(readFile(t, file))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	f, err := sim.NewFleet(sim.FleetConfig{GatewayURL: d.gatewayURL, Token: token, N: n, NamePrefix: "rep",
		Session: session.Config{StartJitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Join(ctx); err != nil {
		t.Fatal(err)
	}
	for _, dm := range f.Daemons() {
		dm.SetRecovery(recovery)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(ctx, 90*time.Second)
	defer wcancel()
	if err := f.WaitFor(wctx, func(s sim.FleetStats) bool { return s.Connected == n }); err != nil {
		t.Fatalf("FakeDaemons connected: %+v (%v)", f.Stats(), err)
	}
	// Each node's inventory (its GPUs) is stored.
	for _, dm := range f.Daemons() {
		eventually(t, 60*time.Second, func() bool {
			node, err := d.st.NodeGet(ctx, dm.NodeID())
			return err == nil && len(inventory(node.Inventory).GetGpus()) > 0
		}, func() string { return "inventory of " + dm.NodeID() })
	}
	return f.Daemons()
}

// gpuView is a GPU as nodes get -o json shows it.
type gpuView struct {
	UUID          string   `json:"uuid"`
	Health        string   `json:"health"`
	HealthReasons []string `json:"healthReasons"`
}

// nodeGPUs reads a node's GPUs through the CLI.
func (d *deployment) nodeGPUs(node string) []gpuView {
	d.t.Helper()
	var resp struct {
		GPUs []gpuView `json:"gpus"`
	}
	d.cliJSON(&resp, d.viaAPI("nodes", "get", node)...)
	if len(resp.GPUs) == 0 {
		d.t.Fatalf("nodes get %s shows no GPUs", node)
	}
	return resp.GPUs
}

// cliFails runs a CLI command that must fail and returns its standard
// error.
func (d *deployment) cliFails(args ...string) string {
	d.t.Helper()
	code, stdout, stderr := testenv.Run(d.t, d.env, "", d.bc, append([]string{"--config", d.cfgFile}, args...)...)
	if code == 0 {
		d.t.Fatalf("better-compute %s succeeded, want a refusal:\n%s", strings.Join(args, " "), stdout)
	}
	return stderr
}

// caseOf reads a remediation case.
func (d *deployment) caseOf(id string) *store.Remediation {
	d.t.Helper()
	c, err := d.st.RemediationGet(context.Background(), id)
	if err != nil {
		d.t.Fatal(err)
	}
	return c
}

// caseSteps lists the remediation events of case id, in order.
func (d *deployment) caseSteps(node, id string) []string {
	d.t.Helper()
	es, err := d.st.OutboxQuery(context.Background(), &store.OutboxQueryParams{Key: node,
		TopicPrefix: "com.better-compute.remediation.", Ascending: true})
	if err != nil {
		d.t.Fatal(err)
	}
	var steps []string
	for _, e := range es {
		var env struct {
			Data events.RemediationData `json:"data"`
		}
		if json.Unmarshal(e.Payload, &env) != nil || env.Data.RemediationID == "" {
			_ = json.Unmarshal(e.Payload, &env.Data)
		}
		if env.Data.RemediationID == id {
			steps = append(steps, strings.TrimPrefix(e.Topic, "com.better-compute.remediation."))
		}
	}
	return steps
}

// TestReturnThatChecksAndHealthThatClears: serve and three FakeDaemons.
// XID 48 (ESCALATE) on GPU 0 of one node escalates its case and the GPU
// reads failed. remediation return is refused CONFLICT naming --reset-gpu,
// --reboot and --force; return --reset-gpu resets the GPU, verifies it and
// returns the node; the GPU then reads ok with no health reason left. A
// second escalated case returned with --force records it in its reason.
func TestReturnThatChecksAndHealthThatClears(t *testing.T) {
	t.Parallel()
	// The breaker admits every node of this small pool (its default, 10 %
	// of 3 GPU nodes, admits one within 10 min).
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{top: "remediation:\n  interval: 300ms\n  verifySettle: 1s\n" +
		"  breaker:\n    share: 100%\n"})
	dms := remediationFleet(t, d, 3, sim.Recovery{ResetDelay: 200 * time.Millisecond})
	ctx := t.Context()
	dm := dms[0]
	node := dm.NodeID()
	if err := dm.RaiseXID(0, 48); err != nil {
		t.Fatal(err)
	}
	var c *store.Remediation
	eventually(t, 60*time.Second, func() bool {
		var err error
		c, err = d.st.RemediationOpenFor(ctx, node)
		return err == nil && c.State == store.RemediationEscalated
	}, func() string { return fmt.Sprintf("case %+v", c) })
	gpu := dm.Inventory().GetGpus()[0].GetUuid()
	eventually(t, 30*time.Second, func() bool { return d.nodeGPUs(node)[0].Health == "failed" },
		func() string { return fmt.Sprintf("GPUs %+v", d.nodeGPUs(node)) })

	stderr := d.cliFails(d.viaAPI("remediation", "return", c.ID)...)
	for _, want := range []string{"CONFLICT", gpu, "reads failed", "--reset-gpu", "--reboot", "--force"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("refused return does not name %q:\n%s", want, stderr)
		}
	}
	if got := d.caseOf(c.ID); got.State != store.RemediationEscalated {
		t.Fatalf("a refused return moved the case to %s", got.State)
	}

	out := d.cli(d.viaAPI("remediation", "return", c.ID, "--reset-gpu", "--note", "swapped the riser")...)
	if !strings.Contains(out, "gpu.reset") {
		t.Errorf("return --reset-gpu printed %q", out)
	}
	eventually(t, 60*time.Second, func() bool { return d.caseOf(c.ID).State == store.RemediationReturned },
		func() string { got := d.caseOf(c.ID); return got.State + ": " + got.Reason })
	if s := dm.FaultStats(); s.Resets != 1 {
		t.Errorf("the daemon reset %d GPUs, want 1", s.Resets)
	}
	gpus := d.nodeGPUs(node)
	if gpus[0].Health != "ok" || len(gpus[0].HealthReasons) != 0 {
		t.Errorf("GPU 0 after the reset: %+v, want ok with no reason left", gpus[0])
	}
	if n, _ := d.st.NodeGet(ctx, node); n.Cordoned || n.Disruption != "" {
		t.Errorf("node after the return: cordoned %v, disruption %q", n.Cordoned, n.Disruption)
	}
	steps := d.caseSteps(node, c.ID)
	if want := []string{"detected", "quarantined", "escalated", "draining", "remediating", "verifying", "returned"}; !slices.Equal(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}

	// --force returns a node whose GPU still reads failed, and says so.
	dm2 := dms[1]
	if err := dm2.RaiseXID(2, 48); err != nil {
		t.Fatal(err)
	}
	var c2 *store.Remediation
	eventually(t, 60*time.Second, func() bool {
		var err error
		c2, err = d.st.RemediationOpenFor(ctx, dm2.NodeID())
		return err == nil && c2.State == store.RemediationEscalated
	}, func() string { return fmt.Sprintf("case %+v", c2) })
	eventually(t, 30*time.Second, func() bool { return d.nodeGPUs(dm2.NodeID())[2].Health == "failed" },
		func() string { return fmt.Sprintf("GPUs %+v", d.nodeGPUs(dm2.NodeID())) })
	d.cli(d.viaAPI("remediation", "return", c2.ID, "--force")...)
	if got := d.caseOf(c2.ID); got.State != store.RemediationReturned || !strings.Contains(got.Reason, "--force") {
		t.Errorf("forced return: %s %q", got.State, got.Reason)
	}
}

// TestRepairsOnOrder: serve and three FakeDaemons in a pool whose
// disruption budget is 1 node. An operator's nodes gpu-reset (by index)
// runs as a remediation case through the budget: a nodes reboot of another
// node while it is out is refused naming the budget; once it is back the
// reboot is admitted, carried out (a new boot) and returned. Both are in the
// audit log under the operator's token and in the nodes' history
// (remediation list --node); a viewer's are refused.
func TestRepairsOnOrder(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{top: "remediation:\n  interval: 300ms\n  verifySettle: 1s\n"})
	dms := remediationFleet(t, d, 3, sim.Recovery{ResetDelay: 2 * time.Second, RebootDelay: 500 * time.Millisecond})
	ctx := t.Context()
	d.cli(d.viaAPI("pools", "set-budget", "default", "--budget", "1")...)
	operator := strings.TrimSpace(d.cli(d.viaAPI("tokens", "create", "--role", "operator")...))
	viewer := strings.TrimSpace(d.cli(d.viaAPI("tokens", "create", "--role", "viewer")...))
	as := func(token string, args ...string) []string { return append(args, "--server", d.api, "--token", token) }
	a, b := dms[0].NodeID(), dms[1].NodeID()

	for _, args := range [][]string{{"nodes", "gpu-reset", a, "--gpu", "1"}, {"nodes", "reboot", a}} {
		if stderr := d.cliFails(as(viewer, args...)...); !strings.Contains(stderr, "PERMISSION_DENIED") {
			t.Errorf("viewer's %v: %s", args, stderr)
		}
	}

	var reset struct {
		RemediationID string `json:"remediationId"`
		GPUUUID       string `json:"gpuUuid"`
		State         string `json:"state"`
	}
	d.cliJSON(&reset, as(operator, "nodes", "gpu-reset", a, "--gpu", "1", "--note", "user reports NaNs")...)
	if want := dms[0].Inventory().GetGpus()[1].GetUuid(); reset.GPUUUID != want || reset.State != store.RemediationDraining {
		t.Errorf("gpu-reset answered %+v, want GPU %s draining", reset, want)
	}
	if n, _ := d.st.NodeGet(ctx, a); !n.Cordoned {
		t.Error("node not cordoned by its ordered reset")
	}
	// The budget (1 node) is taken by the reset: a reboot of another node
	// waits.
	if stderr := d.cliFails(as(operator, "nodes", "reboot", b)...); !strings.Contains(stderr, "CONFLICT") ||
		!strings.Contains(stderr, "disruption budget") {
		t.Errorf("reboot while the budget is full: %s", stderr)
	}
	eventually(t, 60*time.Second, func() bool { return d.caseOf(reset.RemediationID).State == store.RemediationReturned },
		func() string { c := d.caseOf(reset.RemediationID); return c.State + ": " + c.Reason })
	if s := dms[0].FaultStats(); s.Resets != 1 {
		t.Errorf("node %s reset %d GPUs, want 1", a, s.Resets)
	}

	var reboot struct {
		RemediationID string `json:"remediationId"`
	}
	d.cliJSON(&reboot, as(operator, "nodes", "reboot", b)...)
	eventually(t, 60*time.Second, func() bool { return d.caseOf(reboot.RemediationID).State == store.RemediationReturned },
		func() string { c := d.caseOf(reboot.RemediationID); return c.State + ": " + c.Reason })
	if s := dms[1].FaultStats(); s.Reboots != 1 {
		t.Errorf("node %s rebooted %d times, want 1", b, s.Reboots)
	}
	if steps := d.caseSteps(b, reboot.RemediationID); !slices.Equal(steps, []string{"draining", "remediating", "verifying", "returned"}) {
		t.Errorf("reboot's steps %v", steps)
	}

	// Audited under the operator's token, refusals included.
	audit, err := d.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "nodes.", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range audit {
		if e.Action == "nodes.gpuReset" || e.Action == "nodes.reboot" {
			got = append(got, e.Action+" "+e.Outcome)
		}
	}
	slices.Sort(got)
	want := []string{"nodes.gpuReset denied", "nodes.gpuReset ok", "nodes.reboot CONFLICT", "nodes.reboot denied", "nodes.reboot ok"}
	if !slices.Equal(got, want) {
		t.Errorf("audit %v, want %v", got, want)
	}
	// The node's and the GPU's history.
	var hist struct {
		Remediations []struct {
			ID      string `json:"id"`
			GPUUUID string `json:"gpuUuid"`
			Action  string `json:"action"`
			State   string `json:"state"`
			Reason  string `json:"reason"`
		} `json:"remediations"`
	}
	d.cliJSON(&hist, d.viaAPI("remediation", "list", "--node", a)...)
	if len(hist.Remediations) != 1 || hist.Remediations[0].GPUUUID != reset.GPUUUID || hist.Remediations[0].Action != "gpu.reset" ||
		hist.Remediations[0].State != "returned" {
		t.Errorf("history of node %s: %+v", a, hist.Remediations)
	}
}
