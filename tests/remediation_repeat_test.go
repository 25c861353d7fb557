package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestRepeatedXIDHoldsNodeForAPerson (issue 32, item 2; NVSentinel's
// RepeatedXIDErrorOnSameGPU): with real processes — serve (embedded SQLite)
// and two real bcds built with nvmlmock — XID 79 flapping on GPU 3 of one
// node: the first is rebooted (the test plays the reboot: a new boot id and
// bcd started again), verified and returned; the next, on the same GPU,
// holds the node for a person (escalated, reason repeated, the first case
// in the event's history), and the ones raised after it add nothing (bcd
// reports no new XID event for a GPU that already reads failed; one that
// came would join the open case): one reboot in all. A healthy neighbour's XID 95 meanwhile is reset and returned.
func TestRepeatedXIDHoldsNodeForAPerson(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n",
		// The breaker admits both nodes of this two-node pool (its default,
		// 10 % of the GPU nodes and at least 1 in 10 min, would hold the
		// neighbour: TestBreakerShareOfPool is about that).
		top: "remediation:\n  interval: 500ms\n  verifySettle: 2s\n  verifyTimeout: 60s\n  actionTimeout: 60s\n" +
			"  breaker:\n    share: 100%\n",
	})
	tokenFile, _ := d.joinToken(2, time.Hour)
	mockBCD := testenv.BinaryTags(t, "bcd", "nvmlmock")
	type machineRun struct {
		m     *machine
		node  string
		stub  string
		np    *testenv.Proc
		start func() *testenv.Proc
	}
	run := func(name string) *machineRun {
		m := newMachine(t, name)
		r := &machineRun{m: m, node: m.mustJoin(d.gatewayURL, tokenFile), stub: t.TempDir()}
		writeScript(t, filepath.Join(r.stub, "systemctl"), "#!/bin/sh\necho \"$*\" >>"+shellQuote(filepath.Join(r.stub, "systemctl.log"))+"\n")
		writeScript(t, filepath.Join(r.stub, "nvidia-smi"), "#!/bin/sh\necho \"$*\" >>"+shellQuote(filepath.Join(r.stub, "nvidia-smi.log"))+"\n")
		gm := m.tm()
		gm.BCD = mockBCD
		bin, args := gm.Argv("node", "--data-dir", m.dataDir, "--plugin-dir", t.TempDir(),
			"--bmc-file", filepath.Join(t.TempDir(), "none.yaml"))
		r.start = func() *testenv.Proc {
			p := testenv.Start(t, []string{"PATH=" + r.stub + ":" + os.Getenv("PATH")}, bin, args...)
			p.WaitLine(`NVML is go-nvml's mock DGX A100`, 60*time.Second)
			p.WaitLine(sessionEstablished.String(), 60*time.Second)
			return p
		}
		r.np = r.start()
		return r
	}
	flap, neighbour := run("gpu-flap"), run("gpu-neighbour")
	nodeOf := func(id string) *store.Node {
		n, err := d.st.NodeGet(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	cases := func(id string) []*store.Remediation {
		list, err := d.st.RemediationList(t.Context(), &store.RemediationListParams{NodeID: id})
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(list, func(a, b *store.Remediation) int { return a.CreatedAt.Compare(b.CreatedAt) })
		return list
	}
	describe := func(id string) func() string {
		return func() string {
			var s []string
			for _, c := range cases(id) {
				s = append(s, c.State+" "+c.Action+": "+c.Reason)
			}
			return id + " cases: " + strings.Join(s, " | ")
		}
	}
	for _, r := range []*machineRun{flap, neighbour} {
		eventually(t, 60*time.Second, func() bool {
			n := nodeOf(r.node)
			return n.State == store.NodeReady && strings.Contains(string(n.Inventory), gputest.UUID(7))
		}, func() string { return r.node + " not ready with its inventory: " + nodeOf(r.node).State })
	}
	raise := func(r *machineRun, lines, pattern string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(r.m.dataDir, "nvmlmock-xids"), []byte(lines), 0o600); err != nil {
			t.Fatal(err)
		}
		// Wait for this raise's own line: the mock reads (and removes)
		// the file once per signal, so raises must not overlap.
		before := len(regexp.MustCompile(pattern).FindAllString(r.np.Output(), -1))
		r.np.Signal(syscall.SIGUSR1)
		eventually(t, 30*time.Second, func() bool {
			return len(regexp.MustCompile(pattern).FindAllString(r.np.Output(), -1)) > before
		}, func() string { return "no new line " + pattern })
	}
	logOf := func(r *machineRun, name string) string {
		b, _ := os.ReadFile(filepath.Join(r.stub, name))
		return string(b)
	}

	// The first XID 79: the reboot is asked for; the test plays it.
	raise(flap, "3 79\n", `msg="Mock XID raised" .*gpu_index=3 xid=79`)
	eventually(t, 60*time.Second, func() bool { return strings.Contains(logOf(flap, "systemctl.log"), "reboot") },
		describe(flap.node))
	flap.np.Kill()
	if err := os.WriteFile(flap.m.bootIDFile, []byte("boot-after-reboot-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	flap.np = flap.start()
	eventually(t, 90*time.Second, func() bool {
		cs := cases(flap.node)
		return len(cs) == 1 && cs[0].State == store.RemediationReturned
	}, describe(flap.node))
	first := cases(flap.node)[0]

	// It comes back on GPU 3, again and again; the neighbour's XID 95 in
	// the middle.
	for i := range 4 {
		raise(flap, "3 79\n", `msg="Mock XID raised" .*gpu_index=3 xid=79`)
		if i == 0 {
			eventually(t, 60*time.Second, func() bool {
				cs := cases(flap.node)
				return len(cs) == 2 && cs[1].State == store.RemediationEscalated
			}, describe(flap.node))
			raise(neighbour, "5 95\n", `msg="Mock XID raised" .*gpu_index=5 xid=95`)
		}
	}
	eventually(t, 90*time.Second, func() bool {
		cs := cases(neighbour.node)
		return len(cs) == 1 && (cs[0].State == store.RemediationReturned || cs[0].State == store.RemediationEscalated)
	}, describe(neighbour.node))
	if got := strings.Count(logOf(flap, "systemctl.log"), "reboot"); got != 1 {
		t.Errorf("flapping node asked to reboot %d times, want 1", got)
	}
	cs := cases(flap.node)
	if len(cs) != 2 {
		t.Fatalf("flapping node has %d cases, want 2 (the reboot, the hold): %s", len(cs), describe(flap.node)())
	}
	held := cs[1]
	if held.State != store.RemediationEscalated || !strings.HasPrefix(held.Reason, "repeated:") || len(held.CommandIDs) != 0 ||
		held.GPUUUID != gputest.UUID(3) {
		t.Errorf("second case: %s, reason %q, %d actions, gpu %s; want escalated, repeated, none, GPU 3",
			held.State, held.Reason, len(held.CommandIDs), held.GPUUUID)
	}
	if n := nodeOf(flap.node); !n.Cordoned || n.Disruption != store.DisruptionQuarantined {
		t.Errorf("held node: cordoned %v, disruption %q", n.Cordoned, n.Disruption)
	}
	es, err := d.st.OutboxQuery(t.Context(), &store.OutboxQueryParams{Key: flap.node, TopicPrefix: events.RemediationEscalated, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 1 {
		t.Fatalf("%d remediation.escalated events, want 1", len(es))
	}
	var env struct {
		Data events.RemediationData `json:"data"`
	}
	if err := json.Unmarshal(es[0].Payload, &env); err != nil {
		t.Fatal(err)
	}
	if env.Data.RemediationID == "" {
		if err := json.Unmarshal(es[0].Payload, &env.Data); err != nil {
			t.Fatal(err)
		}
	}
	if h := env.Data.History; len(h) != 1 || h[0].RemediationID != first.ID || h[0].Action != "reboot" || h[0].Actions != 1 ||
		!strings.HasPrefix(env.Data.Reason, "repeated:") {
		t.Errorf("escalated event: reason %q, history %+v; want repeated, case %s (one reboot)", env.Data.Reason, h, first.ID)
	}
	nc := cases(neighbour.node)[0]
	if nc.State != store.RemediationReturned || nc.Action != "gpu.reset" || nc.Attempts != 1 {
		t.Errorf("neighbour's XID 95: %s, action %s, %d attempts (%s); want returned after one gpu.reset", nc.State, nc.Action, nc.Attempts, nc.Reason)
	}
	if n := nodeOf(neighbour.node); n.Cordoned || n.Disruption != "" {
		t.Errorf("neighbour after its reset: cordoned %v, disruption %q", n.Cordoned, n.Disruption)
	}
	t.Logf("flap: %d reboot, then held (%s); neighbour's XID 95: %s after %s",
		strings.Count(logOf(flap, "systemctl.log"), "reboot"), held.Reason, nc.State, nc.Action)
}
