package watch_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/controlplane/pkg/watch"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

var (
	cellRE  = regexp.MustCompile(`<a class="cell s-([a-z]+)" data-gpu="([^"]+)"`)
	countRE = regexp.MustCompile(`<li class="s-([a-z]+)" data-state="[a-z]+"><i class="sw s-[a-z]+"></i><span>[a-z]+</span> <b>(\d+)</b>`)
)

// setGPUs gives node id an inventory of n GPUs (the last one failed when
// failLast) and moves it to state.
func setGPUs(t *testing.T, st store.Store, id, state string, n int, failLast bool) {
	t.Helper()
	inv := &sessionv1.Inventory{Digest: fmt.Sprintf("%s-%d-%v", id, n, failLast)}
	for i := range n {
		g := &sessionv1.GPU{Index: uint32(i), Name: "NVIDIA A100-SXM4-40GB", Uuid: fmt.Sprintf("GPU-%s-%d", id, i)}
		if failLast && i == n-1 {
			g.Health = &sessionv1.GPUHealth{State: sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED, Reasons: []string{"<b>xid 79</b>"}}
		}
		inv.Gpus = append(inv.Gpus, g)
	}
	b, err := protojson.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.NodeSetInventory(ctx, id, b, inv.Digest); err != nil {
		t.Fatal(err)
	}
	if err := st.NodeSetState(ctx, id, state); err != nil {
		t.Fatal(err)
	}
}

func mapCounts(body string) map[string]string {
	out := map[string]string{}
	i := strings.Index(body, `id="map-counts"`)
	j := strings.Index(body[i:], "</ul>")
	for _, m := range countRE.FindAllStringSubmatch(body[i:i+j], -1) {
		out[m[1]] = m[2]
	}
	return out
}

// TestGPUMapUnknownNeverOK: the GPUs of an unreachable node read unknown
// on the map, in its counts and on the node's page, whatever its last
// inventory said; a failed GPU is one failed cell; the node's hostname
// and the health reasons it sent are text.
func TestGPUMapUnknownNeverOK(t *testing.T) {
	f := newFixture(t, watch.Config{})
	ctx := context.Background()
	x, err := f.st.NodeGet(ctx, "node_x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_y", PoolID: x.PoolID, Hostname: "y", MachineID: "my"}); err != nil {
		t.Fatal(err)
	}
	setGPUs(t, f.st, "node_x", store.NodeReady, 4, true)
	setGPUs(t, f.st, "node_y", store.NodeUnreachable, 8, false)
	c := f.client(t)
	f.login(t, c, f.viewer)
	resp, body := f.get(t, c, "/watch")
	if resp.StatusCode != 200 {
		t.Fatalf("GET /watch: %d", resp.StatusCode)
	}
	states := map[string]int{}
	for _, m := range cellRE.FindAllStringSubmatch(body, -1) {
		states[m[1]]++
	}
	if states["ok"] != 3 || states["failed"] != 1 || states["unknown"] != 8 || len(states) != 3 {
		t.Fatalf("cells by state %v, want 3 ok, 1 failed, 8 unknown", states)
	}
	if got := mapCounts(body); got["ok"] != "3" || got["unknown"] != "8" || got["failed"] != "1" {
		t.Fatalf("map counts %v, want ok 3, unknown 8, failed 1", got)
	}
	if strings.Contains(body, "<script>alert(1)</script>") || !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Fatal("the node's markup hostname is not escaped on the map")
	}
	_, body = f.get(t, c, "/watch/nodes/node_y")
	if n := strings.Count(body, `data-state="unknown"><td class="n">`); n != 8 {
		t.Fatalf("the unreachable node's page shows %d GPUs unknown, want 8:\n%s", n, body)
	}
	_, body = f.get(t, c, "/watch/nodes/node_x")
	if strings.Contains(body, "<b>xid 79</b>") || !strings.Contains(body, "&lt;b&gt;xid 79&lt;/b&gt;") {
		t.Fatal("a health reason from the node is not escaped on its page")
	}
	resp, body = f.get(t, c, "/watch/gpus/GPU-node_x-3")
	if resp.StatusCode != 200 || !strings.Contains(body, `id="gpu-state">failed<`) {
		t.Fatalf("GPU page: %d\n%s", resp.StatusCode, body)
	}
}

// TestGPUMapCollapses: a pool of more nodes than CollapseAt shows its
// counts and a link that opens it; opened, it shows at most MaxOpenNodes
// rows and says how many more.
func TestGPUMapCollapses(t *testing.T) {
	f := newFixture(t, watch.Config{CollapseAt: 5, MaxOpenNodes: 10})
	ctx := context.Background()
	x, err := f.st.NodeGet(ctx, "node_x")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 14 {
		id := fmt.Sprintf("node_c%02d", i)
		if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: x.PoolID, Hostname: id, MachineID: "m" + id}); err != nil {
			t.Fatal(err)
		}
		setGPUs(t, f.st, id, store.NodeReady, 2, false)
	}
	c := f.client(t)
	f.login(t, c, f.viewer)
	_, body := f.get(t, c, "/watch")
	if n := len(cellRE.FindAllString(body, -1)); n != 0 || !strings.Contains(body, `href="/watch?open=gpu"`) {
		t.Fatalf("a pool of 15 nodes with CollapseAt 5 shows %d cells, or no link to open it", n)
	}
	if got := mapCounts(body); got["ok"] != "28" {
		t.Fatalf("collapsed counts %v, want 28 ok", got)
	}
	_, body = f.get(t, c, "/watch?open=gpu")
	if n := strings.Count(body, `<div class="node" data-node=`); n != 10 || !strings.Contains(body, "and 5 more nodes") {
		t.Fatalf("the opened pool shows %d rows, want 10 and 5 more", n)
	}
	_, body = f.get(t, c, "/watch?open=gpu&gpu=ok&model=a100&group=model")
	if !strings.Contains(body, `data-group="NVIDIA A100-SXM4-40GB"`) {
		t.Fatal("group=model does not group by the GPU's model")
	}
}

// TestGPUMapRefusals: values the page never makes are a 400 with a
// reason, never a store read.
func TestGPUMapRefusals(t *testing.T) {
	f := newFixture(t, watch.Config{})
	c := f.client(t)
	f.login(t, c, f.viewer)
	for path, want := range map[string]int{
		"/watch?group=colour":                      400,
		"/watch?gpu=purple":                        400,
		"/watch?label=nokey":                       400,
		"/watch?model=" + strings.Repeat("a", 129): 400,
		"/watch/nodes/..%2Fetc":                    400,
		"/watch/nodes/node_nosuch":                 404,
		"/watch/gpus/GPU-nosuch":                   404,
		"/watch/gpus/%3Cb%3E":                      400,
		"/watch/nodes/node_x":                      200,
	} {
		if resp, body := f.get(t, c, path); resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d: %s", path, resp.StatusCode, want, body)
		}
	}
	// Without a session the node page is the login form, its fragment a 401.
	anon := f.client(t)
	if _, body := f.get(t, anon, "/watch/nodes/node_x"); !strings.Contains(body, `id="token"`) {
		t.Fatal("the node page without a session is not the login form")
	}
	if resp, _ := f.get(t, anon, "/watch/nodes/node_x?fragment=1"); resp.StatusCode != 401 {
		t.Fatalf("the node page's fragment without a session: %d, want 401", resp.StatusCode)
	}
}

// TestGPUMapReservedAndCapacity: a GPU held now by a reservation is a
// reserved cell and counts reserved in its pool's capacity (the others
// free, a failed one out of service); the reservation is a bar on the
// time line, its owner as text.
func TestGPUMapReservedAndCapacity(t *testing.T) {
	f := newFixture(t, watch.Config{})
	ctx := context.Background()
	setGPUs(t, f.st, "node_x", store.NodeReady, 4, true)
	x, err := f.st.NodeGet(ctx, "node_x")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	r, err := f.st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: x.PoolID, GPUs: 1, Start: now.Add(-time.Minute), End: now.Add(time.Hour),
		Owner: "<i>team-a</i>", CreatedBy: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: r.ID,
		Slots: []*store.ReservationSlot{{NodeID: "node_x", GPU: 1, GPUUUID: "GPU-node_x-1"}}}); err != nil {
		t.Fatal(err)
	}
	c := f.client(t)
	f.login(t, c, f.viewer)
	_, body := f.get(t, c, "/watch")
	states := map[string]string{}
	for _, m := range cellRE.FindAllStringSubmatch(body, -1) {
		states[m[2]] = m[1]
	}
	if states["GPU-node_x-1"] != "reserved" || states["GPU-node_x-0"] != "ok" || states["GPU-node_x-3"] != "failed" {
		t.Fatalf("cells %v, want GPU 1 reserved, 0 ok, 3 failed", states)
	}
	capRow := regexp.MustCompile(`<tr data-pool="gpu"><td>gpu</td><td>[^<]*</td><td class="n">(\d+)</td><td class="n free">(\d+)</td><td class="n">(\d+)</td><td class="n out">(\d+)</td>`).FindStringSubmatch(body)
	if capRow == nil || capRow[1] != "4" || capRow[2] != "2" || capRow[3] != "1" || capRow[4] != "1" {
		t.Fatalf("capacity row %q, want 4 GPUs: 2 free, 1 reserved, 1 out", capRow)
	}
	if !strings.Contains(body, `<g data-reservation="`+r.ID+`">`) || strings.Contains(body, "<i>team-a</i>") || !strings.Contains(body, "&lt;i&gt;team-a&lt;/i&gt;") {
		t.Fatal("the reservation is not on the time line with its owner as text")
	}
}
