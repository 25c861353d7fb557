package tests

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/tests/testenv"
)

const testSecret = "e2e-secret-e2e-secret-e2e-secret-e2e"

// serveConfig keeps every listener of a test process on a free loopback port.
const serveConfig = `
host:
  listen: 127.0.0.1:0
  gateway:
    listen: 127.0.0.1:0
`

// startServe runs better-compute serve and returns it with its API URL.
func startServe(t *testing.T, env []string, args ...string) (*testenv.Proc, string) {
	t.Helper()
	return startServeConfig(t, env, serveConfig, args...)
}

// startServeConfig is startServe with the configuration file's content.
func startServeConfig(t *testing.T, env []string, config string, args ...string) (*testenv.Proc, string) {
	t.Helper()
	bin := testenv.Binary(t, "better-compute")
	cfg := testenv.WriteFile(t, "better-compute.yaml", config)
	p := testenv.Start(t, env, bin, append([]string{"serve", "--config", cfg}, args...)...)
	m := p.WaitLine(`msg="API listening" addr=(\S+)`, 60*time.Second)
	return p, "http://" + m[1]
}

// e2eTrustDomain is the trust domain of the PostgreSQL deployments' PKI.
const e2eTrustDomain = "e2e.test"

// initPostgresPKI migrates the PostgreSQL database of env, runs pki init
// and pki issue-gateway for localhost and 127.0.0.1, and returns the
// configuration lines that point the gateway at the certificate files (to
// go under host.gateway). With PostgreSQL the gateway role refuses to start
// without them. env must carry the deployment secret every process uses.
func initPostgresPKI(t *testing.T, env []string) string {
	t.Helper()
	return testenv.InitPostgresPKI(t, env, e2eTrustDomain)
}

func checkHealthy(t *testing.T, api, dialect string) {
	t.Helper()
	if code, body := testenv.Get(t, api+"/healthz"); code != 200 {
		t.Fatalf("/healthz = %d %s", code, body)
	}
	if code, body := testenv.Get(t, api+"/readyz"); code != 200 {
		t.Fatalf("/readyz = %d %s", code, body)
	}
	code, body := testenv.Get(t, api+"/api/health")
	var h struct {
		Status    string    `json:"status"`
		Database  string    `json:"database"`
		LatencyMs *float64  `json:"latencyMs"`
		Time      time.Time `json:"time"`
	}
	if err := json.Unmarshal([]byte(body), &h); err != nil || code != 200 || h.Status != "ok" || h.Database != "ok" || h.LatencyMs == nil || h.Time.IsZero() {
		t.Fatalf("/api/health = %d %s (%v)", code, body, err)
	}
}

func TestServeEmbeddedDefault(t *testing.T) {
	t.Parallel()
	dataDir := filepath.Join(t.TempDir(), "data")
	p, api := startServe(t, []string{"BETTER_COMPUTE_DATA_DIR=" + dataDir})
	p.WaitLine(`msg=Serving .*store=sqlite`, 10*time.Second)
	checkHealthy(t, api, "sqlite")
	if _, err := os.Stat(filepath.Join(dataDir, "state.db")); err != nil {
		t.Fatalf("no embedded database: %v", err)
	}
	fi, err := os.Stat(filepath.Join(dataDir, "secret"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("generated secret: %v %v", fi, err)
	}
	p.Stop(syscallTERM, 15*time.Second)
	if code := p.Wait(time.Second); code != 0 {
		t.Fatalf("serve exited %d after SIGTERM", code)
	}
}

func TestServePostgres(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + url, "BETTER_COMPUTE_SECRET=" + testSecret}
	tlsFiles := initPostgresPKI(t, env)
	p, api := startServeConfig(t, env, serveConfig+tlsFiles, "--data-dir", t.TempDir())
	p.WaitLine(`msg=Serving .*store=postgres`, 10*time.Second)
	p.WaitLine(`msg="Gateway listening" .*addr=127\.0\.0\.1:\d+`, 10*time.Second)
	checkHealthy(t, api, "postgres")
}

func TestConcurrentMigratePostgres(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, "better-compute")
	url := pgtest.URL(t)
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + url, "BETTER_COMPUTE_SECRET=" + testSecret}
	type result struct {
		code           int
		stdout, stderr string
	}
	results := make([]result, 2)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			code, out, errOut := testenv.Run(t, env, "", bin, "migrate")
			results[i] = result{code, out, errOut}
		})
	}
	wg.Wait()
	applied := 0
	for _, r := range results {
		if r.code != 0 {
			t.Fatalf("migrate exited %d: %s", r.code, r.stderr)
		}
		if strings.Contains(r.stdout, "applied") {
			applied++
		}
	}
	if applied != 1 {
		t.Fatalf("%d of 2 concurrent migrate runs applied migrations, want exactly 1: %+v", applied, results)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n, distinct int
	if err := conn.QueryRow(ctx, `SELECT count(*), count(DISTINCT name) FROM schema_migrations`).Scan(&n, &distinct); err != nil || n == 0 || n != distinct {
		t.Fatalf("schema_migrations: %d rows, %d distinct (%v); want each migration once", n, distinct, err)
	}
}

func TestUnknownMigrationRefused(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, "better-compute")
	url := pgtest.URL(t)
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + url, "BETTER_COMPUTE_SECRET=" + testSecret}
	if code, _, errOut := testenv.Run(t, env, "", bin, "migrate"); code != 0 {
		t.Fatalf("migrate: %s", errOut)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations (name, applied_at) VALUES ('0099_from_the_future', 'x')`); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"migrate"}, {"serve", "--no-migrate", "--port", "0"}, {"serve", "--port", "0"}} {
		code, _, errOut := testenv.Run(t, env, "", bin, args...)
		if code == 0 || !strings.Contains(errOut, "0099_from_the_future") {
			t.Fatalf("%v with an unknown applied migration: exit %d, stderr %q; want a refusal naming it", args, code, errOut)
		}
	}
}

func TestBadConfiguration(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, "better-compute")
	for _, tc := range []struct {
		name string
		file string
		env  []string
		key  string
	}{
		{"unknown key", "databse:\n  url: postgres://x@127.0.0.1/db\n", nil, `databse: line 1: unknown key "databse"`},
		{"short secret", "", []string{"BETTER_COMPUTE_SECRET=short"}, "secret"},
		{"bad url", "", []string{"BETTER_COMPUTE_DATABASE_URL=http://nope", "BETTER_COMPUTE_SECRET=" + testSecret}, "database.url"},
		{"split roles on sqlite", "", []string{"BETTER_COMPUTE_ROLES=api,gateway"}, "split roles need PostgreSQL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := filepath.Join(t.TempDir(), "data")
			args := []string{"serve", "--data-dir", dataDir}
			if tc.file != "" {
				args = append(args, "--config", testenv.WriteFile(t, "c.yaml", tc.file))
			}
			code, stdout, stderr := testenv.Run(t, tc.env, "", bin, args...)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if code != 2 || len(lines) != 1 || !strings.Contains(stderr, tc.key) || stdout != "" {
				t.Fatalf("exit %d, stderr %q; want exit 2 and one line naming %q", code, stderr, tc.key)
			}
			if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
				t.Fatalf("bad configuration still created the data dir (%v)", err)
			}
		})
	}
}
