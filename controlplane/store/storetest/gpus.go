package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

// testGPUPlacements: a GPU's stays (migration 0022) follow its UUID from
// node to node in the order they began; a UUID current in a node without a
// session moves; one current in a live node is a conflict marked on both
// stays and written as gpu.uuid-conflict for both nodes; a GPU no longer
// listed ends its stay; the list filters by pool, model and health, and
// pages; an unknown UUID is ErrNotFound.
func testGPUPlacements(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	pool := fixture(ctx, t, h)
	other := fixture(ctx, t, h)
	addNode(ctx, t, h, pool, "node_gp1")
	addNode(ctx, t, h, pool, "node_gp2")
	addNode(ctx, t, h, other, "node_gp3")
	if _, err := st.GPUPlacements(ctx, "GPU-none"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown GPU: %v, want ErrNotFound", err)
	}
	if err := st.GPUPlacementsSet(ctx, &store.GPUPlacementsSetParams{NodeID: "node_gpX"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown node: %v, want ErrNotFound", err)
	}
	t0 := time.Now().UTC().Truncate(time.Microsecond)
	at := func(d time.Duration) *time.Time { v := t0.Add(d); return &v }
	a100 := "NVIDIA A100-SXM4-40GB"
	set := func(node string, now *time.Time, gpus ...store.GPUSeen) {
		t.Helper()
		check(t, st.GPUPlacementsSet(ctx, &store.GPUPlacementsSetParams{NodeID: node, GPUs: gpus, Now: now}))
	}
	set("node_gp1", at(0), store.GPUSeen{UUID: "GPU-m", Serial: "S1", Model: a100, Health: store.GPUHealthOK},
		store.GPUSeen{UUID: "GPU-k", Model: a100, Health: store.GPUHealthFailed})
	set("node_gp1", at(time.Minute), store.GPUSeen{UUID: "GPU-m", Serial: "S1", Model: a100, Health: store.GPUHealthDegraded},
		store.GPUSeen{UUID: "GPU-k", Model: a100, Health: store.GPUHealthFailed})
	ps := must(st.GPUPlacements(ctx, "GPU-m"))
	if len(ps) != 1 || !ps[0].Current || ps[0].NodeID != "node_gp1" || ps[0].Hostname != "node_gp1.example" ||
		ps[0].PoolID != pool.ID || ps[0].BoardSerial != "S1" || ps[0].Health != store.GPUHealthDegraded ||
		!ps[0].FirstSeen.Equal(t0) || !ps[0].LastSeen.Equal(t0.Add(time.Minute)) {
		t.Fatalf("one stay = %+v", ps)
	}
	// node_gp1 is offline (no session): GPU-m shows up in node_gp2, moved.
	set("node_gp2", at(2*time.Minute), store.GPUSeen{UUID: "GPU-m", Serial: "S1", Model: a100, Health: store.GPUHealthOK})
	ps = must(st.GPUPlacements(ctx, "GPU-m"))
	if len(ps) != 2 || ps[0].NodeID != "node_gp1" || ps[0].Current || ps[1].NodeID != "node_gp2" || !ps[1].Current ||
		ps[1].Conflict != "" || ps[0].Conflict != "" || !ps[1].FirstSeen.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("moved: stays = %+v", ps)
	}
	// node_gp1's next inventory lists GPU-k only: GPU-m stays ended there.
	set("node_gp1", at(3*time.Minute), store.GPUSeen{UUID: "GPU-k", Model: a100, Health: store.GPUHealthFailed})
	if ps = must(st.GPUPlacements(ctx, "GPU-m")); len(ps) != 2 || ps[0].Current || !ps[1].Current {
		t.Fatalf("after the old node's inventory: %+v", ps)
	}

	// Two live nodes list GPU-k: a conflict on both, never merged.
	for i, n := range []string{"node_gp1", "node_gp3"} {
		if _, _, err := st.SessionOpen(ctx, &store.SessionOpenParams{NodeID: n, SessionID: "sess_gp" + string(rune('a'+i)),
			GatewayID: "gw_gp"}); err != nil {
			t.Fatal(err)
		}
	}
	set("node_gp3", at(4*time.Minute), store.GPUSeen{UUID: "GPU-k", Model: a100, Health: store.GPUHealthOK},
		store.GPUSeen{UUID: "GPU-z", Model: "NVIDIA H100 80GB HBM3", Health: store.GPUHealthOK})
	ps = must(st.GPUPlacements(ctx, "GPU-k"))
	if len(ps) != 2 || !ps[0].Current || !ps[1].Current || ps[0].Conflict != "node_gp3" || ps[1].Conflict != "node_gp1" {
		t.Fatalf("conflict: stays = %+v", ps)
	}
	subjects := map[string]string{}
	for _, n := range []string{"node_gp1", "node_gp3"} {
		es := must(st.OutboxQuery(ctx, &store.OutboxQueryParams{Key: n, TopicPrefix: events.GPUUUIDConflict, Limit: 10}))
		if len(es) != 1 {
			t.Fatalf("conflict events of %s = %d, want 1", n, len(es))
		}
		var env struct {
			Data events.GPUUUIDConflictData `json:"data"`
		}
		check(t, json.Unmarshal(es[0].Payload, &env))
		if d := env.Data; d.GPUUUID != "GPU-k" || d.NodeID != n || d.OtherHostname == "" {
			t.Fatalf("conflict event of %s: %+v", n, d)
		}
		subjects[n] = env.Data.OtherNodeID
	}
	if subjects["node_gp1"] != "node_gp3" || subjects["node_gp3"] != "node_gp1" {
		t.Fatalf("conflict events name %v", subjects)
	}

	list := func(p store.GPUListParams) []string {
		t.Helper()
		var out []string
		for _, g := range must(st.GPUList(ctx, &p)) {
			out = append(out, g.GPUUUID+"@"+g.NodeID)
		}
		return out
	}
	eq := func(got []string, want ...string) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("list = %v, want %v", got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("list = %v, want %v", got, want)
			}
		}
	}
	eq(list(store.GPUListParams{PoolID: pool.ID}), "GPU-k@node_gp1", "GPU-m@node_gp2")
	eq(list(store.GPUListParams{Model: a100}), "GPU-k@node_gp1", "GPU-k@node_gp3", "GPU-m@node_gp2")
	eq(list(store.GPUListParams{Unhealthy: true}), "GPU-k@node_gp1", "GPU-k@node_gp3")
	eq(list(store.GPUListParams{PoolID: other.ID, Unhealthy: true}), "GPU-k@node_gp3")
	eq(list(store.GPUListParams{Limit: 2}), "GPU-k@node_gp1", "GPU-k@node_gp3")
	eq(list(store.GPUListParams{After: "GPU-k", AfterNode: "node_gp1", Limit: 2}), "GPU-k@node_gp3", "GPU-m@node_gp2")

	// The conflict ends with node_gp3's stay: node_gp1's mark clears.
	set("node_gp3", at(5*time.Minute), store.GPUSeen{UUID: "GPU-z", Model: "NVIDIA H100 80GB HBM3", Health: store.GPUHealthOK})
	ps = must(st.GPUPlacements(ctx, "GPU-k"))
	if len(ps) != 2 || !ps[0].Current || ps[0].Conflict != "" || ps[1].Current || ps[1].Conflict != "node_gp1" {
		t.Fatalf("conflict ended: stays = %+v", ps)
	}
	eq(list(store.GPUListParams{Unhealthy: true}), "GPU-k@node_gp1") // failed still

	// Incidents by model: cases naming a GPU, by its model on the case's
	// node; the excluded finding (an operator's repair) and cases of no
	// GPU left out.
	for _, c := range []*store.Remediation{
		{NodeID: "node_gp1", Finding: "xid", GPUUUID: "GPU-m"},
		{NodeID: "node_gp2", Finding: "xid", GPUUUID: "GPU-m"},
		{NodeID: "node_gp3", Finding: "xid", GPUUUID: "GPU-z"},
		{NodeID: "node_gp3", Finding: "operator", GPUUUID: "GPU-z"},
		{NodeID: "node_gp3", Finding: "unresponsive"},
	} {
		c.State, c.Action, c.CreatedAt = store.RemediationDetected, "escalate", t0
		c = must(st.RemediationCreate(ctx, c, "remediation:w1"))
		must(st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationReturned, Actor: "w"}))
	}
	byModel := map[string]int{}
	for _, c := range must(st.GPUIncidentsByModel(ctx, "operator")) {
		byModel[c.Model] = c.Count
	}
	if len(byModel) != 2 || byModel[a100] != 2 || byModel["NVIDIA H100 80GB HBM3"] != 1 {
		t.Fatalf("incidents by model = %v, want 2 %s and 1 H100", byModel, a100)
	}

	// Service by model: GPU-z has one current stay on node_gp3 since
	// 4 min, so 6 min at 10 min; the A100s (GPU-k, GPU-m) have some.
	service := map[string]*store.GPUModelService{}
	for _, m := range must(st.GPUServiceByModel(ctx, *at(10 * time.Minute))) {
		service[m.Model] = m
	}
	if h := service["NVIDIA H100 80GB HBM3"]; len(service) != 2 || h == nil || h.GPUs != 1 || h.Seconds != 360 {
		t.Fatalf("service by model: H100 %+v of %d models, want 1 GPU for 360 s", h, len(service))
	}
	if a := service[a100]; a == nil || a.GPUs != 2 || a.Seconds <= 0 {
		t.Fatalf("service by model: A100 %+v, want 2 GPUs seen for some time", a)
	}
}

// produceGPUConflictEvents writes gpu.uuid-conflict: two nodes with a
// session open list the same GPU UUID.
func produceGPUConflictEvents(ctx context.Context, t *testing.T, h *Harness, pool *store.Pool) {
	t.Helper()
	for _, n := range []string{"node_evg1", "node_evg2"} {
		addNode(ctx, t, h, pool, n)
		if _, _, err := h.Store.SessionOpen(ctx, &store.SessionOpenParams{NodeID: n, SessionID: "sess_" + n, GatewayID: "gw_evg"}); err != nil {
			t.Fatal(err)
		}
		check(t, h.Store.GPUPlacementsSet(ctx, &store.GPUPlacementsSetParams{NodeID: n, GPUs: []store.GPUSeen{{UUID: "GPU-evg"}}}))
	}
}
