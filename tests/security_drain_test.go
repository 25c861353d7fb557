package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// drained is the line bcd logs when a Drain asks it to reconnect elsewhere,
// with the wait it chose.
var drained = regexp.MustCompile(`msg="Gateway asked the node to reconnect elsewhere".* delay=(\S+)`)

// TestGatewayRestartNotSilent (issue 29, item 2): serve (embedded SQLite)
// with a BMC agent configured — two real bcd machines of one site, one
// running the real bcx-ipmi, beside four FakeDaemons, every node with
// sealed credentials of OpenIPMI's ipmi_sim — is restarted (SIGTERM, then
// started again). Each node gets a Drain with a random delay of up to 20 s
// (drainDelay), waits a random share of it and then reconnects: most
// nodes' heartbeats stop for longer than the liveness window (three 1 s
// intervals; six nodes make it near certain some do). Before issue 29
// liveness made such a node unreachable and remediation opened a
// silent-node case, power cycling it through the agent; now liveness
// counts the delay the gateway gave, so no node goes unreachable, no case
// opens, no power command is sent and the BMC's chassis stays on.
func TestGatewayRestartNotSilent(t *testing.T) {
	t.Parallel()
	requireIPMITools(t)
	sim0 := startIPMISim(t)
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n    drainDelay: 20s\n",
		top:     "remediation:\n  interval: 500ms\n  actionTimeout: 60s\n",
	})
	tokenFile, _ := d.joinToken(6, time.Hour)
	agentM, nodeM := newMachine(t, "bmc-agent"), newMachine(t, "gpu-drained")
	agent, node := agentM.mustJoin(d.gatewayURL, tokenFile), nodeM.mustJoin(d.gatewayURL, tokenFile)

	plugins := filepath.Join(t.TempDir(), "plugins")
	copyFile(t, testenv.Binary(t, "bcx-ipmi"), filepath.Join(plugins, "bcx-ipmi"), 0o755)
	if err := os.Chmod(plugins, 0o755); err != nil {
		t.Fatal(err)
	}
	start := func(m *machine, pluginDir string) *testenv.Proc {
		t.Helper()
		bin, args := m.argv("node", "--data-dir", m.dataDir, "--plugin-dir", pluginDir,
			"--bmc-file", filepath.Join(t.TempDir(), "none.yaml"))
		p := testenv.Start(t, nil, bin, args...)
		p.WaitLine(sessionEstablished.String(), 30*time.Second)
		return p
	}
	procs := map[string]*testenv.Proc{agent: start(agentM, plugins), node: start(nodeM, t.TempDir())}
	fl, err := sim.NewFleet(sim.FleetConfig{GatewayURL: d.gatewayURL, Token: strings.TrimSpace(readFile(t, tokenFile)),
		N: 4, NamePrefix: "drained", NoInventory: true, Session: session.Config{StartJitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fl.Join(t.Context()); err != nil {
		t.Fatal(err)
	}
	ids := []string{agent, node}
	for _, fd := range fl.Daemons() {
		ids = append(ids, fd.NodeID())
	}
	runDaemons(t, fl.Daemons())
	ready := func() bool {
		n := d.nodes()
		for _, id := range ids {
			if n[id].State != "ready" {
				return false
			}
		}
		return true
	}
	list := func() string { return strings.TrimSpace(d.cli(d.viaAPI("nodes", "list")...)) }
	eventually(t, 30*time.Second, ready, func() string { return "nodes not ready: " + list() })
	// Every node has a BMC the agent can drive: a silent one would be
	// probed and power cycled (TestSilentNodePowerCycledThroughSiteAgent).
	for _, id := range ids {
		sealSimCredentials(t, d, id, sim0)
	}

	stopped := time.Now()
	d.serve.Stop(syscall.SIGTERM, 30*time.Second)
	d.start()
	for id, p := range procs {
		m := p.WaitLine(drained.String(), 30*time.Second)
		t.Logf("bcd node %s waits %s before it reconnects", id, m[1])
	}
	eventually(t, 60*time.Second, func() bool {
		for _, id := range ids {
			s, err := d.st.SessionGet(t.Context(), id)
			if err != nil || s.ConnectedAt.Before(stopped) {
				return false
			}
		}
		return ready()
	}, func() string { return "nodes not back after the restart: " + list() })
	for _, id := range ids {
		if s, err := d.st.SessionGet(t.Context(), id); err == nil {
			t.Logf("node %s reconnected %.1f s after the gateway stopped", id, s.ConnectedAt.Sub(stopped).Seconds())
		}
	}

	for _, id := range ids {
		if c := latestCase(t, d.st, id); c != nil {
			t.Errorf("remediation case for node %s after a gateway restart: %s %s (%s)", id, c.Finding, c.State, c.Reason)
		}
		es, err := d.st.OutboxQuery(t.Context(), &store.OutboxQueryParams{Key: id, TopicPrefix: "com.better-compute.node.un", Ascending: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			t.Errorf("node %s: %s while it waited out its reconnect delay", id, e.Topic)
		}
	}
	cmds, err := d.st.CommandList(t.Context(), &store.CommandListParams{NodeID: agent})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		if strings.HasPrefix(c.Kind, "power.") {
			t.Errorf("the BMC agent was sent %s (%s) after a gateway restart", c.Kind, c.State)
		}
	}
	// ipmi_sim's chassis control logs every operation: reads only.
	for l := range strings.SplitSeq(sim0.read(t, "log"), "\n") {
		if strings.HasPrefix(l, "set ") {
			t.Errorf("the BMC was told %q after a gateway restart", l)
		}
	}
	if got := sim0.read(t, "power"); got != "1" {
		t.Errorf("the BMC's chassis power is %q after a gateway restart, want 1 (on)", got)
	}
}
