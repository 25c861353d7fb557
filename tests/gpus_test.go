package tests

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestGPUsFollowTheBoard (issue 44, items 2 and 3): a real control plane
// (one serve process, SQLite), three FakeDaemons (8 GPUs each, UUIDs
// unique per node) and one real bcd built with nvmlmock:
//
//   - `gpus list --unhealthy -o json` lists exactly the GPUs whose health
//     reads degraded (persistence mode off on two GPUs of two simulated
//     nodes and one of the real node);
//   - a board with a history on node A (an XID) moved to node B (a spare
//     takes its slot in A; B lists it in GPU 0's slot), with an XID on B: `gpus get UUID -o json` shows A then B, and the findings of
//     each, with no conflict;
//   - the UUID of a board of live node B reported by live node C too:
//     gpu.uuid-conflict on both nodes, each naming the other, both stays
//     current and marked, never merged, and both in `gpus list --unhealthy`.
func TestGPUsFollowTheBoard(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{top: "remediation:\n  interval: 500ms\n"})
	ctx := t.Context()
	file, _ := d.joinToken(3, time.Hour)
	tok, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var fds []*sim.FakeDaemon
	for _, name := range []string{"gpus-a", "gpus-b", "gpus-c"} {
		fd, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: name, Session: session.Config{StartJitter: -1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := fd.Join(ctx, d.gatewayURL, strings.TrimSpace(string(tok))); err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan error, 1)
		go func() { done <- fd.Run(runCtx) }()
		t.Cleanup(func() { stop(); <-done })
		fds = append(fds, fd)
	}
	a, b, c := fds[0], fds[1], fds[2]
	uuid := func(fd *sim.FakeDaemon, i int) string { return fd.Inventory().GetGpus()[i].GetUuid() }
	serial := func(fd *sim.FakeDaemon, i int) string { return fd.Inventory().GetGpus()[i].GetSerial() }
	seen := map[string]bool{}
	for _, fd := range fds {
		for _, g := range fd.Inventory().GetGpus() {
			if seen[g.GetUuid()] {
				t.Fatalf("the simulator gave UUID %s to two GPUs", g.GetUuid())
			}
			seen[g.GetUuid()] = true
		}
	}

	run := func(args ...string) (string, error) {
		code, stdout, stderr := runBC(t, d, args...)
		if code != 0 {
			return "", fmt.Errorf("better-compute %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
		}
		return stdout, nil
	}
	list := func(args ...string) ([]string, string) {
		t.Helper()
		out, err := run(append([]string{"gpus", "list", "-o", "json"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		r := &apiv1.ListGPUsResponse{}
		if err := protojson.Unmarshal([]byte(out), r); err != nil {
			t.Fatalf("gpus list -o json: %v\n%s", err, out)
		}
		var got []string
		for _, g := range r.GetGpus() {
			got = append(got, g.GetGpuUuid()+"@"+g.GetNodeId())
		}
		slices.Sort(got)
		return got, out
	}
	get := func(id string) (*apiv1.GPUDetail, string) {
		t.Helper()
		out, err := run("gpus", "get", id, "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		g := &apiv1.GPUDetail{}
		if err := protojson.Unmarshal([]byte(out), g); err != nil {
			t.Fatalf("gpus get -o json: %v\n%s", err, out)
		}
		return g, out
	}
	at := func(fd *sim.FakeDaemon, i int) string { return uuid(fd, i) + "@" + fd.NodeID() }

	// And one real bcd (nvmlmock: go-nvml's mock DGX A100).
	rn := startMockGPUNode(t, d, "gpus-real")

	// Every GPU of the fleet, then exactly the unhealthy ones.
	eventually(t, 60*time.Second, func() bool { got, _ := list(); return len(got) == 32 },
		func() string { _, out := list(); return "gpus list: not the fleet's 32 GPUs:\n" + out })
	if got, out := list("--model", "NVIDIA A100-SXM4-40GB", "--pool", "default"); len(got) != 24 {
		t.Fatalf("gpus list --model --pool default: %d GPUs, want 24\n%s", len(got), out)
	}
	if got, _ := list("--unhealthy"); len(got) != 0 {
		t.Fatalf("gpus list --unhealthy on a healthy fleet: %v", got)
	}
	if err := a.SetPersistenceMode(1, false); err != nil {
		t.Fatal(err)
	}
	if err := c.SetPersistenceMode(5, false); err != nil {
		t.Fatal(err)
	}
	rn.set("4 persistence off", `msg="Mock reading set" .*gpu_index=4 reading="persistence off"`)
	want := []string{at(a, 1), at(c, 5), gputest.UUID(4) + "@" + rn.id}
	slices.Sort(want)
	eventually(t, 60*time.Second, func() bool { got, _ := list("--unhealthy"); return slices.Equal(got, want) },
		func() string {
			got, out := list("--unhealthy")
			return fmt.Sprintf("gpus list --unhealthy = %v, want %v\n%s", got, want, out)
		})

	// A board with a history on A moves to B.
	moved := uuid(a, 0)
	if err := a.RaiseXID(0, 13); err != nil {
		t.Fatal(err)
	}
	findingsOn := func(g *apiv1.GPUDetail, node string) int {
		n := 0
		for _, f := range g.GetHistory().GetFindings() {
			if f.GetNodeId() == node && f.GetGpuUuid() == moved {
				n++
			}
		}
		return n
	}
	eventually(t, 60*time.Second, func() bool { g, _ := get(moved); return findingsOn(g, a.NodeID()) > 0 },
		func() string { _, out := get(moved); return "no finding of node A in the GPU's history:\n" + out })
	// The repair: the board leaves A (a spare takes its slot) and fills
	// GPU 0's slot of B.
	if err := a.SwapGPU(0, "GPU-00000000-59a2-4e1d-8c3b-5a1e5e000001", "spare-1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() bool { g, _ := get(moved); return len(g.GetCurrent()) == 0 },
		func() string { _, out := get(moved); return "the board is still current on node A:\n" + out })
	if err := b.SwapGPU(0, moved, serial(a, 0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() bool { g, _ := get(moved); return len(g.GetCurrent()) == 1 },
		func() string { _, out := get(moved); return "the board is not current on node B:\n" + out })
	if err := b.RaiseXID(0, 13); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() bool { g, _ := get(moved); return findingsOn(g, b.NodeID()) > 0 },
		func() string { _, out := get(moved); return "no finding of node B in the GPU's history:\n" + out })
	g, out := get(moved)
	var nodes []string
	for _, p := range g.GetPlacements() {
		nodes = append(nodes, p.GetNodeId())
		if p.GetConflictNodeId() != "" || p.GetBoardSerial() != serial(a, 0) {
			t.Fatalf("a moved board's stay: %v\n%s", p, out)
		}
	}
	if !slices.Equal(nodes, []string{a.NodeID(), b.NodeID()}) || g.GetPlacements()[0].GetCurrent() ||
		!proto.Equal(g.GetCurrent()[0], g.GetPlacements()[1]) || findingsOn(g, a.NodeID()) == 0 {
		t.Fatalf("gpus get %s: stays in %v, want node A then node B (current), with the findings of each\n%s", moved, nodes, out)
	}
	if !g.GetPlacements()[0].GetFirstSeenTime().AsTime().Before(g.GetPlacements()[1].GetFirstSeenTime().AsTime()) {
		t.Fatalf("stays out of order:\n%s", out)
	}
	human, err := run("gpus", "get", moved)
	if err != nil || !strings.Contains(human, "now: node "+b.NodeID()) || !strings.Contains(human, a.NodeID()) {
		t.Fatalf("gpus get %s (table): %v\n%s", moved, err, human)
	}

	// B's board GPU 2 reported by C too, both live: a conflict on both.
	copied := uuid(b, 2)
	if err := c.SwapGPU(2, copied, serial(b, 2)); err != nil {
		t.Fatal(err)
	}
	conflicts := func() map[string]string {
		out, err := run("events", "list", "--type", "gpu.uuid-conflict", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		r := &apiv1.ListEventsResponse{}
		if err := protojson.Unmarshal([]byte(out), r); err != nil {
			t.Fatalf("events list -o json: %v\n%s", err, out)
		}
		m := map[string]string{}
		for _, e := range r.GetEvents() {
			data := e.GetCloudEvent().GetFields()["data"].GetStructValue().GetFields()
			if data["gpuUuid"].GetStringValue() == copied {
				m[e.GetSubject()] = data["otherNodeId"].GetStringValue()
			}
		}
		return m
	}
	eventually(t, 60*time.Second, func() bool { return len(conflicts()) == 2 },
		func() string { return fmt.Sprintf("gpu.uuid-conflict events of %s: %v", copied, conflicts()) })
	if m := conflicts(); m[b.NodeID()] != c.NodeID() || m[c.NodeID()] != b.NodeID() {
		t.Fatalf("gpu.uuid-conflict: %v, want node B naming C and C naming B", m)
	}
	g, out = get(copied)
	if len(g.GetCurrent()) != 2 || len(g.GetPlacements()) != 2 {
		t.Fatalf("gpus get %s in a conflict: want two current stays\n%s", copied, out)
	}
	for _, p := range g.GetCurrent() {
		other := map[string]string{b.NodeID(): c.NodeID(), c.NodeID(): b.NodeID()}[p.GetNodeId()]
		if other == "" || p.GetConflictNodeId() != other {
			t.Fatalf("a conflicting stay %v does not name the other node\n%s", p, out)
		}
	}
	want = append(want, at(b, 2), copied+"@"+c.NodeID())
	slices.Sort(want)
	if got, out := list("--unhealthy"); !slices.Equal(got, want) {
		t.Fatalf("gpus list --unhealthy with a conflict = %v, want %v\n%s", got, want, out)
	}
	// Neither node's conflict is acted on: no remediation case names the UUID.
	if out, err := run("remediation", "history", "--gpu", copied, "-o", "json"); err != nil || strings.Contains(out, `"cases"`) {
		t.Fatalf("remediation history --gpu %s: a case for a UUID conflict (%v)\n%s", copied, err, out)
	}
	code, stdout, stderr := runBC(t, d, "gpus", "get", "GPU-nosuch")
	if code != exitFailure || !strings.Contains(stdout+stderr, "no GPU GPU-nosuch") {
		t.Fatalf("gpus get GPU-nosuch: exit %d, want %d and not found\n%s%s", code, exitFailure, stdout, stderr)
	}
}

// runBC runs better-compute against d's API and returns its exit code and
// output.
func runBC(t *testing.T, d *deployment, args ...string) (int, string, string) {
	t.Helper()
	return testenv.Run(t, d.env, "", d.bc, d.viaAPI(append([]string{"--config", d.cfgFile}, args...)...)...)
}
