package sqlite

import (
	"context"
	"database/sql"
	"io/fs"
	"path/filepath"
	"testing"
)

// TestMigrationKeepsInventories: a database at 0004, with a node that has
// reported its inventory, migrated by Open and Migrate, still returns that
// inventory (0005 moves it into node_inventories).
func TestMigrationKeepsInventories(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	if err := registerOnce(); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE schema_migrations (name text PRIMARY KEY, applied_at text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"0001_init", "0002_node_shard", "0003_node_rejoin_index", "0004_commands_open_deadline"} {
		b, err := fs.ReadFile(migrations, "migrations/"+name+".sql")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(string(b)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := db.Exec(`INSERT INTO schema_migrations VALUES (?, '2026-11-01')`, name); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []string{
		`INSERT INTO sites (id, name, region, created_at) VALUES ('site_1', 'ams-1', 'eu', 1)`,
		`INSERT INTO pools (id, name, site_id, created_at) VALUES ('pool_1', 'gpu', 'site_1', 1)`,
		`INSERT INTO nodes (id, pool_id, hostname, state, inventory, inventory_digest, created_at, updated_at, shard)
			VALUES ('node_1', 'pool_1', 'gpu-01', 'ready', '{"gpus":8}', 'd1', 1, 1, 7)`,
		`INSERT INTO nodes (id, pool_id, hostname, state, created_at, updated_at, shard)
			VALUES ('node_2', 'pool_1', 'gpu-02', 'joined', 1, 1, 9)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	applied, err := s.Migrate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) == 0 || applied[0] != "0005_node_inventories" {
		t.Fatalf("applied %v, want 0005_node_inventories first", applied)
	}
	n, err := s.NodeGet(ctx, "node_1")
	if err != nil {
		t.Fatal(err)
	}
	if string(n.Inventory) != `{"gpus":8}` || n.InventoryDigest != "d1" {
		t.Fatalf("node_1 inventory %q digest %q after migrating", n.Inventory, n.InventoryDigest)
	}
	n, err = s.NodeGet(ctx, "node_2")
	if err != nil {
		t.Fatal(err)
	}
	if n.Inventory != nil {
		t.Fatalf("node_2 inventory %q, want none", n.Inventory)
	}
}

// TestConnectionPragmas: every connection the store opens is in WAL mode,
// with the busy timeout, synchronous=NORMAL and foreign keys.
func TestConnectionPragmas(t *testing.T) {
	db, err := sql.Open("sqlite", dsn(filepath.Join(t.TempDir(), "state.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for pragma, want := range map[string]string{
		"journal_mode": "wal", "busy_timeout": "10000", "synchronous": "1", "foreign_keys": "1",
	} {
		var got string
		if err := db.QueryRow("PRAGMA " + pragma).Scan(&got); err != nil {
			t.Fatalf("PRAGMA %s: %v", pragma, err)
		}
		if got != want {
			t.Errorf("PRAGMA %s = %s, want %s", pragma, got, want)
		}
	}
}
