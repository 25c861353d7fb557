package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/healthgate"
	"github.com/better-compute/better-compute/controlplane/store"
)

// testRollouts walks a rollout's rows: create (one pending row per node of
// the pool, the node's version kept), one open rollout per pool, waves
// (previous versions recorded), node steps with their commands and the
// live view (session, command states), operator moves guarded by From,
// listing and the active set.
func testRollouts(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	pool := fixture(ctx, t, h)
	for i := range 4 {
		id := fmt.Sprintf("node_ro%d", i)
		must(st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: id + ".example", MachineID: "m-" + id, BCDVersion: "0.1.0"}))
	}
	if _, err := st.RolloutCreate(ctx, &store.RolloutCreateParams{PoolID: "pool_none", Version: "0.2.0", Canary: 1, Wave: "1",
		MaxUnavailable: "1", Timeout: time.Minute}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("rollout of an unknown pool: %v, want ErrNotFound", err)
	}
	ro := must(st.RolloutCreate(ctx, &store.RolloutCreateParams{PoolID: pool.ID, Version: "0.2.0", BaseURL: "https://x/api/downloads",
		Canary: 1, Wave: "50%", MaxUnavailable: "2", Soak: 3 * time.Second, Timeout: time.Minute, Drain: true, CreatedBy: "token:t"}))
	if ro.State != store.RolloutPending || ro.Soak != 3*time.Second || ro.Timeout != time.Minute || !ro.Drain || ro.CurrentWave != 0 ||
		ro.Wave != "50%" || ro.Canary != 1 || ro.CreatedBy != "token:t" || ro.FinishedAt != nil {
		t.Fatalf("created rollout = %+v", ro)
	}
	if _, err := st.RolloutCreate(ctx, &store.RolloutCreateParams{PoolID: pool.ID, Version: "0.3.0", Canary: 1, Wave: "1",
		MaxUnavailable: "1", Timeout: time.Minute}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a second open rollout of the pool: %v, want ErrConflict", err)
	}
	nodes := must(st.RolloutNodes(ctx, ro.ID))
	if len(nodes) != 4 {
		t.Fatalf("rollout nodes = %d, want 4", len(nodes))
	}
	for _, n := range nodes {
		if n.State != store.RolloutNodePending || n.Wave != 0 || n.PreviousVersion != "0.1.0" || n.BCDVersion != "0.1.0" || n.Connected {
			t.Fatalf("new rollout node = %+v", n)
		}
	}
	if got := must(st.RolloutsActive(ctx)); !slices.ContainsFunc(got, func(r *store.Rollout) bool { return r.ID == ro.ID }) {
		t.Fatalf("active rollouts lack %s", ro.ID)
	}

	// The canary wave: node_ro0, now on 0.1.5.
	must(st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_ro0", PoolID: pool.ID, Hostname: "node_ro0.example", MachineID: "m-node_ro0", BCDVersion: "0.1.5"}))
	one := 1
	ro = must(st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: ro.ID, From: []string{store.RolloutPending}, State: store.RolloutRunning,
		Wave: &one, WaveNodes: []string{"node_ro0"}}))
	if ro.State != store.RolloutRunning || ro.CurrentWave != 1 {
		t.Fatalf("started rollout = %+v", ro)
	}
	cmd := must(st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_ro0"}, Kind: "upgrade",
		IdempotencyKey: "rollout:" + ro.ID + ":upgrade", Timeout: time.Minute}))[0]
	check(t, st.RolloutNodeUpdate(ctx, &store.RolloutNodeUpdateParams{RolloutID: ro.ID, NodeID: "node_ro0", State: store.RolloutNodeUpgrading,
		UpgradeCommandID: cmd.ID}))
	mustOpen(t, h, ctx, "node_ro0", "sess_ro0", "gw_ro")
	nodes = must(st.RolloutNodes(ctx, ro.ID))
	var n0 *store.RolloutNode
	for _, n := range nodes {
		if n.NodeID == "node_ro0" {
			n0 = n
		}
	}
	if n0 == nil || n0.Wave != 1 || n0.PreviousVersion != "0.1.5" || n0.State != store.RolloutNodeUpgrading || n0.UpgradeCommandID != cmd.ID ||
		n0.UpgradeState != store.CommandQueued || !n0.Connected || n0.Hostname != "node_ro0.example" || n0.RollbackState != "" {
		t.Fatalf("canary node = %+v", n0)
	}
	if nodes[len(nodes)-1].NodeID != "node_ro0" {
		t.Fatalf("rollout nodes not by wave: last is %s", nodes[len(nodes)-1].NodeID)
	}
	if err := st.RolloutNodeUpdate(ctx, &store.RolloutNodeUpdateParams{RolloutID: ro.ID, NodeID: "node_none", State: store.RolloutNodeFailed}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("update of a node not in the rollout: %v, want ErrNotFound", err)
	}

	// The watch (issue 30): a session opened without a resume cursor
	// counts a bcd start; the rollout node keeps what the reconciler saw.
	starts := n0.BCDStarts
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for i, fresh := range []bool{true, false} {
		if _, _, err := st.SessionOpen(ctx, &store.SessionOpenParams{NodeID: "node_ro0", SessionID: fmt.Sprintf("sess_ro0%d", i), GatewayID: "gw_ro",
			Fresh: fresh, Now: &t0}); err != nil {
			t.Fatal(err)
		}
	}
	check(t, st.RolloutNodeUpdate(ctx, &store.RolloutNodeUpdateParams{RolloutID: ro.ID, NodeID: "node_ro0", State: store.RolloutNodeSoaking,
		Watch: &store.RolloutNodeWatch{Starts: 7, SessionSince: &t0, Drops: 1}}))
	for _, n := range must(st.RolloutNodes(ctx, ro.ID)) {
		if n.NodeID == "node_ro0" && (n.BCDStarts != starts+1 || n.WatchStarts != 7 || n.Drops != 1 || n.SeenSessionSince == nil ||
			!n.SeenSessionSince.Equal(t0) || n.SessionSince == nil || !n.SessionSince.Equal(t0) || n.State != store.RolloutNodeSoaking) {
			t.Fatalf("watched node = %+v (bcd starts before %d)", n, starts)
		}
	}

	// The health gate (issue 30, item 3): soaking records the soak's
	// start; the session starts above are node events (a bcd start, then
	// a drop: the node was never drained); RolloutHealthCounts counts them,
	// GPU findings above info and commands finished in a window, the
	// rollout's own not counted.
	for _, n := range must(st.RolloutNodes(ctx, ro.ID)) {
		if n.NodeID == "node_ro0" && n.SoakStartedAt == nil {
			t.Fatalf("soaking node has no soak start: %+v", n)
		}
	}
	for _, e := range []*store.Event{
		{NodeID: "node_ro0", Kind: "gpu.xid", Severity: "warning", Message: "XID 13", Time: t0},
		{NodeID: "node_ro0", Kind: "gpu.xid", Severity: "info", Message: "XID 63", Time: t0},
		{NodeID: "node_ro0", Kind: "gpu.xid", Severity: "critical", Message: "XID 79", Time: t0.Add(-time.Hour)},
		{NodeID: "node_ro1", Kind: "gpu.xid", Severity: "critical", Message: "XID 79", Time: t0},
	} {
		must(st.EventInsert(ctx, e))
	}
	for i, by := range []string{"token:t", "token:t", "rollout:" + ro.ID} {
		c := must(st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_ro0"}, Kind: "exec", CreatedBy: by,
			IdempotencyKey: fmt.Sprintf("gate-%d", i), Timeout: time.Minute}))[0]
		state := store.CommandFailed
		if i == 1 {
			state = store.CommandSucceeded
		}
		must(st.CommandFinish(ctx, &store.CommandFinishParams{ID: c.ID, State: state, Now: &t0}))
	}
	// A reconnect a gateway's drain asked for is no drop.
	if _, err := st.SessionDrain(ctx, &store.SessionDrainParams{GatewayID: "gw_ro", Within: time.Minute, Now: &t0}); err != nil {
		t.Fatal(err)
	}
	back := t0.Add(10 * time.Second)
	if _, _, err := st.SessionOpen(ctx, &store.SessionOpenParams{NodeID: "node_ro0", SessionID: "sess_ro0d", GatewayID: "gw_ro", Now: &back}); err != nil {
		t.Fatal(err)
	}
	window := []store.HealthSpan{{NodeID: "node_ro0", From: t0.Add(-time.Minute), To: t0.Add(time.Minute)}}
	if c := must(st.RolloutHealthCounts(ctx, window, "rollout:"+ro.ID)); *c != (store.HealthCounts{Restarts: 1, Drops: 1, Findings: 1, Commands: 2, FailedCommands: 1}) {
		t.Fatalf("health counts = %+v, want 1 start, 1 drop, 1 finding, 1 of 2 commands failed", *c)
	}
	if c := must(st.RolloutHealthCounts(ctx, []store.HealthSpan{{NodeID: "node_ro0", From: t0.Add(time.Minute), To: t0.Add(time.Hour)}}, "")); *c != (store.HealthCounts{}) {
		t.Fatalf("health counts of a later window = %+v, want none", *c)
	}
	gate := &healthgate.Report{Wave: 1, Verdict: healthgate.Halt, Comparison: healthgate.ComparisonNotUpgraded, From: t0, To: t0.Add(time.Minute),
		UpgradedNodes: 1, ComparisonNodes: 3, Measures: []healthgate.Result{{Measure: healthgate.Measure{Name: "findings", Unit: "GPU-hour",
			Upgraded: healthgate.Group{Count: 9, Exposure: 0.1}}, Worse: true}}}
	ro = must(st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: ro.ID, Gate: gate}))
	if got := must(st.RolloutGet(ctx, ro.ID)); len(got.Gates) != 1 || got.Gates[0].Verdict != healthgate.Halt || got.Gates[0].Measures[0].Upgraded.Count != 9 ||
		!got.Gates[0].From.Equal(t0) {
		t.Fatalf("health gates read back = %+v", got.Gates)
	}

	// Operator moves: pause only from running, resume only from paused.
	// The bake's clock stops while paused.
	if _, err := st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: ro.ID, From: []string{store.RolloutPaused}, State: store.RolloutRunning}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("resume of a running rollout: %v, want ErrConflict", err)
	}
	ro = must(st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: ro.ID, StartBake: true, Now: &t0}))
	if !ro.Baking() || ro.BakeDone(t0.Add(5*time.Second)) != 5*time.Second {
		t.Fatalf("baking rollout = %+v", ro)
	}
	t1, t2 := t0.Add(10*time.Second), t0.Add(time.Minute)
	ro = must(st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: ro.ID, From: []string{store.RolloutRunning}, State: store.RolloutPaused, Actor: "token:t", Now: &t1}))
	if ro.BakeResumedAt != nil || ro.BakeElapsed != 10*time.Second || ro.BakeDone(t2) != 10*time.Second {
		t.Fatalf("paused bake = %+v", ro)
	}
	ro = must(st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: ro.ID, From: []string{store.RolloutPaused}, State: store.RolloutRunning, Now: &t2}))
	if ro.State != store.RolloutRunning || ro.BakeDone(t2.Add(5*time.Second)) != 15*time.Second {
		t.Fatalf("resumed rollout = %+v", ro)
	}
	if got := must(st.RolloutGet(ctx, ro.ID)); got.BakeStartedAt == nil || !got.BakeStartedAt.Equal(t0) || got.BakeDone(t2.Add(5*time.Second)) != 15*time.Second {
		t.Fatalf("bake read back = %+v", got)
	}
	ro = must(st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: ro.ID, State: store.RolloutAborted, Reason: "operator"}))
	if ro.FinishedAt == nil || ro.Reason != "operator" {
		t.Fatalf("aborted rollout = %+v", ro)
	}
	if got := must(st.RolloutsActive(ctx)); slices.ContainsFunc(got, func(r *store.Rollout) bool { return r.ID == ro.ID }) {
		t.Fatalf("an aborted rollout is active")
	}
	// The pool is free for another rollout; the list filters.
	ro2 := must(st.RolloutCreate(ctx, &store.RolloutCreateParams{PoolID: pool.ID, Version: "0.3.0", Canary: 2, Wave: "1",
		MaxUnavailable: "1", Timeout: time.Minute, RequireEvidence: true}))
	if !ro2.RequireEvidence || ro2.Gates != nil && len(ro2.Gates) != 0 {
		t.Fatalf("rollout created with --require-evidence = %+v", ro2)
	}
	all := must(st.RolloutList(ctx, &store.RolloutListParams{PoolID: pool.ID}))
	open := must(st.RolloutList(ctx, &store.RolloutListParams{PoolID: pool.ID, Active: true}))
	if len(all) != 2 || len(open) != 1 || open[0].ID != ro2.ID {
		t.Fatalf("rollouts of the pool: %d, open %v, want 2 and [%s]", len(all), open, ro2.ID)
	}
	if _, err := st.RolloutGet(ctx, "roll_none"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("get of an unknown rollout: %v", err)
	}
}

// produceRolloutEvents writes every rollout.* event type (testEvents reads
// them all back and checks their shapes): a rollout that starts, pauses,
// resumes, walks a node through every step, completes its waves, halts,
// completes, and others that abort and fail.
func produceRolloutEvents(ctx context.Context, t *testing.T, h *Harness, pool *store.Pool) {
	st := h.Store
	for _, id := range []string{"node_rev1", "node_rev2"} {
		must(st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: id + ".example", MachineID: "m-" + id, BCDVersion: "0.1.0"}))
	}
	create := func() *store.Rollout {
		return must(st.RolloutCreate(ctx, &store.RolloutCreateParams{PoolID: pool.ID, Version: "0.2.0", Canary: 1, Wave: "1",
			MaxUnavailable: "1", Timeout: time.Minute, CreatedBy: "token:t"}))
	}
	move := func(ro *store.Rollout, state string, wave int, nodes ...string) {
		p := &store.RolloutUpdateParams{ID: ro.ID, State: state}
		if wave >= 0 {
			p.Wave, p.WaveNodes = &wave, nodes
		}
		must(st.RolloutUpdate(ctx, p))
	}
	node := func(ro *store.Rollout, id, state string) {
		check(t, st.RolloutNodeUpdate(ctx, &store.RolloutNodeUpdateParams{RolloutID: ro.ID, NodeID: id, State: state, Reason: "step " + state}))
	}
	ro := create()
	move(ro, store.RolloutRunning, 1, "node_rev1")
	move(ro, store.RolloutPaused, -1)
	move(ro, store.RolloutRunning, -1)
	for _, s := range []string{store.RolloutNodeDraining, store.RolloutNodeUpgrading, store.RolloutNodeSoaking, store.RolloutNodeUpgraded,
		store.RolloutNodeFailed, store.RolloutNodeRollingBack, store.RolloutNodeRolledBack} {
		node(ro, "node_rev1", s)
	}
	move(ro, store.RolloutRunning, 2, "node_rev2")
	node(ro, "node_rev2", store.RolloutNodeSkipped)
	move(ro, store.RolloutRollingBack, -1)
	move(ro, store.RolloutHalted, -1)
	move(ro, store.RolloutCompleted, -1)
	move(create(), store.RolloutAborted, -1)
	move(create(), store.RolloutFailed, -1)

	// The canary's wave-started names its node; a node step its command
	// and versions.
	entries := must(st.OutboxQuery(ctx, &store.OutboxQueryParams{Key: ro.ID, Ascending: true}))
	var types []string
	for _, e := range entries {
		env, err := events.Parse(e.Payload)
		if err != nil {
			t.Fatalf("rollout event %d: %v", e.ID, err)
		}
		types = append(types, env.Type)
		if env.Type == events.RolloutWaveStarted {
			var d events.RolloutWaveData
			check(t, json.Unmarshal(env.Data, &d))
			if d.Wave == 1 && (!d.Canary || !slices.Equal(d.NodeIDs, []string{"node_rev1"})) {
				t.Errorf("canary wave-started = %+v", d)
			}
		}
		if env.Type == events.RolloutNodeUpgraded {
			var d events.RolloutNodeData
			check(t, json.Unmarshal(env.Data, &d))
			if d.NodeID != "node_rev1" || d.PreviousVersion != "0.1.0" || d.Version != "0.2.0" || d.Wave != 1 || d.State != store.RolloutNodeUpgraded {
				t.Errorf("node-upgraded = %+v", d)
			}
		}
	}
	want := []string{events.RolloutCreated, events.RolloutWaveStarted, events.RolloutStarted, events.RolloutPaused, events.RolloutResumed,
		events.RolloutNodeDraining, events.RolloutNodeUpgrading, events.RolloutNodeSoaking, events.RolloutNodeUpgraded,
		events.RolloutNodeFailed, events.RolloutNodeRollingBack, events.RolloutNodeRolledBack,
		events.RolloutWaveCompleted, events.RolloutWaveStarted, events.RolloutNodeSkipped, events.RolloutRollingBack,
		events.RolloutHalted, events.RolloutWaveCompleted, events.RolloutCompleted}
	if !slices.Equal(types, want) {
		t.Errorf("rollout events in order:\n got %v\nwant %v", types, want)
	}
}
