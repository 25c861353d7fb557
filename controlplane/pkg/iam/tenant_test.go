package iam_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
)

// TestTenantStopped: a token of a tenant below a suspended one is refused
// within StoppedRefresh (5 s) although its decision is cached for 30 s,
// Recheck sees the suspension at once, resume restores the token, and a
// principal carries its tenant (docs/tenants.md).
func TestTenantStopped(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	parent, err := st.TenantCreate(ctx, &store.TenantCreateParams{Name: "parent", ParentID: store.RootTenant})
	if err != nil {
		t.Fatal(err)
	}
	child, err := st.TenantCreate(ctx, &store.TenantCreateParams{Name: "child", ParentID: parent.ID})
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{now: time.Now()}
	a := iam.NewAuthenticator(iam.Config{Now: c.Now}, st)
	secret, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleOperator, TenantID: child.ID})
	if err != nil {
		t.Fatal(err)
	}
	p, err := a.Authenticate(ctx, secret, inNet)
	if err != nil {
		t.Fatal(err)
	}
	if p.TenantID != child.ID || p.TenantPath != child.Path || !p.Sees(child.Path) || p.Sees(parent.Path) {
		t.Fatalf("principal = %+v", p)
	}
	if _, err := st.TenantSetSuspended(ctx, parent.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Recheck(ctx, secret, inNet); !errors.Is(err, iam.ErrTenantStopped) || !iam.IsRefusal(err) {
		t.Fatalf("recheck after the parent's suspension: %v", err)
	}
	c.add(iam.DefaultStoppedRefresh)
	if _, err := a.Authenticate(ctx, secret, inNet); !errors.Is(err, iam.ErrTenantStopped) {
		t.Fatalf("%v after the parent's suspension: %v, want ErrTenantStopped", iam.DefaultStoppedRefresh, err)
	}
	if _, err := st.TenantSetSuspended(ctx, parent.ID, false); err != nil {
		t.Fatal(err)
	}
	c.add(iam.DefaultStoppedRefresh)
	if _, err := a.Authenticate(ctx, secret, inNet); err != nil {
		t.Fatalf("after resume: %v", err)
	}
	if _, err := st.TenantDelete(ctx, &store.TenantDeleteParams{ID: parent.ID}); err != nil {
		t.Fatal(err)
	}
	c.add(iam.DefaultStoppedRefresh)
	if _, err := a.Authenticate(ctx, secret, inNet); !errors.Is(err, iam.ErrTenantStopped) {
		t.Fatalf("after the parent's deletion: %v", err)
	}
}
