package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
)

// TestTenantCursorsSealed: a tenant's viewer paging gpus.list,
// rollouts.list and events.list one row at a time over a fleet whose rows
// interleave with another tenant's sees all of its own rows and never
// another tenant's id, in an item or in a cursor (docs/tenants.md, "List
// cursors"); a cursor it did not get from this API, from another list or
// another tenant is INVALID_ARGUMENT; a root token's cursors stay plain.
func TestTenantCursorsSealed(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	site, err := f.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	tokens := map[string]string{}
	for _, name := range []string{"a", "b"} {
		ten, err := f.st.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-" + name, ParentID: store.RootTenant})
		if err != nil {
			t.Fatal(err)
		}
		if tokens[name], _, err = iam.Create(ctx, f.st, iam.CreateParams{Role: store.RoleViewer, TenantID: ten.ID}); err != nil {
			t.Fatal(err)
		}
		// Two pools, each with one node of two GPUs and one rollout, ids
		// interleaved with the other tenant's in every list's order.
		for i := 1; i <= 2; i++ {
			up := strings.ToUpper(name)
			pool, err := f.st.PoolCreate(ctx, &store.PoolCreateParams{Name: fmt.Sprintf("p%s%d", name, i), SiteID: site.ID, TenantID: ten.ID})
			if err != nil {
				t.Fatal(err)
			}
			node := fmt.Sprintf("node_%d%s%s%s", i, name, name, name)
			if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: node, PoolID: pool.ID, Hostname: node, MachineID: node}); err != nil {
				t.Fatal(err)
			}
			if err := f.st.GPUPlacementsSet(ctx, &store.GPUPlacementsSetParams{NodeID: node, GPUs: []store.GPUSeen{
				{UUID: fmt.Sprintf("GPU-%d%s%s1", i, up, up), Model: "m", Health: store.GPUHealthOK},
				{UUID: fmt.Sprintf("GPU-%d%s%s2", i, up, up), Model: "m", Health: store.GPUHealthOK},
			}}); err != nil {
				t.Fatal(err)
			}
			if _, err := f.st.RolloutCreate(ctx, &store.RolloutCreateParams{ID: fmt.Sprintf("ro_%d%s%s%s", i, name, name, name),
				PoolID: pool.ID, Version: "1.0.0", BaseURL: "https://example.invalid", Canary: 1, Wave: "1", MaxUnavailable: "1", Soak: time.Minute, Timeout: time.Hour, Bake: time.Minute, CreatedBy: "token:t"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := 1; i <= 2; i++ {
		for _, name := range []string{"a", "b"} {
			node := fmt.Sprintf("node_%d%s%s%s", i, name, name, name)
			if _, err := f.st.OutboxInsert(ctx, "node.test", node, []byte(`{"nodeId":"`+node+`"}`)); err != nil {
				t.Fatal(err)
			}
		}
	}

	for _, c := range []struct{ method, items, field string }{
		{"gpus.list", "gpus", "gpuUuid"},
		{"rollouts.list", "rollouts", "id"},
		{"events.list", "events", "subject"},
	} {
		for _, me := range []string{"a", "b"} {
			other := map[string]string{"a": "b", "b": "a"}[me]
			bad := []string{strings.Repeat(other, 3), strings.Repeat(strings.ToUpper(other), 2)}
			var got, cursors []string
			cursor := ""
			for pages := 0; ; pages++ {
				if pages > 20 {
					t.Fatalf("%s as %s: no end of pages", c.method, me)
				}
				r := f.call(c.method, tokens[me], `{"page":{"limit":1,"cursor":"`+cursor+`"}}`, peer)
				if r.Code != 200 {
					t.Fatalf("%s as %s, cursor %q: %d %v", c.method, me, cursor, r.Code, r.Body)
				}
				next, _ := r.Body["nextCursor"].(string)
				delete(r.Body, "nextCursor")
				b, _ := json.Marshal(r.Body)
				// A CloudEvent's id is random base32 ("evt_…bbb…" came up
				// once): it names no tenant, and is left out of the match.
				b = randomEventID.ReplaceAll(b, []byte("evt_"))
				for _, s := range bad {
					if strings.Contains(string(b), s) {
						t.Fatalf("%s as team-%s: the answer names team-%s's %q: %s", c.method, me, other, s, b)
					}
					if !strings.HasPrefix(next, "c1.") && strings.Contains(next, s) {
						t.Fatalf("%s as team-%s: the cursor names team-%s's %q: %s", c.method, me, other, s, next)
					}
				}
				items, _ := r.Body[c.items].([]any)
				for _, it := range items {
					got = append(got, it.(map[string]any)[c.field].(string))
				}
				if next == "" {
					break
				}
				cursors = append(cursors, next)
				cursor = next
			}
			for _, cur := range cursors {
				if !strings.HasPrefix(cur, "c1.") {
					t.Errorf("%s as team-%s: cursor %q is not sealed", c.method, me, cur)
				}
				// Another tenant, or another list, cannot use it.
				wantCode(t, f.call(c.method, tokens[other], `{"page":{"limit":1,"cursor":"`+cur+`"}}`, peer), 400, "INVALID_ARGUMENT", "page.cursor")
				if c.method != "gpus.list" {
					wantCode(t, f.call("gpus.list", tokens[me], `{"page":{"limit":1,"cursor":"`+cur+`"}}`, peer), 400, "INVALID_ARGUMENT", "page.cursor")
				}
			}
			want := map[string]int{"gpus.list": 4, "rollouts.list": 2, "events.list": 4}[c.method] // events: rollout.created too
			if len(got) != want {
				t.Errorf("%s as team-%s: %d rows %v, want its own %d", c.method, me, len(got), got, want)
			}
		}
	}

	// A plain cursor (a root caller's, or a guessed id) is not one this
	// API issued to a tenant.
	r := f.call("gpus.list", f.admin, `{"page":{"limit":1}}`, peer)
	plain, _ := r.Body["nextCursor"].(string)
	if r.Code != 200 || plain == "" || strings.HasPrefix(plain, "c1.") {
		t.Fatalf("root's gpus.list: %d %v", r.Code, r.Body)
	}
	r = f.call("gpus.list", tokens["a"], `{"page":{"limit":1,"cursor":"`+plain+`"}}`, peer)
	wantCode(t, r, 400, "INVALID_ARGUMENT", "page.cursor")
	if msg, _ := r.Body["message"].(string); !strings.Contains(msg, "cursor is not one this API issued") {
		t.Errorf("a plain cursor: %v", r.Body)
	}
	wantCode(t, f.call("gpus.list", tokens["a"], `{"page":{"limit":1,"cursor":"c1.AAAA"}}`, peer), 400, "INVALID_ARGUMENT", "page.cursor")
}

// randomEventID matches an event's random id (store.NewID("evt")).
var randomEventID = regexp.MustCompile(`evt_[a-z0-9]+`)
