package tests

import (
	"encoding/json"
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

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
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
// back (the test boots the machine, with a new boot id, and starts it
// again, as the machine's boot would), it is verified by its new boot id
// and returned to service. Every step is in the event stream in
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
	bootBefore := nodeBootID(t, d.st, silent)
	if want := readBootID(t, silentM); bootBefore != want {
		t.Fatalf("the silent node's recorded boot id %q, want its machine's %q", bootBefore, want)
	}

	sealSimCredentials(t, d, silent, sim)

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
			if !strings.HasPrefix(c.BootID, bootBefore+"|") {
				t.Errorf("the case recorded boot %q at the power cycle, want the node's boot id %s", c.BootID, bootBefore)
			}
			silentM.boot()
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
	if after, want := nodeBootID(t, d.st, silent), readBootID(t, silentM); after == bootBefore || after != want {
		t.Errorf("silent node's boot id after return %q (before %q), want its new boot's %q", after, bootBefore, want)
	}
}

// nodeBootID reads the boot id the store recorded for node.
func nodeBootID(t *testing.T, st store.Store, node string) string {
	t.Helper()
	n, err := st.NodeGet(t.Context(), node)
	if err != nil {
		t.Fatal(err)
	}
	return n.BootID
}

// readBootID reads m's current boot id.
func readBootID(t *testing.T, m *machine) string {
	t.Helper()
	b, err := os.ReadFile(m.bootIDFile)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
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
	cmds, diags := splitDiag(cmds)
	if len(cmds) != 1 || cmds[0].Kind != "reboot" {
		t.Errorf("node's commands: %d (want the one reboot)", len(cmds))
	}
	if len(diags) != 1 {
		t.Errorf("node's diagnostics before return: %d, want one across the worker kills", len(diags))
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

// TestXID79RebootThenPowerCycle: with real processes — serve (embedded
// SQLite), two real bcd machines of one site, the real bcx-ipmi on one
// (the site's BMC agent) and OpenIPMI's ipmi_sim as the other's BMC — the
// GPU node's bcd is the nvmlmock build (go-nvml's mock DGX A100;
// docs/gpu-health.md, "Test hook") with a stand-in systemctl first on its
// PATH that records what it is asked and reboots nothing. XID 79
// (ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, RESTART_BM) raised on GPU 3 quarantines the
// node, drains it and sends it a reboot command; when the stand-in has been
// asked to reboot, the test kills the node's bcd (a reboot that hangs) and
// does not start it again. The reboot is failed after verifyTimeout and the
// policy power cycles the node through the agent: ipmi_sim's chassis goes
// off and on, and its chassis-control script, on power on, gives the
// machine a new boot id and starts the node's bcd (the machine booting).
// The node connects again with a fresh mock (no XID) and the new boot id,
// is verified and returned to service. Every step is in the
// event stream in order.
func TestXID79RebootThenPowerCycle(t *testing.T) {
	t.Parallel()
	requireIPMITools(t)
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n",
		// The reboot's command outlives verifyTimeout, so that the
		// reboot is failed for not coming back, not for expiring.
		top: "remediation:\n  interval: 500ms\n  verifySettle: 2s\n  verifyTimeout: 40s\n  actionTimeout: 150s\n",
	})
	tokenFile, _ := d.joinToken(2, time.Hour)
	agentM, gpuM := newMachine(t, "bmc-agent"), newMachine(t, "gpu-xid79")
	agent, node := agentM.mustJoin(d.gatewayURL, tokenFile), gpuM.mustJoin(d.gatewayURL, tokenFile)
	mockBCD := testenv.BinaryTags(t, "bcd", "nvmlmock")

	plugins := filepath.Join(t.TempDir(), "plugins")
	copyFile(t, testenv.Binary(t, "bcx-ipmi"), filepath.Join(plugins, "bcx-ipmi"), 0o755)
	if err := os.Chmod(plugins, 0o755); err != nil {
		t.Fatal(err)
	}
	bin, args := agentM.argv("node", "--data-dir", agentM.dataDir, "--plugin-dir", plugins,
		"--bmc-file", filepath.Join(t.TempDir(), "none.yaml"))
	testenv.Start(t, nil, bin, args...).WaitLine(sessionEstablished.String(), 60*time.Second)

	// The GPU machine: a stand-in systemctl that records its arguments,
	// and the script its BMC's chassis control runs on power on.
	dir := t.TempDir()
	stub := filepath.Join(dir, "stub")
	asked := filepath.Join(dir, "systemctl.log")
	writeScript(t, filepath.Join(stub, "systemctl"), "#!/bin/sh\necho \"$*\" >>"+shellQuote(asked)+"\n")
	path := "PATH=" + stub + ":" + os.Getenv("PATH")
	gm := gpuM.tm()
	gm.BCD = mockBCD
	bin, args = gm.Argv("node", "--data-dir", gpuM.dataDir, "--plugin-dir", t.TempDir(),
		"--bmc-file", filepath.Join(t.TempDir(), "none.yaml"))
	pidFile, bootLog, boots := filepath.Join(dir, "bcd.pid"), filepath.Join(dir, "bcd-after-boot.log"), filepath.Join(dir, "boots")
	argv := []string{"env", "-i", path, "HOME=" + os.TempDir(), "TZ=UTC", bin}
	var cmdline []string
	for _, a := range append(argv, args...) {
		cmdline = append(cmdline, shellQuote(a))
	}
	// On: the machine boots (a new boot id) and starts its bcd, in a
	// session of its own with its output in a file (ipmi_sim waits for
	// the script, not for bcd), its pid recorded. Off: whatever runs there
	// dies.
	boot := writeScript(t, filepath.Join(dir, "boot"), fmt.Sprintf(`#!/bin/sh
pid=%[1]s
if [ -s "$pid" ] && kill -0 "$(cat "$pid")" 2>/dev/null; then exit 0; fi
echo boot >>%[2]s
cat /proc/sys/kernel/random/uuid >%[5]s || exit
setsid sh -c 'echo $$ >"$0"; exec "$@"' "$pid" %[3]s >>%[4]s 2>&1 </dev/null &
`, shellQuote(pidFile), shellQuote(boots), strings.Join(cmdline, " "), shellQuote(bootLog), shellQuote(gpuM.bootIDFile)))
	halt := writeScript(t, filepath.Join(dir, "halt"), fmt.Sprintf(`#!/bin/sh
pid=%[1]s
if [ -s "$pid" ]; then kill -9 "$(cat "$pid")" 2>/dev/null; fi
exit 0
`, shellQuote(pidFile)))
	chassis := writeScript(t, filepath.Join(dir, "chassis_control"), fmt.Sprintf(`#!/bin/sh
# plugins/ipmi/testdata/chassis_control, and the machine's power: on boots it, off halts it.
%[1]s "$@" || exit
[ "$2" = set ] || exit 0
shift 2
while [ $# -ge 2 ]; do
	case "$1 $2" in
	"power 1") %[2]s ;;
	"power 0") %[3]s ;;
	esac
	shift 2
done
`, shellQuote(filepath.Join(repoRoot(), "plugins", "ipmi", "testdata", "chassis_control")), shellQuote(boot), shellQuote(halt)))
	sim := startIPMISimWith(t, chassis)
	// The bcd the machine's boot started is the test's to stop.
	t.Cleanup(func() { stopPidFile(t, pidFile) })

	np := testenv.Start(t, []string{path}, bin, args...)
	np.WaitLine(`NVML is go-nvml's mock DGX A100`, 60*time.Second)
	np.WaitLine(sessionEstablished.String(), 60*time.Second)
	nodeOf := func(id string) *store.Node {
		n, err := d.st.NodeGet(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	eventually(t, 60*time.Second, func() bool {
		return nodeOf(agent).State == store.NodeReady && nodeOf(node).State == store.NodeReady &&
			strings.Contains(string(nodeOf(node).Inventory), gputest.UUID(7)) && runsIPMI(nodeOf(agent).Inventory)
	}, func() string {
		return "nodes not ready with their inventories: agent " + nodeOf(agent).State + ", node " + nodeOf(node).State
	})
	bootBefore := nodeOf(node).BootID
	if want := readBootID(t, gpuM); bootBefore != want {
		t.Fatalf("the node's recorded boot id %q, want its machine's %q", bootBefore, want)
	}

	sealSimCredentials(t, d, node, sim)

	// XID 79 on GPU 3.
	if err := os.WriteFile(filepath.Join(gpuM.dataDir, "nvmlmock-xids"), []byte("3 79\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	np.Signal(syscall.SIGUSR1)
	np.WaitLine(`msg="Mock XID raised" .*gpu_index=3 xid=79`, 30*time.Second)

	// Quarantined, drained and the reboot asked for: the stand-in says so.
	eventually(t, 120*time.Second, func() bool {
		b, _ := os.ReadFile(asked)
		return strings.Contains(string(b), "reboot")
	}, func() string {
		c := latestCase(t, d.st, node)
		if c == nil {
			return "no case for the node"
		}
		return "no reboot asked; case " + c.State + " action " + c.Action + ": " + c.Reason
	})
	rebootAsked := time.Since(start)
	c := latestCase(t, d.st, node)
	if !strings.HasPrefix(c.BootID, bootBefore+"|") {
		t.Errorf("the case recorded boot %q at the reboot, want the node's boot id %s", c.BootID, bootBefore)
	}
	if c.State != store.RemediationRemediating || c.Action != "reboot" || c.Finding != "xid" || c.XID != 79 ||
		c.Resolution != "RESTART_BM" || c.GPUUUID != gputest.UUID(3) || !nodeOf(node).Cordoned {
		t.Fatalf("when the reboot was asked: case %s action %s finding %s xid %d %s gpu %s, node cordoned %v",
			c.State, c.Action, c.Finding, c.XID, c.Resolution, c.GPUUUID, nodeOf(node).Cordoned)
	}
	// The node's inventory says GPU 3 failed (what verification reads).
	eventually(t, 60*time.Second, func() bool { return failedGPUs(nodeOf(node).Inventory) == gputest.UUID(3) },
		func() string { return "failed GPUs before the reboot: " + failedGPUs(nodeOf(node).Inventory) })
	// The reboot hangs: bcd is gone, the machine does not come back.
	np.Stop(syscall.SIGKILL, time.Second)

	eventually(t, 180*time.Second, func() bool {
		c := latestCase(t, d.st, node)
		return c.State == store.RemediationReturned || c.State == store.RemediationEscalated
	}, func() string {
		c := latestCase(t, d.st, node)
		return "case " + c.State + " action " + c.Action + ": " + c.Reason
	})
	took := time.Since(start)
	c = latestCase(t, d.st, node)
	if c.State != store.RemediationReturned {
		t.Fatalf("case %s: %s", c.State, c.Reason)
	}
	t.Logf("XID 79 → reboot asked in %v, → returned in %v", rebootAsked.Round(time.Millisecond), took.Round(time.Millisecond))

	// Every step in the event stream, in order: the node's GPU event, then
	// each remediation move with its action.
	es, err := d.st.OutboxQuery(t.Context(), &store.OutboxQueryParams{TopicPrefix: "com.better-compute.", Ascending: true,
		Limit: store.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, e := range es {
		env, err := events.Parse(e.Payload)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case env.Type == events.GPUHealthChanged:
			var data events.GPUHealthData
			if err := json.Unmarshal(env.Data, &data); err != nil {
				t.Fatal(err)
			}
			if data.NodeID == node {
				steps = append(steps, fmt.Sprintf("gpu.health-changed %s %d %s %s", data.Kind, data.XID, data.Resolution, data.GPUUUID))
				t.Logf("event %s: %s %s xid %d %s %s", e.CreatedAt.Format("15:04:05.000"), env.Type, data.Kind, data.XID, data.XIDMnemonic, data.Resolution)
			}
		case strings.HasPrefix(env.Type, "com.better-compute.remediation.") && e.Key == node:
			var data events.RemediationData
			if err := json.Unmarshal(env.Data, &data); err != nil {
				t.Fatal(err)
			}
			steps = append(steps, strings.TrimPrefix(e.Topic, "com.better-compute.remediation.")+" "+data.Action)
			t.Logf("event %s: %s %s attempts %d: %s", e.CreatedAt.Format("15:04:05.000"), env.Type, data.Action, data.Attempts, data.Reason)
		}
	}
	want := []string{"gpu.health-changed gpu.xid 79 RESTART_BM " + gputest.UUID(3),
		"detected reboot", "quarantined reboot", "draining reboot", "remediating reboot",
		"draining power-cycle", "remediating power-cycle", "verifying power-cycle", "returned power-cycle"}
	if !slices.Equal(steps, want) {
		t.Errorf("remediation steps of the node\n%q, want\n%q", steps, want)
	}
	if c.Finding != "xid" || c.Action != "power-cycle" || c.Attempts != 2 || len(c.CommandIDs) != 2 {
		t.Errorf("case finding %s action %s attempts %d commands %v", c.Finding, c.Action, c.Attempts, c.CommandIDs)
	}

	// The commands: one reboot on the node, asked of systemctl once (and
	// cancelled when the node did not come back, so that it is not
	// delivered again); one power cycle through the agent, with the node's
	// secret opened under a grant.
	cmds, err := d.st.CommandList(t.Context(), &store.CommandListParams{NodeID: node})
	if err != nil {
		t.Fatal(err)
	}
	cmds, diags := splitDiag(cmds)
	if len(diags) != 1 || diags[0].State != store.CommandSucceeded {
		t.Errorf("node's diagnostics before return: %d, want one that succeeded", len(diags))
	}
	if len(cmds) != 1 || cmds[0].Kind != "reboot" || cmds[0].ID != c.CommandIDs[0] ||
		(cmds[0].State != store.CommandCancelled && cmds[0].State != store.CommandLost) {
		for _, cmd := range cmds {
			t.Logf("node's command %s %s %s: %s", cmd.ID, cmd.Kind, cmd.State, cmd.Error)
		}
		t.Errorf("node's commands: %d, want the one reboot, cancelled or lost", len(cmds))
	} else {
		t.Logf("the reboot command ended %s: %s", cmds[0].State, cmds[0].Error)
	}
	if b, _ := os.ReadFile(asked); string(b) != "reboot\n" {
		t.Errorf("systemctl was asked %q, want one reboot", b)
	}
	cmds, err = d.st.CommandList(t.Context(), &store.CommandListParams{NodeID: agent})
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != 1 || cmds[0].Kind != "power.cycle" || cmds[0].State != store.CommandSucceeded || cmds[0].ID != c.CommandIDs[1] {
		for _, cmd := range cmds {
			t.Logf("agent's command %s %s %s: %s", cmd.ID, cmd.Kind, cmd.State, cmd.Error)
		}
		t.Errorf("agent's commands: %d, want the one power.cycle, succeeded", len(cmds))
	}
	audit, err := d.st.AuditQuery(t.Context(), &store.AuditQueryParams{Resource: "secret/bmc/" + node, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(audit, func(a *store.AuditEntry) bool {
		return a.Action == "secret.read-granted" && a.Actor == "node:"+agent && a.Outcome == "success"
	}) {
		t.Errorf("no granted secret read by the agent: %+v", audit)
	}

	// The BMC went off and on, and the boot started the node's bcd once.
	if log := sim.read(t, "log"); !strings.Contains(log, "set power 0") || !strings.Contains(log, "set power 1") {
		t.Errorf("chassis control log:\n%s", log)
	}
	if b, _ := os.ReadFile(boots); string(b) != "boot\n" {
		t.Errorf("boots %q, want one", b)
	}
	if b, _ := os.ReadFile(bootLog); !sessionEstablished.Match(b) {
		t.Errorf("the bcd the boot started has no session:\n%s", b)
	}
	if n := nodeOf(node); n.State != store.NodeReady || n.Cordoned || failedGPUs(n.Inventory) != "" ||
		!strings.Contains(string(n.Inventory), gputest.UUID(7)) {
		t.Errorf("node after return: %s, cordoned %v, inventory %s", n.State, n.Cordoned, n.Inventory)
	}
	if after, want := nodeOf(node).BootID, readBootID(t, gpuM); after == bootBefore || after != want {
		t.Errorf("node's boot id after return %q (before %q), want the new boot's %q", after, bootBefore, want)
	}
}

// inventory decodes a stored inventory (protojson of session.v1
// Inventory); an unreadable one is empty.
func inventory(b []byte) *sessionv1.Inventory {
	inv := &sessionv1.Inventory{}
	if protojson.Unmarshal(b, inv) != nil {
		return &sessionv1.Inventory{}
	}
	return inv
}

// failedGPUs lists the UUIDs of the GPUs an inventory says failed,
// comma-separated.
func failedGPUs(b []byte) string {
	var failed []string
	for _, g := range inventory(b).GetGpus() {
		if g.GetHealth().GetState() == sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED {
			failed = append(failed, g.GetUuid())
		}
	}
	return strings.Join(failed, ",")
}

// runsIPMI reports whether an inventory lists the ipmi plugin healthy.
func runsIPMI(b []byte) bool {
	return slices.ContainsFunc(inventory(b).GetPlugins(), func(p *sessionv1.PluginInfo) bool {
		return p.GetName() == "ipmi" && p.GetHealthy()
	})
}

// sealSimCredentials seals ipmi_sim's user and password as node's BMC
// credentials (bmc credentials set, through the API).
func sealSimCredentials(t *testing.T, d *deployment, node string, sim *ipmiSim) {
	t.Helper()
	pwFile := filepath.Join(t.TempDir(), "bmc-password")
	if err := os.WriteFile(pwFile, []byte(simPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.cli(d.viaAPI("bmc", "credentials", "set", "--node", node, "--address", "127.0.0.1", "--username", simUser,
		"--password-file", pwFile, "--providers", "ipmitool", "--ipmi-port", strconv.Itoa(sim.port), "--bmc-timeout", "10s")...)
}

// writeScript writes an executable file at path and returns path.
func writeScript(t *testing.T, path, body string) string {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// shellQuote quotes s for sh.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// stopPidFile stops the process whose pid file names it, if it runs:
// SIGTERM, then SIGKILL after 10 s.
func stopPidFile(t *testing.T, pidFile string) {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return
	}
	gone := func() bool {
		st, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
		if err != nil {
			return true
		}
		s := string(st)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		return len(f) > 0 && f[0] == "Z"
	}
	if gone() {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for deadline := time.Now().Add(10 * time.Second); !gone(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			return
		}
	}
}

// splitDiag splits a node's commands into its actions and the gpu.diag
// checks run before it returned (docs/remediation.md, "Diagnostic before
// return").
func splitDiag(cmds []*store.Command) (actions, diags []*store.Command) {
	for _, c := range cmds {
		if c.Kind == sessionv1.KindGPUDiag {
			diags = append(diags, c)
		} else {
			actions = append(actions, c)
		}
	}
	return actions, diags
}
