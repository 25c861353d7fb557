package tests

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// rollingFrom is release N-1 of TestRollingUpgradeUnderLoad: the commit
// issue 40 was filed on (migrations 0001–0016; no processes table, no
// gateways drain, no host.gateway.limits or host.processes keys).
const rollingFrom = "8bb68ee6ca4eef262f0d1823df502e76d290ef87"

// rollingFromVersion is the version N-1 is stamped with: another than the
// current tree's test build (0.0.0-e2e), as two releases are, which is
// what tells a live N-1 gateway row from an N gateway process.
const rollingFromVersion = "0.0.0-e2e-previous"

// rollingContract is the contract migration that release N embeds in this
// test (the current tree has none newer than N-1): it drops a table the
// test creates for N-1, and sorts after every real migration, so N's
// processes declare it as their schema. It is laid over the tree for N's
// build only (testenv.BinaryOverlay).
const (
	rollingContractName = "9000_e2e_rolling_contract"
	rollingContract     = "-- contract\n" +
		"-- e2e only (tests/rolling_upgrade_test.go): stands for release N's contract\n" +
		"-- migration, dropping a shape only release N-1 needs.\n" +
		"DROP TABLE e2e_previous_shape;\n"
)

// rollingConfig is what every process reads, of either release: listeners
// on loopback (the gateways' ports come by flag, kept across an upgrade),
// heartbeats every 2 s and a 3 s drain window. Both releases know every
// key of it.
const rollingConfig = `host:
  listen: 127.0.0.1:0
  gateway:
    listen: 127.0.0.1:0
    heartbeatInterval: 2s
    drainDelay: 3s
`

// rollingNextConfig is what release N adds to rollingConfig, keys release
// N-1 does not have: the per-source gateway bounds of splitConfig (every
// FakeDaemon dials from 127.0.0.1) and processesConfig's compressed
// heartbeat. It goes after the tlsFiles lines.
const rollingNextConfig = `    limits: {pendingPerSource: 256, queuedPerSource: 4096, joinsPerSecond: 1000, joinBurst: 1000, handshakeTimeout: 10s}
` + processesConfig

// rollingDaemons is how many FakeDaemons run beside the real bcd, half
// joined through each gateway.
const rollingDaemons = 200

// TestRollingUpgradeUnderLoad (issue 40; docs/upgrade-control-plane.md,
// "Split roles"): an api, two workers and two gateways of release N-1 (the
// commit rollingFrom, built in a git worktree) run on PostgreSQL with 200
// FakeDaemons and one real bcd of N-1 while a stream of commands goes
// through the api (behind a load balancer in the test). The deployment
// moves to release N (this tree, with one contract migration laid over
// it) as the doc orders: N's migrate applies its expand migrations under
// the running N-1 processes and refuses its contract migration, naming
// them; the api (a new N api started before the N-1 one stops), then each
// worker, then each gateway, drained (an N-1 gateway drains at SIGTERM;
// it has no `gateways drain`) and started again on its address. Checked:
// every command created through the api ended succeeded exactly once (the
// database's write log, and the real bcd's own record of what it ran);
// every node moved between gateways on the session protocol's Drain, the
// same node ids throughout, with no join and no session error in the
// nodes' logs; migrate refuses the contract migration while the last N-1
// process runs, naming it alone, and applies it once it stopped; `processes
// list` ends with the five N processes.
func TestRollingUpgradeUnderLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	began := time.Now()
	prev := testenv.BuildRelease(t, rollingFrom, rollingFromVersion)
	next := testenv.BinaryOverlay(t, "better-compute", "rolling-contract", map[string]string{
		"controlplane/store/postgres/migrations/" + rollingContractName + ".sql": rollingContract})
	t.Logf("built release N-1 (%s) and N in %v", rollingFrom[:7], time.Since(began).Round(time.Millisecond))

	// Release N-1's deployment: its migrate, pki, and processes.
	d := &splitDeployment{t: t, tag: fmt.Sprintf("%08x", rand.Uint32()), bin: next, url: pgtest.URL(t),
		env: []string{"BETTER_COMPUTE_SECRET=" + testSecret}}
	cli := append(slices.Clone(d.env), "BETTER_COMPUTE_DATABASE_URL="+d.url)
	tlsDir := t.TempDir()
	// Everything on the N-1 schema is made by N-1 (its CLI, then its API):
	// this build's store writes columns N-1's schema has not got yet.
	var adminSecret string
	for _, args := range [][]string{
		{"migrate"},
		{"pki", "init", "--trust-domain", e2eTrustDomain},
		{"pki", "issue-gateway", "--dns", "localhost", "--ip", "127.0.0.1", "--out-dir", tlsDir},
	} {
		code, stdout, stderr := testenv.Run(t, cli, "", prev.BetterCompute, args...)
		if code != 0 {
			t.Fatalf("release N-1 better-compute %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
		}
		if m := regexp.MustCompile(`first admin API token \(shown once, keep it safe\): (\S+)`).FindStringSubmatch(stdout); m != nil {
			adminSecret = m[1]
		}
	}
	if adminSecret == "" {
		t.Fatal("release N-1's pki init printed no admin token")
	}
	tlsFiles := fmt.Sprintf("    tlsFiles:\n      cert: %s\n      key: %s\n",
		filepath.Join(tlsDir, "gateway.crt"), filepath.Join(tlsDir, "gateway.key"))
	prevCfg := testenv.WriteFile(t, "previous.yaml", rollingConfig+tlsFiles)
	nextCfg := testenv.WriteFile(t, "next.yaml", rollingConfig+tlsFiles+rollingNextConfig)
	installWriteLog(t, d.url)
	db, err := pgx.Connect(ctx, d.url+"&application_name=e2e-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	d.db = db
	if _, err := db.Exec(ctx, `CREATE TABLE e2e_previous_shape (id integer)`); err != nil {
		t.Fatal(err)
	}

	r := &rolling{d: d, prev: prev, prevCfg: prevCfg, nextCfg: nextCfg}
	apiProc := r.start("api", "api", prev.BetterCompute, prevCfg)
	workers := []*splitProc{{name: "worker-1"}, {name: "worker-2"}}
	for _, w := range workers {
		w.p = r.start(w.name, workerRoles, prev.BetterCompute, prevCfg)
	}
	for i := range 2 {
		g := &splitProc{name: fmt.Sprintf("gateway-%d", i+1)}
		r.gwListen = append(r.gwListen, fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)))
		g.p = r.start(g.name, "gateway", prev.BetterCompute, prevCfg, "--gateway-listen", r.gwListen[i])
		d.gateways = append(d.gateways, g)
	}
	apiAddr := apiProc.WaitLine(`msg="API listening" addr=(\S+)`, 60*time.Second)[1]
	for _, w := range workers {
		w.id = w.p.WaitLine(`msg="Worker roles running".* worker=(\S+)`, 60*time.Second)[1]
	}
	for _, g := range d.gateways {
		g.url = g.p.WaitLine(`msg="Gateway listening" .*public_url=(\S+)`, 60*time.Second)[1]
		g.id = r.gatewayAt(g.url, "")
	}

	// The load balancer in front of the api processes.
	lb := newSwitchProxy(t, "http://"+apiAddr)
	d.api = lb.url + "/api"
	st, err := backend.Open(ctx, d.url+"&application_name=e2e-test", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d.st = st
	d.admin = &client.Client{BaseURL: d.api, Token: adminSecret}

	// The nodes, on N-1: 100 FakeDaemons joined through each gateway and a
	// real bcd of N-1 through the first.
	logs := &nodeWarnings{mu: &sync.Mutex{}, recs: &[]nodeWarning{}}
	nodes := r.joinFleet(logs)
	m := testenv.NewMachine(t, "rolling-bcd")
	m.BCD = prev.BCD
	bcdNode := r.joinBCD(m, d.gateways[0])
	bcd := r.startBCD(m)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bcd's output:\n%s", bcd.Output())
		}
	})
	nodes = append(nodes, bcdNode)
	eventually(t, 90*time.Second, func() bool { return r.sessions(d.gateways[0].id)+r.sessions(d.gateways[1].id) == len(nodes) },
		func() string {
			return fmt.Sprintf("%d + %d sessions on the N-1 gateways, want %d", r.sessions(d.gateways[0].id), r.sessions(d.gateways[1].id), len(nodes))
		})
	joins := r.joinCount()
	stream := startRollingCommands(d.admin, nodes[:len(nodes)-1], bcdNode, m.DataDir)
	t.Logf("release N-1 up: api, 2 workers, 2 gateways, %d FakeDaemons and a real bcd, commands flowing (%v since start)",
		rollingDaemons, time.Since(began).Round(time.Millisecond))

	// 1. Expand, under the running N-1 processes: N's expand migrations
	// apply and its contract migration is refused, naming them.
	code, out, errOut := testenv.Run(t, cli, "", next, "migrate")
	if code == 0 || !strings.Contains(errOut, "contract migration "+rollingContractName+" refused") {
		t.Fatalf("release N's migrate under N-1 processes: exit %d, stdout %q, stderr %q; want its contract migration refused", code, out, errOut)
	}
	for _, id := range []string{workers[0].id, workers[1].id, d.gateways[0].id, d.gateways[1].id} {
		if !strings.Contains(errOut, id+" (version "+rollingFromVersion) {
			t.Errorf("the refusal does not name N-1 process %s: %s", id, errOut)
		}
	}
	if applied := r.applied(); !slices.Contains(applied, "0019_processes_gateway_drain") || slices.Contains(applied, rollingContractName) {
		t.Fatalf("after the expand step, applied %v: want N's expand migrations and not its contract one", applied)
	}
	t.Logf("expand: %s; contract refused: %s", strings.TrimSpace(out), strings.TrimSpace(errOut))

	// 2. The api: a new N api is ready before the N-1 one stops.
	newAPI := r.start("api-next", "api", next, nextCfg)
	newAddr := newAPI.WaitLine(`msg="API listening" addr=(\S+)`, 60*time.Second)[1]
	eventually(t, 30*time.Second, func() bool { c, _ := testenv.Get(t, "http://"+newAddr+"/readyz"); return c == 200 },
		func() string { return "release N's api is not ready" })
	lb.set("http://" + newAddr)
	r.stop(apiProc, "N-1 api")

	// 3. The workers, one at a time: each N worker holds shards with the
	// other before the next moves.
	for i, w := range workers {
		r.stop(w.p, "N-1 "+w.name)
		nw := &splitProc{name: w.name + "-next"}
		nw.p = r.start(nw.name, workerRoles, next, nextCfg)
		nw.id = nw.p.WaitLine(`msg="Worker roles running".* worker=(\S+)`, 60*time.Second)[1]
		workers[i] = nw
		took := d.waitShards(60*time.Second, workers[0].id, workers[1].id)
		t.Logf("%s moved to N: shards split over the two workers %v after it started", w.name, took.Round(time.Millisecond))
	}

	// 4. The gateways, one at a time, each drained: an N-1 gateway drains
	// at SIGTERM, telling each node to leave over its window; the N
	// gateway starts on the same address.
	onStart := r.drops(bcd)
	var lastStopped time.Time // the last N-1 gateway's exit
	for i := range d.gateways {
		old, other := d.gateways[i], d.gateways[1-i]
		if i == 1 {
			// The last N-1 process: the contract migration waits for it.
			code, _, errOut := testenv.Run(t, cli, "", next, "migrate")
			if code == 0 || !strings.Contains(errOut, rollingContractName) || !strings.Contains(errOut, "gateway "+old.id+" (version "+rollingFromVersion) ||
				strings.Count(errOut, "(version ") != 1 {
				t.Fatalf("migrate with one N-1 gateway left: exit %d, stderr %q; want the contract migration refused naming gateway %s alone", code, errOut, old.id)
			}
		}
		moved := time.Now()
		r.stop(old.p, "N-1 "+old.name)
		lastStopped = time.Now()
		eventually(t, 60*time.Second, func() bool { return r.sessions(other.id) == len(nodes) },
			func() string {
				return fmt.Sprintf("%d of %d sessions on %s after %s stopped", r.sessions(other.id), len(nodes), other.name, old.name)
			})
		t.Logf("%s (N-1) drained and stopped: every node on %s %v after SIGTERM", old.name, other.name, time.Since(moved).Round(time.Millisecond))
		ng := &splitProc{name: old.name + "-next"}
		ng.p = r.start(ng.name, "gateway", next, nextCfg, "--gateway-listen", r.gwListen[i])
		ng.url = ng.p.WaitLine(`msg="Gateway listening" .*public_url=(\S+)`, 60*time.Second)[1]
		ng.id = r.gatewayAt(ng.url, old.id)
		d.gateways[i] = ng
	}

	// 5. Contract: no N-1 process is left.
	code, out, errOut = testenv.Run(t, cli, "", next, "migrate")
	if code != 0 || !strings.Contains(out, rollingContractName) {
		t.Fatalf("migrate once every process runs N: exit %d, stdout %q, stderr %q; want %s applied", code, out, errOut, rollingContractName)
	}
	var gone bool
	if err := db.QueryRow(ctx, `SELECT to_regclass('e2e_previous_shape') IS NULL`).Scan(&gone); err != nil || !gone {
		t.Fatalf("e2e_previous_shape still there after the contract migration (%v)", err)
	}
	rows := d.processes(t)
	for _, p := range rows {
		if p.Version != "0.0.0-e2e" || p.Schema != rollingContractName {
			t.Errorf("process %s runs version %s schema %s after the upgrade, want N (0.0.0-e2e, %s)", p.ID, p.Version, p.Schema, rollingContractName)
		}
	}
	if len(rows) != 5 {
		t.Errorf("processes list shows %d processes after the upgrade, want 5 (api, 2 workers, 2 gateways): %+v", len(rows), rows)
	}

	// The nodes: all back on N's gateways, the same nodes, none joined
	// again.
	eventually(t, 60*time.Second, func() bool { return r.sessions(d.gateways[0].id)+r.sessions(d.gateways[1].id) == len(nodes) },
		func() string { return "not every node holds a session on release N's gateways" })
	if got := r.nodeIDs(); !slices.Equal(got, slices.Sorted(slices.Values(nodes))) {
		t.Errorf("nodes after the upgrade: %d, want the %d that joined on N-1 (a node joined again?)", len(got), len(nodes))
	}
	if n := r.joinCount(); n != joins {
		t.Errorf("%d joins after the upgrade, %d before: a node joined again", n, joins)
	}
	// An N-1 gateway may answer a node's Hello with a Command before its
	// Welcome under a stream of commands (the race N fixes:
	// TestNothingBeforeWelcome); the node retries, perhaps first at the
	// gateway then stopped. Those nodes' warnings are counted; any other
	// warning, or that defect once no N-1 gateway runs, fails.
	const defect = "answered Hello with *sessionv1.GatewayMessage_Command, not Welcome"
	hit := map[string]bool{}
	for _, w := range logs.get() {
		if strings.Contains(w.line, defect) && w.at.Before(lastStopped) {
			hit[w.daemon] = true
		}
	}
	var retried int
	for _, w := range logs.get() {
		if hit[w.daemon] {
			retried++
			continue
		}
		t.Errorf("FakeDaemon %s logged during the upgrade: %s", w.daemon, w.line)
	}
	if len(hit) > 0 {
		t.Logf("%d FakeDaemons met N-1's Command before Welcome and retried (%d warnings)", len(hit), retried)
	}
	for _, line := range strings.Split(bcd.Output(), "\n") {
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, "Session with gateway ended") {
			t.Errorf("bcd logged a session error: %s", line)
		}
	}
	if n := r.drops(bcd) - onStart; n != 2 {
		t.Errorf("bcd logged %d drains during the gateways' moves, want 2 (it moves on Drain, once per gateway)", n)
	}

	// Every command ended exactly once, and bcd ran each of its own once.
	// The stream runs on to the count checkCommandsTerminal wants, should
	// the roll have been quicker.
	eventually(t, 2*time.Minute, func() bool { return stream.created() >= 600 },
		func() string { return fmt.Sprintf("only %d commands created", stream.created()) })
	ids, errs := stream.stopAndList()
	if len(errs) > 0 {
		t.Errorf("%d commands.create calls failed through the upgrade, the first: %v", len(errs), errs[0])
	}
	d.checkCommandsTerminal(ids)
	stream.checkBCDRanOnce(t)
	t.Logf("TestRollingUpgradeUnderLoad done in %v", time.Since(began).Round(time.Millisecond))
}

// rolling is the state of TestRollingUpgradeUnderLoad beside its
// splitDeployment.
type rolling struct {
	d                *splitDeployment
	prev             *testenv.Release
	prevCfg, nextCfg string
	gwListen         []string // each gateway's address, kept across its upgrade
}

// start runs serve --roles roles --no-migrate of bin with cfg as the
// process name.
func (r *rolling) start(name, roles, bin, cfg string, args ...string) *testenv.Proc {
	env := append(slices.Clone(r.d.env), "BETTER_COMPUTE_DATABASE_URL="+r.d.url+"&application_name="+r.d.app(name))
	return testenv.Start(r.d.t, env, bin, append([]string{"serve", "--config", cfg, "--roles", roles, "--no-migrate"}, args...)...)
}

// stop sends SIGTERM to p and waits for it to exit 0.
func (r *rolling) stop(p *testenv.Proc, what string) {
	r.d.t.Helper()
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(60 * time.Second); code != 0 {
		r.d.t.Fatalf("%s exited %d after SIGTERM, want 0:\n%s", what, code, p.Output())
	}
}

// query runs one single-value query on the test's own connection (plain
// SQL: the schema is release N-1's for a while).
func (r *rolling) query(dst any, sql string, args ...any) {
	r.d.t.Helper()
	if err := r.d.db.QueryRow(context.Background(), sql, args...).Scan(dst); err != nil {
		r.d.t.Fatalf("%s: %v", sql, err)
	}
}

// gatewayAt waits for the gateways row of the gateway serving address and
// returns its id (not was's: the row of a stopped process).
func (r *rolling) gatewayAt(address, was string) string {
	r.d.t.Helper()
	var id string
	eventually(r.d.t, 30*time.Second, func() bool {
		err := r.d.db.QueryRow(context.Background(), `SELECT id FROM gateways WHERE address = $1 AND id <> $2`, address, was).Scan(&id)
		return err == nil
	}, func() string { return "no gateways row for " + address })
	return id
}

// sessions counts the sessions held on gateway id.
func (r *rolling) sessions(id string) int {
	var n int
	r.query(&n, `SELECT count(*) FROM sessions WHERE gateway_id = $1`, id)
	return n
}

// applied lists the migrations the database recorded.
func (r *rolling) applied() []string {
	r.d.t.Helper()
	rows, err := r.d.db.Query(context.Background(), `SELECT name FROM schema_migrations ORDER BY name`)
	if err != nil {
		r.d.t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		r.d.t.Fatal(err)
	}
	return names
}

// nodeIDs lists the nodes, sorted.
func (r *rolling) nodeIDs() []string {
	r.d.t.Helper()
	rows, err := r.d.db.Query(context.Background(), `SELECT id FROM nodes ORDER BY id`)
	if err != nil {
		r.d.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		r.d.t.Fatal(err)
	}
	return ids
}

// joinCount is how many joins the join tokens admitted.
func (r *rolling) joinCount() int {
	var n int
	r.query(&n, `SELECT coalesce(sum(uses), 0)::int FROM join_tokens`)
	return n
}

// drops counts bcd's log lines for a session ended by the gateway's Drain.
func (r *rolling) drops(bcd *testenv.Proc) int {
	return strings.Count(bcd.Output(), "Session drained, reconnecting elsewhere")
}

// joinFleet joins rollingDaemons/2 FakeDaemons through each gateway (each
// fleet's daemons name that gateway first), logging to logs, runs them
// until the test ends, and returns their node ids.
func (r *rolling) joinFleet(logs *nodeWarnings) []string {
	d := r.d
	d.t.Helper()
	ctx := context.Background()
	site, err := d.admin.SitesCreate(ctx, &apiv1.CreateSiteRequest{Name: "rolling", Region: "default"})
	if err != nil {
		d.t.Fatal(err)
	}
	pool, err := d.admin.PoolsCreate(ctx, &apiv1.CreatePoolRequest{Name: "rolling", Site: site.GetId()})
	if err != nil {
		d.t.Fatal(err)
	}
	bundle, err := bootstrap.LoadBundle(ctx, d.st, testSecret)
	if err != nil {
		d.t.Fatal(err)
	}
	token, _, err := api.CreateJoinToken(ctx, d.st, bundle.GatewayPin(), pool.GetId(), time.Hour, rollingDaemons, "e2e rolling", "")
	if err != nil {
		d.t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	var running sync.WaitGroup
	d.t.Cleanup(func() { cancel(); running.Wait() })
	var ids []string
	for _, g := range d.gateways {
		f, err := sim.NewFleet(sim.FleetConfig{GatewayURL: g.url, Token: token, N: rollingDaemons / len(d.gateways),
			NamePrefix: "rolling-" + g.name, NoInventory: true, Logger: slog.New(logs),
			Session: session.Config{StartJitter: time.Second}})
		if err != nil {
			d.t.Fatal(err)
		}
		jctx, jcancel := context.WithTimeout(ctx, 90*time.Second)
		err = f.Join(jctx)
		jcancel()
		if err != nil {
			d.t.Fatalf("join through %s: %v", g.name, err)
		}
		running.Go(func() { _ = f.Run(runCtx) })
		for _, dm := range f.Daemons() {
			ids = append(ids, dm.NodeID())
		}
	}
	return ids
}

// joinBCD joins machine m through g with a one-use token and returns its
// node id.
func (r *rolling) joinBCD(m *testenv.Machine, g *splitProc) string {
	d := r.d
	d.t.Helper()
	ctx := context.Background()
	site, err := d.admin.SitesCreate(ctx, &apiv1.CreateSiteRequest{Name: m.Name, Region: "default"})
	if err != nil {
		d.t.Fatal(err)
	}
	pool, err := d.admin.PoolsCreate(ctx, &apiv1.CreatePoolRequest{Name: m.Name, Site: site.GetId()})
	if err != nil {
		d.t.Fatal(err)
	}
	bundle, err := bootstrap.LoadBundle(ctx, d.st, testSecret)
	if err != nil {
		d.t.Fatal(err)
	}
	token, _, err := api.CreateJoinToken(ctx, d.st, bundle.GatewayPin(), pool.GetId(), time.Hour, 1, "e2e "+m.Name, "")
	if err != nil {
		d.t.Fatal(err)
	}
	bin, args := m.Argv("join", "--gateway", g.url, "--token-file", testenv.WriteFile(d.t, "token", token), "--data-dir", m.DataDir)
	code, stdout, stderr := testenv.Run(d.t, nil, "", bin, args...)
	match := regexp.MustCompile(`Joined as node (\S+) `).FindStringSubmatch(stdout)
	if code != 0 || match == nil {
		d.t.Fatalf("release N-1 bcd join: exit %d\n%s%s", code, stdout, stderr)
	}
	return match[1]
}

// startBCD runs bcd node on m.
func (r *rolling) startBCD(m *testenv.Machine) *testenv.Proc {
	bin, args := m.Argv("node", "--data-dir", m.DataDir)
	return testenv.Start(r.d.t, nil, bin, args...)
}

// nodeWarnings is a slog.Handler that keeps every record at WARN or
// above with its time and the FakeDaemon that logged it (sim_daemon).
type nodeWarnings struct {
	mu     *sync.Mutex
	recs   *[]nodeWarning
	daemon string
}

type nodeWarning struct {
	daemon, line string
	at           time.Time
}

func (w *nodeWarnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (w *nodeWarnings) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s", a); return true })
	w.mu.Lock()
	defer w.mu.Unlock()
	*w.recs = append(*w.recs, nodeWarning{daemon: w.daemon, line: b.String(), at: r.Time})
	return nil
}

func (w *nodeWarnings) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *w
	for _, a := range attrs {
		if a.Key == "sim_daemon" {
			c.daemon = a.Value.String()
		}
	}
	return &c
}

func (w *nodeWarnings) WithGroup(string) slog.Handler { return w }

func (w *nodeWarnings) get() []nodeWarning {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(*w.recs)
}

// switchProxy is the load balancer in front of the api processes: it
// sends every request to one target, which the test switches.
type switchProxy struct {
	url    string
	target atomic.Pointer[url.URL]
}

func newSwitchProxy(t *testing.T, target string) *switchProxy {
	p := &switchProxy{}
	p.set(target)
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(p.target.Load()) }}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

func (p *switchProxy) set(target string) {
	u, err := url.Parse(target)
	if err != nil {
		panic(err)
	}
	p.target.Store(u)
}

// rollingCommands creates an exec command every 50 ms through the api:
// `true` on one or two FakeDaemons picked at random, and every tenth one
// on the real bcd, which appends the command's number to a file on its
// machine, so that what bcd ran can be counted.
type rollingCommands struct {
	ranFile string

	mu     sync.Mutex
	ids    []string
	bcdSeq []int // the numbers of the bcd commands the api created
	errs   []error

	cancel context.CancelFunc
	done   chan struct{}
}

func startRollingCommands(c *client.Client, fakes []string, bcdNode, bcdDir string) *rollingCommands {
	dir := filepath.Join(filepath.Dir(bcdDir), "ran")
	if err := os.Mkdir(dir, 0o777); err == nil {
		_ = os.Chmod(dir, 0o777) // bcd's command user writes there
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &rollingCommands{ranFile: filepath.Join(dir, "ran"), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			req := &apiv1.CreateCommandsRequest{Kind: "exec", Timeout: durationpb.New(splitCommandTimeout)}
			if n%10 == 0 {
				req.NodeIds = []string{bcdNode}
				req.Exec = &apiv1.ExecSpec{Argv: []string{"sh", "-c", "echo " + strconv.Itoa(n) + " >>" + s.ranFile}}
			} else {
				for range 1 + rand.IntN(2) {
					req.NodeIds = append(req.NodeIds, fakes[rand.IntN(len(fakes))])
				}
				req.NodeIds = slices.Compact(slices.Sorted(slices.Values(req.NodeIds)))
				req.Exec = &apiv1.ExecSpec{Argv: []string{"true"}}
			}
			resp := &apiv1.CreateCommandsResponse{}
			err := c.Call(ctx, "commands.create", req, resp)
			s.mu.Lock()
			switch {
			case ctx.Err() != nil && err != nil:
				// Stopped mid-call: the final checks count rows.
			case err != nil:
				s.errs = append(s.errs, err)
			default:
				for _, cmd := range resp.GetCommands() {
					s.ids = append(s.ids, cmd.GetId())
				}
				if n%10 == 0 {
					s.bcdSeq = append(s.bcdSeq, n)
				}
			}
			s.mu.Unlock()
		}
	}()
	return s
}

// created counts the commands created so far.
func (s *rollingCommands) created() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

// stopAndList stops the stream and returns the ids created and the errors.
func (s *rollingCommands) stopAndList() ([]string, []error) {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ids), slices.Clone(s.errs)
}

// checkBCDRanOnce checks that bcd ran every command the api created for
// it exactly once (run after the commands ended: checkCommandsTerminal).
func (s *rollingCommands) checkBCDRanOnce(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(s.ranFile)
	if err != nil {
		t.Fatalf("bcd's record of the commands it ran: %v", err)
	}
	ran := map[int]int{}
	for _, f := range strings.Fields(string(b)) {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("bcd's record holds %q", f)
		}
		ran[n]++
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var wrong []string
	for _, n := range s.bcdSeq {
		if ran[n] != 1 {
			wrong = append(wrong, fmt.Sprintf("#%d ran %d times", n, ran[n]))
		}
		delete(ran, n)
	}
	for n, c := range ran {
		// A call stopped mid-way may have created one.
		if c != 1 {
			wrong = append(wrong, fmt.Sprintf("#%d (not listed) ran %d times", n, c))
		}
	}
	sort.Strings(wrong)
	if len(wrong) > 0 {
		t.Errorf("bcd ran %d of its %d commands other than once: %v", len(wrong), len(s.bcdSeq), wrong)
	}
	t.Logf("bcd ran each of its %d commands once", len(s.bcdSeq))
}
