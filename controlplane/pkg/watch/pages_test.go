package watch_test

import (
	"context"
	"fmt"
	"html"
	"regexp"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/watch"
	"github.com/better-compute/better-compute/controlplane/store"
)

var (
	nodeRow  = regexp.MustCompile(`<tr data-node="([^"]+)"`)
	nextLink = regexp.MustCompile(`<a id="next" href="([^"]+)">`)
)

// TestNodeListPages: with more nodes than a page holds, the page counts
// them all (by state and site, and in the list's heading) but lists one
// page of 100 with a link to the next; following the links shows every
// node once, and the last page has no link. So 10,000 nodes are never one
// 10,000-row table.
func TestNodeListPages(t *testing.T) {
	f := newFixture(t, watch.Config{}) // the default: 100 nodes a page
	ctx := context.Background()
	x, err := f.st.NodeGet(ctx, "node_x")
	if err != nil {
		t.Fatal(err)
	}
	const total = 250 // node_x and 249 more
	for i := range total - 1 {
		id := fmt.Sprintf("node_p%03d", i)
		if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: x.PoolID, Hostname: id + ".example", MachineID: "m-" + id}); err != nil {
			t.Fatal(err)
		}
	}
	c := f.client(t)
	f.login(t, c, f.viewer)

	seen := map[string]bool{}
	path, pages := "/watch", 0
	for path != "" {
		resp, body := f.get(t, c, path)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
		pages++
		if !strings.Contains(body, fmt.Sprintf(`<span class="total" id="nodes-total">%d</span>`, total)) {
			t.Fatalf("page %d (%s) does not count %d nodes:\n%s", pages, path, total, body)
		}
		rows := nodeRow.FindAllStringSubmatch(body, -1)
		want := min(100, total-len(seen))
		if len(rows) != want {
			t.Fatalf("page %d (%s) lists %d nodes, want %d", pages, path, len(rows), want)
		}
		for _, r := range rows {
			if seen[r[1]] {
				t.Fatalf("page %d (%s) lists %s again", pages, path, r[1])
			}
			seen[r[1]] = true
		}
		path = ""
		if m := nextLink.FindStringSubmatch(body); m != nil {
			path = html.UnescapeString(m[1])
		}
	}
	if pages != 3 || len(seen) != total {
		t.Fatalf("%d pages listed %d of %d nodes, want 3 pages listing all", pages, len(seen), total)
	}
}
