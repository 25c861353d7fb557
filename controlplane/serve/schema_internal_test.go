package serve

import (
	"context"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// TestPrepareSchemaContractWaits (issue 40): serve starts while its contract
// migration waits for an older build's process, applying the expand one
// before it, with and without --no-migrate; it refuses to start when an
// expand migration it needs waits behind the refused contract.
func TestPrepareSchemaContractWaits(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	build := os.DirFS("../store/sqlite/migrations")
	withExtra := func(extra fstest.MapFS) fstest.MapFS {
		out := fstest.MapFS{}
		entries, err := fs.ReadDir(build, ".")
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			b, err := fs.ReadFile(build, e.Name())
			if err != nil {
				t.Fatal(err)
			}
			out[e.Name()] = &fstest.MapFile{Data: b}
		}
		for n, f := range extra {
			out[n] = f
		}
		return out
	}
	expand := &fstest.MapFile{Data: []byte("-- expand\nCREATE TABLE contract_test (a integer, b integer);\n")}
	contract := &fstest.MapFile{Data: []byte("-- contract\nALTER TABLE contract_test DROP COLUMN b;\n")}
	later := &fstest.MapFile{Data: []byte("-- expand\nCREATE TABLE contract_test_later (a integer);\n")}
	type swapper interface{ WithMigrations(fs.FS) store.Store }

	t.Run("contract last", func(t *testing.T) {
		st := sqlitetest.Open(t)
		if _, err := st.ProcessHeartbeat(ctx, &store.ProcessHeartbeatParams{ID: "p-older", Version: "1.0.0"}); err != nil {
			t.Fatal(err)
		}
		next := st.(swapper).WithMigrations(withExtra(fstest.MapFS{"9990_e.sql": expand, "9991_c.sql": contract}))
		if err := prepareSchema(ctx, next, false, log); err != nil {
			t.Fatalf("serve with only a contract migration waiting: %v", err)
		}
		status, err := next.MigrationStatus(ctx)
		if err != nil || strings.Join(status.Pending, ",") != "9991_c" {
			t.Fatalf("pending after start = %+v (%v), want 9991_c", status, err)
		}
		if err := prepareSchema(ctx, next, true, log); err != nil {
			t.Fatalf("serve --no-migrate with only a contract migration waiting: %v", err)
		}
	})
	t.Run("expand behind the contract", func(t *testing.T) {
		st := sqlitetest.Open(t)
		if _, err := st.ProcessHeartbeat(ctx, &store.ProcessHeartbeatParams{ID: "p-older", Version: "1.0.0"}); err != nil {
			t.Fatal(err)
		}
		next := st.(swapper).WithMigrations(withExtra(fstest.MapFS{"9990_e.sql": expand, "9991_c.sql": contract, "9992_e.sql": later}))
		err := prepareSchema(ctx, next, false, log)
		if err == nil || !strings.Contains(err.Error(), "p-older") || !strings.Contains(err.Error(), "9992_e") {
			t.Fatalf("serve with an expand migration behind a refused contract: err = %v, want a refusal naming p-older and 9992_e", err)
		}
	})
}
