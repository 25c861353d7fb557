package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/store"
)

// TestGPUsMethods: viewers list GPUs (filtered, paged by cursor) and get
// one with its stays and history; every input is bounded, and an unknown
// UUID is NOT_FOUND, not a 500.
func TestGPUsMethods(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	site, err := f.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := f.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "gpus", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_g", PoolID: pool.ID, Hostname: "g", MachineID: "g"}); err != nil {
		t.Fatal(err)
	}
	if err := f.st.GPUPlacementsSet(ctx, &store.GPUPlacementsSetParams{NodeID: "node_g", GPUs: []store.GPUSeen{
		{UUID: "GPU-1", Model: "NVIDIA A100-SXM4-40GB", Health: store.GPUHealthOK},
		{UUID: "GPU-2", Model: "NVIDIA A100-SXM4-40GB", Health: store.GPUHealthFailed},
	}}); err != nil {
		t.Fatal(err)
	}
	viewer := f.token(store.RoleViewer, 0)

	r := f.call("gpus.list", viewer, `{"pool":"gpus","page":{"limit":1}}`, peer)
	if list, _ := r.Body["gpus"].([]any); r.Code != 200 || len(list) != 1 || r.Body["nextCursor"] != "GPU-1/node_g" {
		t.Fatalf("list, one a page: %d %v", r.Code, r.Body)
	}
	r = f.call("gpus.list", viewer, `{"page":{"limit":1,"cursor":"GPU-1/node_g"}}`, peer)
	if list, _ := r.Body["gpus"].([]any); r.Code != 200 || len(list) != 1 || list[0].(map[string]any)["gpuUuid"] != "GPU-2" {
		t.Fatalf("list, second page: %d %v", r.Code, r.Body)
	}
	r = f.call("gpus.list", viewer, `{"unhealthy":true,"model":"NVIDIA A100-SXM4-40GB"}`, peer)
	if list, _ := r.Body["gpus"].([]any); r.Code != 200 || len(list) != 1 || list[0].(map[string]any)["health"] != "failed" {
		t.Fatalf("list --unhealthy: %d %v", r.Code, r.Body)
	}
	r = f.call("gpus.get", viewer, `{"uuid":"GPU-2"}`, peer)
	if cur, _ := r.Body["current"].([]any); r.Code != 200 || len(cur) != 1 || cur[0].(map[string]any)["nodeId"] != "node_g" {
		t.Fatalf("get: %d %v", r.Code, r.Body)
	}
	wantCode(t, f.call("gpus.get", viewer, `{"uuid":"GPU-nosuch"}`, peer), 404, "NOT_FOUND", "uuid")
	wantCode(t, f.call("gpus.get", viewer, `{}`, peer), 400, "INVALID_ARGUMENT", "uuid")
	wantCode(t, f.call("gpus.get", viewer, `{"uuid":"GPU with spaces"}`, peer), 400, "INVALID_ARGUMENT", "uuid")
	wantCode(t, f.call("gpus.get", viewer, `{"uuid":"`+strings.Repeat("x", 129)+`"}`, peer), 400, "INVALID_ARGUMENT", "uuid")
	wantCode(t, f.call("gpus.get", viewer, `{"uuid":"GPU-1","limit":1001}`, peer), 400, "INVALID_ARGUMENT", "limit")
	wantCode(t, f.call("gpus.list", viewer, `{"model":"`+strings.Repeat("m", 129)+`"}`, peer), 400, "INVALID_ARGUMENT", "model")
	wantCode(t, f.call("gpus.list", viewer, `{"page":{"limit":1001}}`, peer), 400, "INVALID_ARGUMENT", "page.limit")
	wantCode(t, f.call("gpus.list", viewer, `{"page":{"cursor":"nocursor"}}`, peer), 400, "INVALID_ARGUMENT", "page.cursor")
	wantCode(t, f.call("gpus.list", viewer, `{"pool":"none"}`, peer), 404, "NOT_FOUND", "pool")
}
