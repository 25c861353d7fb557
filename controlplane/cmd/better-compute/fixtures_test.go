package main

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
)

// mustSitePool creates in st the site siteName (region eu-1) and the pool
// poolName at it.
func mustSitePool(t *testing.T, st store.Store, siteName, poolName string) (*store.Site, *store.Pool) {
	t.Helper()
	ctx := context.Background()
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: siteName, Region: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: poolName, SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	return site, pool
}

// mustToken is the secret of a new API token of role (store.RoleAdmin,
// ...) in st.
func mustToken(t *testing.T, st store.Store, role string) string {
	t.Helper()
	token, _, err := iam.Create(context.Background(), st, iam.CreateParams{Role: role})
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// apiCLI serves the API over st in-process (deployment secret secret) and
// returns a cli that calls it with token, in a data directory and a home
// of its own.
func apiCLI(t *testing.T, st store.Store, secret, token string) cli {
	t.Helper()
	srv := httptest.NewServer(api.New(api.Config{Secret: secret}, st, nil).Handler())
	t.Cleanup(srv.Close)
	return cli{t: t, env: map[string]string{config.EnvDataDir: t.TempDir(), "HOME": t.TempDir(), envURL: srv.URL, envToken: token}}
}
