package watch_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/watch"
	"github.com/better-compute/better-compute/controlplane/store"
)

// TestTenantScopedPage: a tenant's token logs in to the page and sees its
// own pool's node (page, fragment, node page, shell page) and nothing of
// the root's node_x, whose node and shell pages are 404 to it as to a
// node that does not exist; the root's viewer sees both. Suspending the
// tenant ends its session and its open stream.
func TestTenantScopedPage(t *testing.T) {
	f := newFixture(t, watch.Config{})
	ctx := context.Background()
	ten, err := f.st.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-a", ParentID: store.RootTenant})
	if err != nil {
		t.Fatal(err)
	}
	site, err := f.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "a-site", Region: "eu", TenantID: ten.ID})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := f.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "a-pool", SiteID: site.ID, TenantID: ten.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_a", PoolID: pool.ID, Hostname: "host-of-a", MachineID: "ma"}); err != nil {
		t.Fatal(err)
	}
	token, _, err := iam.Create(ctx, f.st, iam.CreateParams{Role: store.RoleViewer, TenantID: ten.ID})
	if err != nil {
		t.Fatal(err)
	}

	c := f.client(t)
	if resp := f.login(t, c, token); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("tenant login: %d", resp.StatusCode)
	}
	for _, path := range []string{"/watch", "/watch/fragment", "/watch/fragment?state=joined"} {
		resp, body := f.get(t, c, path)
		if resp.StatusCode != 200 || !strings.Contains(body, "node_a") || strings.Contains(body, "node_x") || strings.Contains(body, "alert(1)") {
			t.Errorf("GET %s of the tenant's session: %d; want node_a and not node_x:\n%s", path, resp.StatusCode, body)
		}
	}
	for path, want := range map[string]int{"/watch/nodes/node_a": 200, "/watch/nodes/node_a/shell": 200,
		"/watch/nodes/node_x": 404, "/watch/nodes/node_x/shell": 404} {
		if resp, body := f.get(t, c, path); resp.StatusCode != want || want == 404 && strings.Contains(body, "alert(1)") {
			t.Errorf("GET %s of the tenant's session: %d, want %d\n%s", path, resp.StatusCode, want, body)
		}
	}
	if resp, body := f.get(t, c, "/watch/actions/cordon/preview?target=node_x"); resp.StatusCode != 404 {
		t.Errorf("preview of the root's node by the tenant's session: %d, want 404\n%s", resp.StatusCode, body)
	}

	root := f.client(t)
	f.login(t, root, f.viewer)
	if resp, body := f.get(t, root, "/watch/fragment"); resp.StatusCode != 200 || !strings.Contains(body, "node_a") || !strings.Contains(body, "node_x") {
		t.Errorf("the root's page: %d; want node_a and node_x:\n%s", resp.StatusCode, body)
	}

	// Suspension ends the tenant's session at its next token check: its
	// open stream says ended, its next request finds no session.
	streamCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(streamCtx, http.MethodGet, f.srv.URL+"/watch/events", nil)
	resp, err := c.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the tenant's stream: %v, %v", resp, err)
	}
	defer resp.Body.Close()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-streamCtx.Done():
				return
			}
		}
	}()
	if _, err := f.st.TenantSetSuspended(ctx, ten.ID, true); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(iam.DefaultStoppedRefresh)
	waitLine(t, lines, "event: ended")
	if resp, _ := f.get(t, c, "/watch/fragment"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("fragment of a suspended tenant's session: %d, want 401", resp.StatusCode)
	}
}

// TestTenantPageCursor: a tenant's session paging the node list one node
// at a time over nodes that interleave with the root's node_x follows
// its own nodes only: no page, and no next link (?after=), names node_x
// (docs/tenants.md, "List cursors").
func TestTenantPageCursor(t *testing.T) {
	f := newFixture(t, watch.Config{PageSize: 1})
	ctx := context.Background()
	ten, err := f.st.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-a", ParentID: store.RootTenant})
	if err != nil {
		t.Fatal(err)
	}
	site, err := f.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "a-site", Region: "eu", TenantID: ten.ID})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := f.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "a-pool", SiteID: site.ID, TenantID: ten.ID})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"node_a", "node_z"} { // node_x lies between
		if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: "host-" + id, MachineID: "m" + id}); err != nil {
			t.Fatal(err)
		}
	}
	token, _, err := iam.Create(ctx, f.st, iam.CreateParams{Role: store.RoleViewer, TenantID: ten.ID})
	if err != nil {
		t.Fatal(err)
	}
	c := f.client(t)
	if resp := f.login(t, c, token); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("tenant login: %d", resp.StatusCode)
	}
	seen := map[string]bool{}
	path := "/watch"
	for pages := 0; path != ""; pages++ {
		if pages > 5 {
			t.Fatal("no end of pages")
		}
		resp, body := f.get(t, c, path)
		if resp.StatusCode != 200 || strings.Contains(body, "node_x") {
			t.Fatalf("GET %s of the tenant's session: %d; names the root's node_x:\n%s", path, resp.StatusCode, body)
		}
		for _, id := range []string{"node_a", "node_z"} {
			if strings.Contains(body, "/watch/nodes/"+id) {
				seen[id] = true
			}
		}
		path = ""
		if _, rest, ok := strings.Cut(body, `id="next" href="`); ok {
			path, _, _ = strings.Cut(rest, `"`)
			path = strings.ReplaceAll(path, "&amp;", "&")
		}
	}
	if !seen["node_a"] || !seen["node_z"] {
		t.Errorf("the tenant's pages showed %v, want node_a and node_z", seen)
	}
}
