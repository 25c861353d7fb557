package api_test

import (
	"context"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// TestNodeGetShowsClockSkew checks that nodes.get gives the clock skew the
// gateway measured (DESIGN.md, "Identity over time", Clocks), and nothing
// before it was measured.
func TestNodeGetShowsClockSkew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	site, err := f.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "ams-1", Region: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := f.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "gpu", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_skew", PoolID: pool.ID, Hostname: "gpu-1", MachineID: "m1"}); err != nil {
		t.Fatal(err)
	}
	get := func() map[string]any {
		t.Helper()
		r := f.call("nodes.get", f.admin, `{"id":"node_skew"}`, peer)
		n, ok := r.Body["node"].(map[string]any)
		if r.Code != 200 || !ok {
			t.Fatalf("nodes.get = %v", r)
		}
		return n
	}
	if n := get(); n["clockSkew"] != nil || n["clockSkewTime"] != nil {
		t.Fatalf("clock skew before any measure: %v, %v", n["clockSkew"], n["clockSkewTime"])
	}
	at := time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)
	if err := f.st.NodeSetClockSkew(ctx, "node_skew", -5400*time.Second-250*time.Millisecond, &at); err != nil {
		t.Fatal(err)
	}
	if n := get(); n["clockSkew"] != "-5400.250s" || n["clockSkewTime"] != "2031-03-04T05:06:07Z" {
		t.Fatalf("clock skew = %v at %v, want -5400.250s at 2031-03-04T05:06:07Z", n["clockSkew"], n["clockSkewTime"])
	}
}
