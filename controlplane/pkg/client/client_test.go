package client_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// TestTypedMethods calls a real API server through the generated typed
// functions: a create, a list that sees it, a refusal as *client.Error, and
// the role api.proto gives a method enforced for another token.
func TestTypedMethods(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	srv := api.New(api.Config{Secret: strings.Repeat("s", 32)}, st, nil)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	token := func(role string) string {
		secret, _, err := iam.Create(ctx, st, iam.CreateParams{Role: role})
		if err != nil {
			t.Fatal(err)
		}
		return secret
	}
	c := &client.Client{BaseURL: hs.URL + "/api", Token: token(store.RoleAdmin)}

	site, err := c.SitesCreate(ctx, &apiv1.CreateSiteRequest{Name: "lab", Region: "eu-1"})
	if err != nil {
		t.Fatalf("SitesCreate: %v", err)
	}
	if site.GetId() == "" || site.GetName() != "lab" || site.GetCreateTime() == nil {
		t.Fatalf("SitesCreate returned %v", site)
	}
	sites, err := c.SitesList(ctx, &apiv1.ListSitesRequest{})
	if err != nil || len(sites.GetSites()) != 1 || sites.GetSites()[0].GetId() != site.GetId() {
		t.Fatalf("SitesList: %v, %v", sites, err)
	}

	_, err = c.NodesGet(ctx, &apiv1.NodeRequest{Id: "n_missing"})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Code != apiv1.CodeNotFound || apiErr.Status != 404 {
		t.Fatalf("NodesGet of a missing node: %v, want NOT_FOUND 404", err)
	}

	viewer := &client.Client{BaseURL: c.BaseURL, Token: token(store.RoleViewer)}
	if _, err := viewer.SitesList(ctx, &apiv1.ListSitesRequest{}); err != nil {
		t.Fatalf("SitesList as viewer: %v", err)
	}
	_, err = viewer.SitesCreate(ctx, &apiv1.CreateSiteRequest{Name: "lab2", Region: "eu-1"})
	if !errors.As(err, &apiErr) || apiErr.Code != apiv1.CodePermissionDenied {
		t.Fatalf("SitesCreate as viewer: %v, want PERMISSION_DENIED (api.proto: role admin)", err)
	}
}
