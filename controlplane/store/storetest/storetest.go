// Package storetest is the conformance suite every store backend passes:
// one suite, run against SQLite and PostgreSQL (as river's
// riverdrivertest). Real differences between backends are switches on the
// dialect inside the suite, never a second suite.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Harness is a fresh, migrated store plus raw SQL access for setting up
// states the Store API cannot reach (such as a migration from a newer
// build).
type Harness struct {
	Store store.Store
	// Exec runs raw SQL on the same database, over a connection of its own
	// (sqlitetest.Exec, pgtest.Exec): the production store has no such
	// hatch.
	Exec func(ctx context.Context, sql string) error
	// Migrations is the backend's migrations directory
	// (os.DirFS("migrations")), for tests that rerun a migration's data
	// step on rows set up in an older form; nil skips them.
	Migrations fs.FS
}

// NewHarness returns a fresh, empty, migrated database for one test.
type NewHarness func(t testing.TB) *Harness

// Exercise runs the whole conformance suite against a backend.
func Exercise(ctx context.Context, t *testing.T, newHarness NewHarness) {
	t.Helper()
	for _, tc := range []struct {
		name string
		fn   func(context.Context, *testing.T, *Harness)
	}{
		{"Migrations", testMigrations},
		{"CommandOutputBounds", testCommandOutputBounds},
		{"LeaseExclusive", testLeaseExclusive},
		{"LeaseExpiryAndFencing", testLeaseExpiryAndFencing},
		{"LeaseRelease", testLeaseRelease},
		{"SitesAndPools", testSitesAndPools},
		{"Tenants", testTenants},
		{"NodeMove", testNodeMove},
		{"IDWinsOverName", testIDWinsOverName},
		{"Nodes", testNodes},
		{"NodeLiveness", testNodeLiveness},
		{"NodeLivenessBesideSessionCloses", testNodeLivenessBesideSessionCloses},
		{"NodeLivenessPoweredOff", testNodeLivenessPoweredOff},
		{"NodeLivenessDrained", testNodeLivenessDrained},
		{"Counts", testCounts},
		{"JoinTokens", testJoinTokens},
		{"JoinTokenConcurrentUses", testJoinTokenConcurrentUses},
		{"GatewaysSessions", testGatewaysSessions},
		{"SessionBootID", testSessionBootID},
		{"GatewayReap", testGatewayReap},
		{"Workers", testWorkers},
		{"Processes", testProcesses},
		{"ContractMigrations", testContractMigrations},
		{"GatewayDrainSet", testGatewayDrainSet},
		{"Commands", testCommands},
		{"CommandSpecForms", testCommandSpecForms},
		{"CommandSweep", testCommandSweep},
		{"CommandClaim", testCommandClaim},
		{"OutboxEventsAudit", testOutboxEventsAudit},
		{"Events", testEvents},
		{"DeadLetters", testDeadLetters},
		{"OutboxRead", testOutboxRead},
		{"AuditQuery", testAuditQuery},
		{"Clock", testClock},
		{"PKIAndRevocations", testPKI},
		{"PKIRotations", testPKIRotations},
		{"ReleasePins", testReleasePins},
		{"PolicyDocuments", testPolicyDocuments},
		{"AccessRequests", testAccessRequests},
		{"OIDCSessions", testOIDCSessions},
		{"APITokensAndSecrets", testAPITokensAndSecrets},
		{"Lifetimes", testLifetimes},
		{"Reservations", testReservations},
		{"ReservationConcurrentBooking", testReservationConcurrentBooking},
		{"ReservationGrants", testReservationGrants},
		{"Remediation", testRemediation},
		{"RemediationHistory", testRemediationHistory},
		{"GPUPlacements", testGPUPlacements},
		{"DisruptionBudget", testDisruptionBudget},
		{"DisruptionConcurrentAdmissions", testDisruptionConcurrentAdmissions},
		{"Rollouts", testRollouts},
		{"HistoryPrune", testHistoryPrune},
		{"Tunnels", testTunnels},
		{"Recordings", testRecordings},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			defer func() {
				if r := recover(); r != nil {
					if m, ok := r.(mustError); ok {
						t.Fatalf("unexpected error: %v", m.err)
					}
					panic(r)
				}
			}()
			tc.fn(ctx, t, newHarness(t))
		})
	}
}

// must returns v, or fails the test (through the recover in Exercise)
// when err is not nil.
func must[T any](v T, err error) T {
	if err != nil {
		panic(mustError{err})
	}
	return v
}

type mustError struct{ err error }

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error = %v, want %v", err, target)
	}
}

func testMigrations(ctx context.Context, t *testing.T, h *Harness) {
	st := must(h.Store.MigrationStatus(ctx))
	if len(st.Pending) != 0 || len(st.Applied) == 0 {
		t.Fatalf("status after migrate: applied %v pending %v", st.Applied, st.Pending)
	}
	again := must(h.Store.Migrate(ctx))
	if len(again) != 0 {
		t.Fatalf("second migrate applied %v, want nothing", again)
	}
	check(t, h.Exec(ctx, `INSERT INTO schema_migrations (name, applied_at) VALUES ('9999_from_a_newer_build', 'x')`))
	_, err := h.Store.Migrate(ctx)
	var me *store.MigrationError
	if !errors.As(err, &me) || !slices.Equal(me.Unknown, []string{"9999_from_a_newer_build"}) {
		t.Fatalf("migrate with unknown applied migration: err = %v, want MigrationError naming it", err)
	}
	if _, err := h.Store.MigrationStatus(ctx); !errors.As(err, &me) {
		t.Fatalf("status with unknown applied migration: err = %v", err)
	}
}

func testLeaseExclusive(ctx context.Context, t *testing.T, h *Harness) {
	const racers = 8
	var wg sync.WaitGroup
	won := make(chan string, racers)
	errs := make(chan error, racers)
	for i := range racers {
		wg.Go(func() {
			holder := fmt.Sprintf("worker-%d", i)
			_, ok, err := h.Store.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: "singleton:race", Holder: holder, TTL: time.Minute})
			if err != nil {
				errs <- err
			}
			if ok {
				won <- holder
			}
		})
	}
	wg.Wait()
	close(won)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var winners []string
	for w := range won {
		winners = append(winners, w)
	}
	if len(winners) != 1 {
		t.Fatalf("%d racers won the lease (%v), want exactly 1", len(winners), winners)
	}
	l := must(h.Store.LeaseGet(ctx, "singleton:race"))
	if l.Holder != winners[0] || l.Epoch != 1 {
		t.Fatalf("lease = %+v, want holder %s at epoch 1", l, winners[0])
	}
	// The holder re-acquiring keeps its epoch.
	l2, ok, err := h.Store.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: "singleton:race", Holder: winners[0], TTL: time.Minute})
	if err != nil || !ok || l2.Epoch != 1 {
		t.Fatalf("re-acquire by holder: %+v %v %v", l2, ok, err)
	}
	leases := must(h.Store.LeaseList(ctx, "singleton:"))
	if len(leases) != 1 {
		t.Fatalf("LeaseList(singleton:) = %d leases", len(leases))
	}
	if got := must(h.Store.LeaseList(ctx, "shard:")); len(got) != 0 {
		t.Fatalf("LeaseList(shard:) = %d leases, want 0", len(got))
	}
}

func testLeaseExpiryAndFencing(ctx context.Context, t *testing.T, h *Harness) {
	t0 := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	at := func(d time.Duration) *time.Time { v := t0.Add(d); return &v }
	const name = "shard:7"
	old, ok, err := h.Store.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: name, Holder: "a", TTL: 15 * time.Second, Now: at(0)})
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if !old.ExpiresAt.Equal(t0.Add(15 * time.Second)) {
		t.Fatalf("expires_at = %v, want %v", old.ExpiresAt, t0.Add(15*time.Second))
	}
	// Before the TTL another holder is refused, and the holder renews.
	if _, ok, _ := h.Store.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: name, Holder: "b", TTL: 15 * time.Second, Now: at(10 * time.Second)}); ok {
		t.Fatal("b took a live lease")
	}
	if _, ok, err := h.Store.LeaseRenew(ctx, &store.LeaseRenewParams{Name: name, Holder: "a", Epoch: 1, TTL: 15 * time.Second, Now: at(5 * time.Second)}); !ok || err != nil {
		t.Fatalf("renew: %v %v", ok, err)
	}
	// a stops renewing; after the TTL b takes over with a higher epoch.
	nl, ok, err := h.Store.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: name, Holder: "b", TTL: 15 * time.Second, Now: at(21 * time.Second)})
	if err != nil || !ok || nl.Epoch != 2 || nl.Holder != "b" {
		t.Fatalf("takeover: %+v %v %v", nl, ok, err)
	}
	if _, ok, _ := h.Store.LeaseRenew(ctx, &store.LeaseRenewParams{Name: name, Holder: "a", Epoch: 1, TTL: 15 * time.Second, Now: at(22 * time.Second)}); ok {
		t.Fatal("old holder renewed a lost lease")
	}
	site := must(h.Store.SiteCreate(ctx, &store.SiteCreateParams{Name: "fenced", Region: "r"}))
	// The old holder's late write is refused and changes nothing.
	err = h.Store.FencedTx(ctx, store.Fence{Lease: name, Holder: "a", Epoch: 1, Now: at(22 * time.Second)}, func(tx store.Store) error {
		_, err := tx.SiteCreate(ctx, &store.SiteCreateParams{Name: "late-write", Region: "r"})
		return err
	})
	wantErr(t, err, store.ErrFenced)
	if _, err := h.Store.SiteGet(ctx, "late-write"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("fenced write landed: %v", err)
	}
	// The new holder's write goes through; past its own expiry it is fenced too.
	check(t, h.Store.FencedTx(ctx, store.Fence{Lease: name, Holder: "b", Epoch: 2, Now: at(23 * time.Second)}, func(tx store.Store) error {
		_, err := tx.PoolCreate(ctx, &store.PoolCreateParams{Name: "by-b", SiteID: site.ID})
		return err
	}))
	must(h.Store.PoolGet(ctx, "by-b"))
	err = h.Store.FencedTx(ctx, store.Fence{Lease: name, Holder: "b", Epoch: 2, Now: at(40 * time.Second)}, func(store.Store) error { return nil })
	wantErr(t, err, store.ErrFenced)
	// An error inside the fenced transaction rolls it back.
	boom := errors.New("boom")
	err = h.Store.FencedTx(ctx, store.Fence{Lease: name, Holder: "b", Epoch: 2, Now: at(24 * time.Second)}, func(tx store.Store) error {
		if _, err := tx.SiteCreate(ctx, &store.SiteCreateParams{Name: "rolled-back", Region: "r"}); err != nil {
			return err
		}
		return boom
	})
	wantErr(t, err, boom)
	if _, err := h.Store.SiteGet(ctx, "rolled-back"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("rolled-back write landed: %v", err)
	}
}

func testLeaseRelease(ctx context.Context, t *testing.T, h *Harness) {
	const name = "gateway:gw1"
	l, ok, err := h.Store.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: name, Holder: "a", TTL: time.Hour})
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	check(t, h.Store.LeaseRelease(ctx, name, "a", l.Epoch))
	nl, ok, err := h.Store.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: name, Holder: "b", TTL: time.Hour})
	if err != nil || !ok || nl.Epoch != l.Epoch+1 {
		t.Fatalf("acquire after release: %+v %v %v", nl, ok, err)
	}
	// A stale release does nothing.
	check(t, h.Store.LeaseRelease(ctx, name, "a", l.Epoch))
	if got := must(h.Store.LeaseGet(ctx, name)); got.Holder != "b" {
		t.Fatalf("stale release freed the lease: %+v", got)
	}
	_, err = h.Store.LeaseGet(ctx, "gateway:never")
	wantErr(t, err, store.ErrNotFound)
}

func testSitesAndPools(ctx context.Context, t *testing.T, h *Harness) {
	s := must(h.Store.SiteCreate(ctx, &store.SiteCreateParams{Name: "ams-1", Region: "eu-1"}))
	if s.ID == "" || s.Region != "eu-1" || s.CreatedAt.IsZero() {
		t.Fatalf("site = %+v", s)
	}
	_, err := h.Store.SiteCreate(ctx, &store.SiteCreateParams{Name: "ams-1", Region: "eu-2"})
	wantErr(t, err, store.ErrConflict)
	if got := must(h.Store.SiteGet(ctx, "ams-1")); got.ID != s.ID {
		t.Fatalf("get by name = %+v", got)
	}
	p := must(h.Store.PoolCreate(ctx, &store.PoolCreateParams{Name: "default", SiteID: s.ID}))
	_, err = h.Store.PoolCreate(ctx, &store.PoolCreateParams{Name: "orphan", SiteID: "site_missing"})
	wantErr(t, err, store.ErrNotFound)
	_, err = h.Store.PoolCreate(ctx, &store.PoolCreateParams{Name: "default", SiteID: s.ID})
	wantErr(t, err, store.ErrConflict)
	if got := must(h.Store.PoolGet(ctx, p.ID)); got.Name != "default" || got.SiteID != s.ID {
		t.Fatalf("pool = %+v", got)
	}
	for i := range 4 {
		must(h.Store.SiteCreate(ctx, &store.SiteCreateParams{Name: fmt.Sprintf("s%d", i), Region: "r"}))
	}
	page1 := must(h.Store.SiteList(ctx, &store.ListParams{Limit: 3}))
	page2 := must(h.Store.SiteList(ctx, &store.ListParams{Limit: 3, Cursor: page1[2].ID}))
	if len(page1) != 3 || len(page2) != 2 {
		t.Fatalf("pages of 5 sites by 3: %d, %d", len(page1), len(page2))
	}
	if pools := must(h.Store.PoolList(ctx, &store.ListParams{})); len(pools) != 1 {
		t.Fatalf("pools = %d", len(pools))
	}
}

// fixture makes a site and a pool.
func fixture(ctx context.Context, t *testing.T, h *Harness) *store.Pool {
	t.Helper()
	s := must(h.Store.SiteCreate(ctx, &store.SiteCreateParams{Name: "site-" + store.NewID("x"), Region: "eu-1"}))
	return must(h.Store.PoolCreate(ctx, &store.PoolCreateParams{Name: "pool-" + store.NewID("x"), SiteID: s.ID}))
}

func addNode(ctx context.Context, t *testing.T, h *Harness, pool *store.Pool, id string) *store.Node {
	t.Helper()
	return must(h.Store.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: id + ".example", MachineID: "m-" + id}))
}

func testNodes(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	notAfter := time.Now().Add(24 * time.Hour).UTC().Truncate(time.Microsecond)
	n := must(h.Store.NodeUpsert(ctx, &store.NodeUpsertParams{
		ID: "node_a", PoolID: pool.ID, Hostname: "gpu-01", MachineID: "mid-1", Labels: map[string]string{"rack": "r1"},
		BCDVersion: "0.1.0", OS: "linux", Arch: "amd64", CertSerial: "01", CertNotAfter: &notAfter,
	}))
	if n.State != store.NodeJoined || n.Labels["rack"] != "r1" || !n.CertNotAfter.Equal(notAfter) || n.LastSeenAt != nil {
		t.Fatalf("node = %+v", n)
	}
	check(t, h.Store.NodeSetState(ctx, "node_a", store.NodeReady))
	check(t, h.Store.NodeSetCordoned(ctx, "node_a", true))
	inv := []byte(`{"gpus":[{"name":"NVIDIA A100-SXM4-40GB"}]}`)
	check(t, h.Store.NodeSetInventory(ctx, "node_a", inv, "sha256:abc"))
	if err := h.Store.NodeSetInventory(ctx, "node_missing", inv, "sha256:abc"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("inventory of an unknown node: %v, want ErrNotFound", err)
	}
	// One label set and removed; the others stay.
	check(t, h.Store.NodeSetLabel(ctx, "node_a", "better-compute.io/gpu-count", "8"))
	if l := must(h.Store.NodeGet(ctx, "node_a")).Labels; l["rack"] != "r1" || l["better-compute.io/gpu-count"] != "8" {
		t.Fatalf("labels after NodeSetLabel: %v", l)
	}
	check(t, h.Store.NodeSetLabel(ctx, "node_a", "better-compute.io/gpu-count", ""))
	if l := must(h.Store.NodeGet(ctx, "node_a")).Labels; len(l) != 1 || l["rack"] != "r1" {
		t.Fatalf("labels after removing one: %v", l)
	}
	if err := h.Store.NodeSetLabel(ctx, "node_missing", "k", "v"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("label of an unknown node: %v, want ErrNotFound", err)
	}
	// A re-join keeps state, labels and history, and replaces identity.
	must(h.Store.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_a", PoolID: pool.ID, Hostname: "gpu-01", MachineID: "mid-1", CertSerial: "02"}))
	got := must(h.Store.NodeGet(ctx, "node_a"))
	if got.State != store.NodeReady || !got.Cordoned || got.CertSerial != "02" || got.Labels["rack"] != "r1" || got.InventoryDigest != "sha256:abc" {
		t.Fatalf("after re-join: %+v", got)
	}
	if !jsonEqual(t, got.Inventory, inv) {
		t.Fatalf("inventory = %s", got.Inventory)
	}
	if byHost := must(h.Store.NodeFindByHostname(ctx, pool.ID, "gpu-01")); byHost.ID != "node_a" {
		t.Fatalf("NodeFindByHostname found %s, want node_a", byHost.ID)
	}
	_, err := h.Store.NodeFindByHostname(ctx, pool.ID, "nope")
	wantErr(t, err, store.ErrNotFound)

	// The join key: set by an upsert that names it, kept by one that
	// does not, replaced by a new certificate.
	must(h.Store.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_a", PoolID: pool.ID, Hostname: "gpu-01", CertSerial: "03",
		KeySHA256: "k1", JoinTokenID: "jt_1"}))
	must(h.Store.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_a", PoolID: pool.ID, Hostname: "gpu-01", CertSerial: "04"}))
	if got := must(h.Store.NodeFindByJoinKey(ctx, "jt_1", "k1")); got.ID != "node_a" || got.KeySHA256 != "k1" || got.JoinTokenID != "jt_1" {
		t.Fatalf("NodeFindByJoinKey = %+v", got)
	}
	for _, k := range [][2]string{{"jt_1", "k2"}, {"jt_2", "k1"}, {"", ""}} {
		_, err := h.Store.NodeFindByJoinKey(ctx, k[0], k[1])
		wantErr(t, err, store.ErrNotFound)
	}
	na := time.Now().UTC().Add(24 * time.Hour).Truncate(time.Second)
	check(t, h.Store.NodeSetCertificate(ctx, &store.NodeSetCertificateParams{ID: "node_a", Serial: "05", NotAfter: na, KeySHA256: "k2"}))
	if got := must(h.Store.NodeGet(ctx, "node_a")); got.CertSerial != "05" || got.KeySHA256 != "k2" || got.CertNotAfter == nil || !got.CertNotAfter.Equal(na) {
		t.Fatalf("after NodeSetCertificate: %+v", got)
	}
	wantErr(t, h.Store.NodeSetCertificate(ctx, &store.NodeSetCertificateParams{ID: "node_missing", Serial: "1", NotAfter: na}), store.ErrNotFound)

	// Clock skew, in milliseconds, negative when the node runs behind.
	if got := must(h.Store.NodeGet(ctx, "node_a")); got.ClockSkew != nil {
		t.Fatalf("clock skew before any measure: %v", *got.ClockSkew)
	}
	at := time.Now().UTC().Add(time.Minute).Truncate(time.Microsecond)
	check(t, h.Store.NodeSetClockSkew(ctx, "node_a", -90*time.Second-250*time.Millisecond, &at))
	if got := must(h.Store.NodeGet(ctx, "node_a")); got.ClockSkew == nil || *got.ClockSkew != -90250*time.Millisecond || got.ClockSkewAt == nil || !got.ClockSkewAt.Equal(at) {
		t.Fatalf("clock skew = %v at %v", got.ClockSkew, got.ClockSkewAt)
	}
	wantErr(t, h.Store.NodeSetClockSkew(ctx, "node_missing", time.Second, nil), store.ErrNotFound)

	addNode(ctx, t, h, pool, "node_b")
	// Two nodes named alike: listed together, oldest first.
	must(h.Store.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_twin", PoolID: pool.ID, Hostname: "gpu-01"}))
	dups := must(h.Store.NodeHostnameDuplicates(ctx, 10))
	if len(dups) != 1 || dups[0].Hostname != "gpu-01" || !slices.Equal(dups[0].NodeIDs, []string{"node_a", "node_twin"}) {
		t.Fatalf("duplicates = %+v", dups)
	}
	check(t, h.Store.NodeDelete(ctx, "node_twin"))
	if missing := must(h.Store.NodesMissing(ctx, []string{"node_a", "node_x", "node_b", "node_y"})); !slices.Equal(missing, []string{"node_x", "node_y"}) {
		t.Fatalf("missing = %v", missing)
	}
	// Ids travel as one JSON array: quotes, backslashes and non-ASCII
	// must come back as they went.
	odd := []string{`node"q`, `node\\b`, "nöde", "node_b", "node,a"}
	if missing := must(h.Store.NodesMissing(ctx, odd)); !slices.Equal(missing, []string{`node"q`, `node\\b`, "nöde", "node,a"}) {
		t.Fatalf("missing = %q", missing)
	}
	if ready := must(h.Store.NodeList(ctx, &store.NodeListParams{State: store.NodeReady})); len(ready) != 1 {
		t.Fatalf("ready nodes = %d", len(ready))
	}
	if all := must(h.Store.NodeList(ctx, &store.NodeListParams{PoolID: pool.ID})); len(all) != 2 {
		t.Fatalf("pool nodes = %d", len(all))
	}
	// Summaries: every node, paged by id, with its digest but never its
	// inventory.
	full := must(h.Store.NodeList(ctx, &store.NodeListParams{}))
	sums := must(h.Store.NodeSummaries(ctx, &store.ListParams{Limit: 1}))
	sums = append(sums, must(h.Store.NodeSummaries(ctx, &store.ListParams{Cursor: sums[0].ID, Limit: 10}))...)
	if len(sums) != len(full) {
		t.Fatalf("summaries = %d nodes, want %d", len(sums), len(full))
	}
	for i, n := range sums {
		f := full[i]
		if n.ID != f.ID || n.PoolID != f.PoolID || n.Hostname != f.Hostname || n.State != f.State || n.Cordoned != f.Cordoned ||
			n.Disruption != f.Disruption || n.BCDVersion != f.BCDVersion || n.InventoryDigest != f.InventoryDigest ||
			!maps.Equal(n.Labels, f.Labels) || n.Inventory != nil {
			t.Fatalf("summary %+v, want the node %+v without its inventory", n, f)
		}
	}
	wantErr(t, h.Store.NodeSetState(ctx, "node_missing", store.NodeReady), store.ErrNotFound)
	check(t, h.Store.NodeDelete(ctx, "node_b"))
	_, err = h.Store.NodeGet(ctx, "node_b")
	wantErr(t, err, store.ErrNotFound)
}

func testJoinTokens(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	hash := []byte("0123456789abcdef0123456789abcdef")
	now := time.Now().UTC()
	at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	tok := must(h.Store.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{ID: "jt1", SecretHash: hash, PoolID: pool.ID, MaxUses: 2, ExpiresAt: now.Add(2 * time.Hour)}))
	if tok.Uses != 0 || tok.MaxUses != 2 {
		t.Fatalf("token = %+v", tok)
	}
	_, err := h.Store.JoinTokenConsume(ctx, "jt1", []byte("wrong"), nil)
	wantErr(t, err, store.ErrTokenInvalid)
	_, err = h.Store.JoinTokenConsume(ctx, "jt-unknown", hash, nil)
	wantErr(t, err, store.ErrTokenInvalid)
	_, err = h.Store.JoinTokenConsume(ctx, "jt1", hash, at(3*time.Hour))
	wantErr(t, err, store.ErrTokenExpired)
	if used := must(h.Store.JoinTokenConsume(ctx, "jt1", hash, nil)); used.Uses != 1 || used.PoolID != pool.ID {
		t.Fatalf("consumed = %+v", used)
	}
	must(h.Store.JoinTokenConsume(ctx, "jt1", hash, nil))
	_, err = h.Store.JoinTokenConsume(ctx, "jt1", hash, nil)
	wantErr(t, err, store.ErrTokenExhausted)
	// A check uses nothing and accepts a used-up token, but nothing else.
	if checked := must(h.Store.JoinTokenCheck(ctx, "jt1", hash, nil)); checked.Uses != 2 || checked.NodeID != "" {
		t.Fatalf("checked = %+v", checked)
	}
	_, err = h.Store.JoinTokenCheck(ctx, "jt1", []byte("wrong"), nil)
	wantErr(t, err, store.ErrTokenInvalid)
	_, err = h.Store.JoinTokenCheck(ctx, "jt1", hash, at(3*time.Hour))
	wantErr(t, err, store.ErrTokenExpired)
	if got := must(h.Store.JoinTokenGet(ctx, "jt1")); got.Uses != 2 {
		t.Fatalf("uses after checks = %d", got.Uses)
	}
	// A reinstall token names its node.
	addNode(ctx, t, h, pool, "node_r")
	if bound := must(h.Store.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{ID: "jt3", SecretHash: hash, PoolID: pool.ID, MaxUses: 1,
		ExpiresAt: now.Add(time.Hour), NodeID: "node_r"})); bound.NodeID != "node_r" {
		t.Fatalf("reinstall token = %+v", bound)
	}

	must(h.Store.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{ID: "jt2", SecretHash: hash, PoolID: pool.ID, MaxUses: 5, ExpiresAt: now.Add(time.Hour)}))
	check(t, h.Store.JoinTokenRevoke(ctx, "jt2"))
	_, err = h.Store.JoinTokenConsume(ctx, "jt2", hash, nil)
	wantErr(t, err, store.ErrTokenRevoked)
	wantErr(t, h.Store.JoinTokenRevoke(ctx, "jt-unknown"), store.ErrNotFound)
	if got := must(h.Store.JoinTokenGet(ctx, "jt2")); got.RevokedAt == nil {
		t.Fatal("revoked token has no revoked_at")
	}
	if list := must(h.Store.JoinTokenList(ctx, &store.ListParams{})); len(list) != 3 {
		t.Fatalf("tokens = %d", len(list))
	}
}

func testJoinTokenConcurrentUses(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	hash := []byte("secret-hash")
	must(h.Store.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{ID: "jt", SecretHash: hash, PoolID: pool.ID, MaxUses: 8, ExpiresAt: time.Now().Add(time.Hour)}))
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted, exhausted := 0, 0
	for range 20 {
		wg.Go(func() {
			_, err := h.Store.JoinTokenConsume(ctx, "jt", hash, nil)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted++
			case errors.Is(err, store.ErrTokenExhausted):
				exhausted++
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if admitted != 8 || exhausted != 12 {
		t.Fatalf("20 concurrent uses of a max-uses 8 token: %d admitted, %d exhausted", admitted, exhausted)
	}
}

func testGatewaysSessions(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	g := must(h.Store.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: "gw1", Region: "eu-1", Address: "10.0.0.1:8443", MaxStreams: 5000}))
	g2 := must(h.Store.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: "gw1", Region: "eu-1", Address: "10.0.0.1:8443", MaxStreams: 5000, Sessions: 3}))
	if g2.Sessions != 3 || !g2.StartedAt.Equal(g.StartedAt) || g2.HeartbeatAt.Before(g.HeartbeatAt) {
		t.Fatalf("gateway refresh = %+v (was %+v)", g2, g)
	}
	must(h.Store.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: "gw2", Region: "eu-1", InternalAddress: "10.0.0.2:8444"}))
	if gws := must(h.Store.GatewayList(ctx)); len(gws) != 2 {
		t.Fatalf("gateways = %d", len(gws))
	}
	// The internal control API's address (migration 0016) round-trips;
	// a gateway without one has it empty.
	if g := must(h.Store.GatewayGet(ctx, "gw2")); g.InternalAddress != "10.0.0.2:8444" {
		t.Fatalf("gw2 internal address = %q, want 10.0.0.2:8444", g.InternalAddress)
	}
	if g := must(h.Store.GatewayGet(ctx, "gw1")); g.InternalAddress != "" {
		t.Fatalf("gw1 internal address = %q, want none", g.InternalAddress)
	}
	addNode(ctx, t, h, pool, "node_s")
	s1, prev := mustOpen(t, h, ctx, "node_s", "sess1", "gw1")
	if s1.Epoch != 1 || prev != nil {
		t.Fatalf("first session = %+v prev %+v", s1, prev)
	}
	s2, prev := mustOpen(t, h, ctx, "node_s", "sess2", "gw2")
	if s2.Epoch != 2 || prev == nil || prev.SessionID != "sess1" || prev.GatewayID != "gw1" {
		t.Fatalf("superseding session = %+v prev %+v", s2, prev)
	}
	// Closing the superseded session leaves the current one.
	check(t, h.Store.SessionClose(ctx, "node_s", "sess1"))
	if cur := must(h.Store.SessionGet(ctx, "node_s")); cur.SessionID != "sess2" {
		t.Fatalf("current session = %+v", cur)
	}
	later := time.Now().Add(time.Minute).UTC().Truncate(time.Microsecond)
	if n := must(h.Store.SessionHeartbeatBatch(ctx, "gw2", []string{"sess2", "sess-gone"}, &later)); n != 1 {
		t.Fatalf("heartbeat batch touched %d sessions, want 1", n)
	}
	if n := must(h.Store.SessionHeartbeatBatch(ctx, "gw1", []string{"sess2"}, &later)); n != 0 {
		t.Fatalf("another gateway's heartbeat touched %d sessions", n)
	}
	if cur := must(h.Store.SessionGet(ctx, "node_s")); !cur.LastHeartbeatAt.Equal(later) {
		t.Fatalf("last heartbeat = %v, want %v", cur.LastHeartbeatAt, later)
	}
	if node := must(h.Store.NodeGet(ctx, "node_s")); node.LastSeenAt == nil || !node.LastSeenAt.Equal(later) {
		t.Fatalf("node last seen = %v", node.LastSeenAt)
	}
	if l := must(h.Store.SessionList(ctx, "gw2")); len(l) != 1 {
		t.Fatalf("gw2 sessions = %d", len(l))
	}
	addNode(ctx, t, h, pool, "node_t")
	mustOpen(t, h, ctx, "node_t", "sess3", "gw2")
	if ids := must(h.Store.SessionIDs(ctx, "gw2")); !slices.Equal(slices.Sorted(slices.Values(ids)), []string{"sess2", "sess3"}) {
		t.Fatalf("gw2 session ids = %v", ids)
	}
	if ids := must(h.Store.SessionIDs(ctx, "gw1")); len(ids) != 0 {
		t.Fatalf("gw1 session ids = %v (its session was superseded)", ids)
	}
	check(t, h.Store.SessionClose(ctx, "node_t", "sess3"))
	check(t, h.Store.SessionClose(ctx, "node_s", "sess2"))
	// The node keeps its last heartbeat once its session is gone.
	if node := must(h.Store.NodeGet(ctx, "node_s")); node.LastSeenAt == nil || !node.LastSeenAt.Equal(later) {
		t.Fatalf("node last seen after its session closed = %v, want %v", node.LastSeenAt, later)
	}
	_, err := h.Store.SessionGet(ctx, "node_s")
	wantErr(t, err, store.ErrNotFound)
	check(t, h.Store.GatewayDelete(ctx, "gw2"))
	_, err = h.Store.GatewayGet(ctx, "gw2")
	wantErr(t, err, store.ErrNotFound)
}

// testGatewayReap follows a gateway killed without warning: while its
// lease lives its sessions stay; once the lease expires they are closed,
// the nodes keep their last heartbeat; after PruneAfter its row and lease
// go. A live gateway's sessions and row are never touched.
func testGatewayReap(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	now := time.Now().UTC().Truncate(time.Microsecond)
	at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	var liveEpoch int64
	for _, id := range []string{"gw-dead", "gw-live"} {
		must(h.Store.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: id, Region: "eu-1", Now: at(0)}))
		l, ok, err := h.Store.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: "gateway:" + id, Holder: "p-" + id, TTL: 20 * time.Second, Now: at(0)})
		if err != nil || !ok {
			t.Fatalf("lease of %s: %v %v", id, ok, err)
		}
		liveEpoch = l.Epoch
	}
	addNode(ctx, t, h, pool, "node_d")
	addNode(ctx, t, h, pool, "node_l")
	mustOpen(t, h, ctx, "node_d", "sess-d", "gw-dead")
	mustOpen(t, h, ctx, "node_l", "sess-l", "gw-live")
	hb := now.Add(time.Second)
	must(h.Store.SessionHeartbeatBatch(ctx, "gw-dead", []string{"sess-d"}, &hb))
	params := func(d time.Duration) *store.GatewayReapParams {
		return &store.GatewayReapParams{LeasePrefix: "gateway:", PruneAfter: time.Hour, Now: at(d)}
	}
	// Both leases live: nothing to do.
	if res := must(h.Store.GatewayReap(ctx, params(10*time.Second))); len(res.Dead) != 0 || res.Sessions != 0 {
		t.Fatalf("with every lease live: %+v", res)
	}
	// gw-live renews; gw-dead was killed.
	if _, ok, err := h.Store.LeaseRenew(ctx, &store.LeaseRenewParams{Name: "gateway:gw-live", Holder: "p-gw-live", Epoch: liveEpoch, TTL: 2 * time.Hour, Now: at(15 * time.Second)}); err != nil || !ok {
		t.Fatalf("renew: %v %v", ok, err)
	}
	res := must(h.Store.GatewayReap(ctx, params(21*time.Second)))
	if !slices.Equal(res.Dead, []string{"gw-dead"}) || res.Sessions != 1 || len(res.Pruned) != 0 {
		t.Fatalf("after gw-dead's lease expired: %+v", res)
	}
	_, err := h.Store.SessionGet(ctx, "node_d")
	wantErr(t, err, store.ErrNotFound)
	if n := must(h.Store.NodeGet(ctx, "node_d")); n.LastSeenAt == nil || !n.LastSeenAt.Equal(hb) {
		t.Fatalf("node of the dead gateway last seen %v, want its last heartbeat %v", n.LastSeenAt, hb)
	}
	if cur := must(h.Store.SessionGet(ctx, "node_l")); cur.SessionID != "sess-l" {
		t.Fatalf("live gateway's session = %+v", cur)
	}
	// Past the retention: the dead gateway's row and lease go.
	res = must(h.Store.GatewayReap(ctx, params(time.Hour+21*time.Second)))
	if !slices.Equal(res.Pruned, []string{"gw-dead"}) || res.Sessions != 0 {
		t.Fatalf("past the retention: %+v", res)
	}
	_, err = h.Store.GatewayGet(ctx, "gw-dead")
	wantErr(t, err, store.ErrNotFound)
	if l, err := h.Store.LeaseGet(ctx, "gateway:gw-dead"); err == nil {
		t.Fatalf("dead gateway's lease kept: %+v", l)
	}
	must(h.Store.GatewayGet(ctx, "gw-live"))
}

// testSessionBootID: the boot id a node reports when its session opens is
// the node's BootID: kept when the session closes and across a re-join's
// upsert, replaced by the next session's, and cleared by a session that
// reports none (an older bcd), so that a stale boot id is never read as
// the current boot's.
func testSessionBootID(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	addNode(ctx, t, h, pool, "node_b")
	bootID := func() string { t.Helper(); return must(h.Store.NodeGet(ctx, "node_b")).BootID }
	if b := bootID(); b != "" {
		t.Fatalf("boot id before any session = %q", b)
	}
	open := func(sess, boot string) {
		t.Helper()
		_, _, err := h.Store.SessionOpen(ctx, &store.SessionOpenParams{NodeID: "node_b", SessionID: sess, GatewayID: "gw1", BootID: boot})
		check(t, err)
	}
	open("sess-b1", "boot-a")
	if b := bootID(); b != "boot-a" {
		t.Fatalf("boot id after the first session = %q, want boot-a", b)
	}
	check(t, h.Store.SessionClose(ctx, "node_b", "sess-b1"))
	addNode(ctx, t, h, pool, "node_b")
	if b := bootID(); b != "boot-a" {
		t.Fatalf("boot id after the session closed and an upsert = %q, want boot-a", b)
	}
	open("sess-b2", "boot-a") // bcd restarted, same boot
	if b := bootID(); b != "boot-a" {
		t.Fatalf("boot id after a restart = %q, want boot-a", b)
	}
	open("sess-b3", "boot-b") // rebooted, superseding the old session
	if b := bootID(); b != "boot-b" {
		t.Fatalf("boot id after a reboot = %q, want boot-b", b)
	}
	open("sess-b4", "")
	if b := bootID(); b != "" {
		t.Fatalf("boot id after a session that reported none = %q, want none", b)
	}
}

func mustOpen(t *testing.T, h *Harness, ctx context.Context, node, sess, gw string) (*store.Session, *store.Session) {
	t.Helper()
	s, prev, err := h.Store.SessionOpen(ctx, &store.SessionOpenParams{NodeID: node, SessionID: sess, GatewayID: gw, RemoteAddr: "127.0.0.1:1"})
	check(t, err)
	return s, prev
}

func testWorkers(ctx context.Context, t *testing.T, h *Harness) {
	now := time.Now().UTC()
	old := now.Add(-time.Minute)
	must(h.Store.WorkerHeartbeat(ctx, &store.WorkerHeartbeatParams{ID: "w1", Roles: []string{"controllers", "sinks"}, Hostname: "h", PID: 10, Now: &now}))
	must(h.Store.WorkerHeartbeat(ctx, &store.WorkerHeartbeatParams{ID: "w2", Roles: []string{"iam"}, Now: &old}))
	live := must(h.Store.WorkerList(ctx, 15*time.Second, &now))
	if len(live) != 1 || live[0].ID != "w1" || !slices.Equal(live[0].Roles, []string{"controllers", "sinks"}) {
		t.Fatalf("live workers = %+v", live)
	}
	if all := must(h.Store.WorkerList(ctx, 0, nil)); len(all) != 2 {
		t.Fatalf("all workers = %d", len(all))
	}
	check(t, h.Store.WorkerDelete(ctx, "w1"))
	if all := must(h.Store.WorkerList(ctx, 0, nil)); len(all) != 1 {
		t.Fatalf("workers after delete = %d", len(all))
	}
}

// testProcesses: every process registers (migration 0019) with its roles,
// version and the newest migration its build knows; a refresh keeps its
// start; rows silent past the timeout are pruned, the others kept.
func testProcesses(ctx context.Context, t *testing.T, h *Harness) {
	now := time.Now().UTC().Truncate(time.Millisecond)
	old := now.Add(-time.Minute)
	p1 := must(h.Store.ProcessHeartbeat(ctx, &store.ProcessHeartbeatParams{ID: "p1", Roles: []string{"api"}, Hostname: "h", PID: 10, Version: "1.2.0", Now: &old}))
	p1b := must(h.Store.ProcessHeartbeat(ctx, &store.ProcessHeartbeatParams{ID: "p1", Roles: []string{"api"}, Hostname: "h", PID: 10, Version: "1.2.0", Now: &now}))
	if !p1b.StartedAt.Equal(p1.StartedAt) || !p1b.HeartbeatAt.After(p1.HeartbeatAt) || p1b.Schema == "" || p1b.PID != 10 {
		t.Fatalf("process refresh = %+v (was %+v)", p1b, p1)
	}
	if len(p1b.InternalCAs) != 0 || p1b.InternalCertCA != "" {
		t.Fatalf("a process without the internal control API reports internal CAs: %+v", p1b)
	}
	// The internal CAs it trusts and presents (migration 0031) follow each
	// heartbeat.
	p1c := must(h.Store.ProcessHeartbeat(ctx, &store.ProcessHeartbeatParams{ID: "p1", Roles: []string{"api"}, Hostname: "h", PID: 10, Version: "1.2.0",
		InternalCAs: []string{"ca-new", "ca-old"}, InternalCertCA: "ca-old", Now: &now}))
	if !slices.Equal(p1c.InternalCAs, []string{"ca-new", "ca-old"}) || p1c.InternalCertCA != "ca-old" {
		t.Fatalf("process internal CAs = %v presenting %q", p1c.InternalCAs, p1c.InternalCertCA)
	}
	must(h.Store.ProcessHeartbeat(ctx, &store.ProcessHeartbeatParams{ID: "p2", Roles: []string{"sinks", "iam"}, Version: "1.1.0", Now: &old}))
	all := must(h.Store.ProcessList(ctx))
	if len(all) != 2 || all[1].ID != "p2" || !slices.Equal(all[1].Roles, []string{"sinks", "iam"}) || all[1].Version != "1.1.0" {
		t.Fatalf("processes = %+v", all)
	}
	if pruned := must(h.Store.ProcessPrune(ctx, 30*time.Second, &now)); !slices.Equal(pruned, []string{"p2"}) {
		t.Fatalf("pruned = %v, want [p2]", pruned)
	}
	check(t, h.Store.ProcessDelete(ctx, "p1"))
	if all := must(h.Store.ProcessList(ctx)); len(all) != 0 {
		t.Fatalf("processes after delete = %+v", all)
	}
}

// testGatewayDrainSet: an operator's drain request (migration 0019) is
// kept across the gateway's own refreshes until undone; an unknown gateway
// is ErrNotFound.
func testGatewayDrainSet(ctx context.Context, t *testing.T, h *Harness) {
	must(h.Store.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: "gwd", Region: "eu-1"}))
	if g := must(h.Store.GatewayDrainSet(ctx, "gwd", true)); !g.DrainRequested {
		t.Fatalf("drain set = %+v", g)
	}
	if g := must(h.Store.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: "gwd", Region: "eu-1", Draining: true})); !g.DrainRequested || !g.Draining {
		t.Fatalf("refresh lost the drain request: %+v", g)
	}
	if g := must(h.Store.GatewayDrainSet(ctx, "gwd", false)); g.DrainRequested {
		t.Fatalf("undrain = %+v", g)
	}
	if _, err := h.Store.GatewayDrainSet(ctx, "nope", true); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("drain of an unknown gateway = %v, want ErrNotFound", err)
	}
}

// testCommandSpecForms: a command's spec is kept in its session-protocol
// form; rows in the form of a build older than migration
// 0008_command_session_spec (spec only, session_spec NULL) are converted,
// both by the migration's data step and, for rows an older build writes
// after it, on read; and the old column keeps the form an older gateway
// reads.
func testCommandSpecForms(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	addNode(ctx, t, h, pool, "node_1")
	cases := []struct {
		kind, legacy, session string
	}{
		{"exec", `{"argv":["nvidia-smi","-L"],"asRoot":true,"outputLimitBytes":"1048576"}`,
			`{"exec":{"argv":["nvidia-smi","-L"],"asRoot":true,"outputLimitBytes":"1048576"}}`},
		{"power.cycle", `{"bmc":"rack1"}`, `{"power":{"bmc":"rack1","action":"cycle"}}`},
		{"power.soft-off", `{}`, `{"power":{"action":"soft-off"}}`},
		{"boot.set", `{"device":"pxe","persistent":true}`, `{"boot":{"device":"pxe","persistent":true}}`},
		{"upgrade", `{"version":"0.2.0","baseUrl":"https://x/api/downloads"}`, `{"upgrade":{"version":"0.2.0","baseUrl":"https://x/api/downloads"}}`},
		{"inventory.refresh", `{}`, `{}`},
	}
	var cmds []*store.Command
	for _, tc := range cases {
		c := must(h.Store.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_1"}, Kind: tc.kind,
			SessionSpec: []byte(tc.session), Timeout: time.Minute}))[0]
		if !jsonEqual(t, c.SessionSpec, []byte(tc.session)) {
			t.Errorf("%s: enqueued session spec %s, want %s", tc.kind, c.SessionSpec, tc.session)
		}
		cmds = append(cmds, c)
	}
	if c := must(h.Store.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_1"}, Kind: "reboot", Timeout: time.Minute}))[0]; string(c.SessionSpec) != "{}" {
		t.Errorf("enqueued without a spec: session spec %s, want {}", c.SessionSpec)
	}
	if _, err := h.Store.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_1"}, Kind: "exec",
		SessionSpec: []byte(`{"exec":{},"power":{}}`), Timeout: time.Minute}); err == nil {
		t.Error("enqueued a session spec with two spec fields")
	}
	// The old column holds the oneof's value, which an older gateway reads
	// as the API's spec (the JSON names are the same): rewrite each row to
	// the old form, as an older API writes it.
	for i, tc := range cases {
		check(t, h.Exec(ctx, fmt.Sprintf(`UPDATE commands SET session_spec = NULL WHERE id = '%s'`, cmds[i].ID)))
		got := must(h.Store.CommandGet(ctx, cmds[i].ID))
		if !jsonEqual(t, got.SessionSpec, []byte(tc.session)) {
			t.Errorf("%s: read from the old column alone: %s, want %s", tc.kind, got.SessionSpec, tc.session)
		}
		check(t, h.Exec(ctx, fmt.Sprintf(`UPDATE commands SET spec = '%s' WHERE id = '%s'`, tc.legacy, cmds[i].ID)))
		got = must(h.Store.CommandGet(ctx, cmds[i].ID))
		if !jsonEqual(t, got.SessionSpec, []byte(tc.session)) {
			t.Errorf("%s: an older build's row (spec %s) reads as %s, want %s", tc.kind, tc.legacy, got.SessionSpec, tc.session)
		}
	}
	if h.Migrations == nil {
		return
	}
	b, err := fs.ReadFile(h.Migrations, "0008_command_session_spec.sql")
	if err != nil {
		t.Fatal(err)
	}
	_, update, ok := strings.Cut(string(b), "\nUPDATE commands SET session_spec")
	if !ok {
		t.Fatal("migration 0008 has no UPDATE commands SET session_spec step")
	}
	check(t, h.Exec(ctx, "UPDATE commands SET session_spec"+update))
	for i, tc := range cases {
		// The migration wrote the column: the read needs no fallback.
		check(t, h.Exec(ctx, fmt.Sprintf(`UPDATE commands SET spec = '"not an object"' WHERE id = '%s'`, cmds[i].ID)))
		got, err := h.Store.CommandGet(ctx, cmds[i].ID)
		if err != nil {
			t.Fatalf("%s: after the migration's data step: %v", tc.kind, err)
		}
		if !jsonEqual(t, got.SessionSpec, []byte(tc.session)) {
			t.Errorf("%s: migration 0008 converted spec %s to %s, want %s", tc.kind, tc.legacy, got.SessionSpec, tc.session)
		}
	}
}

func testCommands(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	for _, id := range []string{"node_1", "node_2", "node_3"} {
		addNode(ctx, t, h, pool, id)
	}
	spec := []byte(`{"exec":{"argv":["uname","-a"]}}`)
	cmds := must(h.Store.CommandEnqueue(ctx, &store.CommandEnqueueParams{
		NodeIDs: []string{"node_1", "node_2", "node_3"}, Kind: "exec", SessionSpec: spec, IdempotencyKey: "req-1",
		CreatedBy: "token_admin", Timeout: time.Minute,
	}))
	if len(cmds) != 3 {
		t.Fatalf("enqueued %d commands", len(cmds))
	}
	c := cmds[0]
	if c.State != store.CommandQueued || c.Kind != "exec" || !jsonEqual(t, c.SessionSpec, spec) || c.DeadlineAt.Sub(c.CreatedAt) != time.Minute {
		t.Fatalf("command = %+v", c)
	}
	again := must(h.Store.CommandEnqueue(ctx, &store.CommandEnqueueParams{
		NodeIDs: []string{"node_1", "node_2", "node_3"}, Kind: "exec", SessionSpec: spec, IdempotencyKey: "req-1", Timeout: time.Minute,
	}))
	if ids(again) == nil || !slices.Equal(ids(again), ids(cmds)) {
		t.Fatalf("idempotent retry returned %v, want %v", ids(again), ids(cmds))
	}
	// With KeyOfCreator the key is its creator's: the same creator's retry
	// gets its commands back; another creator's is refused, with nothing
	// of the first's, and enqueues nothing.
	own := must(h.Store.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_1"}, Kind: "exec", SessionSpec: spec,
		IdempotencyKey: "req-1", KeyOfCreator: true, CreatedBy: "token_admin", Timeout: time.Minute}))
	if len(own) != 1 || own[0].ID != cmds[0].ID {
		t.Fatalf("the creator's retry with KeyOfCreator returned %v, want %s", ids(own), cmds[0].ID)
	}
	if got, err := h.Store.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_1", "node_2"}, Kind: "exec",
		SessionSpec: spec, IdempotencyKey: "req-1", KeyOfCreator: true, CreatedBy: "token_other", Timeout: time.Minute}); !errors.Is(err, store.ErrConflict) || got != nil {
		t.Fatalf("another creator's key: %v, %v; want ErrConflict and no command", ids(got), err)
	}
	if outbox := must(h.Store.OutboxList(ctx, 0, 10)); len(outbox) != 3 || outbox[0].Topic != events.CommandCreated || outbox[0].Key != cmds[0].ID {
		t.Fatalf("outbox after enqueue+retry = %+v (want one command.created per command, none for the retry)", outbox)
	}
	ok := must(h.Store.CommandSetState(ctx, &store.CommandSetStateParams{ID: c.ID, State: store.CommandDispatched, GatewayID: "gw1"}))
	must(h.Store.CommandSetState(ctx, &store.CommandSetStateParams{ID: c.ID, State: store.CommandRunning}))
	got := must(h.Store.CommandGet(ctx, c.ID))
	if !ok || got.State != store.CommandRunning || got.Attempt != 1 || got.GatewayID != "gw1" || got.DispatchedAt == nil || got.StartedAt == nil {
		t.Fatalf("running command = %+v", got)
	}
	appendOut := func(p *store.CommandOutputChunk) int { return must(h.Store.CommandAppendOutput(ctx, p)) }
	if n := appendOut(&store.CommandOutputChunk{CommandID: c.ID, Seq: 1, Stream: store.StreamStdout, Data: []byte("Linux "), NodeID: "node_1"}); n != 6 {
		t.Fatalf("kept %d of 6 bytes", n)
	}
	// Another node's output for this command is not stored.
	if n := appendOut(&store.CommandOutputChunk{CommandID: c.ID, Seq: 9, Stream: store.StreamStdout, Data: []byte("forged"), NodeID: "node_2"}); n != 0 {
		t.Fatalf("kept %d bytes of another node's output", n)
	}
	if ok := must(h.Store.CommandFinish(ctx, &store.CommandFinishParams{ID: c.ID, NodeID: "node_2", State: store.CommandFailed})); ok {
		t.Fatal("another node finished the command")
	}
	appendOut(&store.CommandOutputChunk{CommandID: c.ID, Seq: 2, Stream: store.StreamStdout, Data: []byte("host\n")})
	// A redelivery is ignored.
	if n := appendOut(&store.CommandOutputChunk{CommandID: c.ID, Seq: 1, Stream: store.StreamStdout, Data: []byte("Linux "), NodeID: "node_1"}); n != 0 {
		t.Fatalf("kept %d bytes of a redelivered chunk", n)
	}
	// A missing command keeps nothing and is no error.
	if n := appendOut(&store.CommandOutputChunk{CommandID: "cmd_missing", Seq: 1, Stream: store.StreamStdout, Data: []byte("x")}); n != 0 {
		t.Fatalf("kept %d bytes for a missing command", n)
	}
	var out []byte
	for _, ch := range must(h.Store.CommandOutputPage(ctx, &store.CommandOutputPageParams{CommandID: c.ID})).Chunks {
		out = append(out, ch.Data...)
	}
	if string(out) != "Linux host\n" {
		t.Fatalf("output = %q", out)
	}
	zero := 0
	if !must(h.Store.CommandFinish(ctx, &store.CommandFinishParams{ID: c.ID, State: store.CommandSucceeded, ExitCode: &zero})) {
		t.Fatal("first terminal result refused")
	}
	// Nothing is accepted for a command after its terminal result.
	if n := appendOut(&store.CommandOutputChunk{CommandID: c.ID, Seq: 3, Stream: store.StreamStdout, Data: []byte("late"), NodeID: "node_1"}); n != 0 {
		t.Fatalf("kept %d bytes of output sent after the result", n)
	}
	if got := must(h.Store.CommandGet(ctx, c.ID)); got.OutputBytes != 11 {
		t.Fatalf("output_bytes after a late chunk = %d, want 11", got.OutputBytes)
	}
	one := 1
	if must(h.Store.CommandFinish(ctx, &store.CommandFinishParams{ID: c.ID, State: store.CommandFailed, ExitCode: &one})) {
		t.Fatal("second terminal result accepted")
	}
	if must(h.Store.CommandSetState(ctx, &store.CommandSetStateParams{ID: c.ID, State: store.CommandRunning})) {
		t.Fatal("terminal command moved back to running")
	}
	got = must(h.Store.CommandGet(ctx, c.ID))
	if got.State != store.CommandSucceeded || got.ExitCode == nil || *got.ExitCode != 0 || got.OutputBytes != 11 || got.FinishedAt == nil {
		t.Fatalf("finished command = %+v", got)
	}
	_, err := h.Store.CommandFinish(ctx, &store.CommandFinishParams{ID: "cmd_missing", State: store.CommandFailed})
	wantErr(t, err, store.ErrNotFound)
	if l := must(h.Store.CommandList(ctx, &store.CommandListParams{BatchID: c.BatchID, State: store.CommandQueued})); len(l) != 2 {
		t.Fatalf("queued commands of batch = %d", len(l))
	}
	// Cancel: a queued command ends at once; a running one is marked.
	queued := cmds[1]
	if c := must(h.Store.CommandRequestCancel(ctx, queued.ID)); c.State != store.CommandCancelled || c.FinishedAt == nil {
		t.Fatalf("cancelled queued command = %+v", c)
	}
	running := cmds[2]
	must(h.Store.CommandSetState(ctx, &store.CommandSetStateParams{ID: running.ID, State: store.CommandRunning}))
	if c := must(h.Store.CommandRequestCancel(ctx, running.ID)); c.State != store.CommandRunning || !c.CancelRequested {
		t.Fatalf("cancel of running command = %+v", c)
	}
	if c := must(h.Store.CommandRequestCancel(ctx, c.ID)); c.State != store.CommandSucceeded || c.CancelRequested {
		t.Fatalf("cancel of finished command changed it: %+v", c)
	}
	_, err = h.Store.CommandRequestCancel(ctx, "cmd_missing")
	wantErr(t, err, store.ErrNotFound)
	if n := must(h.Store.CommandPrune(ctx, time.Now().Add(time.Hour))); n != 2 {
		t.Fatalf("pruned %d commands, want the 2 finished", n)
	}
	if l := must(h.Store.CommandList(ctx, &store.CommandListParams{NodeID: "node_1"})); len(l) != 0 {
		t.Fatalf("node_1 commands after prune = %d", len(l))
	}
}

func ids(cmds []*store.Command) []string {
	var out []string
	for _, c := range cmds {
		out = append(out, c.ID)
	}
	slices.Sort(out)
	return out
}

func testOutboxEventsAudit(ctx context.Context, t *testing.T, h *Harness) {
	if m := must(h.Store.OutboxMaxID(ctx)); m != 0 {
		t.Fatalf("empty outbox: max id %d", m)
	}
	id1 := must(h.Store.OutboxInsert(ctx, "node.joined", "node_a", []byte(`{"node":"node_a"}`)))
	id2 := must(h.Store.OutboxInsert(ctx, "node.joined", "node_b", []byte(`{"node":"node_b"}`)))
	if id2 <= id1 {
		t.Fatalf("outbox ids not increasing: %d, %d", id1, id2)
	}
	if m := must(h.Store.OutboxMaxID(ctx)); m != id2 {
		t.Fatalf("outbox max id %d, want %d", m, id2)
	}
	if after := must(h.Store.OutboxList(ctx, id1, 10)); len(after) != 1 || after[0].Key != "node_b" {
		t.Fatalf("outbox after %d = %+v", id1, after)
	}
	if c := must(h.Store.OutboxCursor(ctx, "webhook")); c != 0 {
		t.Fatalf("fresh cursor = %d", c)
	}
	check(t, h.Store.OutboxCursorSet(ctx, "webhook", id1))
	check(t, h.Store.OutboxCursorSet(ctx, "webhook", id2))
	if c := must(h.Store.OutboxCursor(ctx, "webhook")); c != id2 {
		t.Fatalf("cursor = %d, want %d", c, id2)
	}

	old := time.Now().Add(-48 * time.Hour).UTC().Truncate(time.Microsecond)
	must(h.Store.EventInsert(ctx, &store.Event{NodeID: "node_a", Kind: "gpu.xid", Severity: "critical", Message: "XID 79", Time: old, Payload: []byte(`{"xid":79}`)}))
	must(h.Store.EventInsert(ctx, &store.Event{NodeID: "node_b", Kind: "node.reboot"}))
	evs := must(h.Store.EventList(ctx, &store.EventListParams{NodeID: "node_a"}))
	if len(evs) != 1 || evs[0].Kind != "gpu.xid" || !evs[0].Time.Equal(old) || !jsonEqual(t, evs[0].Payload, []byte(`{"xid":79}`)) {
		t.Fatalf("events = %+v", evs)
	}
	if n := must(h.Store.EventPrune(ctx, time.Now().Add(-24*time.Hour))); n != 1 {
		t.Fatalf("pruned %d events", n)
	}

	must(h.Store.AuditInsert(ctx, &store.AuditEntry{Time: old, Actor: "join-token:jt1", Action: "join", Resource: "node_a", Outcome: "refused: expired", SourceIP: "192.0.2.7"}))
	must(h.Store.AuditInsert(ctx, &store.AuditEntry{Actor: "token_admin", Action: "sites.create", Outcome: "ok", Details: []byte(`{"name":"x"}`)}))
	log := must(h.Store.AuditList(ctx, 0, 10))
	if len(log) != 2 || log[0].SourceIP != "192.0.2.7" || log[0].Outcome != "refused: expired" {
		t.Fatalf("audit log = %+v", log)
	}
	if n := must(h.Store.AuditPrune(ctx, time.Now().Add(-24*time.Hour))); n != 1 {
		t.Fatalf("pruned %d audit rows", n)
	}
}

// testAuditQuery checks AuditQuery's filters, newest-first order and
// paging by id, and that the action prefix is literal ('_' and '%' are not
// wildcards; case matters).
func testAuditQuery(ctx context.Context, t *testing.T, h *Harness) {
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	rows := []store.AuditEntry{
		{Time: base, Actor: "token:a", Action: "sites.create", Resource: "ams-1", Outcome: "ok"},
		{Time: base.Add(time.Minute), Actor: "token:a", Action: "pools.create", Resource: "gpu", Outcome: "ok"},
		{Time: base.Add(2 * time.Minute), Actor: "token:b", Action: "joinTokens.create", Resource: "gpu", Outcome: "ok"},
		{Time: base.Add(3 * time.Minute), Actor: "token:b", Action: "joinTokens.revoke", Resource: "jt_1", Outcome: "NOT_FOUND"},
		{Time: base.Add(4 * time.Minute), Actor: "join-token:jt_2", Action: "join", Resource: "node_a", Outcome: "ok"},
		{Time: base.Add(5 * time.Minute), Actor: "token:a", Action: "sites_create", Resource: "x", Outcome: "denied"},
	}
	ids := make([]int64, len(rows))
	for i := range rows {
		ids[i] = must(h.Store.AuditInsert(ctx, &rows[i]))
	}
	got := func(p store.AuditQueryParams) []int64 {
		t.Helper()
		var out []int64
		for _, e := range must(h.Store.AuditQuery(ctx, &p)) {
			out = append(out, e.ID)
		}
		return out
	}
	want := func(name string, p store.AuditQueryParams, idx ...int) {
		t.Helper()
		var w []int64
		for _, i := range idx {
			w = append(w, ids[i])
		}
		if g := got(p); !slices.Equal(g, w) {
			t.Errorf("%s: ids %v, want %v", name, g, w)
		}
	}
	want("all, newest first", store.AuditQueryParams{}, 5, 4, 3, 2, 1, 0)
	want("actor", store.AuditQueryParams{Actor: "token:a"}, 5, 1, 0)
	want("action prefix", store.AuditQueryParams{ActionPrefix: "joinTokens."}, 3, 2)
	want("whole action", store.AuditQueryParams{ActionPrefix: "sites.create"}, 0)
	want("underscore is literal", store.AuditQueryParams{ActionPrefix: "sites_"}, 5)
	want("percent is literal", store.AuditQueryParams{ActionPrefix: "%"})
	want("case matters", store.AuditQueryParams{ActionPrefix: "JOINTOKENS."})
	want("resource", store.AuditQueryParams{Resource: "gpu"}, 2, 1)
	want("outcome", store.AuditQueryParams{Outcome: "NOT_FOUND"}, 3)
	want("since inclusive, until exclusive", store.AuditQueryParams{Since: base.Add(time.Minute), Until: base.Add(3 * time.Minute)}, 2, 1)
	want("all filters", store.AuditQueryParams{Actor: "token:b", ActionPrefix: "joinTokens", Resource: "gpu", Outcome: "ok",
		Since: base, Until: base.Add(time.Hour)}, 2)
	want("nothing matches", store.AuditQueryParams{Actor: "token:c"})

	// Pages of two, each after the last id of the one before.
	var paged []int64
	p := store.AuditQueryParams{Limit: 2}
	for range 10 {
		page := got(p)
		paged = append(paged, page...)
		if len(page) < p.Limit {
			break
		}
		p.BeforeID = page[len(page)-1]
	}
	if w := []int64{ids[5], ids[4], ids[3], ids[2], ids[1], ids[0]}; !slices.Equal(paged, w) {
		t.Fatalf("paged ids %v, want %v", paged, w)
	}
	e := must(h.Store.AuditQuery(ctx, &store.AuditQueryParams{Outcome: "NOT_FOUND"}))
	if len(e) != 1 || !e[0].Time.Equal(base.Add(3*time.Minute)) || e[0].Actor != "token:b" || e[0].Resource != "jt_1" || e[0].Action != "joinTokens.revoke" {
		t.Fatalf("entry = %+v", e)
	}
}

func testClock(ctx context.Context, t *testing.T, h *Harness) {
	before := time.Now()
	now := must(h.Store.Now(ctx))
	after := time.Now()
	// The test database runs on this machine: its clock agrees with ours
	// to well within a second.
	if now.Before(before.Add(-time.Second)) || now.After(after.Add(time.Second)) {
		t.Fatalf("database clock %v, local clock between %v and %v", now, before, after)
	}
	if now.Location() != time.UTC {
		t.Fatalf("database clock in %v, want UTC", now.Location())
	}
}

func testPKI(ctx context.Context, t *testing.T, h *Harness) {
	_, err := h.Store.PKIBundleGet(ctx)
	wantErr(t, err, store.ErrNotFound)
	check(t, h.Store.PKIBundleCreate(ctx, &store.PKIBundle{TrustDomain: "compute.example", Sealed: []byte{1, 2, 3}}))
	wantErr(t, h.Store.PKIBundleCreate(ctx, &store.PKIBundle{TrustDomain: "other", Sealed: []byte{9}}), store.ErrConflict)
	check(t, h.Store.PKIBundleUpdate(ctx, &store.PKIBundle{TrustDomain: "compute.example", Sealed: []byte{4, 5}}))
	b := must(h.Store.PKIBundleGet(ctx))
	if b.TrustDomain != "compute.example" || !slices.Equal(b.Sealed, []byte{4, 5}) {
		t.Fatalf("bundle = %+v", b)
	}
	// A conditional update applies only over the bundle it was made from.
	wantErr(t, h.Store.PKIBundleUpdate(ctx, &store.PKIBundle{TrustDomain: "compute.example", Sealed: []byte{6}, Prev: []byte{1, 2, 3}}),
		store.ErrConflict)
	check(t, h.Store.PKIBundleUpdate(ctx, &store.PKIBundle{TrustDomain: "compute.example", Sealed: []byte{4, 5, 6}, Prev: []byte{4, 5}}))
	if b = must(h.Store.PKIBundleGet(ctx)); !slices.Equal(b.Sealed, []byte{4, 5, 6}) {
		t.Fatalf("bundle after a conditional update = %+v", b)
	}
	check(t, h.Store.PKIBundleUpdate(ctx, &store.PKIBundle{TrustDomain: "compute.example", Sealed: []byte{4, 5}, Prev: []byte{4, 5, 6}}))
	before := time.Now().Add(-time.Second)
	check(t, h.Store.RevocationInsert(ctx, &store.Revocation{Serial: "abc", NodeID: "node_a", Reason: "re-join"}))
	check(t, h.Store.RevocationInsert(ctx, &store.Revocation{Serial: "abc", NodeID: "node_a", Reason: "again"}))
	if !must(h.Store.RevocationCheck(ctx, "abc")) || must(h.Store.RevocationCheck(ctx, "def")) {
		t.Fatal("revocation check wrong")
	}
	if l := must(h.Store.RevocationList(ctx, before)); len(l) != 1 || l[0].Reason != "re-join" {
		t.Fatalf("revocations = %+v", l)
	}
	if l := must(h.Store.RevocationList(ctx, time.Now().Add(time.Hour))); len(l) != 0 {
		t.Fatalf("future revocations = %d", len(l))
	}
}

func testAPITokensAndSecrets(ctx context.Context, t *testing.T, h *Harness) {
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	check(t, h.Store.APITokenCreate(ctx, &store.APIToken{ID: "tok1", Role: store.RoleViewer, AllowCIDRs: []string{"10.0.0.0/8"}, ExpiresAt: &exp}, []byte("h1")))
	wantErr(t, h.Store.APITokenCreate(ctx, &store.APIToken{ID: "tok2", Role: store.RoleAdmin}, []byte("h1")), store.ErrConflict)
	got := must(h.Store.APITokenBySecret(ctx, []byte("h1")))
	if got.ID != "tok1" || got.Role != store.RoleViewer || !slices.Equal(got.AllowCIDRs, []string{"10.0.0.0/8"}) || !got.ExpiresAt.Equal(exp) {
		t.Fatalf("token = %+v", got)
	}
	_, err := h.Store.APITokenBySecret(ctx, []byte("nope"))
	wantErr(t, err, store.ErrNotFound)
	check(t, h.Store.APITokenRevoke(ctx, "tok1"))
	if l := must(h.Store.APITokenList(ctx, &store.ListParams{})); len(l) != 1 || l[0].RevokedAt == nil {
		t.Fatalf("tokens = %+v", l)
	}
	check(t, h.Store.APITokenCreate(ctx, &store.APIToken{ID: "tok3", Role: store.RoleAdmin}, []byte("h3")))
	if n := must(h.Store.TokensPrune(ctx, time.Now().Add(-time.Hour))); n != 0 {
		t.Fatalf("pruned %d tokens revoked just now", n)
	}
	if n := must(h.Store.TokensPrune(ctx, time.Now().Add(time.Hour))); n != 1 {
		t.Fatalf("pruned %d tokens, want the revoked one", n)
	}
	if l := must(h.Store.APITokenList(ctx, &store.ListParams{})); len(l) != 1 || l[0].ID != "tok3" {
		t.Fatalf("tokens after prune = %+v", l)
	}
	check(t, h.Store.SecretPut(ctx, &store.Secret{Name: "bmc/node_a", NodeID: "node_a", Sealed: []byte{1}}))
	check(t, h.Store.SecretPut(ctx, &store.Secret{Name: "bmc/node_a", NodeID: "node_a", Sealed: []byte{2}}))
	if s := must(h.Store.SecretGet(ctx, "bmc/node_a")); !slices.Equal(s.Sealed, []byte{2}) {
		t.Fatalf("secret = %+v", s)
	}
	check(t, h.Store.SecretDelete(ctx, "bmc/node_a"))
	_, err = h.Store.SecretGet(ctx, "bmc/node_a")
	wantErr(t, err, store.ErrNotFound)
}

func testCommandSweep(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	for _, id := range []string{"node_gone", "node_live"} {
		addNode(ctx, t, h, pool, id)
	}
	now := time.Now().UTC()
	at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	// node_live has a session; node_gone had one and lost it a minute ago.
	mustOpen(t, h, ctx, "node_live", "s-live", "gw1")
	s, _, err := h.Store.SessionOpen(ctx, &store.SessionOpenParams{NodeID: "node_gone", SessionID: "s-gone", GatewayID: "gw1", Now: at(-time.Minute)})
	check(t, err)
	check(t, h.Store.SessionClose(ctx, "node_gone", s.SessionID))
	enqueue := func(node, key string, timeout time.Duration) *store.Command {
		c := must(h.Store.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{node}, Kind: "exec", SessionSpec: []byte(`{}`), IdempotencyKey: key, Timeout: timeout}))[0]
		must(h.Store.CommandSetState(ctx, &store.CommandSetStateParams{ID: c.ID, State: store.CommandRunning, GatewayID: "gw1"}))
		return c
	}
	lost := enqueue("node_gone", "", time.Hour)
	requeued := enqueue("node_gone", "retry-me", time.Hour)
	alive := enqueue("node_live", "", time.Hour)
	overdue := enqueue("node_live", "", time.Second)
	queuedOverdue := must(h.Store.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_live"}, Kind: "exec", SessionSpec: []byte(`{}`), Timeout: time.Second}))[0]

	res := must(h.Store.CommandSweep(ctx, &store.CommandSweepParams{LostAfter: 30 * time.Second, Now: at(5 * time.Second)}))
	if got := ids(res.Expired); !slices.Equal(got, ids([]*store.Command{overdue, queuedOverdue})) {
		t.Fatalf("expired %v", got)
	}
	if len(res.Lost) != 1 || res.Lost[0].ID != lost.ID || res.Lost[0].State != store.CommandLost {
		t.Fatalf("lost %+v", res.Lost)
	}
	if len(res.Requeued) != 1 || res.Requeued[0].ID != requeued.ID || res.Requeued[0].State != store.CommandQueued {
		t.Fatalf("requeued %+v", res.Requeued)
	}
	if c := must(h.Store.CommandGet(ctx, alive.ID)); c.State != store.CommandRunning {
		t.Fatalf("command of a live node swept: %+v", c)
	}
	// A second sweep finds nothing more: every command reached one state.
	again := must(h.Store.CommandSweep(ctx, &store.CommandSweepParams{LostAfter: 30 * time.Second, Now: at(6 * time.Second)}))
	if len(again.Expired)+len(again.Lost)+len(again.Requeued) != 0 {
		t.Fatalf("second sweep changed %+v", again)
	}
}

func testNodeLiveness(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	now := time.Now().UTC()
	at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	n := addNode(ctx, t, h, pool, "node_live")
	if n.Shard != store.ShardOf("node_live") {
		t.Fatalf("shard = %d, want %d", n.Shard, store.ShardOf("node_live"))
	}
	_, _, err := h.Store.SessionOpen(ctx, &store.SessionOpenParams{NodeID: "node_live", SessionID: "s1", GatewayID: "gw", Now: at(0)})
	check(t, err)
	check(t, h.Store.NodeSetState(ctx, "node_live", store.NodeReady))
	p := &store.NodeLivenessParams{Shard: n.Shard, StaleAfter: 30 * time.Second, Now: at(10 * time.Second)}
	all := make([]int, store.Shards)
	for i := range all {
		all[i] = i
	}
	// due checks the shards NodeLivenessDue names at p.Now, of all of
	// them: none, or the node's.
	due := func(p *store.NodeLivenessParams, want bool) {
		t.Helper()
		var shards []int
		if want {
			shards = []int{n.Shard}
		}
		q := &store.NodeLivenessDueParams{Shards: all, StaleAfter: p.StaleAfter, Now: p.Now}
		if got := must(h.Store.NodeLivenessDue(ctx, q)); !slices.Equal(got, shards) {
			t.Fatalf("NodeLivenessDue(now %v) = %v, want %v", p.Now, got, shards)
		}
	}
	due(p, false)
	if u, r := mustPair(h.Store.NodeLivenessReconcile(ctx, p)); len(u)+len(r) != 0 {
		t.Fatalf("fresh node changed: %v %v", u, r)
	}
	// Another shard's reconcile leaves it alone.
	other := *p
	other.Shard, other.Now = (n.Shard+1)%store.Shards, at(time.Hour)
	if u, _ := mustPair(h.Store.NodeLivenessReconcile(ctx, &other)); len(u) != 0 {
		t.Fatalf("shard %d reconciled a node of shard %d", other.Shard, n.Shard)
	}
	due(&other, true)
	// Only the shards asked about are looked at.
	others := slices.DeleteFunc(slices.Clone(all), func(s int) bool { return s == n.Shard })
	if got := must(h.Store.NodeLivenessDue(ctx, &store.NodeLivenessDueParams{Shards: others, StaleAfter: p.StaleAfter, Now: other.Now})); len(got) != 0 {
		t.Fatalf("NodeLivenessDue without shard %d = %v, want none", n.Shard, got)
	}
	if got := must(h.Store.NodeLivenessDue(ctx, &store.NodeLivenessDueParams{StaleAfter: p.StaleAfter, Now: other.Now})); len(got) != 0 {
		t.Fatalf("NodeLivenessDue of no shards = %v, want none", got)
	}
	p.Now = at(31 * time.Second)
	due(p, true)
	if u, _ := mustPair(h.Store.NodeLivenessReconcile(ctx, p)); !slices.Equal(u, []string{"node_live"}) {
		t.Fatalf("silent node not unreachable: %v", u)
	}
	if got := must(h.Store.NodeGet(ctx, "node_live")); got.State != store.NodeUnreachable {
		t.Fatalf("state = %s", got.State)
	}
	due(p, false)
	must(h.Store.SessionHeartbeatBatch(ctx, "gw", []string{"s1"}, at(40*time.Second)))
	p.Now = at(41 * time.Second)
	due(p, true)
	if _, r := mustPair(h.Store.NodeLivenessReconcile(ctx, p)); !slices.Equal(r, []string{"node_live"}) {
		t.Fatalf("node back not ready: %v", r)
	}
	due(p, false)

	// Silent nodes in several shards, some never connected (their join
	// time counts): each shard is named once, in ascending order.
	quiet := []string{"node_live"}
	for i := range 12 {
		id := fmt.Sprintf("node_quiet%02d", i)
		addNode(ctx, t, h, pool, id)
		check(t, h.Store.NodeSetState(ctx, id, store.NodeReady))
		quiet = append(quiet, id)
	}
	var want []int
	for _, id := range quiet {
		want = append(want, store.ShardOf(id))
	}
	slices.Sort(want)
	want = slices.Compact(want)
	later := &store.NodeLivenessDueParams{Shards: all, StaleAfter: 30 * time.Second, Now: at(time.Hour)}
	if got := must(h.Store.NodeLivenessDue(ctx, later)); !slices.Equal(got, want) {
		t.Fatalf("NodeLivenessDue an hour on = %v, want %v", got, want)
	}
	later.Shards = want[1:]
	if got := must(h.Store.NodeLivenessDue(ctx, later)); !slices.Equal(got, want[1:]) {
		t.Fatalf("NodeLivenessDue of shards %v = %v, want them all", want[1:], got)
	}
}

// testNodeLivenessDrained: a node whose gateway drained it (SessionDrain)
// counts as heard from until it is due back, and is unreachable only once
// that time is StaleAfter old; a node of another gateway is not marked
// (issue 29: a gateway restart opened silent-node cases).
func testNodeLivenessDrained(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	const stale, within = 30 * time.Second, 60 * time.Second
	now := time.Now().UTC()
	at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
	for _, id := range []string{"node_drained", "node_elsewhere"} {
		addNode(ctx, t, h, pool, id)
		gw := "gw_draining"
		if id == "node_elsewhere" {
			gw = "gw_staying"
		}
		_, _, err := h.Store.SessionOpen(ctx, &store.SessionOpenParams{NodeID: id, SessionID: "s_" + id, GatewayID: gw, Now: at(0)})
		check(t, err)
		check(t, h.Store.NodeSetState(ctx, id, store.NodeReady))
	}
	if n := must(h.Store.SessionDrain(ctx, &store.SessionDrainParams{GatewayID: "gw_draining", Within: within, Now: at(0)})); n != 1 {
		t.Fatalf("SessionDrain marked %d nodes, want 1", n)
	}
	check(t, h.Store.SessionClose(ctx, "node_drained", "s_node_drained"))
	// unreachable reconciles id's shard at now and returns who moved.
	unreachable := func(id string, now time.Duration) []string {
		t.Helper()
		u, _ := mustPair(h.Store.NodeLivenessReconcile(ctx, &store.NodeLivenessParams{
			Shard: store.ShardOf(id), StaleAfter: stale, Now: at(now)}))
		return slices.DeleteFunc(u, func(s string) bool { return s != id })
	}
	// Past StaleAfter, inside the delay: the other gateway's node is
	// silent, the drained one is not.
	if u := unreachable("node_elsewhere", 31*time.Second); !slices.Equal(u, []string{"node_elsewhere"}) {
		t.Fatalf("undrained silent node: unreachable %v", u)
	}
	due := must(h.Store.NodeLivenessDue(ctx, &store.NodeLivenessDueParams{
		Shards: []int{store.ShardOf("node_drained")}, StaleAfter: stale, Now: at(within + stale - time.Second)}))
	if len(due) != 0 {
		t.Fatalf("drained node due within its delay plus StaleAfter: %v", due)
	}
	if u := unreachable("node_drained", within+stale-time.Second); len(u) != 0 {
		t.Fatalf("drained node unreachable within its delay plus StaleAfter: %v", u)
	}
	// Not back by its delay plus StaleAfter: silent.
	if u := unreachable("node_drained", within+stale+time.Second); !slices.Equal(u, []string{"node_drained"}) {
		t.Fatalf("drained node not back: unreachable %v", u)
	}
}

// testNodeLivenessPoweredOff: a node its BMC reported off stays
// powered-off (never unreachable) while silent, is not brought back by the
// heartbeat the report itself left within the grace, and is ready again once
// it heartbeats after the grace (issue 15: "bmc on" after "bmc off" left a
// heartbeating node powered-off until it reconnected).
func testNodeLivenessPoweredOff(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	const grace, stale = 10 * time.Second, 30 * time.Second
	off := func(id, session string) time.Time {
		t.Helper()
		n := addNode(ctx, t, h, pool, id)
		past := time.Now().Add(-time.Minute)
		_, _, err := h.Store.SessionOpen(ctx, &store.SessionOpenParams{NodeID: id, SessionID: session, GatewayID: "gw", Now: &past})
		check(t, err)
		check(t, h.Store.NodeSetState(ctx, id, store.NodeReady))
		check(t, h.Store.NodeSetState(ctx, id, store.NodePoweredOff))
		if n = must(h.Store.NodeGet(ctx, id)); n.State != store.NodePoweredOff {
			t.Fatalf("state of %s = %s, want %s", id, n.State, store.NodePoweredOff)
		}
		return n.UpdatedAt // when it was marked off
	}
	base := off("node_off", "s1")
	shard := store.ShardOf("node_off")
	at := func(d time.Duration) *time.Time { v := base.Add(d); return &v }
	pass := func(now time.Duration, wantReady bool) {
		t.Helper()
		p := &store.NodeLivenessParams{Shard: shard, StaleAfter: stale, PoweredOffGrace: grace, Now: at(now)}
		due := must(h.Store.NodeLivenessDue(ctx, &store.NodeLivenessDueParams{
			Shards: []int{shard}, StaleAfter: stale, PoweredOffGrace: grace, Now: at(now)}))
		if got := len(due) == 1; got != wantReady {
			t.Fatalf("NodeLivenessDue at +%s = %v, want due %v", now, due, wantReady)
		}
		u, r := mustPair(h.Store.NodeLivenessReconcile(ctx, p))
		var want []string
		if wantReady {
			want = []string{"node_off"}
		}
		if len(u) != 0 || !slices.Equal(r, want) {
			t.Fatalf("reconcile at +%s: unreachable %v, ready %v; want ready %v", now, u, r, want)
		}
	}
	// Silent: powered-off, however long, never unreachable.
	pass(time.Hour, false)
	// The report's own heartbeat, flushed a second later, does not count.
	must(h.Store.SessionHeartbeatBatch(ctx, "gw", []string{"s1"}, at(time.Second)))
	pass(2*time.Second, false)
	if n := must(h.Store.NodeGet(ctx, "node_off")); n.State != store.NodePoweredOff {
		t.Fatalf("state after the report's heartbeat = %s, want %s", n.State, store.NodePoweredOff)
	}
	// A heartbeat after the grace does.
	must(h.Store.SessionHeartbeatBatch(ctx, "gw", []string{"s1"}, at(grace+2*time.Second)))
	pass(grace+3*time.Second, true)
	if n := must(h.Store.NodeGet(ctx, "node_off")); n.State != store.NodeReady {
		t.Fatalf("state after a heartbeat past the grace = %s, want %s", n.State, store.NodeReady)
	}
	pass(grace+4*time.Second, false)

	// Heard from after the grace but not since StaleAfter: it stays
	// powered-off rather than ready for one pass.
	base2 := off("node_off_quiet", "s2")
	later := base2.Add(grace + time.Second)
	must(h.Store.SessionHeartbeatBatch(ctx, "gw", []string{"s2"}, &later))
	now := later.Add(stale + time.Second)
	p := &store.NodeLivenessParams{Shard: store.ShardOf("node_off_quiet"), StaleAfter: stale, PoweredOffGrace: grace, Now: &now}
	if u, r := mustPair(h.Store.NodeLivenessReconcile(ctx, p)); slices.Contains(r, "node_off_quiet") || slices.Contains(u, "node_off_quiet") {
		t.Fatalf("stale powered-off node moved: unreachable %v, ready %v", u, r)
	}
}

// testNodeLivenessBesideSessionCloses runs a liveness pass over a shard
// while another transaction closes every session of it in node id order, as
// a gateway's flush does when a rack drops: neither may fail (on
// PostgreSQL, a deadlock aborts one of them).
func testNodeLivenessBesideSessionCloses(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	const shard, n = 17, 40
	var rack []string
	for i := 0; len(rack) < n; i++ {
		if id := fmt.Sprintf("node_rack%05d", i); store.ShardOf(id) == shard {
			rack = append(rack, id)
		}
	}
	// Inserted out of id order, so the table's order is not the ids'.
	for _, i := range rand.Perm(n) {
		addNode(ctx, t, h, pool, rack[i])
	}
	past := time.Now().Add(-time.Hour)
	for round := range 30 {
		sessions := make([]string, n)
		for i, id := range rack {
			check(t, h.Store.NodeSetState(ctx, id, store.NodeReady))
			sessions[i] = fmt.Sprintf("s%d-%d", round, i)
			if _, _, err := h.Store.SessionOpen(ctx, &store.SessionOpenParams{NodeID: id, SessionID: sessions[i], GatewayID: "gw", Now: &past}); err != nil {
				t.Fatal(err)
			}
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		var closeErr, passErr error
		wg.Go(func() {
			<-start
			closeErr = h.Store.Tx(ctx, func(tx store.Store) error {
				for i, id := range rack {
					if err := tx.SessionClose(ctx, id, sessions[i]); err != nil {
						return err
					}
				}
				return nil
			})
		})
		wg.Go(func() {
			<-start
			passErr = h.Store.Tx(ctx, func(tx store.Store) error {
				_, _, err := tx.NodeLivenessReconcile(ctx, &store.NodeLivenessParams{Shard: shard, StaleAfter: 30 * time.Second})
				return err
			})
		})
		close(start)
		wg.Wait()
		if closeErr != nil || passErr != nil {
			t.Fatalf("round %d: closing sessions: %v; liveness pass: %v", round, closeErr, passErr)
		}
	}
}

func mustPair(a, b []string, err error) ([]string, []string) {
	if err != nil {
		panic(mustError{err})
	}
	return a, b
}

func testCommandClaim(ctx context.Context, t *testing.T, h *Harness) {
	pool := fixture(ctx, t, h)
	for _, id := range []string{"node_a", "node_b", "node_c"} {
		addNode(ctx, t, h, pool, id)
	}
	mustOpen(t, h, ctx, "node_a", "sa", "gw1")
	mustOpen(t, h, ctx, "node_b", "sb", "gw2")
	cmds := must(h.Store.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_a", "node_b", "node_c"}, Kind: "exec", SessionSpec: []byte(`{}`), Timeout: time.Minute}))
	got := must(h.Store.CommandClaim(ctx, &store.CommandClaimParams{GatewayID: "gw1", Limit: 10}))
	if len(got) != 1 || got[0].NodeID != "node_a" || got[0].State != store.CommandDispatched || got[0].GatewayID != "gw1" || got[0].Attempt != 1 {
		t.Fatalf("gw1 claimed %+v", got)
	}
	if again := must(h.Store.CommandClaim(ctx, &store.CommandClaimParams{GatewayID: "gw1", Limit: 10})); len(again) != 0 {
		t.Fatalf("claimed twice: %+v", again)
	}
	// Concurrent claimers on gw2 get node_b's command exactly once.
	var wg sync.WaitGroup
	var mu sync.Mutex
	claimed := 0
	for range 4 {
		wg.Go(func() {
			c, err := h.Store.CommandClaim(ctx, &store.CommandClaimParams{GatewayID: "gw2", Limit: 10})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			claimed += len(c)
			mu.Unlock()
		})
	}
	wg.Wait()
	if claimed != 1 {
		t.Fatalf("4 concurrent claimers got %d commands, want 1", claimed)
	}
	// node_c has no session: its command waits.
	if c := must(h.Store.CommandGet(ctx, cmds[2].ID)); c.State != store.CommandQueued {
		t.Fatalf("command without a session = %s", c.State)
	}
	if inflight := must(h.Store.CommandInFlight(ctx, "node_a")); len(inflight) != 1 {
		t.Fatalf("in flight on node_a = %d", len(inflight))
	}
	must(h.Store.CommandRequestCancel(ctx, got[0].ID))
	if cancels := must(h.Store.CommandCancelsPending(ctx, "gw1")); len(cancels) != 1 || cancels[0].ID != got[0].ID {
		t.Fatalf("cancels = %+v", cancels)
	}
}
