package doctor_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/doctor"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/reconcilers/sweeper"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

const secret = "doctor-test-secret-0123456789abcdef"

// rawStore is a backend's store with raw SQL for states the API cannot
// reach.
type rawStore struct {
	store.Store
	// ExecRaw runs raw SQL on the same database over a connection of its
	// own (sqlitetest.Exec, pgtest.Exec).
	ExecRaw func(ctx context.Context, sql string) error
}

// backends open a fresh, empty store of each backend.
var backends = []struct {
	name string
	open func(t *testing.T) rawStore
}{
	{"sqlite", func(t *testing.T) rawStore {
		path := filepath.Join(t.TempDir(), "state.db")
		st, err := sqlite.Open(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return rawStore{st, sqlitetest.Exec(path)}
	}},
	{"postgres", func(t *testing.T) rawStore {
		url := pgtest.URL(t)
		st, err := postgres.Open(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return rawStore{st, pgtest.Exec(url)}
	}},
}

// each runs fn against a fresh, migrated store of each backend.
func each(t *testing.T, fn func(t *testing.T, st rawStore)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st := b.open(t)
			if _, err := st.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			fn(t, st)
		})
	}
}

func want(t *testing.T, r doctor.Result, id string, st doctor.Status, hint string) {
	t.Helper()
	if r.ID != id || r.Status != st || !strings.Contains(r.Hint, hint) {
		t.Fatalf("got %s %s %q (detail %q); want %s %s with %q", r.ID, r.Status, r.Hint, r.Detail, id, st, hint)
	}
}

func ptr[T any](v T) *T { return &v }

// fleet writes sites, pools and nodes.
type fleet struct {
	t    *testing.T
	st   store.Store
	pool string
}

func newFleet(t *testing.T, st store.Store) *fleet {
	ctx := context.Background()
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "dc1", Region: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "gpus", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	return &fleet{t: t, st: st, pool: pool.ID}
}

// node adds a ready node last seen at seen, with a certificate ending at
// certEnd, running bcd version.
func (f *fleet) node(id, version string, seen, certEnd time.Time) {
	f.t.Helper()
	ctx := context.Background()
	if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: f.pool, Hostname: id, MachineID: id,
		BCDVersion: version, CertNotAfter: &certEnd, Now: &seen}); err != nil {
		f.t.Fatal(err)
	}
	if _, _, err := f.st.SessionOpen(ctx, &store.SessionOpenParams{NodeID: id, SessionID: "sess_" + id, GatewayID: "gw-1", Now: &seen}); err != nil {
		f.t.Fatal(err)
	}
	if err := f.st.NodeSetState(ctx, id, store.NodeReady); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fleet) gateway(id string, sessions, maxStreams int, at time.Time) {
	f.t.Helper()
	if _, err := f.st.GatewayUpsert(context.Background(), &store.GatewayUpsertParams{ID: id, Region: "eu-1", Address: "https://gw.example.com",
		Sessions: sessions, MaxStreams: maxStreams, Now: &at}); err != nil {
		f.t.Fatal(err)
	}
}

// overdue enqueues a command for node whose deadline passed late ago.
func (f *fleet) overdue(node string, late time.Duration) {
	f.t.Helper()
	created := time.Now().Add(-late - time.Minute)
	if _, err := f.st.CommandEnqueue(context.Background(), &store.CommandEnqueueParams{NodeIDs: []string{node}, Kind: "exec",
		SessionSpec: []byte(`{}`), Timeout: time.Minute, Now: &created}); err != nil {
		f.t.Fatal(err)
	}
}

// sweeperLease takes the sweeper's lease at at for ttl.
func sweeperLease(t *testing.T, st store.Store, at time.Time, ttl time.Duration) {
	t.Helper()
	if _, ok, err := st.LeaseAcquire(context.Background(), &store.LeaseAcquireParams{Name: sweeper.LeaseName, Holder: "worker-1", TTL: ttl, Now: &at}); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
}

func TestSchema(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			st := b.open(t)
			r, migrated := doctor.Schema(ctx, st)
			want(t, r, doctor.IDSchema, doctor.Fail, "pending migration(s): run better-compute migrate")
			if migrated {
				t.Fatal("an empty database counts as migrated")
			}
			rep := doctor.Run(ctx, st, doctor.Config{Secret: secret})
			if len(rep.Checks) != 3 || rep.Status != doctor.Fail || !rep.Failed(false) {
				t.Fatalf("unmigrated report = %+v", rep)
			}
			if _, err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			r, migrated = doctor.Schema(ctx, st)
			want(t, r, doctor.IDSchema, doctor.OK, "schema is current")
			if !migrated {
				t.Fatal("migrated database counts as unmigrated")
			}
			if err := st.ExecRaw(ctx, `INSERT INTO schema_migrations (name, applied_at) VALUES ('9999_from_the_future.sql', 'x')`); err != nil {
				t.Fatal(err)
			}
			r, _ = doctor.Schema(ctx, st)
			want(t, r, doctor.IDSchema, doctor.Fail, "migrated by a newer build")
			if !strings.Contains(r.Detail, "9999_from_the_future") {
				t.Fatalf("detail %q does not name the unknown migration", r.Detail)
			}
		})
	}
}

// skewed is a store whose clock runs off by skew.
type skewed struct {
	store.Store
	skew time.Duration
}

func (s skewed) Now(ctx context.Context) (time.Time, error) {
	t, err := s.Store.Now(ctx)
	return t.Add(s.skew), err
}

func TestClock(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, st rawStore) {
		ctx := context.Background()
		r, db := doctor.Clock(ctx, st, time.Now)
		want(t, r, doctor.IDClock, doctor.OK, "")
		if d := time.Since(db).Abs(); d > time.Second {
			t.Fatalf("database time %v is %v off", db, d)
		}
		r, _ = doctor.Clock(ctx, skewed{st, 5 * time.Second}, time.Now)
		want(t, r, doctor.IDClock, doctor.Warn, "ahead of this machine's")
		r, _ = doctor.Clock(ctx, skewed{st, -2 * time.Minute}, time.Now)
		want(t, r, doctor.IDClock, doctor.Fail, "2m0s behind this machine's")
	})
}

func TestPKI(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, st rawStore) {
		ctx := context.Background()
		now := time.Now()
		r, b := doctor.PKI(ctx, st, secret, false, now)
		want(t, r, doctor.IDPKI, doctor.Fail, "pki init")
		r, _ = doctor.PKI(ctx, st, secret, true, now)
		want(t, r, doctor.IDPKI, doctor.Warn, "serve makes it")
		if b != nil {
			t.Fatal("bundle without a row")
		}
		if _, err := bootstrap.InitBundle(ctx, st, secret, "compute.example.com"); err != nil {
			t.Fatal(err)
		}
		r, b = doctor.PKI(ctx, st, secret, false, now)
		want(t, r, doctor.IDPKI, doctor.OK, "opens")
		if b == nil || b.TrustDomain != "compute.example.com" {
			t.Fatalf("bundle = %+v", b)
		}
		r, _ = doctor.PKI(ctx, st, strings.Repeat("x", 40), false, now)
		want(t, r, doctor.IDPKI, doctor.Fail, "does not open with this deployment secret")
		// Each CA is its own check, naming the CA and its end date: ok,
		// warn within 90 days, fail within 30 and once ended.
		end := b.NodeCA.Cert.NotAfter.UTC().Format("2006-01-02")
		for _, tc := range []struct {
			at   time.Time
			st   doctor.Status
			hint string
		}{
			{now, doctor.OK, "ends on " + end},
			{now.Add(pki.DefaultCAValidity - 60*24*time.Hour), doctor.Warn, "ends on " + end + ", in "},
			{now.Add(pki.DefaultCAValidity - 20*24*time.Hour), doctor.Fail, "ends on " + end + ", in "},
			{now.Add(pki.DefaultCAValidity + time.Hour), doctor.Fail, "ended on " + end},
		} {
			r, b := doctor.PKI(ctx, st, secret, false, tc.at)
			want(t, r, doctor.IDPKI, doctor.OK, "opens")
			cas := doctor.CAs(b, r, tc.at)
			if len(cas) != 3 {
				t.Fatalf("CA checks = %+v", cas)
			}
			for i, name := range []string{"node CA", "gateway CA", "internal CA"} {
				want(t, cas[i], []string{doctor.IDNodeCA, doctor.IDGatewayCA, doctor.IDInternalCA}[i], tc.st, "the "+name+" "+tc.hint)
			}
		}
		for _, c := range doctor.CAs(nil, doctor.Result{ID: doctor.IDPKI, Status: doctor.Warn}, now) {
			if c.Status != doctor.Warn || !strings.Contains(c.Hint, "see the pki check") {
				t.Errorf("CA check without a bundle = %+v", c)
			}
		}
	})
}

func TestGatewayIdentity(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b, err := pki.Init(pki.InitOptions{TrustDomain: "compute.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.Init(pki.InitOptions{TrustDomain: "compute.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert, key, err := bootstrap.WriteGatewayCert(b, dir, []string{"gw.example.com"}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	gw := doctor.GatewayConfig{Enabled: true, CertFile: cert, KeyFile: key, PublicURL: "https://gw.example.com:443"}

	want(t, doctor.GatewayIdentity(b, gw, false, now), doctor.IDGatewayIdentity, doctor.OK, "can authenticate daemons")
	want(t, doctor.GatewayIdentity(nil, doctor.GatewayConfig{}, false, now), doctor.IDGatewayIdentity, doctor.OK, "does not run the gateway role")
	want(t, doctor.GatewayIdentity(nil, gw, false, now), doctor.IDGatewayIdentity, doctor.Fail, "without the PKI bundle")
	want(t, doctor.GatewayIdentity(other, gw, false, now), doctor.IDGatewayIdentity, doctor.Fail, "does not chain to the bundle's gateway serving CA")
	want(t, doctor.GatewayIdentity(b, doctor.GatewayConfig{Enabled: true}, false, now), doctor.IDGatewayIdentity, doctor.Fail, "tlsFiles is not set")
	missing := doctor.GatewayConfig{Enabled: true, CertFile: filepath.Join(dir, "none.crt"), KeyFile: filepath.Join(dir, "none.key")}
	want(t, doctor.GatewayIdentity(b, missing, false, now), doctor.IDGatewayIdentity, doctor.Fail, "cannot load")
	want(t, doctor.GatewayIdentity(b, missing, true, now), doctor.IDGatewayIdentity, doctor.Warn, "serve issues it")
	wrongHost := gw
	wrongHost.PublicURL = "https://gateway.elsewhere.example:8443"
	want(t, doctor.GatewayIdentity(b, wrongHost, false, now), doctor.IDGatewayIdentity, doctor.Fail, "does not name gateway.elsewhere.example")
	want(t, doctor.GatewayIdentity(b, gw, false, now.Add(pki.DefaultServerTTL-10*24*time.Hour)), doctor.IDGatewayIdentity, doctor.Warn, "ends in 10 days")
	want(t, doctor.GatewayIdentity(b, gw, false, now.Add(pki.DefaultServerTTL-3*24*time.Hour)), doctor.IDGatewayIdentity, doctor.Fail, "re-issue it now")
	want(t, doctor.GatewayIdentity(b, gw, true, now.Add(pki.DefaultServerTTL-10*24*time.Hour)), doctor.IDGatewayIdentity, doctor.Warn, "re-issues it within the hour")
	want(t, doctor.GatewayIdentity(b, gw, true, now.Add(pki.DefaultServerTTL-3*24*time.Hour)), doctor.IDGatewayIdentity, doctor.Fail, "not running")
	want(t, doctor.GatewayIdentity(b, gw, false, now.Add(pki.DefaultServerTTL+time.Hour)), doctor.IDGatewayIdentity, doctor.Fail, "has expired")

	// The leaf alone: a daemon holding only the pin finds no anchor.
	pem, err := os.ReadFile(cert)
	if err != nil {
		t.Fatal(err)
	}
	end := strings.Index(string(pem), "-----END CERTIFICATE-----") + len("-----END CERTIFICATE-----\n")
	leafOnly := filepath.Join(dir, "leaf.crt")
	if err := os.WriteFile(leafOnly, pem[:end], 0o600); err != nil {
		t.Fatal(err)
	}
	lo := gw
	lo.CertFile = leafOnly
	want(t, doctor.GatewayIdentity(b, lo, false, now), doctor.IDGatewayIdentity, doctor.Fail, "lacks the gateway serving CA")
}

func TestNotifier(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	want(t, doctor.Notifier(ctx, store.DialectSQLite, "", ""), doctor.IDGatewayNotifier, doctor.OK, "in-process")
	want(t, doctor.Notifier(ctx, store.DialectPostgres, pgtest.URL(t), ""), doctor.IDGatewayNotifier, doctor.OK, "delivers wake-ups")
	want(t, doctor.Notifier(ctx, store.DialectPostgres, "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2", ""),
		doctor.IDGatewayNotifier, doctor.Fail, "1-second loop")
}

// TestNotifierThroughPgBouncer: through PgBouncer in transaction mode LISTEN
// succeeds and hears nothing, which fails the check with a hint naming
// database.notifyURL; a direct notifyURL beside the pooled URL passes.
func TestNotifierThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct, bouncer := pgtest.Database(t)
	start := time.Now()
	r := doctor.Notifier(ctx, store.DialectPostgres, bouncer, "")
	want(t, r, doctor.IDGatewayNotifier, doctor.Fail, "set database.notifyURL (BETTER_COMPUTE_DATABASE_NOTIFY_URL)")
	if took := time.Since(start); took < doctor.NotifierWait || took > doctor.NotifierWait+5*time.Second {
		t.Errorf("the failing check took %v, want about %v", took, doctor.NotifierWait)
	}
	want(t, doctor.Notifier(ctx, store.DialectPostgres, bouncer, direct), doctor.IDGatewayNotifier, doctor.OK, "delivers wake-ups")
}

func TestRoutes(t *testing.T) {
	t.Parallel()
	want(t, doctor.Routes("/api", nil), doctor.IDRoutes, doctor.OK, "no host routes are configured")
	want(t, doctor.Routes("/metrics", nil), doctor.IDRoutes, doctor.Fail, "clashes with the built-in route /metrics")
	want(t, doctor.Routes("/.well-known", nil), doctor.IDRoutes, doctor.Fail, "/.well-known/better-compute")
	want(t, doctor.Routes("/api", []string{"/hooks", "/status"}), doctor.IDRoutes, doctor.OK, "2 host routes")
	want(t, doctor.Routes("/api", []string{"/api/extra"}), doctor.IDRoutes, doctor.Fail, "clashes with basePath /api")
	want(t, doctor.Routes("/api", []string{"/hooks", "/hooks/github"}), doctor.IDRoutes, doctor.Fail, "host route /hooks/github clashes with host route /hooks")
	want(t, doctor.Routes("/apiv2", []string{"/api"}), doctor.IDRoutes, doctor.OK, "")
}

func TestQueueAndSweeper(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, st rawStore) {
		ctx := context.Background()
		now := time.Now()
		f := newFleet(t, st)
		f.node("node-a", "v0.1.0", now, now.Add(24*time.Hour))

		r, n := doctor.Queue(ctx, st, now)
		want(t, r, doctor.IDQueue, doctor.OK, "no command")
		// No lease and nothing overdue: nothing sweeps, nothing waits.
		want(t, doctor.Sweeper(ctx, st, n, now), doctor.IDSweeper, doctor.Warn, "no process runs the CommandSweeper")
		sweeperLease(t, st, now, 15*time.Second)
		want(t, doctor.Sweeper(ctx, st, n, now), doctor.IDSweeper, doctor.OK, "runs")

		// A command a minute past its deadline warns.
		f.overdue("node-a", time.Minute)
		r, n = doctor.Queue(ctx, st, now)
		want(t, r, doctor.IDQueue, doctor.Warn, "1 command(s) past their deadline")
		if n != 1 || !strings.Contains(r.Detail, "1 queued") {
			t.Fatalf("overdue = %d, detail %q", n, r.Detail)
		}

		// The stopped sweeper: its lease expired ten minutes ago and a
		// command is long overdue.
		sweeperLease(t, st, now.Add(-10*time.Minute), 15*time.Second)
		f.overdue("node-a", 10*time.Minute)
		r, n = doctor.Queue(ctx, st, now)
		want(t, r, doctor.IDQueue, doctor.Fail, "2 command(s) long past their deadline")
		r = doctor.Sweeper(ctx, st, n, now)
		want(t, r, doctor.IDSweeper, doctor.Fail, "the CommandSweeper is stopped and 2 command(s) are overdue")
		if !strings.Contains(r.Detail, "expired") {
			t.Fatalf("detail %q", r.Detail)
		}

		// Released: the same.
		l, err := st.LeaseGet(ctx, sweeper.LeaseName)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.LeaseRelease(ctx, l.Name, l.Holder, l.Epoch); err != nil {
			t.Fatal(err)
		}
		want(t, doctor.Sweeper(ctx, st, n, now), doctor.IDSweeper, doctor.Fail, "stopped")
	})
}

func TestGatewayHeadroom(t *testing.T) {
	t.Parallel()
	now := time.Now()
	gw := func(id string, sessions, max int, age time.Duration, draining bool) *store.Gateway {
		return &store.Gateway{ID: id, Sessions: sessions, MaxStreams: max, HeartbeatAt: now.Add(-age), Draining: draining}
	}
	live := 30 * time.Second
	want(t, doctor.GatewayHeadroom(nil, 0, now, live), doctor.IDGatewayHeadroom, doctor.OK, "no nodes yet")
	want(t, doctor.GatewayHeadroom(nil, 3, now, live), doctor.IDGatewayHeadroom, doctor.Warn, "no live gateway for 3 node(s)")
	want(t, doctor.GatewayHeadroom([]*store.Gateway{gw("gw-1", 10, 100, time.Second, false)}, 10, now, live), doctor.IDGatewayHeadroom, doctor.OK, "10 of 100")
	want(t, doctor.GatewayHeadroom([]*store.Gateway{gw("gw-1", 10, 100, 0, false), gw("gw-2", 95, 100, 0, false)}, 10, now, live),
		doctor.IDGatewayHeadroom, doctor.Warn, "gateway gw-2 uses 95 of 100 streams (95 %)")
	want(t, doctor.GatewayHeadroom([]*store.Gateway{gw("gw-1", 100, 100, 0, false)}, 10, now, live), doctor.IDGatewayHeadroom, doctor.Fail, "gw-1 is full")
	// A stale row and a draining gateway are not live.
	want(t, doctor.GatewayHeadroom([]*store.Gateway{gw("gw-1", 100, 100, time.Minute, false), gw("gw-2", 100, 100, 0, true), gw("gw-3", 1, 100, 0, false)}, 10, now, live),
		doctor.IDGatewayHeadroom, doctor.OK, "1 live gateway(s)")
}

func TestNodeChecks(t *testing.T) {
	t.Parallel()
	now := time.Now()
	ready := func(id, version string, seen, certEnd time.Duration) *store.Node {
		return &store.Node{ID: id, State: store.NodeReady, BCDVersion: version, LastSeenAt: ptr(now.Add(-seen)), CertNotAfter: ptr(now.Add(certEnd))}
	}
	healthy := []*store.Node{ready("a", "v0.2.0", time.Second, 20*time.Hour), ready("b", "0.2.0", 5*time.Second, 10*time.Hour)}
	want(t, doctor.Heartbeats(healthy, 10*time.Second, now), doctor.IDHeartbeats, doctor.OK, "within 30s")
	want(t, doctor.OldDaemons(healthy), doctor.IDOldDaemons, doctor.OK, "every node runs bcd v0.2.0")
	want(t, doctor.ExpiringCerts(healthy, now, doctor.CertWarnWithin), doctor.IDExpiringCerts, doctor.OK, "")

	silent := append(healthy, ready("c", "v0.1.9", time.Minute, 5*time.Hour), ready("d", "v0.10.0-rc.1", time.Hour, -time.Hour),
		&store.Node{ID: "e", State: store.NodeUnreachable, LastSeenAt: ptr(now.Add(-time.Hour)), BCDVersion: "dev"})
	r := doctor.Heartbeats(silent, 10*time.Second, now)
	want(t, r, doctor.IDHeartbeats, doctor.Warn, "2 ready node(s) silent for more than 30s")
	if !strings.Contains(r.Detail, "c, d") {
		t.Fatalf("detail %q", r.Detail)
	}
	r = doctor.OldDaemons(silent)
	want(t, r, doctor.IDOldDaemons, doctor.Warn, "3 node(s) run a bcd older than v0.10.0-rc.1")
	if !strings.Contains(r.Detail, "1 on v0.1.9") || !strings.Contains(r.Detail, "1 node(s) without a semantic version") {
		t.Fatalf("detail %q", r.Detail)
	}
	want(t, doctor.ExpiringCerts(silent[:3], now, doctor.CertWarnWithin), doctor.IDExpiringCerts, doctor.Warn, "1 node certificate(s) end within 6h")
	r = doctor.ExpiringCerts(silent, now, doctor.CertWarnWithin)
	want(t, r, doctor.IDExpiringCerts, doctor.Fail, "1 node certificate(s) expired: each node re-attests by itself")
	// 30 s certificates renew within 5 to 10 s of their end: a healthy
	// one with 9 s left is fine, one with 4 s left missed its renewal.
	short := []*store.Node{ready("s1", "v0.2.0", time.Second, 9*time.Second), ready("s2", "v0.2.0", time.Second, 4*time.Second)}
	want(t, doctor.ExpiringCerts(short[:1], now, 30*time.Second/6), doctor.IDExpiringCerts, doctor.OK, "")
	want(t, doctor.ExpiringCerts(short, now, 30*time.Second/6), doctor.IDExpiringCerts, doctor.Warn, "1 node certificate(s) end within 5s")
	if r.Detail != "expired: d; expiring: c" {
		t.Fatalf("detail %q", r.Detail)
	}
}

// TestRun builds a healthy deployment, then creates each condition doctor
// must report: a stopped sweeper, silent nodes and a gateway near its
// stream limit.
func TestRun(t *testing.T) {
	t.Parallel()
	each(t, func(t *testing.T, st rawStore) {
		ctx := context.Background()
		now := time.Now()
		b, err := bootstrap.InitBundle(ctx, st, secret, "compute.example.com")
		if err != nil {
			t.Fatal(err)
		}
		cert, key, err := bootstrap.WriteGatewayCert(b, t.TempDir(), []string{"gw.example.com"}, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		cfg := doctor.Config{Secret: secret, Gateway: doctor.GatewayConfig{Enabled: true, CertFile: cert, KeyFile: key, PublicURL: "https://gw.example.com"}}
		if st.Dialect() == store.DialectPostgres {
			cfg.DatabaseURL = pgtest.URL(t)
		}
		f := newFleet(t, st)
		f.gateway("gw-1", 2, 100, now)
		f.node("node-a", "v0.2.0", now, now.Add(20*time.Hour))
		f.node("node-b", "v0.2.0", now, now.Add(20*time.Hour))
		sweeperLease(t, st, now, time.Minute)

		rep := doctor.Run(ctx, st, cfg)
		statuses := map[string]doctor.Status{}
		for _, c := range rep.Checks {
			statuses[c.ID] = c.Status
		}
		if rep.Status != doctor.OK || len(rep.Checks) != 25 || rep.Failed(true) {
			t.Fatalf("healthy deployment: %+v", rep)
		}
		// A stopped sweeper, silent nodes, a gateway at 95 of 100 streams.
		sweeperLease(t, st, now.Add(-10*time.Minute), 15*time.Second)
		f.overdue("node-a", 10*time.Minute)
		f.node("node-c", "v0.2.0", now.Add(-5*time.Minute), now.Add(20*time.Hour))
		f.node("node-d", "v0.2.0", now.Add(-time.Hour), now.Add(20*time.Hour))
		f.gateway("gw-1", 95, 100, now)

		rep = doctor.Run(ctx, st, cfg)
		got := map[string]doctor.Result{}
		for _, c := range rep.Checks {
			got[c.ID] = c
		}
		want(t, got[doctor.IDSweeper], doctor.IDSweeper, doctor.Fail, "stopped")
		want(t, got[doctor.IDQueue], doctor.IDQueue, doctor.Fail, "long past their deadline")
		want(t, got[doctor.IDHeartbeats], doctor.IDHeartbeats, doctor.Warn, "2 ready node(s) silent")
		want(t, got[doctor.IDGatewayHeadroom], doctor.IDGatewayHeadroom, doctor.Warn, "gw-1 uses 95 of 100 streams")
		if rep.Status != doctor.Fail || !rep.Failed(false) || rep.Count(doctor.Fail) != 2 || rep.Count(doctor.Warn) != 2 {
			t.Fatalf("report: %+v", rep)
		}
		for id, st := range statuses {
			if r := got[id]; r.Status != st && id != doctor.IDSweeper && id != doctor.IDQueue && id != doctor.IDHeartbeats && id != doctor.IDGatewayHeadroom {
				t.Errorf("%s changed from %s to %s: %s", id, st, r.Status, r.Hint)
			}
		}
	})
}

// TestProcesses: control-plane.processes warns on a row not refreshed
// within the stale bound and on builds more than one release apart; one
// minor version of skew, and dev builds, are fine.
func TestProcesses(t *testing.T) {
	now := time.Now()
	proc := func(id, version string, silent time.Duration) *store.Process {
		return &store.Process{ID: id, Roles: []string{"api"}, Hostname: "h", Version: version, HeartbeatAt: now.Add(-silent)}
	}
	want(t, doctor.Processes(nil, now, 15*time.Second), doctor.IDProcesses, doctor.OK, "no process is registered")
	want(t, doctor.Processes([]*store.Process{proc("a", "1.4.0", time.Second), proc("b", "1.5.2", 0), proc("c", "dev", 0)}, now, 15*time.Second),
		doctor.IDProcesses, doctor.OK, "3 process(es) registered")
	want(t, doctor.Processes([]*store.Process{proc("a", "1.5.0", time.Minute), proc("b", "1.5.0", 0)}, now, 15*time.Second),
		doctor.IDProcesses, doctor.Warn, "1 process row(s) not refreshed for over 15s")
	want(t, doctor.Processes([]*store.Process{proc("a", "1.3.0", 0), proc("b", "1.5.0", 0)}, now, 15*time.Second),
		doctor.IDProcesses, doctor.Warn, "builds 1.3.0 and 1.5.0 run together: more than one release apart")
	want(t, doctor.Processes([]*store.Process{proc("a", "1.9.0", 0), proc("b", "2.0.0", 0)}, now, 15*time.Second),
		doctor.IDProcesses, doctor.Warn, "more than one release apart")
}

// contractPending reports one pending migration, a contract one.
type contractPending struct{ store.Migrator }

func (contractPending) MigrationStatus(context.Context) (*store.MigrationStatus, error) {
	return &store.MigrationStatus{Applied: []string{"0001_init"}, Pending: []string{"0002_drop"}, PendingContract: []string{"0002_drop"}}, nil
}

// TestSchemaContractPending: a contract migration waiting for older builds
// to stop (issue 40) warns; the build runs on the schema before it.
func TestSchemaContractPending(t *testing.T) {
	r, migrated := doctor.Schema(context.Background(), contractPending{})
	want(t, r, doctor.IDSchema, doctor.Warn, "pending contract migration(s)")
	if !migrated || !strings.Contains(r.Detail, "0002_drop") {
		t.Fatalf("migrated = %v, detail %q: want migrated and the migration named", migrated, r.Detail)
	}
}
