package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// Rollouts of bcd end to end (issue 20), on the production shape: one api,
// one gateway and two worker processes on PostgreSQL, the release folder
// (downloads.dir) holding releases built by the test with go build and
// signed with the project's release signing (release manifest, release
// sign), their key pinned (downloads.releasePins). Three real `bcd node`
// processes and FakeDaemons hold real sessions. Soaks and timeouts are
// compressed; the rollout reconciler steps every 200 ms.

const (
	relA       = "0.1.0" // what every node runs first
	relB       = "0.2.0" // the good release
	relFail    = "0.3.0" // a bcd that exits at once: it fails its trial
	relSick    = "0.4.0" // starts, then turns unhealthy (played by the FakeDaemons)
	rolloutDur = 90 * time.Second
)

// rolloutEnv is the deployment and its release folder.
type rolloutEnv struct {
	*splitDeployment
	dist, key, pin, pins string
	bc                   string // the better-compute binary
	server               string // the API origin, for the CLI
	token                string
}

func newRolloutEnv(t *testing.T) *rolloutEnv {
	t.Helper()
	return newRolloutEnvWith(t, "")
}

// newRolloutEnvWith is newRolloutEnv with extra lines under the rollouts
// key of the configuration (two-space indented, such as
// "  healthGate:\n    minNodeHours: 0.001\n").
func newRolloutEnvWith(t *testing.T, rolloutsConfig string) *rolloutEnv {
	t.Helper()
	bc := testenv.Binary(t, "better-compute")
	dir := t.TempDir()
	e := &rolloutEnv{dist: filepath.Join(dir, "dist"), key: filepath.Join(dir, "keys", "release.key"), bc: bc}
	out := runOK(t, nil, bc, "release", "keygen", "--out", e.key)
	e.pin = regexp.MustCompile(`pin:\s+(sha256/\S+)`).FindStringSubmatch(out)[1]
	e.pins = testenv.WriteFile(t, "release-pins", e.pin+"\n")
	e.release(t, relA, bcdAt(t, relA))
	e.release(t, relB, bcdAt(t, relB))
	e.release(t, relFail, exitingBinary(t))
	e.release(t, relSick, bcdAt(t, relB))
	e.splitDeployment = newSplitDeploymentWith(t, 1, 2, func([]string) string {
		return fmt.Sprintf("downloads:\n  dir: %s\n  releasePins: [%s]\nrollouts:\n  interval: 200ms\n%s", e.dist, e.pin, rolloutsConfig)
	})
	e.server = strings.TrimSuffix(e.api, "/api")
	e.token = e.admin.Token
	return e
}

// release signs bin as bcd's release version in the release folder.
func (e *rolloutEnv) release(t *testing.T, version, bin string) {
	t.Helper()
	rdir := filepath.Join(e.dist, version)
	copyFile(t, bin, filepath.Join(rdir, buildDir("bcd"), "bcd"), 0o755)
	runOK(t, nil, e.bc, "release", "manifest", "--dist", rdir, "--version", version, "--expires", "24h")
	runOK(t, nil, e.bc, "release", "sign", "--key", e.key, "--in", filepath.Join(rdir, "manifest.json"))
}

// runOK runs a program and fails the test when it fails.
func runOK(t *testing.T, env []string, bin string, args ...string) string {
	t.Helper()
	code, stdout, stderr := testenv.Run(t, env, "", bin, args...)
	if code != 0 {
		t.Fatalf("%s %s: exit %d\n%s%s", filepath.Base(bin), strings.Join(args, " "), code, stdout, stderr)
	}
	return stdout
}

// cli runs an API command of better-compute against the deployment.
func (e *rolloutEnv) cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	args = append(args, "--server", e.server, "--token", e.token)
	return testenv.Run(t, e.env, "", e.bin, append([]string{"--config", e.cfgFile}, args...)...)
}

// pool makes a pool and a join token for n daemons of it.
func (e *rolloutEnv) newPool(t *testing.T, name string, n int) (*store.Pool, string) {
	t.Helper()
	ctx := context.Background()
	site, err := e.st.SiteGet(ctx, "rollouts")
	if err != nil {
		if site, err = e.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "rollouts", Region: "default"}); err != nil {
			t.Fatal(err)
		}
	}
	pool, err := e.st.PoolCreate(ctx, &store.PoolCreateParams{Name: name, SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := bootstrap.LoadBundle(ctx, e.st, testSecret)
	if err != nil {
		t.Fatal(err)
	}
	token, _, err := api.CreateJoinToken(ctx, e.st, bundle.GatewayPin(), pool.ID, time.Hour, n, "rollouts e2e", "")
	if err != nil {
		t.Fatal(err)
	}
	return pool, token
}

// fakes joins n FakeDaemons on version A with token; run starts them.
func (e *rolloutEnv) joinFakes(t *testing.T, prefix, token string, n int) []*sim.FakeDaemon {
	t.Helper()
	return e.joinFakesWith(t, prefix, token, n, false)
}

// joinFakesWith is joinFakes whose daemons send their inventory (eight
// simulated GPUs each) when withInventory is set.
func (e *rolloutEnv) joinFakesWith(t *testing.T, prefix, token string, n int, withInventory bool) []*sim.FakeDaemon {
	t.Helper()
	fl, err := sim.NewFleet(sim.FleetConfig{GatewayURL: e.gateways[0].url, Token: token, N: n, NamePrefix: prefix, NoInventory: !withInventory,
		Session: session.Config{StartJitter: -1, BackoffBase: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fl.Join(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, d := range fl.Daemons() {
		d.SetVersion(relA)
	}
	return fl.Daemons()
}

// runDaemons runs daemons until the test ends.
func runDaemons(t *testing.T, ds []*sim.FakeDaemon) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, len(ds))
	for _, d := range ds {
		go func() { _ = d.Run(ctx); done <- struct{}{} }()
	}
	t.Cleanup(func() {
		cancel()
		for range ds {
			<-done
		}
	})
}

// realNode installs bcd A in its own folder, joins it with token and runs
// `bcd node`; it returns the process and its data directory.
func (e *rolloutEnv) realNode(t *testing.T, name, token string) *testenv.Proc {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	bin := filepath.Join(dir, "bin", "bcd")
	copyFile(t, bcdAt(t, relA), bin, 0o755)
	tokFile := testenv.WriteFile(t, name+"-token", token)
	data := filepath.Join(dir, "data")
	runOK(t, nil, bin, "join", "--gateway", e.gateways[0].url, "--token-file", tokFile, "--data-dir", data)
	p := testenv.Start(t, nil, bin, "node", "--data-dir", data, "--release-pins-file", e.pins, "--upgrade-health-timeout", "20s")
	p.WaitLine(`msg="Session established"`, 60*time.Second)
	return p
}

// rollout runs rollouts create and returns the rollout's id. Without a
// --bake in args it passes --bake 0s: the rollouts of issue 20's tests end
// with their last wave (the default bake is 10 min).
func (e *rolloutEnv) rollout(t *testing.T, args ...string) string {
	t.Helper()
	if !slices.Contains(args, "--bake") {
		args = append(args, "--bake", "0s")
	}
	code, stdout, stderr := e.cli(t, append([]string{"rollouts", "create"}, args...)...)
	if code != 0 {
		t.Fatalf("rollouts create %v: exit %d\n%s%s", args, code, stdout, stderr)
	}
	return regexp.MustCompile(`roll_[a-z0-9]+`).FindString(stdout)
}

// await waits for the rollout to reach state.
func (e *rolloutEnv) await(t *testing.T, id, state string) *store.Rollout {
	t.Helper()
	var ro *store.Rollout
	eventually(t, rolloutDur, func() bool {
		var err error
		ro, err = e.st.RolloutGet(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if state != store.RolloutFailed && ro.State == store.RolloutFailed {
			t.Fatalf("rollout %s failed: %s", id, ro.Reason)
		}
		return ro.State == state
	}, func() string {
		s := fmt.Sprintf("rollout %s is %s (wave %d, %q), want %s", id, ro.State, ro.CurrentWave, ro.Reason, state)
		nodes, _ := e.st.RolloutNodes(context.Background(), id)
		for _, n := range nodes {
			s += fmt.Sprintf("\n  %s %s wave %d %s v%s %q", n.NodeID, n.Hostname, n.Wave, n.State, n.BCDVersion, n.Reason)
		}
		return s
	})
	return ro
}

// rolloutEvents is what the event stream says of a rollout.
type rolloutEvents struct {
	types    []string
	maxOut   int            // the most of its nodes out of service at once
	upgrades map[string]int // upgrade commands sent, by node
	order    []string       // nodes in the order they were upgraded
	waves    []events.RolloutWaveData
}

func (e *rolloutEnv) eventsOf(t *testing.T, id string) rolloutEvents {
	t.Helper()
	entries, err := e.st.OutboxQuery(context.Background(), &store.OutboxQueryParams{Key: id, Ascending: true, Limit: store.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	h := rolloutEvents{upgrades: map[string]int{}}
	out := map[string]bool{}
	for _, en := range entries {
		env, err := events.Parse(en.Payload)
		if err != nil {
			t.Fatal(err)
		}
		h.types = append(h.types, env.Type)
		if env.Type == events.RolloutWaveStarted {
			var w events.RolloutWaveData
			_ = json.Unmarshal(env.Data, &w)
			h.waves = append(h.waves, w)
		}
		var d events.RolloutNodeData
		if json.Unmarshal(env.Data, &d) != nil || d.NodeID == "" {
			continue
		}
		switch d.State {
		case store.RolloutNodeDraining, store.RolloutNodeUpgrading, store.RolloutNodeSoaking, store.RolloutNodeRollingBack:
			out[d.NodeID] = true
		default:
			delete(out, d.NodeID)
		}
		if d.State == store.RolloutNodeUpgrading {
			h.upgrades[d.NodeID]++
		}
		if d.State == store.RolloutNodeUpgraded {
			h.order = append(h.order, d.NodeID)
		}
		h.maxOut = max(h.maxOut, len(out))
	}
	return h
}

// upgradeCommands counts a node's upgrade commands.
func (e *rolloutEnv) upgradeCommands(t *testing.T, node string) int {
	t.Helper()
	cmds, err := e.st.CommandList(context.Background(), &store.CommandListParams{NodeID: node})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range cmds {
		if c.Kind == "upgrade" {
			n++
		}
	}
	return n
}

func TestRollouts(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t)
	ctx := context.Background()

	// Pool main: three real bcd nodes now, 50 FakeDaemons joined but not
	// yet running (offline), all on A.
	main, token := e.newPool(t, "main", 53)
	var real []*testenv.Proc
	for i := range 3 {
		real = append(real, e.realNode(t, fmt.Sprintf("bcd-%d", i+1), token))
	}
	fakes := e.joinFakes(t, "main", token, 50)
	realIDs := func() []string {
		nodes, err := e.st.NodeList(ctx, &store.NodeListParams{PoolID: main.ID, ListParams: store.ListParams{Limit: store.MaxListLimit}})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, n := range nodes {
			if strings.HasPrefix(n.Hostname, "main") {
				continue
			}
			ids = append(ids, n.ID)
		}
		return ids
	}()
	if len(realIDs) != 3 {
		t.Fatalf("real nodes %v, want 3", realIDs)
	}

	t.Run("refused releases", func(t *testing.T) {
		for _, v := range []string{"9.9.9", "v2"} {
			code, _, stderr := e.cli(t, "rollouts", "create", "--version", v, "--pool", "main")
			if code != 2 || !strings.Contains(stderr, "version") {
				t.Errorf("rollouts create --version %s: exit %d %q, want 2 naming the version", v, code, stderr)
			}
		}
	})

	t.Run("a failing trial halts after the canary", func(t *testing.T) {
		// The canary is a real bcd (the FakeDaemons are offline): its
		// trial fails, bcd restores A itself, the rollout halts.
		id := e.rollout(t, "--version", relFail, "--pool", "main", "--canary", "1", "--wave", "10", "--soak", "1s", "--timeout", "40s")
		ro := e.await(t, id, store.RolloutHalted)
		t.Logf("halted: %s", ro.Reason)
		if !slices.Contains(realIDs, ro.FailedNodeID) || !strings.Contains(ro.Reason, "failed to start") {
			t.Errorf("failed node %s (%q), want a real bcd whose trial failed", ro.FailedNodeID, ro.Reason)
		}
		nodes, _ := e.st.RolloutNodes(ctx, id)
		for _, n := range nodes {
			touched := n.NodeID == ro.FailedNodeID
			if touched != (n.UpgradeCommandID != "") || (!touched && n.State != store.RolloutNodePending) {
				t.Errorf("%s: %s, upgrade %q (the canary is %s)", n.NodeID, n.State, n.UpgradeCommandID, ro.FailedNodeID)
			}
		}
		eventually(t, 30*time.Second, func() bool {
			n, _ := e.st.NodeGet(ctx, ro.FailedNodeID)
			_, err := e.st.SessionGet(ctx, ro.FailedNodeID)
			return n.BCDVersion == relA && err == nil
		}, func() string { return "the canary is not back on " + relA })
		// Never a new wave while halted; abort frees the pool.
		if cur, _ := e.st.RolloutGet(ctx, id); cur.CurrentWave != 1 {
			t.Errorf("halted rollout in wave %d", cur.CurrentWave)
		}
		if code, stdout, stderr := e.cli(t, "rollouts", "abort", id, "--reason", "bad release"); code != 0 {
			t.Fatalf("abort: %d %s%s", code, stdout, stderr)
		}
	})

	t.Run("A to B in waves", func(t *testing.T) {
		runDaemons(t, fakes)
		eventually(t, 30*time.Second, func() bool {
			n := 0
			for _, d := range fakes {
				if _, err := e.st.SessionGet(ctx, d.NodeID()); err == nil {
					n++
				}
			}
			return n == len(fakes)
		}, func() string { return "the FakeDaemons are not all connected" })
		if code, stdout, stderr := e.cli(t, "pools", "set-budget", "main", "--budget", "20%"); code != 0 {
			t.Fatalf("set-budget: %d %s%s", code, stdout, stderr)
		}
		id := e.rollout(t, "--version", relB, "--pool", "main", "--canary", "1", "--wave", "10", "--max-unavailable", "8",
			"--soak", "1s", "--timeout", "40s")
		code, stdout, stderr := e.cli(t, "rollouts", "get", id, "--watch", "--every", "500ms")
		t.Logf("rollouts get --watch: exit %d\n%s%s", code, stdout, stderr)
		if code != 0 || !strings.Contains(stdout, "completed") {
			t.Fatalf("watch: exit %d", code)
		}
		ro := e.await(t, id, store.RolloutCompleted)
		h := e.eventsOf(t, id)
		if len(h.waves) == 0 || !h.waves[0].Canary || len(h.waves[0].NodeIDs) != 1 || len(h.order) == 0 || h.order[0] != h.waves[0].NodeIDs[0] {
			t.Errorf("canary first: waves %+v, upgraded in order %v", h.waves, h.order)
		}
		if h.maxOut > 8 {
			t.Errorf("%d nodes out at once, want at most 8 (--max-unavailable)", h.maxOut)
		}
		t.Logf("%d waves, at most %d nodes out at once, %d events", ro.CurrentWave, h.maxOut, len(h.types))
		for _, typ := range []string{events.RolloutCreated, events.RolloutStarted, events.RolloutWaveStarted, events.RolloutNodeDraining,
			events.RolloutNodeUpgrading, events.RolloutNodeSoaking, events.RolloutNodeUpgraded, events.RolloutWaveCompleted, events.RolloutCompleted} {
			if !slices.Contains(h.types, typ) {
				t.Errorf("no %s in the event stream", typ)
			}
		}
		nodes, _ := e.st.RolloutNodes(ctx, id)
		for _, n := range nodes {
			if n.State != store.RolloutNodeUpgraded || n.BCDVersion != relB || h.upgrades[n.NodeID] != 1 {
				t.Errorf("%s (%s): %s on %s after %d upgrades, want upgraded on %s after 1", n.NodeID, n.Hostname, n.State, n.BCDVersion,
					h.upgrades[n.NodeID], relB)
			}
		}
		for _, d := range fakes {
			if d.Upgrades() != 1 {
				t.Errorf("%s ran %d upgrades", d.Name(), d.Upgrades())
			}
		}
		for _, p := range real {
			if !strings.Contains(p.Output(), "version=0.2.0") {
				t.Errorf("a real bcd did not restart on %s", relB)
			}
		}
	})

	t.Run("unhealthy during the soak rolls the wave back", func(t *testing.T) {
		_, tok := e.newPool(t, "sick", 4)
		ds := e.joinFakes(t, "sick", tok, 4)
		for _, d := range ds {
			d.SetRelease(relSick, sim.Release{UnhealthyAfter: 500 * time.Millisecond, DownFor: 3 * time.Second})
		}
		runDaemons(t, ds)
		if code, _, stderr := e.cli(t, "pools", "set-budget", "sick", "--budget", "2"); code != 0 {
			t.Fatal(stderr)
		}
		id := e.rollout(t, "--version", relSick, "--pool", "sick", "--canary", "2", "--wave", "2", "--soak", "10s", "--timeout", "20s")
		ro := e.await(t, id, store.RolloutHalted)
		t.Logf("halted: %s", ro.Reason)
		if !strings.Contains(ro.Reason, "unhealthy during the soak") {
			t.Errorf("reason %q", ro.Reason)
		}
		nodes, _ := e.st.RolloutNodes(ctx, id)
		for _, n := range nodes {
			if n.Wave == 1 && (n.State != store.RolloutNodeRolledBack || n.BCDVersion != relA || n.RollbackCommandID == "") {
				t.Errorf("canary %s: %s on %s, want rolled back to %s by command", n.NodeID, n.State, n.BCDVersion, relA)
			}
			if n.Wave != 1 && n.State != store.RolloutNodePending {
				t.Errorf("%s outside the wave: %s", n.NodeID, n.State)
			}
		}
	})

	t.Run("two quarantined of ten and a budget of three: one at a time", func(t *testing.T) {
		pool, tok := e.newPool(t, "budget", 10)
		ds := e.joinFakes(t, "budget", tok, 10)
		runDaemons(t, ds)
		if err := e.st.PoolSetBudget(ctx, &store.PoolSetBudgetParams{PoolID: pool.ID, Spec: "3"}); err != nil {
			t.Fatal(err)
		}
		for _, d := range ds[:2] {
			if a, err := e.st.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: d.NodeID(), Reason: store.DisruptionQuarantined,
				Owner: "remediation:e2e"}); err != nil || !a.Admitted {
				t.Fatalf("quarantine: %+v %v", a, err)
			}
		}
		id := e.rollout(t, "--version", relB, "--pool", "budget", "--canary", "1", "--wave", "3", "--max-unavailable", "3",
			"--soak", "300ms", "--timeout", "20s")
		e.await(t, id, store.RolloutCompleted)
		if h := e.eventsOf(t, id); h.maxOut != 1 {
			t.Errorf("%d nodes upgraded at once, want 1", h.maxOut)
		}
		for _, d := range ds {
			want := relB
			if d == ds[0] || d == ds[1] {
				want = relA
			}
			if d.Version() != want {
				t.Errorf("%s on %s, want %s", d.Name(), d.Version(), want)
			}
		}
	})

	t.Run("kill -9 of the worker mid-wave", func(t *testing.T) {
		_, tok := e.newPool(t, "kill", 12)
		ds := e.joinFakes(t, "kill", tok, 12)
		runDaemons(t, ds)
		if code, _, stderr := e.cli(t, "pools", "set-budget", "kill", "--budget", "4"); code != 0 {
			t.Fatal(stderr)
		}
		id := e.rollout(t, "--version", relB, "--pool", "kill", "--canary", "1", "--wave", "4", "--soak", "2s", "--timeout", "60s")
		// Mid-wave: the second wave has nodes upgrading or soaking.
		eventually(t, rolloutDur, func() bool {
			nodes, _ := e.st.RolloutNodes(ctx, id)
			for _, n := range nodes {
				if n.Wave == 2 && (n.State == store.RolloutNodeSoaking || n.State == store.RolloutNodeUpgrading) {
					return true
				}
			}
			return false
		}, func() string { return "the second wave never started" })
		l, err := e.st.LeaseGet(ctx, shard.LeaseName(store.ShardOf(id)))
		if err != nil {
			t.Fatal(err)
		}
		victim := e.worker(l.Holder)
		victim.p.Kill()
		t.Logf("kill -9 of %s, the holder of %s", victim.name, l.Name)
		e.await(t, id, store.RolloutCompleted)
		if l2, _ := e.st.LeaseGet(ctx, l.Name); l2.Holder == l.Holder || l2.Epoch <= l.Epoch {
			t.Errorf("lease %s still %s at epoch %d", l.Name, l2.Holder, l2.Epoch)
		}
		for _, d := range ds {
			if d.Upgrades() != 1 || d.Version() != relB || e.upgradeCommands(t, d.NodeID()) != 1 {
				t.Errorf("%s: %d upgrades run, %d commands, on %s; want 1, 1, %s", d.Name(), d.Upgrades(), e.upgradeCommands(t, d.NodeID()), d.Version(), relB)
			}
		}
	})
}
