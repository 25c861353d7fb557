package tests

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestContractMigrationWaitsForOlderBuilds (issue 40): on a database at
// 0004, a live gateway of a build from before the processes table holds
// back the contract migration 0005 (it drops columns that build reads):
// migrate and serve refuse, naming it, and apply nothing past 0004; once
// its row goes stale (the gateway is gone), migrate applies everything.
func TestContractMigrationWaitsForOlderBuilds(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, "better-compute")
	url := pgtest.URL(t)
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + url, "BETTER_COMPUTE_SECRET=" + testSecret}
	if code, out, errOut := testenv.Run(t, env, "", bin, "migrate", "--to", "0004_commands_open_deadline"); code != 0 || !strings.Contains(out, "applied 4 migration(s)") {
		t.Fatalf("migrate --to 0004: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO gateways (id, version, started_at, heartbeat_at) VALUES ('gw-older-build', '0.4.0', now(), now())`); err != nil {
		t.Fatal(err)
	}
	applied := func() int {
		t.Helper()
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, args := range [][]string{{"migrate"}, {"serve", "--port", "0", "--data-dir", t.TempDir()}} {
		code, _, errOut := testenv.Run(t, env, "", bin, args...)
		if code == 0 || !strings.Contains(errOut, "0005_node_inventories") || !strings.Contains(errOut, "gateway gw-older-build") {
			t.Fatalf("%v with an older gateway live: exit %d, stderr %q; want a refusal naming 0005_node_inventories and gw-older-build", args, code, errOut)
		}
		if n := applied(); n != 4 {
			t.Fatalf("%v applied past the refused contract: %d migrations recorded, want 4", args, n)
		}
	}
	// The older gateway stops: its row is no longer refreshed.
	if _, err := conn.Exec(ctx, `UPDATE gateways SET heartbeat_at = now() - interval '2 minutes' WHERE id = 'gw-older-build'`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := testenv.Run(t, env, "", bin, "migrate")
	if code != 0 || !strings.Contains(out, "0005_node_inventories") || !strings.Contains(out, "0019_processes_gateway_drain") {
		t.Fatalf("migrate once the older gateway is gone: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	t.Logf("after the older gateway went: %s", strings.TrimSpace(out))
}

// TestReadyOnASchemaANewerBuildMigrated (issue 40): a running process stays
// ready when a newer build applies migrations it does not know (the expand
// step of a rolling upgrade), where a restart of it refuses the schema
// (TestUnknownMigrationRefused).
func TestReadyOnASchemaANewerBuildMigrated(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + url, "BETTER_COMPUTE_SECRET=" + testSecret}
	tlsFiles := initPostgresPKI(t, env)
	p, api := startServeConfig(t, env, serveConfig+tlsFiles, "--data-dir", t.TempDir())
	p.WaitLine(`msg=Serving .*store=postgres`, 30*time.Second)
	// Ready first (its clock checked: on a loaded machine that can come
	// after "Serving"), so the check below judges the migration alone.
	testenv.Eventually(t, 30*time.Second, func() bool {
		code, _ := testenv.Get(t, api+"/readyz")
		return code == 200
	}, func() string { return "/readyz never 200 before the newer build's migration" })
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations (name, applied_at) VALUES ('9999_from_a_newer_build', 'x')`); err != nil {
		t.Fatal(err)
	}
	if code, body := testenv.Get(t, api+"/readyz"); code != 200 {
		t.Fatalf("/readyz after a newer build's migration = %d %s, want 200", code, body)
	}
}
