package tests

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/reconcilers/sweeper"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// splitConfig is the one configuration file every process of the split
// deployment reads: every listener on a free loopback port (so two gateways
// share the file), heartbeats every 2 s (liveness calls a node unreachable
// after 6 s) and drains within 3 s, so that the scenario fits in about a
// minute and a half. Every FakeDaemon comes from 127.0.0.1, so the
// gateway's bounds per source address are its bounds in all, and 300
// handshakes at once on a busy machine get the 10 s they had before issue
// 28 rather than the default 5 s. The gateway's
// tlsFiles lines follow.
const splitConfig = `host:
  listen: 127.0.0.1:0
  gateway:
    listen: 127.0.0.1:0
    heartbeatInterval: 2s
    drainDelay: 3s
    limits: {pendingPerSource: 256, queuedPerSource: 4096, joinsPerSecond: 1000, joinBurst: 1000, handshakeTimeout: 10s}
`

// workerRoles are the roles of a worker process of the split deployment.
const workerRoles = "controllers,scheduler,sinks,iam"

// killSlack is what the shard round itself may add to the 20 s within
// which a killed worker's shards are held by the others: the survivors
// acquire them one by one in a round of 256 lease statements, on a
// machine whose cores may be busy (a takeover at 19.97 s was seen through
// PgBouncer on a loaded 2-core machine, the round's start sitting at the
// TTL's edge).
const killSlack = 3 * time.Second

// splitCommandTimeout is the deadline of every command of the stream.
const splitCommandTimeout = 20 * time.Second

// splitDeployment is the production shape of DESIGN.md on PostgreSQL: one
// migrate, then api, gateway and worker processes started with --no-migrate
// from one configuration file and one secret. Each process connects with
// its own application_name (app), which the write log (installWriteLog)
// records with every write.
type splitDeployment struct {
	t       *testing.T
	tag     string // makes application names unique to this deployment
	bin     string
	url     string   // the test schema's URL
	env     []string // the secret; each process adds its database URL
	cfgFile string
	st      store.Store // the test's own connections (application_name e2e-test)
	db      *pgx.Conn

	api      string // http://127.0.0.1:port/api
	apiProc  *testenv.Proc
	admin    *client.Client
	gateways []*splitProc
	workers  []*splitProc
}

// splitProc is one process of the deployment: its name, its worker id or
// gateway id and public URL.
type splitProc struct {
	name string
	id   string
	url  string // gateways: what daemons dial
	p    *testenv.Proc
}

// newSplitDeployment migrates a fresh schema, runs pki init and
// issue-gateway, installs the write log, and starts one api, gateways
// gateway and workers worker processes.
func newSplitDeployment(t *testing.T, gateways, workers int) *splitDeployment {
	t.Helper()
	return newSplitDeploymentWith(t, gateways, workers, nil)
}

// newSplitDeploymentWith is newSplitDeployment with more configuration:
// extra, when set, runs after pki init with the environment of the CLI
// (secret and database URL) and returns YAML appended to the configuration
// file (indented to follow host.gateway's keys or top-level keys).
func newSplitDeploymentWith(t *testing.T, gateways, workers int, extra func(env []string) string) *splitDeployment {
	t.Helper()
	ctx := context.Background()
	d := &splitDeployment{t: t, tag: fmt.Sprintf("%08x", rand.Uint32()), bin: testenv.Binary(t, "better-compute"), url: pgtest.URL(t)}
	d.env = []string{"BETTER_COMPUTE_SECRET=" + testSecret}
	tlsFiles := initPostgresPKI(t, append(slices.Clone(d.env), "BETTER_COMPUTE_DATABASE_URL="+d.url))
	more := ""
	if extra != nil {
		more = extra(append(slices.Clone(d.env), "BETTER_COMPUTE_DATABASE_URL="+d.url))
	}
	d.cfgFile = testenv.WriteFile(t, "better-compute.yaml", splitConfig+tlsFiles+more)
	installWriteLog(t, d.url)

	st, err := backend.Open(ctx, d.url+"&application_name=e2e-test", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d.st = st
	db, err := pgx.Connect(ctx, d.url+"&application_name=e2e-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	d.db = db

	// Start every process at once; each waits for its own readiness line.
	apiProc := d.start("api", "api")
	for i := range gateways {
		name := fmt.Sprintf("gateway-%d", i+1)
		d.gateways = append(d.gateways, &splitProc{name: name, p: d.start(name, "gateway")})
	}
	for i := range workers {
		name := fmt.Sprintf("worker-%d", i+1)
		d.workers = append(d.workers, &splitProc{name: name, p: d.start(name, workerRoles)})
	}
	d.apiProc = apiProc
	d.api = "http://" + apiProc.WaitLine(`msg="API listening" addr=(\S+)`, 60*time.Second)[1] + "/api"
	for _, g := range d.gateways {
		g.url = g.p.WaitLine(`msg="Gateway listening" .*public_url=(\S+)`, 60*time.Second)[1]
	}
	for _, w := range d.workers {
		w.id = w.p.WaitLine(`msg="Worker roles running".* worker=(\S+)`, 60*time.Second)[1]
	}
	// A gateway's row (its id, and its address for the joins' gateway
	// lists) is written at its first lease renewal.
	eventually(t, 10*time.Second, func() bool {
		gws, err := d.st.GatewayList(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range d.gateways {
			for _, row := range gws {
				if row.Address == g.url {
					g.id = row.ID
				}
			}
		}
		return !slices.ContainsFunc(d.gateways, func(g *splitProc) bool { return g.id == "" })
	}, func() string { return "the gateways have no rows in gateways" })

	secret, _, err := iam.Create(ctx, d.st, iam.CreateParams{Role: store.RoleAdmin, Description: "e2e workers"})
	if err != nil {
		t.Fatal(err)
	}
	d.admin = &client.Client{BaseURL: d.api, Token: secret}
	return d
}

// app is the application_name of the process name.
func (d *splitDeployment) app(name string) string { return name + "." + d.tag }

// start runs serve --roles roles --no-migrate as the process name.
func (d *splitDeployment) start(name, roles string) *testenv.Proc {
	env := append(slices.Clone(d.env), "BETTER_COMPUTE_DATABASE_URL="+d.url+"&application_name="+d.app(name))
	return testenv.Start(d.t, env, d.bin, "serve", "--config", d.cfgFile, "--roles", roles, "--no-migrate")
}

// connections returns the server's open connections by process name.
func (d *splitDeployment) connections() map[string]int {
	d.t.Helper()
	rows, err := d.db.Query(context.Background(), `SELECT application_name, count(*) FROM pg_stat_activity
		WHERE application_name LIKE '%.' || $1 GROUP BY 1`, d.tag)
	if err != nil {
		d.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var app string
		var n int
		if err := rows.Scan(&app, &n); err != nil {
			d.t.Fatal(err)
		}
		out[strings.TrimSuffix(app, "."+d.tag)] = n
	}
	return out
}

// worker returns the worker process with id.
func (d *splitDeployment) worker(id string) *splitProc {
	for _, w := range d.workers {
		if w.id == id {
			return w
		}
	}
	d.t.Fatalf("no worker process has id %q", id)
	return nil
}

// installWriteLog adds to the test schema a table, e2e_writes, and
// triggers that record, with the writer's application_name and the
// database's clock, every change of lease holder or epoch (renewals that
// change neither are left out), every command and node state change,
// every outbox cursor move, and every deletion retention or token expiry
// makes. The fencing and exactly-once checks read it: it is what the
// database saw, not what the processes say they did.
func installWriteLog(t *testing.T, url string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	const ddl = `
CREATE TABLE e2e_writes (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    app     text NOT NULL DEFAULT current_setting('application_name'),
    tbl     text NOT NULL,
    op      text NOT NULL,
    key     text NOT NULL,
    shard   integer,
    old_val text,
    new_val text
);
CREATE FUNCTION e2e_record() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    o jsonb;
    n jsonb;
    r jsonb;
BEGIN
    IF TG_OP <> 'INSERT' THEN o := to_jsonb(OLD); END IF;
    IF TG_OP <> 'DELETE' THEN n := to_jsonb(NEW); END IF;
    r := coalesce(n, o);
    INSERT INTO e2e_writes (tbl, op, key, shard, old_val, new_val)
    VALUES (TG_TABLE_NAME, TG_OP, r->>TG_ARGV[0], (r->>'shard')::integer,
        CASE WHEN TG_ARGV[1] = 'holder@epoch' THEN (o->>'holder') || '@' || (o->>'epoch') ELSE o->>TG_ARGV[1] END,
        CASE WHEN TG_ARGV[1] = 'holder@epoch' THEN (n->>'holder') || '@' || (n->>'epoch') ELSE n->>TG_ARGV[1] END);
    RETURN NULL;
END $$;
CREATE TRIGGER e2e_leases AFTER INSERT OR DELETE ON leases
    FOR EACH ROW EXECUTE FUNCTION e2e_record('name', 'holder@epoch');
CREATE TRIGGER e2e_leases_moved AFTER UPDATE ON leases
    FOR EACH ROW WHEN (OLD.holder IS DISTINCT FROM NEW.holder OR OLD.epoch IS DISTINCT FROM NEW.epoch)
    EXECUTE FUNCTION e2e_record('name', 'holder@epoch');
CREATE TRIGGER e2e_commands AFTER INSERT OR DELETE ON commands
    FOR EACH ROW EXECUTE FUNCTION e2e_record('id', 'state');
CREATE TRIGGER e2e_commands_state AFTER UPDATE ON commands
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION e2e_record('id', 'state');
CREATE TRIGGER e2e_nodes_state AFTER UPDATE ON nodes
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION e2e_record('id', 'state');
CREATE TRIGGER e2e_nodes_deleted AFTER DELETE ON nodes
    FOR EACH ROW EXECUTE FUNCTION e2e_record('id', 'state');
CREATE TRIGGER e2e_outbox_cursors AFTER INSERT OR UPDATE OR DELETE ON outbox_cursors
    FOR EACH ROW EXECUTE FUNCTION e2e_record('sink', 'last_id');
CREATE TRIGGER e2e_join_tokens AFTER DELETE ON join_tokens FOR EACH ROW EXECUTE FUNCTION e2e_record('id', 'id');
CREATE TRIGGER e2e_api_tokens AFTER DELETE ON api_tokens FOR EACH ROW EXECUTE FUNCTION e2e_record('id', 'id');
CREATE TRIGGER e2e_events AFTER DELETE ON events FOR EACH ROW EXECUTE FUNCTION e2e_record('id', 'id');
CREATE TRIGGER e2e_audit_log AFTER DELETE ON audit_log FOR EACH ROW EXECUTE FUNCTION e2e_record('id', 'id');
`
	if _, err := conn.Exec(ctx, ddl); err != nil {
		t.Fatalf("install the write log: %v", err)
	}
}

// loggedWrite is a row of e2e_writes.
type loggedWrite struct {
	ID             int64
	At             time.Time
	App, Table, Op string
	Key            string
	Shard          *int
	OldVal, NewVal *string
}

// writes returns the write log's rows matching where (SQL over e2e_writes,
// with args), in order.
func (d *splitDeployment) writes(where string, args ...any) []loggedWrite {
	d.t.Helper()
	rows, err := d.db.Query(context.Background(), `SELECT id, at, app, tbl, op, key, shard, old_val, new_val
		FROM e2e_writes WHERE `+where+` ORDER BY id`, args...)
	if err != nil {
		d.t.Fatal(err)
	}
	defer rows.Close()
	var out []loggedWrite
	for rows.Next() {
		var w loggedWrite
		if err := rows.Scan(&w.ID, &w.At, &w.App, &w.Table, &w.Op, &w.Key, &w.Shard, &w.OldVal, &w.NewVal); err != nil {
			d.t.Fatal(err)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		d.t.Fatal(err)
	}
	return out
}

// dbNow is the database's clock, which decides lease expiry.
func (d *splitDeployment) dbNow() time.Time {
	d.t.Helper()
	now, err := d.st.Now(context.Background())
	if err != nil {
		d.t.Fatal(err)
	}
	return now
}

// shardsSettled reports whether every shard is held, unexpired by the
// database's clock, by its rendezvous owner among holders, and returns how
// many each holds and how many are not held so.
func (d *splitDeployment) shardsSettled(holders []string) (bool, map[string]int, int) {
	d.t.Helper()
	now := d.dbNow()
	leases, err := d.st.LeaseList(context.Background(), "shard:")
	if err != nil {
		d.t.Fatal(err)
	}
	byName := map[string]*store.Lease{}
	for _, l := range leases {
		byName[l.Name] = l
	}
	held, off := map[string]int{}, 0
	for n := range store.Shards {
		l := byName[shard.LeaseName(n)]
		if l == nil || l.Holder != shard.Owner(n, holders) || !l.ExpiresAt.After(now) {
			off++
			continue
		}
		held[l.Holder]++
	}
	return off == 0, held, off
}

// waitShards waits until every shard is held by its rendezvous owner among
// holders (shard.Owner) and returns how long that took.
func (d *splitDeployment) waitShards(timeout time.Duration, holders ...string) time.Duration {
	d.t.Helper()
	start := time.Now()
	var held map[string]int
	var off int
	eventually(d.t, timeout, func() bool {
		var ok bool
		ok, held, off = d.shardsSettled(holders)
		return ok
	}, func() string {
		return fmt.Sprintf("shards held by their owners among %v: %v; %d not", holders, held, off)
	})
	return time.Since(start)
}

// leaseHolder returns the holder of lease name, "" when no one holds it.
func (d *splitDeployment) leaseHolder(name string) (string, int64) {
	d.t.Helper()
	l, err := d.st.LeaseGet(context.Background(), name)
	if errors.Is(err, store.ErrNotFound) {
		return "", 0
	}
	if err != nil {
		d.t.Fatal(err)
	}
	if !l.ExpiresAt.After(d.dbNow()) {
		return "", l.Epoch
	}
	return l.Holder, l.Epoch
}

// splitFleet is FakeDaemons joined through the deployment's gateways and
// run one by one, so a test can stop any of them.
type splitFleet struct {
	fleets  []*sim.Fleet
	daemons []*sim.FakeDaemon
	stop    map[string]context.CancelFunc // by node id
	done    sync.WaitGroup
}

// joinFleet joins perGateway FakeDaemons through each gateway (so each
// daemon's gateway list names that gateway first) and runs them all.
func (d *splitDeployment) joinFleet(ctx context.Context, perGateway int) *splitFleet {
	d.t.Helper()
	site, err := d.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "e2e", Region: "default"})
	if err != nil {
		d.t.Fatal(err)
	}
	pool, err := d.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "default", SiteID: site.ID})
	if err != nil {
		d.t.Fatal(err)
	}
	bundle, err := bootstrap.LoadBundle(ctx, d.st, testSecret)
	if err != nil {
		d.t.Fatal(err)
	}
	n := perGateway * len(d.gateways)
	token, _, err := api.CreateJoinToken(ctx, d.st, bundle.GatewayPin(), pool.ID, time.Hour, n, "e2e workers", "")
	if err != nil {
		d.t.Fatal(err)
	}
	f := &splitFleet{stop: map[string]context.CancelFunc{}}
	for _, g := range d.gateways {
		fl, err := sim.NewFleet(sim.FleetConfig{GatewayURL: g.url, Token: token, N: perGateway, NamePrefix: g.name,
			NoInventory: true, Session: session.Config{StartJitter: time.Second}})
		if err != nil {
			d.t.Fatal(err)
		}
		if err := fl.Join(ctx); err != nil {
			d.t.Fatal(err)
		}
		f.fleets = append(f.fleets, fl)
		f.daemons = append(f.daemons, fl.Daemons()...)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	for _, dm := range f.daemons {
		dctx, stop := context.WithCancel(runCtx)
		f.stop[dm.NodeID()] = stop
		f.done.Go(func() {
			if err := dm.Run(dctx); err != nil {
				d.t.Errorf("FakeDaemon %s stopped: %v", dm.Name(), err)
			}
		})
	}
	d.t.Cleanup(func() { cancel(); f.done.Wait() })
	for _, fl := range f.fleets {
		wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
		err := fl.WaitFor(wctx, func(s sim.FleetStats) bool { return s.Connected == perGateway })
		wcancel()
		if err != nil {
			d.t.Fatalf("FakeDaemons connected: %+v (%v)", fl.Stats(), err)
		}
	}
	return f
}

// connected counts the fleet's daemons holding a session.
func (f *splitFleet) connected() int {
	n := 0
	for _, fl := range f.fleets {
		n += fl.Stats().Connected
	}
	return n
}

// commandStream creates commands through the API at a steady rate, each
// for one or two nodes picked at random among the targets, and remembers
// every command id the API returned.
type commandStream struct {
	c *client.Client

	mu      sync.Mutex
	targets []string
	ids     []string
	errs    []error

	cancel context.CancelFunc
	done   chan struct{}
}

// startCommands starts a stream of calls every interval.
func startCommands(c *client.Client, targets []string, interval time.Duration) *commandStream {
	ctx, cancel := context.WithCancel(context.Background())
	s := &commandStream{c: c, targets: slices.Clone(targets), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			s.mu.Lock()
			var nodes []string
			for range 1 + rand.IntN(2) {
				nodes = append(nodes, s.targets[rand.IntN(len(s.targets))])
			}
			s.mu.Unlock()
			nodes = slices.Compact(slices.Sorted(slices.Values(nodes)))
			resp := &apiv1.CreateCommandsResponse{}
			err := c.Call(ctx, "commands.create", &apiv1.CreateCommandsRequest{NodeIds: nodes, Kind: "exec",
				Exec: &apiv1.ExecSpec{Argv: []string{"true"}}, Timeout: durationpb.New(splitCommandTimeout)}, resp)
			s.mu.Lock()
			switch {
			case ctx.Err() != nil && err != nil:
				// Stopped mid-call: whether it was created is unknown,
				// and the final check counts rows, not this list.
			case err != nil:
				s.errs = append(s.errs, err)
			default:
				for _, cmd := range resp.GetCommands() {
					s.ids = append(s.ids, cmd.GetId())
				}
			}
			s.mu.Unlock()
		}
	}()
	return s
}

// exclude stops targeting nodes.
func (s *commandStream) exclude(nodes ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.targets = slices.DeleteFunc(s.targets, func(n string) bool { return slices.Contains(nodes, n) })
}

// stopAndList stops the stream and returns the ids created and the errors.
func (s *commandStream) stopAndList() ([]string, []error) {
	s.cancel()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ids), slices.Clone(s.errs)
}

// TestWorkersSplitRoles runs the production shape on PostgreSQL: one api,
// two gateways and three worker processes from one configuration, 300
// FakeDaemons joined through both gateways and a steady stream of commands
// through the API, and checks, on the database's own record:
//
//   - kill -9 of the worker holding the CommandSweeper: all 256 shards are
//     held by their rendezvous owners among the two others within 20 s
//     (plus one round's duration), and the sweeper moves;
//   - SIGSTOP of the worker then holding the sweeper until every lease it
//     held has passed to the third at a higher epoch, then SIGCONT: it
//     logs the loss of the sweeper lease, and every write it makes after
//     the pause is made under a lease it acquired after it (none under an
//     epoch it held before); it rejoins, takes back its share, and marks
//     nodes of its new shards that stop heartbeating unreachable;
//   - SIGTERM of one gateway: its daemons move to the other (sessions
//     rows), and it exits 0;
//   - every command the API created reaches exactly one terminal state,
//     succeeded, within its deadline: one transition into a terminal state
//     per command and none out of one;
//   - SIGTERM of a worker: it releases its leases and leaves workers, and
//     the last worker holds every shard.
func TestWorkersSplitRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	began := time.Now()
	d := newSplitDeployment(t, 2, 3)
	fleet := d.joinFleet(ctx, 150)
	for _, g := range d.gateways {
		eventually(t, 10*time.Second, func() bool {
			s, err := d.st.SessionList(ctx, g.id)
			return err == nil && len(s) == 150
		}, func() string { return g.name + " does not hold the sessions of the 150 daemons joined through it" })
	}
	var nodes []string
	for _, dm := range fleet.daemons {
		nodes = append(nodes, dm.NodeID())
	}
	stream := startCommands(d.admin, nodes, 40*time.Millisecond)
	settle := d.waitShards(40*time.Second, d.workers[0].id, d.workers[1].id, d.workers[2].id)
	t.Logf("deployment up, 300 daemons connected, shards over 3 workers settled %v later (%v since start)",
		settle.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))

	// kill -9 of the worker holding the CommandSweeper.
	var victimID string
	eventually(t, 30*time.Second, func() bool { victimID, _ = d.leaseHolder(sweeper.LeaseName); return victimID != "" },
		func() string { return "no worker holds the command sweeper" })
	victim := d.worker(victimID)
	var survivors []string
	for _, w := range d.workers {
		if w != victim {
			survivors = append(survivors, w.id)
		}
	}
	killed := time.Now()
	victim.p.Kill()
	took := d.waitShards(25*time.Second, survivors...)
	t.Logf("kill -9 of %s (%s): all 256 shards held by the two others %v later", victim.name, victim.id, took.Round(time.Millisecond))
	// The design's bound: the dead worker's row goes stale after the TTL
	// (15 s from its last heartbeat, at most 5 s before the kill), and the
	// survivors take its shards at their next round (every 5 s), plus the
	// round's own duration.
	if took > 20*time.Second+killSlack {
		t.Errorf("shards held by the survivors %v after the kill -9, want within 20 s (and %v for the round itself)", took, killSlack)
	}
	var sweeperID string
	eventually(t, 30*time.Second, func() bool {
		sweeperID, _ = d.leaseHolder(sweeper.LeaseName)
		return slices.Contains(survivors, sweeperID)
	}, func() string { return "the command sweeper did not move to a surviving worker" })
	t.Logf("command sweeper on %s %v after the kill -9", d.worker(sweeperID).name, time.Since(killed).Round(time.Millisecond))

	// SIGSTOP of the worker now holding the sweeper, past its leases' TTL.
	paused := d.worker(sweeperID)
	other := survivors[0]
	if other == paused.id {
		other = survivors[1]
	}
	fenced, stoppedAt := d.stopPastTTL(paused, other)

	// SIGCONT: the resumed worker's leases are gone. It must log the
	// sweeper lease's loss, write nothing under the old epochs, and take
	// back its share under new ones.
	lost := regexp.MustCompile(`msg="(Lease lost|Lease no longer trusted|Job under lease failed)".*lease=` + regexp.QuoteMeta(sweeper.LeaseName))
	lostBefore := countLines(paused.p, lost)
	resumedAt := d.dbNow()
	paused.p.Signal(syscall.SIGCONT)
	eventually(t, 20*time.Second, func() bool { return countLines(paused.p, lost) > lostBefore },
		func() string { return paused.name + " did not log the loss of " + sweeper.LeaseName + " after SIGCONT" })
	d.waitShards(30*time.Second, paused.id, other)
	t.Logf("%s resumed; shards split again over it and %s %v later", paused.name, d.worker(other).name,
		d.dbNow().Sub(resumedAt).Round(time.Millisecond))

	// Nodes of shards the resumed worker holds now stop heartbeating: it
	// is the one to mark them unreachable, under its new leases.
	stopped := d.stopNodesOf(fleet, stream, paused.id, 3)
	eventually(t, 30*time.Second, func() bool {
		for _, id := range stopped {
			if n, err := d.st.NodeGet(ctx, id); err != nil || n.State != store.NodeUnreachable {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("nodes %v not unreachable after their daemons stopped", stopped) })
	for _, id := range stopped {
		paused.p.WaitLine(`msg="Node unreachable".* node_id=`+regexp.QuoteMeta(id), 10*time.Second)
	}
	d.checkFenced(paused, fenced, stoppedAt, resumedAt, stopped)

	// SIGTERM of a gateway: its daemons move to the other.
	d.moveGateway(fleet, d.gateways[0], d.gateways[1], len(fleet.daemons)-len(stopped))
	t.Logf("database connections open by process (of at most max(4, cores) in each store pool): %v", d.connections())

	// Every command ends in exactly one terminal state.
	ids, errs := stream.stopAndList()
	if len(errs) > 0 {
		t.Errorf("%d commands.create calls failed, the first: %v", len(errs), errs[0])
	}
	d.checkCommandsTerminal(ids)

	// A graceful stop releases the leases and leaves workers at once.
	d.leaveGracefully(paused, other)
	t.Logf("TestWorkersSplitRoles done in %v", time.Since(began).Round(time.Millisecond))
}

// stopPastTTL sends SIGSTOP to w and waits until every lease it held has
// passed to other at a higher epoch; it returns those leases, by name, with
// the epoch w held them at, and the database's time of the stop.
func (d *splitDeployment) stopPastTTL(w *splitProc, other string) (stale map[string]int64, stoppedAt time.Time) {
	d.t.Helper()
	ctx := context.Background()
	leases, err := d.st.LeaseList(ctx, "")
	if err != nil {
		d.t.Fatal(err)
	}
	stoppedAt = d.dbNow()
	w.p.Signal(syscall.SIGSTOP)
	// Leases are read after the stop too: one acquired between the list
	// and the signal would otherwise be missed.
	held := map[string]int64{}
	after, err := d.st.LeaseList(ctx, "")
	if err != nil {
		d.t.Fatal(err)
	}
	for _, l := range append(leases, after...) {
		if l.Holder == w.id {
			held[l.Name] = max(held[l.Name], l.Epoch)
		}
	}
	if _, ok := held[sweeper.LeaseName]; !ok {
		d.t.Fatalf("%s does not hold %s at SIGSTOP", w.name, sweeper.LeaseName)
	}
	shards := 0
	for name := range held {
		if strings.HasPrefix(name, "shard:") {
			shards++
		}
	}
	var moved map[string]*store.Lease
	eventually(d.t, 45*time.Second, func() bool {
		moved = map[string]*store.Lease{}
		for name, epoch := range held {
			l, err := d.st.LeaseGet(ctx, name)
			if err != nil {
				d.t.Fatal(err)
			}
			if l.Holder != other || l.Epoch <= epoch {
				return false
			}
			moved[name] = l
		}
		return true
	}, func() string {
		return fmt.Sprintf("the leases of stopped %s did not all pass to %s: %v", w.name, other, held)
	})
	d.t.Logf("SIGSTOP of %s (%s): its %d leases (%d shards and %s at epoch %d) all passed to the other worker at higher epochs %v later",
		w.name, w.id, len(held), shards, sweeper.LeaseName, held[sweeper.LeaseName], d.dbNow().Sub(stoppedAt).Round(time.Millisecond))
	d.waitShards(20*time.Second, other)
	return held, stoppedAt
}

// stopNodesOf stops up to n daemons whose node's shard worker holds now,
// once the stream no longer targets them and their commands have ended,
// and returns their node ids.
func (d *splitDeployment) stopNodesOf(f *splitFleet, s *commandStream, worker string, n int) []string {
	d.t.Helper()
	ctx := context.Background()
	leases, err := d.st.LeaseList(ctx, "shard:")
	if err != nil {
		d.t.Fatal(err)
	}
	holder := map[string]string{}
	for _, l := range leases {
		holder[l.Name] = l.Holder
	}
	var picked []string
	for _, dm := range f.daemons {
		if id := dm.NodeID(); holder[shard.LeaseName(store.ShardOf(id))] == worker && len(picked) < n {
			picked = append(picked, id)
		}
	}
	if len(picked) == 0 {
		d.t.Fatalf("no daemon's node is in a shard of %s", worker)
	}
	s.exclude(picked...)
	eventually(d.t, 30*time.Second, func() bool {
		var open int
		err := d.db.QueryRow(ctx, `SELECT count(*) FROM commands WHERE node_id = ANY($1)
			AND state NOT IN ('succeeded', 'failed', 'cancelled', 'expired', 'lost')`, picked).Scan(&open)
		if err != nil {
			d.t.Fatal(err)
		}
		return open == 0
	}, func() string { return "commands of the nodes to stop did not end" })
	for _, id := range picked {
		f.stop[id]()
	}
	return picked
}

// leaseGuarding names the lease that must fence a worker's write.
func leaseGuarding(w loggedWrite) string {
	switch w.Table {
	case "nodes":
		if w.Shard != nil {
			return shard.LeaseName(*w.Shard)
		}
	case "commands":
		if w.Op == "UPDATE" {
			return sweeper.LeaseName
		}
		return "singleton:retention"
	case "outbox_cursors":
		return "singleton:outbox-dispatch:" + w.Key
	case "join_tokens", "api_tokens":
		return "singleton:iam:token-expiry"
	case "events", "audit_log":
		return "singleton:retention"
	}
	return ""
}

// checkFenced checks the write log for w, stopped at stoppedAt while
// holding stale (lease name → epoch) and resumed at resumedAt: no lease w
// held before the pause came back to w at its old epoch, and every write w
// made after the stop was made while the database gave the lease that
// guards it to w, under an acquisition made after resumedAt for every write
// after it (a statement already sent at the stop may land just after it,
// under the lease w held then). It also checks that the nodes w was to mark
// unreachable were marked by w, so the check is not vacuous.
func (d *splitDeployment) checkFenced(w *splitProc, stale map[string]int64, stoppedAt, resumedAt time.Time, unreachable []string) {
	d.t.Helper()
	// The holder of each lease after each logged change, in order.
	type change struct {
		at     time.Time
		holder string
		epoch  int64
	}
	history := map[string][]change{}
	for _, lw := range d.writes(`tbl = 'leases'`) {
		c := change{at: lw.At}
		if lw.NewVal != nil {
			h, e, _ := strings.Cut(*lw.NewVal, "@")
			c.holder = h
			fmt.Sscan(e, &c.epoch)
		}
		history[lw.Key] = append(history[lw.Key], c)
		if c.holder == w.id {
			if old, ok := stale[lw.Key]; ok && c.epoch <= old && lw.At.After(resumedAt) {
				d.t.Errorf("%s took back %s at epoch %d after the pause, not above its old %d", w.name, lw.Key, c.epoch, old)
			}
		}
	}
	holderAt := func(lease string, at time.Time) (change, bool) {
		var last change
		found := false
		for _, c := range history[lease] {
			if c.at.After(at) {
				break
			}
			last, found = c, true
		}
		return last, found
	}
	writes := d.writes(`app = $1 AND tbl <> 'leases' AND at > $2`, d.app(w.name), stoppedAt)
	marked := map[string]bool{}
	for _, lw := range writes {
		lease := leaseGuarding(lw)
		c, ok := holderAt(lease, lw.At)
		switch {
		case lease == "":
			d.t.Errorf("%s wrote %s %s %s, which no lease guards", w.name, lw.Op, lw.Table, lw.Key)
		case !ok || c.holder != w.id:
			d.t.Errorf("%s wrote %s %s %s at %v while %s was held by %q: a write under a lost lease landed",
				w.name, lw.Op, lw.Table, lw.Key, lw.At, lease, c.holder)
		case lw.At.After(resumedAt) && !c.at.After(resumedAt):
			d.t.Errorf("%s wrote %s %s %s at %v under %s epoch %d, acquired before its pause",
				w.name, lw.Op, lw.Table, lw.Key, lw.At, lease, c.epoch)
		}
		if lw.Table == "nodes" && lw.NewVal != nil && *lw.NewVal == store.NodeUnreachable {
			marked[lw.Key] = true
		}
	}
	for _, id := range unreachable {
		if !marked[id] {
			d.t.Errorf("node %s was not marked unreachable by %s: the fencing check saw none of its writes", id, w.name)
		}
	}
	d.t.Logf("fencing: %s made %d fenced writes after SIGCONT, each under a lease it acquired after the pause; none under the %d leases it held before",
		w.name, len(writes), len(stale))
}

// moveGateway sends SIGTERM to from and waits until every running daemon
// holds its session on to.
func (d *splitDeployment) moveGateway(f *splitFleet, from, to *splitProc, running int) {
	d.t.Helper()
	ctx := context.Background()
	before, err := d.st.SessionList(ctx, from.id)
	if err != nil {
		d.t.Fatal(err)
	}
	start := time.Now()
	from.p.Signal(syscall.SIGTERM)
	if code := from.p.Wait(30 * time.Second); code != 0 {
		d.t.Errorf("%s exited %d after SIGTERM, want 0", from.name, code)
	}
	exited := time.Since(start)
	var onFrom, onTo int
	eventually(d.t, 30*time.Second, func() bool {
		a, err := d.st.SessionList(ctx, from.id)
		if err != nil {
			d.t.Fatal(err)
		}
		b, err := d.st.SessionList(ctx, to.id)
		if err != nil {
			d.t.Fatal(err)
		}
		onFrom, onTo = len(a), len(b)
		return onFrom == 0 && onTo == running && f.connected() == running
	}, func() string {
		return fmt.Sprintf("sessions: %d on %s, %d on %s, %d connected; want all %d on %s", onFrom, from.name, onTo, to.name, f.connected(), running, to.name)
	})
	d.t.Logf("SIGTERM of %s: exited in %v; its %d sessions all on %s %v after the signal",
		from.name, exited.Round(time.Millisecond), len(before), to.name, time.Since(start).Round(time.Millisecond))
}

// terminalStates waits, at most timeout, until no command is left
// non-terminal, and returns every command's state by id.
func (d *splitDeployment) terminalStates(timeout time.Duration) map[string]string {
	d.t.Helper()
	ctx := context.Background()
	var open int
	eventually(d.t, timeout, func() bool {
		err := d.db.QueryRow(ctx, `SELECT count(*) FROM commands
			WHERE state NOT IN ('succeeded', 'failed', 'cancelled', 'expired', 'lost')`).Scan(&open)
		if err != nil {
			d.t.Fatal(err)
		}
		return open == 0
	}, func() string { return fmt.Sprintf("%d commands still not terminal", open) })
	states := map[string]string{}
	rows, err := d.db.Query(ctx, `SELECT id, state FROM commands`)
	if err != nil {
		d.t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id, state string
		if err := rows.Scan(&id, &state); err != nil {
			d.t.Fatal(err)
		}
		states[id] = state
	}
	if err := rows.Err(); err != nil {
		d.t.Fatal(err)
	}
	return states
}

// checkCommandsTerminal waits until no command is left non-terminal (at
// most the commands' deadline plus the sweeper's window) and checks that
// every command in ids, and every command in the table, succeeded, with
// exactly one transition into a terminal state and none out of one.
func (d *splitDeployment) checkCommandsTerminal(ids []string) {
	d.t.Helper()
	states := d.terminalStates(splitCommandTimeout + 10*time.Second)
	tally := map[string]int{}
	for _, s := range states {
		tally[s]++
	}
	for _, id := range ids {
		if _, ok := states[id]; !ok {
			d.t.Errorf("command %s, created through the API, is not in commands", id)
		}
	}
	into, outOf := map[string]int{}, map[string]int{}
	for _, lw := range d.writes(`tbl = 'commands'`) {
		wasTerminal := lw.OldVal != nil && store.IsTerminal(*lw.OldVal)
		isTerminal := lw.NewVal != nil && store.IsTerminal(*lw.NewVal)
		if isTerminal && !wasTerminal {
			into[lw.Key]++
		}
		if wasTerminal {
			outOf[lw.Key]++
		}
	}
	bad := 0
	for id, state := range states {
		if state != store.CommandSucceeded || into[id] != 1 || outOf[id] != 0 {
			if bad++; bad <= 10 {
				d.t.Errorf("command %s: state %s, %d transitions into a terminal state and %d out of one; want succeeded, 1 and 0",
					id, state, into[id], outOf[id])
			}
		}
	}
	d.t.Logf("commands: %d created through the API (%d rows), by state %v; %d not ended exactly once as succeeded",
		len(ids), len(states), tally, bad)
	if len(states) < 500 {
		d.t.Errorf("only %d commands in the stream; the checks above need a steady stream", len(states))
	}
}

// leaveGracefully sends SIGTERM to w and checks it exits 0 having released
// its leases and left workers, and that last then holds every shard.
func (d *splitDeployment) leaveGracefully(w *splitProc, last string) {
	d.t.Helper()
	ctx := context.Background()
	start := time.Now()
	w.p.Signal(syscall.SIGTERM)
	if code := w.p.Wait(30 * time.Second); code != 0 {
		d.t.Errorf("%s exited %d after SIGTERM, want 0", w.name, code)
	}
	w.p.WaitLine(`msg="Released shards and left"`, time.Second)
	live, err := d.st.WorkerList(ctx, 0, nil)
	if err != nil {
		d.t.Fatal(err)
	}
	if slices.ContainsFunc(live, func(x *store.Worker) bool { return x.ID == w.id }) {
		d.t.Errorf("%s is still in workers after SIGTERM", w.name)
	}
	leases, err := d.st.LeaseList(ctx, "")
	if err != nil {
		d.t.Fatal(err)
	}
	var kept []string
	for _, l := range leases {
		if l.Holder == w.id {
			kept = append(kept, l.Name)
		}
	}
	sort.Strings(kept)
	if len(kept) > 0 {
		d.t.Errorf("%s still holds %v after SIGTERM", w.name, kept)
	}
	d.waitShards(15*time.Second, last)
	d.t.Logf("SIGTERM of %s: released its leases and left workers; all 256 shards on the last worker %v after the signal",
		w.name, time.Since(start).Round(time.Millisecond))
}

// TestSplitRolesRefusedOnSQLite checks that worker roles alone, asked for
// with --roles, are refused on the embedded SQLite store with exit 2 and
// one line saying why and what to do.
func TestSplitRolesRefusedOnSQLite(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, "better-compute")
	code, stdout, stderr := testenv.Run(t, []string{"BETTER_COMPUTE_DATA_DIR=" + t.TempDir()}, "", bin,
		"serve", "--roles", workerRoles)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if code != 2 || len(lines) != 1 || stdout != "" || !strings.Contains(stderr, "split roles need PostgreSQL") ||
		!strings.Contains(stderr, "database") {
		t.Fatalf("serve --roles %s on SQLite: exit %d, stdout %q, stderr %q; want exit 2 and one line saying split roles need PostgreSQL",
			workerRoles, code, stdout, stderr)
	}
}

// TestStalledFencedTransaction holds a fenced transaction open on one shard
// lease, as a worker paused or cut off between its fence check (which
// takes FOR SHARE on the lease row) and its commit leaves it, for longer
// than the leases' TTL, and checks that the other 255 shards stay held
// throughout (one stuck transaction must not stall the shard rounds of the
// live workers), that the server ended the stuck transaction rather than
// let it commit, and that its shard is held again afterwards.
func TestStalledFencedTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newSplitDeployment(t, 0, 2)
	d.waitShards(40*time.Second, d.workers[0].id, d.workers[1].id)
	leases, err := d.st.LeaseList(ctx, "shard:")
	if err != nil {
		t.Fatal(err)
	}
	stuck := leases[0]
	release := make(chan struct{})
	stalled := make(chan error, 1)
	go func() {
		stalled <- d.st.FencedTx(ctx, store.Fence{Lease: stuck.Name, Holder: stuck.Holder, Epoch: stuck.Epoch},
			func(store.Store) error { <-release; return nil })
	}()
	start := time.Now()
	worst := 0
	for time.Since(start) < 20*time.Second {
		now := d.dbNow()
		leases, err := d.st.LeaseList(ctx, "shard:")
		if err != nil {
			t.Fatal(err)
		}
		unheld := 0
		for _, l := range leases {
			if l.Name != stuck.Name && (l.Holder == "" || !l.ExpiresAt.After(now)) {
				unheld++
			}
		}
		if unheld > worst {
			worst = unheld
			t.Logf("%v after the transaction stalled on %s: %d other shards unheld", time.Since(start).Round(time.Millisecond), stuck.Name, unheld)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if worst > 0 {
		t.Errorf("a fenced transaction left open on %s left up to %d other shards unheld, want none", stuck.Name, worst)
	}
	close(release)
	if err := <-stalled; err == nil {
		t.Errorf("a fenced transaction left open past its lease's TTL committed; want the server to have ended it")
	} else {
		t.Logf("the stalled transaction ended: %v", err)
	}
	d.waitShards(10*time.Second, d.workers[0].id, d.workers[1].id)
}
