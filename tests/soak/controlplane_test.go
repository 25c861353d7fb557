package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/tests/testenv"
)

// soakSecret is the deployment secret every process shares.
const soakSecret = "soak-secret-soak-secret-soak-secret-soak"

// heartbeatInterval is what the gateways tell daemons; liveness calls a
// node unreachable after three of them.
const heartbeatInterval = 3 * time.Second

// workerRoles are the roles of a worker process.
const workerRoles = "controllers,scheduler,sinks,iam"

// processKeep is how many recent output lines of each process are kept in
// memory for WaitLine; the rest is only in the log folder.
const processKeep = 2000

// cpProc is one control-plane process: its roles and its configuration
// file (ports fixed, so that a restart listens where daemons dial), and
// the process of its current run.
type cpProc struct {
	name  string // api, gateway-1, worker-1
	roles string
	cfg   string
	url   string // api: base URL of the API; gateway: what daemons dial

	p      *testenv.Proc // nil while stopped
	id     string        // the gateway's or worker's id in this run
	starts int
	gone   bool // removed for good
}

// controlPlane is the soak's deployment on its own PostgreSQL schema.
type controlPlane struct {
	t       *testing.T
	bin     string
	url     string // the schema's URL
	tag     string // makes application names unique
	certTTL time.Duration
	logDir  string
	tls     string // the gateway's tlsFiles configuration lines

	st    store.Store   // the test's own store (application_name soak-test)
	db    *pgxpool.Pool // the test's own connections for the checks
	token string        // an admin API token

	mu       sync.Mutex
	api      *cpProc
	gateways []*cpProc // every gateway started, the removed ones too
	workers  []*cpProc
}

// newControlPlane migrates a fresh schema, runs pki init and
// issue-gateway, installs the write log and starts api, two gateways and
// two workers.
func newControlPlane(t *testing.T, certTTL time.Duration, logDir string) *controlPlane {
	t.Helper()
	ctx := context.Background()
	c := &controlPlane{t: t, bin: testenv.Binary(t, "better-compute"), url: pgtest.URL(t),
		tag: fmt.Sprintf("%08x", rand.Uint32()), certTTL: certTTL, logDir: logDir}
	c.tls = testenv.InitPostgresPKI(t, []string{"BETTER_COMPUTE_SECRET=" + soakSecret, "BETTER_COMPUTE_DATABASE_URL=" + c.url}, "soak.test")
	installWriteLog(t, c.url)

	st, err := backend.Open(ctx, c.url+"&application_name=soak-test", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c.st = st
	db, err := pgxpool.New(ctx, c.url+"&application_name=soak-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	c.db = db
	secret, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleAdmin, Description: "soak"})
	if err != nil {
		t.Fatal(err)
	}
	c.token = secret

	apiPort := testenv.FreePort(t)
	c.api = &cpProc{name: "api", roles: "api", cfg: c.config("api", apiPort, 0), url: fmt.Sprintf("http://127.0.0.1:%d/api", apiPort)}
	c.addGateway()
	c.addGateway()
	for i := range 2 {
		name := fmt.Sprintf("worker-%d", i+1)
		c.workers = append(c.workers, &cpProc{name: name, roles: workerRoles, cfg: c.config(name, 0, 0)})
	}
	c.startAll()
	return c
}

// config writes the configuration file of process name: the API on
// apiPort and the gateway on gwPort (0: any free port, for a process that
// does not run the role).
func (c *controlPlane) config(name string, apiPort, gwPort int) string {
	body := fmt.Sprintf(`pki:
  reattestGrace: 168h
host:
  listen: 127.0.0.1:%d
  gateway:
    listen: 127.0.0.1:%d
    heartbeatInterval: %s
    drainDelay: 3s
    nodeCertTTL: %s
    limits: {pendingPerSource: 256, queuedPerSource: 4096, joinsPerSecond: 1000, joinBurst: 1000, handshakeTimeout: 10s}
%s`, apiPort, gwPort, heartbeatInterval, c.certTTL, c.tls)
	p := filepath.Join(c.t.TempDir(), name+".yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		c.t.Fatal(err)
	}
	return p
}

// addGateway adds a gateway on a port of its own; it starts with the next
// startAll or start.
func (c *controlPlane) addGateway() *cpProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	port := testenv.FreePort(c.t)
	name := fmt.Sprintf("gateway-%d", len(c.gateways)+1)
	g := &cpProc{name: name, roles: "gateway", cfg: c.config(name, 0, port), url: fmt.Sprintf("https://localhost:%d", port)}
	c.gateways = append(c.gateways, g)
	return g
}

// procs returns every process not removed for good.
func (c *controlPlane) procs() []*cpProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := []*cpProc{c.api}
	for _, g := range c.gateways {
		if !g.gone {
			out = append(out, g)
		}
	}
	return append(out, c.workers...)
}

// liveGateways returns the gateways not removed for good.
func (c *controlPlane) liveGateways() []*cpProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*cpProc
	for _, g := range c.gateways {
		if !g.gone {
			out = append(out, g)
		}
	}
	return out
}

// startAll starts every stopped process at once and waits until each is
// ready.
func (c *controlPlane) startAll() {
	c.t.Helper()
	var wg sync.WaitGroup
	for _, p := range c.procs() {
		if p.p == nil {
			c.launch(p)
		}
	}
	for _, p := range c.procs() {
		wg.Go(func() { c.ready(p) })
	}
	wg.Wait()
	if c.t.Failed() {
		c.t.FailNow()
	}
}

// start starts p and waits until it is ready.
func (c *controlPlane) start(p *cpProc) {
	c.t.Helper()
	c.launch(p)
	c.ready(p)
}

// launch runs serve --roles for p with the fence tag on, its output
// appended to its log file.
func (c *controlPlane) launch(p *cpProc) {
	c.t.Helper()
	log, err := os.OpenFile(filepath.Join(c.logDir, p.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { log.Close() })
	fmt.Fprintf(log, "==== start %d at %s\n", p.starts+1, time.Now().UTC().Format(time.RFC3339Nano))
	env := []string{"BETTER_COMPUTE_SECRET=" + soakSecret,
		"BETTER_COMPUTE_DATABASE_URL=" + c.url + "&application_name=" + c.app(p.name),
		postgres.EnvFenceTag + "=1"}
	proc := testenv.StartLogged(c.t, log, processKeep, env, c.bin, "serve", "--config", p.cfg, "--roles", p.roles, "--no-migrate")
	c.mu.Lock()
	p.p, p.id = proc, ""
	p.starts++
	c.mu.Unlock()
}

// ready waits until p's roles are up and notes its id. It runs in its own
// goroutine (startAll): it reports with Errorf.
func (c *controlPlane) ready(p *cpProc) {
	const wait = 90 * time.Second
	c.mu.Lock()
	proc := p.p
	c.mu.Unlock()
	var m []string
	switch p.roles {
	case "api":
		waitLine(c.t, proc, `msg="API listening"`, wait)
		return
	case "gateway":
		m = waitLine(c.t, proc, `msg="Gateway listening".* gateway_id=(\S+)`, wait)
	default:
		m = waitLine(c.t, proc, `msg="Worker roles running".* worker=(\S+)`, wait)
	}
	if m != nil {
		c.mu.Lock()
		p.id = m[1]
		c.mu.Unlock()
	}
}

// running reports whether p runs now, and its id in this run.
func (c *controlPlane) running(p *cpProc) (bool, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return p.p != nil, p.id
}

// gatewayIDs returns the ids of the gateways running now.
func (c *controlPlane) gatewayIDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for _, g := range c.gateways {
		if g.p != nil && g.id != "" {
			ids = append(ids, g.id)
		}
	}
	return ids
}

// app is the application_name of process name.
func (c *controlPlane) app(name string) string { return name + "." + c.tag }

// kill sends SIGKILL to p's process group and waits for it.
func (c *controlPlane) kill(p *cpProc) {
	c.detach(p).Kill()
}

// stop sends SIGTERM to p and waits (at most 30 s, then SIGKILL).
func (c *controlPlane) stop(p *cpProc) {
	c.detach(p).Stop(syscall.SIGTERM, 30*time.Second)
}

// detach marks p stopped and returns its process.
func (c *controlPlane) detach(p *cpProc) *testenv.Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	proc := p.p
	p.p, p.id = nil, ""
	return proc
}

// remove stops gateway g for good.
func (c *controlPlane) remove(g *cpProc) {
	c.stop(g)
	c.mu.Lock()
	g.gone = true
	c.mu.Unlock()
}

// worker returns the worker process with id, nil when none has it.
func (c *controlPlane) worker(id string) *cpProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.workers {
		if w.id == id {
			return w
		}
	}
	return nil
}

// leaseHolder returns the holder and epoch of lease name, "" when it is
// not held now by the database's clock.
func (c *controlPlane) leaseHolder(name string) (string, int64) {
	var holder string
	var epoch int64
	err := c.db.QueryRow(context.Background(), `SELECT CASE WHEN expires_at > now() THEN holder ELSE '' END, epoch
		FROM leases WHERE name = $1`, name).Scan(&holder, &epoch)
	if err != nil {
		return "", 0
	}
	return holder, epoch
}

// leasesOf returns the leases holder holds now, by name, with their epochs.
func (c *controlPlane) leasesOf(holder string) map[string]int64 {
	c.t.Helper()
	rows, err := c.db.Query(context.Background(), `SELECT name, epoch FROM leases WHERE holder = $1 AND expires_at > now()`, holder)
	if err != nil {
		c.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var name string
		var epoch int64
		if err := rows.Scan(&name, &epoch); err != nil {
			c.t.Fatal(err)
		}
		out[name] = epoch
	}
	return out
}

// shardsSettled reports whether all 256 shard leases are held, unexpired,
// by live workers of this run.
func (c *controlPlane) shardsSettled() bool {
	var ids []string
	c.mu.Lock()
	for _, w := range c.workers {
		if w.p != nil && w.id != "" {
			ids = append(ids, w.id)
		}
	}
	c.mu.Unlock()
	var n int
	err := c.db.QueryRow(context.Background(), `SELECT count(*) FROM leases
		WHERE name LIKE 'shard:%' AND expires_at > now() AND holder = ANY($1)`, ids).Scan(&n)
	return err == nil && n == store.Shards
}

// apiUp reports whether the API answers its health check.
func (c *controlPlane) apiUp() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return healthy(ctx, c.api.url)
}

// waitLine is Proc.WaitLine for a goroutine: a miss is an Errorf, and nil.
func waitLine(t *testing.T, p *testenv.Proc, pattern string, timeout time.Duration) []string {
	m, err := p.Await(pattern, timeout)
	if err != nil {
		t.Error(err)
	}
	return m
}

// allRunning reports whether every process not removed for good runs and
// is ready.
func (c *controlPlane) allRunning() bool {
	for _, p := range c.procs() {
		if ok, id := c.running(p); !ok || (id == "" && p.roles != "api") {
			return false
		}
	}
	return true
}
