package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/doctor"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestPgBouncerSplitRoles runs the production shape through PgBouncer in
// transaction mode (tests/pgbouncer.sh, the settings docs/scaling.md gives):
// every process's database.url goes through it, with
// default_query_exec_mode=exec, and database.notifyURL is a direct
// connection for the gateway's LISTEN.
//
//   - migrate and pki init through PgBouncer; the admin token pki init
//     prints creates a site and a pool through the API;
//   - doctor fails host.gateway.notifier without notifyURL (LISTEN through
//     PgBouncer hears nothing) and passes with it;
//   - one api, one gateway and two worker processes; the gateway LISTENs on
//     the direct connection; a real bcd joins and commands run;
//   - kill -9 of a worker: the other holds every shard within the lease TTL
//     and commands still run.
func TestPgBouncerSplitRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct, bouncer := pgtest.Database(t)
	d := &splitDeployment{t: t, tag: fmt.Sprintf("%08x", rand.Uint32()), bin: testenv.Binary(t, "better-compute"), url: bouncer}
	// The LISTEN connection names itself, so that the test can find it on
	// the server: a LISTEN through PgBouncer would carry the process's name.
	listenApp := "listen." + d.tag
	d.env = []string{"BETTER_COMPUTE_SECRET=" + testSecret, config.EnvDatabaseNotifyURL + "=" + direct + "&application_name=" + listenApp}
	adminToken, tlsFiles := initThroughPgBouncer(t, append(slices.Clone(d.env), config.EnvDatabaseURL+"="+bouncer))
	d.cfgFile = testenv.WriteFile(t, "better-compute.yaml", splitConfig+tlsFiles)

	st, err := backend.Open(ctx, direct+"&application_name=e2e-test", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d.st = st
	db, err := pgx.Connect(ctx, direct+"&application_name=e2e-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	d.db = db

	// doctor through PgBouncer: without notifyURL LISTEN hears nothing.
	withoutNotify := []string{"BETTER_COMPUTE_SECRET=" + testSecret, config.EnvDatabaseURL + "=" + bouncer}
	code, checks := doctorChecks(t, d.bin, withoutNotify, d.cfgFile)
	if n := checks[doctor.IDGatewayNotifier]; code == 0 || n.Status != "fail" || !strings.Contains(n.Hint, "database.notifyURL") {
		t.Fatalf("doctor through PgBouncer without notifyURL: exit %d, %s %+v; want a non-zero exit and %s failing with a hint naming database.notifyURL",
			code, doctor.IDGatewayNotifier, n, doctor.IDGatewayNotifier)
	}
	_, checks = doctorChecks(t, d.bin, append(slices.Clone(d.env), config.EnvDatabaseURL+"="+bouncer), d.cfgFile)
	if n := checks[doctor.IDGatewayNotifier]; n.Status != "ok" {
		t.Fatalf("doctor through PgBouncer with a direct notifyURL: %s %+v, want ok", doctor.IDGatewayNotifier, n)
	}

	apiProc := d.start("api", "api")
	gw := &splitProc{name: "gateway-1", p: d.start("gateway-1", "gateway")}
	d.gateways = []*splitProc{gw}
	for i := range 2 {
		name := fmt.Sprintf("worker-%d", i+1)
		d.workers = append(d.workers, &splitProc{name: name, p: d.start(name, workerRoles)})
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range append([]*splitProc{{name: "api", p: apiProc}, gw}, d.workers...) {
				t.Logf("%s's output:\n%s", p.name, p.p.Output())
			}
		}
	})
	d.api = "http://" + apiProc.WaitLine(`msg="API listening" addr=(\S+)`, 60*time.Second)[1] + "/api"
	gw.url = gw.p.WaitLine(`msg="Gateway listening" .*public_url=(\S+)`, 60*time.Second)[1]
	for _, w := range d.workers {
		w.id = w.p.WaitLine(`msg="Worker roles running".* worker=(\S+)`, 60*time.Second)[1]
	}
	eventually(t, 20*time.Second, func() bool {
		gws, err := d.st.GatewayList(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range gws {
			if row.Address == gw.url {
				gw.id = row.ID
			}
		}
		return gw.id != ""
	}, func() string { return "the gateway has no row in gateways" })

	// The admin token pki init printed works on the API.
	d.admin = &client.Client{BaseURL: d.api, Token: adminToken}
	if err := d.admin.Call(ctx, "sites.create", &apiv1.CreateSiteRequest{Name: "bouncer", Region: "default"}, &apiv1.Site{}); err != nil {
		t.Fatalf("sites.create with pki init's admin token: %v", err)
	}
	if err := d.admin.Call(ctx, "pools.create", &apiv1.CreatePoolRequest{Name: "bouncer", Site: "bouncer"}, &apiv1.Pool{}); err != nil {
		t.Fatalf("pools.create with pki init's admin token: %v", err)
	}

	// The gateway LISTENs on the direct connection.
	eventually(t, 20*time.Second, func() bool {
		var n int
		err := d.db.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND query IN ('LISTEN better_compute_wake', 'LISTEN "better_compute_wake"')`, listenApp).Scan(&n)
		return err == nil && n == 1
	}, func() string { return "no LISTEN better_compute_wake on the direct connection (database.notifyURL)" })

	m, nodeID := d.joinMachine("bouncer-01", gw)
	m.node()
	d.waitSession(nodeID, gw)
	runEcho := func(word string) {
		t.Helper()
		resp := &apiv1.CreateCommandsResponse{}
		if err := d.admin.Call(ctx, "commands.create", &apiv1.CreateCommandsRequest{NodeIds: []string{nodeID}, Kind: "exec",
			Exec: &apiv1.ExecSpec{Argv: []string{"echo", word}}, Timeout: durationpb.New(30 * time.Second)}, resp); err != nil {
			t.Fatalf("commands.create: %v", err)
		}
		id := resp.GetCommands()[0].GetId()
		var c *store.Command
		eventually(t, 30*time.Second, func() bool {
			c, err = d.st.CommandGet(ctx, id)
			return err == nil && c.State == store.CommandSucceeded
		}, func() string { return fmt.Sprintf("command %s (echo %s): %+v, %v", id, word, c, err) })
	}
	for i := range 3 {
		runEcho(fmt.Sprintf("before-%d", i))
	}

	d.waitShards(60*time.Second, d.workers[0].id, d.workers[1].id)
	victim, survivor := d.workers[0], d.workers[1]
	victim.p.Kill()
	// As TestWorkersSplitRoles: the TTL of 15 s from the victim's last
	// renewal, at most 5 s before the kill.
	took := d.waitShards(20*time.Second+killSlack+10*time.Second, survivor.id)
	t.Logf("kill -9 of %s: all shards held by %s %v later", victim.name, survivor.name, took.Round(time.Millisecond))
	if took > 20*time.Second+killSlack {
		t.Errorf("shards held by the survivor %v after the kill -9, want within 20 s (and %v for the round itself)", took, killSlack)
	}
	for i := range 3 {
		runEcho(fmt.Sprintf("after-%d", i))
	}
}

// initThroughPgBouncer runs migrate, pki init and pki issue-gateway with
// env (its database URL through PgBouncer) and returns the admin token pki
// init printed and the host.gateway lines naming the certificate files.
func initThroughPgBouncer(t *testing.T, env []string) (adminToken, tlsFiles string) {
	t.Helper()
	bin := testenv.Binary(t, "better-compute")
	dir := t.TempDir()
	run := func(args ...string) string {
		code, stdout, stderr := testenv.Run(t, env, "", bin, args...)
		if code != 0 {
			t.Fatalf("better-compute %s through PgBouncer: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
		}
		return stdout
	}
	run("migrate")
	var res struct {
		AdminToken string `json:"adminToken"`
	}
	out := run("pki", "init", "--trust-domain", e2eTrustDomain, "-o", "json")
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.AdminToken == "" {
		t.Fatalf("pki init -o json through PgBouncer printed no admin token (%v): %s", err, out)
	}
	run("pki", "issue-gateway", "--dns", "localhost", "--ip", "127.0.0.1", "--out-dir", dir)
	return res.AdminToken, fmt.Sprintf("    tlsFiles:\n      cert: %s\n      key: %s\n",
		filepath.Join(dir, "gateway.crt"), filepath.Join(dir, "gateway.key"))
}

// doctorChecks runs doctor -o json with env and cfgFile and returns its
// exit code and checks by id.
func doctorChecks(t *testing.T, bin string, env []string, cfgFile string) (int, map[string]doctorResult) {
	t.Helper()
	code, out, errOut := testenv.Run(t, env, "", bin, "--config", cfgFile, "doctor", "-o", "json")
	var res struct {
		Checks []doctorResult `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || len(res.Checks) == 0 {
		t.Fatalf("doctor -o json: %v\n%s%s", err, out, errOut)
	}
	m := map[string]doctorResult{}
	for _, c := range res.Checks {
		m[c.ID] = c
	}
	return code, m
}
