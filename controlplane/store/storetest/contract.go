package storetest

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// migrationSwapper is the store backends' handle on the same database with
// another migration set (queries.Store.WithMigrations), for tests only.
type migrationSwapper interface {
	WithMigrations(fsys fs.FS) store.Store
}

// testContractMigrations: an expand migration always runs; a contract one
// (issue 40) is refused, naming them, while a live process needs the old
// shape (a processes row with an older or no schema, a live workers row
// with no processes row, a live gateways row with no gateway process of its
// version), and runs once they are gone; processes of the build that
// embeds it do not hold it back.
func testContractMigrations(ctx context.Context, t *testing.T, h *Harness) {
	sw, ok := h.Store.(migrationSwapper)
	if !ok || h.Migrations == nil {
		t.Skip("backend cannot swap its migration set")
	}
	// The build's set plus a test-only expand and contract after it.
	next := fstest.MapFS{
		"9990_test_expand.sql":   {Data: []byte("-- expand\nCREATE TABLE contract_test (a integer, b integer);\n")},
		"9991_test_contract.sql": {Data: []byte("-- contract\nALTER TABLE contract_test DROP COLUMN b;\n")},
	}
	entries := must(fs.ReadDir(h.Migrations, "."))
	for _, e := range entries {
		next[e.Name()] = &fstest.MapFile{Data: must(fs.ReadFile(h.Migrations, e.Name()))}
	}
	nextBuild := sw.WithMigrations(next)
	noSchema := sw.WithMigrations(fstest.MapFS{})

	// Builds that still need the old shape: this build's process (its
	// schema is older than 9991), one that declares no schema, a worker and
	// a gateway of a build from before the processes table.
	must(h.Store.ProcessHeartbeat(ctx, &store.ProcessHeartbeatParams{ID: "p-old", Roles: []string{"api"}, Version: "1.0.0"}))
	must(noSchema.ProcessHeartbeat(ctx, &store.ProcessHeartbeatParams{ID: "p-noschema", Roles: []string{"sinks", "iam"}, Version: "0.9.0"}))
	must(h.Store.WorkerHeartbeat(ctx, &store.WorkerHeartbeatParams{ID: "w-old", Roles: []string{"workers"}, Version: "0.9.0"}))
	must(h.Store.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: "gw-old", Version: "0.9.0"}))
	// The new build's own processes hold nothing back: its worker and
	// gateway rows are covered by its processes row.
	must(nextBuild.ProcessHeartbeat(ctx, &store.ProcessHeartbeatParams{ID: "p-new", Roles: []string{"workers", "gateway"}, Version: "2.0.0"}))
	must(h.Store.WorkerHeartbeat(ctx, &store.WorkerHeartbeatParams{ID: "p-new", Roles: []string{"workers"}, Version: "2.0.0"}))
	must(h.Store.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: "gw-new", Version: "2.0.0"}))
	// A worker and a gateway not heard from within ContractLiveWithin are
	// not live.
	stale := time.Now().Add(-2 * store.ContractLiveWithin)
	must(h.Store.WorkerHeartbeat(ctx, &store.WorkerHeartbeatParams{ID: "w-dead", Version: "0.8.0", Now: &stale}))
	must(h.Store.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: "gw-dead", Version: "0.8.0", Now: &stale}))

	applied, err := nextBuild.Migrate(ctx)
	var refused *store.ContractRefusedError
	if !errors.As(err, &refused) || refused.Migration != "9991_test_contract" {
		t.Fatalf("migrate with older builds live: applied %v, err = %v; want 9991_test_contract refused", applied, err)
	}
	if !slices.Equal(applied, []string{"9990_test_expand"}) {
		t.Fatalf("applied %v before the refused contract, want [9990_test_expand]", applied)
	}
	var named []string
	for _, p := range refused.Processes {
		named = append(named, strings.Fields(p)[1])
	}
	if want := []string{"p-noschema", "p-old", "w-old", "gw-old"}; !slices.Equal(named, want) {
		t.Fatalf("refusal names %v (%q), want %v", named, refused.Processes, want)
	}
	if !strings.Contains(err.Error(), "p-old") || !strings.Contains(err.Error(), "9991_test_contract") {
		t.Fatalf("refusal message %q names neither the process nor the migration", err)
	}
	st := must(nextBuild.MigrationStatus(ctx))
	if !slices.Equal(st.Pending, []string{"9991_test_contract"}) || !slices.Equal(st.PendingContract, st.Pending) || len(st.PendingExpand()) != 0 {
		t.Fatalf("status after the refusal: pending %v, contract %v", st.Pending, st.PendingContract)
	}

	// Still refused while any one of them is live.
	check(t, h.Store.ProcessDelete(ctx, "p-old"))
	check(t, h.Store.ProcessDelete(ctx, "p-noschema"))
	check(t, h.Store.GatewayDelete(ctx, "gw-old"))
	if _, err := nextBuild.Migrate(ctx); !errors.As(err, &refused) || len(refused.Processes) != 1 || !strings.HasPrefix(refused.Processes[0], "worker w-old ") {
		t.Fatalf("migrate with only w-old live: err = %v, want refused naming worker w-old", err)
	}
	must(h.Store.WorkerHeartbeat(ctx, &store.WorkerHeartbeatParams{ID: "w-old", Version: "0.9.0", Now: &stale}))

	applied, err = nextBuild.Migrate(ctx)
	if err != nil || !slices.Equal(applied, []string{"9991_test_contract"}) {
		t.Fatalf("migrate once the older builds are gone: applied %v, err = %v; want [9991_test_contract]", applied, err)
	}
	if st := must(nextBuild.MigrationStatus(ctx)); len(st.Pending) != 0 {
		t.Fatalf("pending after the contract ran: %v", st.Pending)
	}
}
