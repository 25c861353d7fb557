package drift_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/controlplane/reconcilers/drift"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TestPoolVersion: the version the most name; a tie names none; empty
// versions are not counted.
func TestPoolVersion(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		vs   []string
		want string
		n    int
		ok   bool
	}{
		{[]string{"550", "550", "535"}, "550", 2, true},
		{[]string{"535", "550", "560", "550"}, "550", 2, true},
		{[]string{"535", "550"}, "", 0, false},
		{[]string{"535", "535", "550", "550", "560"}, "", 0, false},
		{[]string{"", "", "550"}, "550", 1, true},
		{nil, "", 0, false},
	} {
		v, n, ok := drift.PoolVersion(c.vs)
		if v != c.want || n != c.n || ok != c.ok {
			t.Errorf("PoolVersion(%q) = %q, %d, %v; want %q, %d, %v", c.vs, v, n, ok, c.want, c.n, c.ok)
		}
	}
}

// TestDriftJudge: of three nodes one on another driver drifts, with the
// pool's version and counts; CUDA is judged on its own; a tie, a pool of
// one and a node without GPUs drift on nothing.
func TestDriftJudge(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	nodes := []drift.Node{{ID: "a", Driver: "550.54.15", CUDA: "12.4"}, {ID: "b", Driver: "550.54.15", CUDA: "12.4"},
		{ID: "c", Driver: "535.104.05", CUDA: "12.2"}, {ID: "d"}}
	got := drift.Judge(nodes, now)
	if len(got) != 1 || got["c"] == nil {
		t.Fatalf("Judge = %v, want only c", got)
	}
	f := got["c"]
	s := f.GetDrift()
	if s.GetDriverVersion() != "535.104.05" || s.GetPoolDriverVersion() != "550.54.15" || s.GetCudaVersion() != "12.2" ||
		s.GetPoolCudaVersion() != "12.4" || s.GetPoolNodes() != 3 || s.GetMatchingNodes() != 2 {
		t.Errorf("signal = %v", s)
	}
	if f.GetResolution() != drift.Resolution || f.GetGpuUuid() != "" || gpufinding.Kind(f) != gpufinding.KindDrift ||
		gpufinding.Check(f) != nil || !f.GetObservedAt().AsTime().Equal(now) {
		t.Errorf("finding = %v", f)
	}
	if got := drift.Summary(s); got != "driver 535.104.05 (pool 550.54.15), cuda 12.2 (pool 12.4)" {
		t.Errorf("Summary = %q", got)
	}
	// The same driver, another CUDA: only CUDA drifts.
	nodes[2] = drift.Node{ID: "c", Driver: "550.54.15", CUDA: "12.2"}
	if s := drift.Judge(nodes, now)["c"].GetDrift(); s.GetDriverVersion() != "" || s.GetCudaVersion() != "12.2" {
		t.Errorf("CUDA only: %v", s)
	}
	if got := drift.Judge(nodes[:1], now); len(got) != 0 {
		t.Errorf("a pool of one: %v", got)
	}
	tie := []drift.Node{{ID: "a", Driver: "550", CUDA: "12.4"}, {ID: "b", Driver: "535", CUDA: "12.4"}}
	if got := drift.Judge(tie, now); len(got) != 0 {
		t.Errorf("a tie: %v", got)
	}
}

// TestDriftRound: a round over a real (SQLite) store writes one gpu.drift
// finding and the label on the drifting node, nothing on the others, and
// nothing more on the next round while it drifts; once the node reports
// the pool's version the label goes and a node.drift-ended event is
// written. A lost fence writes nothing.
func TestDriftRound(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
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
	setDriver := func(id, driver string) {
		t.Helper()
		inv := &sessionv1.Inventory{Digest: id + driver, Gpus: []*sessionv1.GPU{{Uuid: "GPU-" + id, DriverVersion: driver, CudaDriverVersion: "12.4"}}}
		b, err := protojson.Marshal(inv)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.NodeSetInventory(ctx, id, b, inv.GetDigest()); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"node_a", "node_b", "node_c"} {
		if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: id}); err != nil {
			t.Fatal(err)
		}
		setDriver(id, "550.54.15")
	}
	setDriver("node_c", "535.104.05")
	l, ok, err := st.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: drift.LeaseName, Holder: "w", TTL: time.Hour})
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	fence := store.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch}
	log := slog.New(slog.DiscardHandler)
	counted := &countMetrics{}
	kinds := func(id string) map[string]int {
		t.Helper()
		es, err := st.EventList(ctx, &store.EventListParams{NodeID: id, Limit: store.MaxListLimit})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, e := range es {
			out[e.Kind]++
		}
		return out
	}
	label := func(id string) string {
		t.Helper()
		n, err := st.NodeGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return n.Labels[drift.Label]
	}
	now := time.Now()
	job := drift.NewJob(st, counted, log)
	for range 2 {
		got, err := job.Round(ctx, fence, now)
		if err != nil {
			t.Fatal(err)
		}
		if len(got[pool.ID]) != 1 || got[pool.ID][0] != "node_c" || counted.last[pool.ID] != 1 {
			t.Fatalf("drifting = %v, counted %v", got, counted.last)
		}
	}
	if k := kinds("node_c"); k[gpufinding.KindDrift] != 1 {
		t.Errorf("node_c events = %v, want one gpu.drift over two rounds", k)
	}
	if l := label("node_c"); l != "driver 535.104.05 (pool 550.54.15)" {
		t.Errorf("node_c label = %q", l)
	}
	for _, id := range []string{"node_a", "node_b"} {
		if k := kinds(id); k[gpufinding.KindDrift] != 0 || label(id) != "" {
			t.Errorf("%s: events %v label %q", id, k, label(id))
		}
	}
	fs, err := st.RemediationFindingsTake(ctx, store.ShardOf("node_c"), store.MaxListLimit)
	if err != nil || len(fs) != 1 || fs[0].GPUFinding.GetDrift().GetPoolDriverVersion() != "550.54.15" {
		t.Errorf("remediation inbox = %v, %v", fs, err)
	}

	setDriver("node_c", "550.54.15")
	if _, err := job.Round(ctx, store.Fence{Lease: l.Name, Holder: "other", Epoch: l.Epoch}, now); err == nil {
		t.Errorf("a lost fence: want an error")
	}
	if label("node_c") == "" {
		t.Errorf("a lost fence removed the label")
	}
	if got, err := job.Round(ctx, fence, now); err != nil || len(got[pool.ID]) != 0 || counted.last[pool.ID] != 0 {
		t.Fatalf("matched again: %v, %v, counted %v", got, err, counted.last)
	}
	if k := kinds("node_c"); k[drift.KindEnded] != 1 || label("node_c") != "" {
		t.Errorf("ended: events %v, label %q", k, label("node_c"))
	}
}

type countMetrics struct{ last map[string]int }

func (m *countMetrics) NodesDrifting(c map[string]int) { m.last = c }
