package transfer_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	"github.com/better-compute/better-compute/controlplane/store/transfer"
)

// source makes a migrated embedded database with a little of everything:
// a site, a pool, nodes, commands with output, events, audit, the PKI
// bundle row and an API token.
func source(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now().Add(time.Hour).UTC()
	var ids []string
	for _, h := range []string{"a", "b", "c"} {
		n, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node-" + h, PoolID: pool.ID, Hostname: h, Labels: map[string]string{"rack": "1", "gpu": "h100"},
			CertSerial: "serial-" + h, CertNotAfter: &after, KeySHA256: "key-" + h, JoinTokenID: "tok"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, n.ID)
	}
	if err := st.NodeSetCordoned(ctx, ids[0], true); err != nil {
		t.Fatal(err)
	}
	if err := st.NodeSetInventory(ctx, ids[1], []byte(`{"gpus": [{"uuid": "GPU-1", "memory": 1e3}], "z": 1.50, "a": "\u00e9"}`), "d1"); err != nil {
		t.Fatal(err)
	}
	cmds, err := st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: ids, Kind: "exec", SessionSpec: []byte(`{"exec":{"argv":["true"]}}`), Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CommandAppendOutput(ctx, &store.CommandOutputChunk{CommandID: cmds[0].ID, Seq: 0, Stream: 1, Data: []byte{0, 1, 2, 0xff}}); err != nil {
		t.Fatal(err)
	}
	for i := range 7 {
		if _, err := st.EventInsert(ctx, &store.Event{NodeID: ids[i%3], Kind: "k", Message: "m", Time: time.Now(), Payload: []byte(`{"i": ` + string(rune('0'+i)) + `}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.AuditInsert(ctx, &store.AuditEntry{Actor: "cli:x", Action: "a", Outcome: "success", Details: []byte(`{"x":1}`)}); err != nil {
		t.Fatal(err)
	}
	if err := st.PKIBundleCreate(ctx, &store.PKIBundle{TrustDomain: "t.example", Sealed: []byte{9, 8, 7}}); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCopyEveryTable copies an embedded database into a fresh PostgreSQL
// schema: the copy plans every table of both schemas (a table, a column
// or a column type it does not handle fails here first), each table's
// count and checksum read again afterwards are equal, ids go on past the
// copied ones, a second copy is refused for the rows now there, and
// Replace copies again.
func TestCopyEveryTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := source(t)
	url := pgtest.URL(t)
	var progress []transfer.Progress
	res, err := transfer.Copy(ctx, transfer.Config{Source: src, Target: url, BatchRows: 2,
		Progress: func(p transfer.Progress) { progress = append(progress, p) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Migrated) == 0 {
		t.Error("the copy migrated nothing on a fresh target")
	}
	// Every table of the target's schema is in the copy.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'`)
	if err != nil {
		t.Fatal(err)
	}
	all, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range all {
		if n != "schema_migrations" && !slices.ContainsFunc(res.Tables, func(r transfer.TableResult) bool { return r.Name == n }) {
			t.Errorf("table %s was not copied", n)
		}
	}
	rowsOf := func(name string) int64 {
		for _, r := range res.Tables {
			if r.Name == name {
				return r.Rows
			}
		}
		return -1
	}
	for name, want := range map[string]int64{"nodes": 3, "commands": 3, "command_output": 1, "pki_bundle": 1, "audit_log": 1, "node_inventories": 1} {
		if got := rowsOf(name); got != want {
			t.Errorf("%s: %d rows copied, want %d", name, got, want)
		}
	}
	if rowsOf("events") < 7 {
		t.Errorf("events: %d rows copied, want at least 7", rowsOf("events"))
	}
	if i := slices.IndexFunc(progress, func(p transfer.Progress) bool { return p.Table == "events" && p.Copied == 2 }); i < 0 {
		t.Errorf("no progress after the first batch of events: %+v", progress)
	}
	cmp, err := transfer.Compare(ctx, src, url)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cmp {
		if !c.Equal() {
			t.Errorf("%s: source %d rows %s, target %d rows %s", c.Name, c.SourceRows, c.SourceChecksum, c.TargetRows, c.TargetChecksum)
		}
	}

	pg, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	id, err := pg.EventInsert(ctx, &store.Event{Kind: "after", Time: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if id <= rowsOf("events") {
		t.Errorf("the first event after the copy has id %d, not past the %d copied", id, rowsOf("events"))
	}

	_, err = transfer.Copy(ctx, transfer.Config{Source: src, Target: url})
	var ne *transfer.NotEmptyError
	if !errors.As(err, &ne) || !slices.Contains(ne.Tables, "nodes") {
		t.Fatalf("a second copy into the same target: %v, want a NotEmptyError naming nodes", err)
	}
	if _, err := transfer.Copy(ctx, transfer.Config{Source: src, Target: url, Replace: true}); err != nil {
		t.Fatalf("copy with Replace: %v", err)
	}
	cmp, err = transfer.Compare(ctx, src, url)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cmp {
		if !c.Equal() {
			t.Errorf("after Replace, %s: source %d rows, target %d rows", c.Name, c.SourceRows, c.TargetRows)
		}
	}
}

// TestCopyRefusesAnotherSchema: a source that an older build migrated
// (a migration missing) is refused before the target is touched.
func TestCopyRefusesAnotherSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := source(t)
	db, err := sqlite.OpenDB(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM schema_migrations WHERE name = (SELECT max(name) FROM schema_migrations)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	url := pgtest.URL(t)
	_, err = transfer.Copy(ctx, transfer.Config{Source: src, Target: url})
	var se *transfer.SchemaError
	if !errors.As(err, &se) || len(se.Missing) != 1 {
		t.Fatalf("copy of an older schema: %v, want a SchemaError with one missing migration", err)
	}
	pg, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	st, err := pg.MigrationStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Applied) != 0 {
		t.Errorf("the refused copy migrated the target: %v", st.Applied)
	}
}

// TestCopyRefusesWhatItDoesNotHandle: a table, a column or a column type
// that only one side has, and a target a newer build migrated, are each
// refused before a row is copied; this is the guard that a table added
// without the copy knowing it fails here, not in an operator's move.
func TestCopyRefusesWhatItDoesNotHandle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := source(t)
	for name, ddl := range map[string]string{
		"table in the target only":  `CREATE TABLE extra (id integer PRIMARY KEY)`,
		"column in the target only": `ALTER TABLE events ADD COLUMN score integer`,
		"type not handled":          `ALTER TABLE events ALTER COLUMN kind TYPE numeric USING 0`,
		"newer build":               `INSERT INTO schema_migrations (name, applied_at) VALUES ('9999_future', 'now')`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			url := pgtest.URL(t)
			pg, err := postgres.Open(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer pg.Close()
			if _, err := pg.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, ddl); err != nil {
				t.Fatal(err)
			}
			_, err = transfer.Copy(ctx, transfer.Config{Source: src, Target: url})
			var pe *transfer.PlanError
			var me *store.MigrationError
			if !errors.As(err, &pe) && !errors.As(err, &me) {
				t.Fatalf("copy: %v, want a PlanError or a MigrationError", err)
			}
			t.Logf("refused: %v", err)
			var n int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM nodes`).Scan(&n); err != nil || n != 0 {
				t.Errorf("the refused copy left %d nodes (%v)", n, err)
			}
		})
	}
}
