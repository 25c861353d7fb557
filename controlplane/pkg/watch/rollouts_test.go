package watch_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/healthgate"
	"github.com/better-compute/better-compute/controlplane/pkg/watch"
	"github.com/better-compute/better-compute/controlplane/store"
)

// TestRolloutOnThePage: a rollout in progress shows in its section with
// its pool, version, state, wave and progress, and a halted one with its
// reason; a completed one leaves the section.
func TestRolloutOnThePage(t *testing.T) {
	f := newFixture(t, watch.Config{})
	ctx := context.Background()
	c := f.client(t)
	f.login(t, c, f.viewer)
	if _, body := f.get(t, c, "/watch"); !strings.Contains(body, "No rollout in progress.") {
		t.Fatalf("page without rollouts lacks the empty section:\n%s", body)
	}
	n, err := f.st.NodeGet(ctx, "node_x")
	if err != nil {
		t.Fatal(err)
	}
	ro, err := f.st.RolloutCreate(ctx, &store.RolloutCreateParams{PoolID: n.PoolID, Version: "0.9.0", Canary: 1, Wave: "1",
		MaxUnavailable: "1", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	one := 1
	if _, err := f.st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: ro.ID, State: store.RolloutRunning, Wave: &one, WaveNodes: []string{"node_x"}}); err != nil {
		t.Fatal(err)
	}
	if err := f.st.RolloutNodeUpdate(ctx, &store.RolloutNodeUpdateParams{RolloutID: ro.ID, NodeID: "node_x", State: store.RolloutNodeUpgrading}); err != nil {
		t.Fatal(err)
	}
	_, body := f.get(t, c, "/watch")
	for _, want := range []string{`data-rollout="` + ro.ID + `"`, "<td>gpu</td><td>0.9.0</td>", `<td class="state">running</td>`, "<td class=\"n\">0/1</td>"} {
		if !strings.Contains(body, want) {
			t.Errorf("rollout section lacks %q:\n%s", want, body)
		}
	}
	// The wave's health gate (issue 30) shows with its figures.
	gate := &healthgate.Report{Wave: 1, Verdict: healthgate.Halt, Comparison: healthgate.ComparisonNotUpgraded, UpgradedNodes: 1,
		ComparisonNodes: 4, UpgradedNodeHours: 0.5, ComparisonNodeHours: 2,
		Measures: []healthgate.Result{{Measure: healthgate.Measure{Name: "findings", Unit: "GPU-hour",
			Upgraded: healthgate.Group{Count: 9, Exposure: 4}, Comparison: healthgate.Group{Count: 2, Exposure: 32}},
			Worse: true, Expected: 0.25, P: 1e-6}}}
	if _, err := f.st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: ro.ID, Gate: gate}); err != nil {
		t.Fatal(err)
	}
	if _, body = f.get(t, c, "/watch"); !strings.Contains(body, "health gate halt — findings: 9 in 4 GPU-hour(s), expected 0.25 from 2 in 32") {
		t.Errorf("the wave's health gate is not shown:\n%s", body)
	}
	if _, err := f.st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: ro.ID, State: store.RolloutHalted, Reason: "node node_x: <b>bad</b>"}); err != nil {
		t.Fatal(err)
	}
	if _, body = f.get(t, c, "/watch"); !strings.Contains(body, "node node_x: &lt;b&gt;bad&lt;/b&gt;") {
		t.Errorf("halted rollout's reason not shown (escaped):\n%s", body)
	}
	if _, err := f.st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: ro.ID, State: store.RolloutAborted}); err != nil {
		t.Fatal(err)
	}
	if _, body = f.get(t, c, "/watch"); strings.Contains(body, `data-rollout="`+ro.ID) {
		t.Errorf("an aborted rollout is still on the page")
	}
}
