package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/store"
)

func TestUpgradeCommandsCreate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	site, err := f.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := f.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_up", PoolID: pool.ID, Hostname: "h"}); err != nil {
		t.Fatal(err)
	}
	create := func(body string, headers ...string) result {
		return f.call("commands.create", f.admin, body, peer, headers...)
	}

	// This API serves no downloads: a base URL must be given.
	wantCode(t, create(`{"nodeIds":["node_up"],"kind":"upgrade","upgrade":{"version":"0.2.0"}}`), http.StatusBadRequest, "INVALID_ARGUMENT", "upgrade.baseUrl")
	wantCode(t, create(`{"nodeIds":["node_up"],"kind":"upgrade"}`), http.StatusBadRequest, "INVALID_ARGUMENT", "upgrade.version")
	wantCode(t, create(`{"nodeIds":["node_up"],"kind":"upgrade","upgrade":{"version":"v0.2.0","baseUrl":"https://m.example/d"}}`), http.StatusBadRequest, "INVALID_ARGUMENT", "upgrade.version")
	wantCode(t, create(`{"nodeIds":["node_up"],"kind":"upgrade","upgrade":{"version":"0.2.0","baseUrl":"ftp://m.example/d"}}`), http.StatusBadRequest, "INVALID_ARGUMENT", "upgrade.baseUrl")
	wantCode(t, create(`{"nodeIds":["node_up"],"kind":"exec","exec":{"argv":["true"]},"upgrade":{"version":"0.2.0"}}`), http.StatusBadRequest, "INVALID_ARGUMENT", "upgrade")
	r := create(`{"nodeIds":["node_up"],"kind":"upgrade","upgrade":{"version":"0.2.0","baseUrl":"https://mirror.example/d/"}}`)
	if r.Code != http.StatusOK {
		t.Fatalf("create: %v", r.Body)
	}
	cmd := r.Body["commands"].([]any)[0].(map[string]any)
	if up, _ := cmd["upgrade"].(map[string]any); cmd["kind"] != "upgrade" || up["version"] != "0.2.0" || up["baseUrl"] != "https://mirror.example/d" {
		t.Fatalf("command %v", cmd)
	}

	// Serving downloads, the base URL is derived from the request, or
	// configured.
	f.srv = api.New(api.Config{Secret: strings.Repeat("s", 32), Downloads: http.NotFoundHandler()}, f.st, nil)
	for _, tc := range []struct {
		headers []string
		want    string
	}{
		{nil, "http://example.com/api/downloads"},
		{[]string{"X-Forwarded-Proto", "https"}, "https://example.com/api/downloads"},
	} {
		r := create(`{"nodeIds":["node_up"],"kind":"upgrade","upgrade":{"version":"0.2.0"}}`, tc.headers...)
		if up, _ := r.Body["commands"].([]any)[0].(map[string]any)["upgrade"].(map[string]any); up["baseUrl"] != tc.want {
			t.Fatalf("derived base URL: %v, want %s", r.Body, tc.want)
		}
	}
	f.srv = api.New(api.Config{Secret: strings.Repeat("s", 32), Downloads: http.NotFoundHandler(),
		DownloadsURL: "https://compute.example.com/api/downloads"}, f.st, nil)
	r = create(`{"nodeIds":["node_up"],"kind":"upgrade","upgrade":{"version":"0.2.0"}}`)
	if up, _ := r.Body["commands"].([]any)[0].(map[string]any)["upgrade"].(map[string]any); up["baseUrl"] != "https://compute.example.com/api/downloads" {
		t.Fatalf("configured base URL: %v", r.Body)
	}
}
