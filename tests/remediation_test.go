package tests

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/shard"
	"github.com/better-compute/better-compute/controlplane/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestSilentNodePowerCycledThroughSiteAgent: with real processes — serve
// (embedded SQLite), two real bcd machines of one site, the real bcx-ipmi
// and OpenIPMI's ipmi_sim as the BMC of one of them — the node whose bcd
// stops is made unreachable by liveness; the remediation reconciler asks its
// BMC through the other node (the site's BMC agent, running bcx-ipmi,
// granted the silent node's sealed BMC secret for each command), which
// says on: unresponsive; the node is quarantined and power cycled through
// the agent (ipmi_sim's chassis goes off and on); when the node's bcd comes
// back (the test starts it again, as the machine's boot would), it is
// verified and returned to service. Every step is in the event stream in
// order, and the agent's reads of the other node's secret are audited.
func TestSilentNodePowerCycledThroughSiteAgent(t *testing.T) {
	t.Parallel()
	requireIPMITools(t)
	sim := startIPMISim(t)
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n",
		top:     "remediation:\n  interval: 500ms\n  verifySettle: 2s\n  verifyTimeout: 60s\n  actionTimeout: 60s\n",
	})
	tokenFile, _ := d.joinToken(2, time.Hour)
	agentM, silentM := newMachine(t, "bmc-agent"), newMachine(t, "gpu-silent")
	agent, silent := agentM.mustJoin(d.gatewayURL, tokenFile), silentM.mustJoin(d.gatewayURL, tokenFile)

	plugins := filepath.Join(t.TempDir(), "plugins")
	copyFile(t, testenv.Binary(t, "bcx-ipmi"), filepath.Join(plugins, "bcx-ipmi"), 0o755)
	if err := os.Chmod(plugins, 0o755); err != nil {
		t.Fatal(err)
	}
	noPlugins := t.TempDir()
	startNode := func(m *machine, pluginDir string) *testenv.Proc {
		t.Helper()
		bin, args := m.argv("node", "--data-dir", m.dataDir, "--plugin-dir", pluginDir,
			"--bmc-file", filepath.Join(t.TempDir(), "none.yaml"))
		p := testenv.Start(t, nil, bin, args...)
		p.WaitLine(sessionEstablished.String(), 30*time.Second)
		return p
	}
	startNode(agentM, plugins)
	sp := startNode(silentM, noPlugins)
	eventually(t, 30*time.Second, func() bool { n := d.nodes(); return n[agent].State == "ready" && n[silent].State == "ready" },
		func() string { return "nodes not ready" })

	pwFile := filepath.Join(t.TempDir(), "bmc-password")
	if err := os.WriteFile(pwFile, []byte(simPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.cli(d.viaAPI("bmc", "credentials", "set", "--node", silent, "--address", "127.0.0.1", "--username", simUser,
		"--password-file", pwFile, "--providers", "ipmitool", "--ipmi-port", strconv.Itoa(sim.port), "--bmc-timeout", "10s")...)

	// The machine hangs: its bcd is gone, its BMC still says on.
	sp.Stop(syscall.SIGKILL, time.Second)
	var cycled bool
	var restarted *testenv.Proc
	eventually(t, 120*time.Second, func() bool {
		c := latestCase(t, d.st, silent)
		if c == nil {
			return false
		}
		if !cycled && c.Action == "power-cycle" && c.State == store.RemediationVerifying {
			// The cycle succeeded: the machine boots, and its bcd starts.
			cycled = true
			restarted = startNode(silentM, noPlugins)
		}
		return c.State == store.RemediationReturned
	}, func() string {
		c := latestCase(t, d.st, silent)
		if c == nil {
			return "no case for the silent node; nodes " + strings.TrimSpace(d.cli(d.viaAPI("nodes", "list")...))
		}
		return "case " + c.State + " action " + c.Action + ": " + c.Reason
	})
	if restarted == nil {
		t.Fatal("the node was returned without the power cycle")
	}

	es, err := d.st.OutboxQuery(t.Context(), &store.OutboxQueryParams{Key: silent, TopicPrefix: "com.better-compute.remediation.", Ascending: true})
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, e := range es {
		steps = append(steps, strings.TrimPrefix(e.Topic, "com.better-compute.remediation."))
	}
	want := []string{"detected", "quarantined", "draining", "remediating", "verifying", "returned"}
	if !slices.Equal(steps, want) {
		t.Errorf("remediation steps of the silent node %v, want %v", steps, want)
	}
	c := latestCase(t, d.st, silent)
	if c.Finding != "unresponsive" || len(c.CommandIDs) != 2 { // the probe and the cycle
		t.Errorf("case finding %s, commands %v", c.Finding, c.CommandIDs)
	}
	// The agent ran the probe and the cycle, each with the node's secret
	// opened under a grant.
	cmds, err := d.st.CommandList(t.Context(), &store.CommandListParams{NodeID: agent})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, cmd := range cmds {
		kinds[cmd.Kind] = cmd.State
	}
	if kinds["power.status"] != store.CommandSucceeded || kinds["power.cycle"] != store.CommandSucceeded {
		t.Errorf("agent's commands %v", kinds)
	}
	audit, err := d.st.AuditQuery(t.Context(), &store.AuditQueryParams{Resource: "secret/bmc/" + silent, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	granted := 0
	for _, a := range audit {
		if a.Action == "secret.read-granted" && a.Actor == "node:"+agent && a.Outcome == "success" {
			granted++
		}
	}
	if granted == 0 {
		t.Errorf("no granted secret read by the agent: %+v", audit)
	}
	if n := d.nodes()[silent]; n.State != "ready" {
		t.Errorf("silent node after return: %s", n.State)
	}
}

// latestCase reads node's newest remediation case from the store.
func latestCase(t *testing.T, st store.Store, node string) *store.Remediation {
	t.Helper()
	list, err := st.RemediationList(t.Context(), &store.RemediationListParams{NodeID: node})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) == 0 {
		return nil
	}
	slices.SortFunc(list, func(a, b *store.Remediation) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return list[len(list)-1]
}

// TestRemediationSurvivesWorkerKill: on the split deployment (PostgreSQL,
// api, gateway and two worker processes), a FakeDaemon raises XID 79
// (RESTART_BM) and takes 8 s to come back from its reboot; while the case
// is remediating, the worker holding the node's shard is killed with
// SIGKILL. The other worker takes the shard once the lease expires,
// resumes the case from its recorded state and returns the node: one
// reboot command, carried out once, and the moves audited under both
// workers.
func TestRemediationSurvivesWorkerKill(t *testing.T) {
	t.Parallel()
	d := newSplitDeploymentWith(t, 1, 2, func([]string) string {
		return "remediation:\n  interval: 500ms\n  verifySettle: 2s\n  verifyTimeout: 90s\n"
	})
	ctx := t.Context()
	f := d.joinFleet(ctx, 3)
	dm := f.daemons[0]
	node := dm.NodeID()
	dm.SetRecovery(sim.Recovery{RebootDelay: 8 * time.Second})
	if err := dm.RaiseXID(0, 79); err != nil {
		t.Fatal(err)
	}
	open := func() *store.Remediation {
		c, err := d.st.RemediationOpenFor(ctx, node)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	eventually(t, 60*time.Second, func() bool { c := open(); return c != nil && c.State == store.RemediationRemediating },
		func() string { return fmt.Sprintf("case %+v", open()) })
	holder, _ := d.leaseHolder(shard.LeaseName(store.ShardOf(node)))
	var killed *splitProc
	for _, w := range d.workers {
		if w.id == holder {
			killed = w
		}
	}
	if killed == nil {
		t.Fatalf("no worker holds the node's shard (holder %q)", holder)
	}
	killed.p.Kill()
	eventually(t, 90*time.Second, func() bool { c := latestCase(t, d.st, node); return c.State == store.RemediationReturned },
		func() string { c := latestCase(t, d.st, node); return "case " + c.State + ": " + c.Reason })

	cmds, err := d.st.CommandList(ctx, &store.CommandListParams{NodeID: node})
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 1 || cmds[0].Kind != "reboot" {
		t.Errorf("node's commands: %d (want the one reboot)", len(cmds))
	}
	if s := dm.FaultStats(); s.Reboots != 1 {
		t.Errorf("the daemon rebooted %d times, want once", s.Reboots)
	}
	c := latestCase(t, d.st, node)
	audit, err := d.st.AuditQuery(ctx, &store.AuditQueryParams{Resource: "remediation/" + c.ID, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	actors := map[string]bool{}
	for _, a := range audit {
		actors[a.Actor] = true
	}
	if !actors["remediation:"+killed.id] || len(actors) != 2 {
		t.Errorf("moves audited under %v: want the killed worker and the one that resumed", actors)
	}
	es, err := d.st.OutboxQuery(ctx, &store.OutboxQueryParams{Key: node, TopicPrefix: "com.better-compute.remediation.", Ascending: true})
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, e := range es {
		steps = append(steps, strings.TrimPrefix(e.Topic, "com.better-compute.remediation."))
	}
	if want := []string{"detected", "quarantined", "draining", "remediating", "verifying", "returned"}; !slices.Equal(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}
}
