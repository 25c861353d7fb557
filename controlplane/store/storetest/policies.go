package storetest

import (
	"context"
	"slices"
	"testing"

	"github.com/better-compute/better-compute/controlplane/store"
)

// testPolicyDocuments: a tenant's document is replaced whole, its version
// counts applies, an expected version that no longer holds is a conflict
// (two applies that read one version cannot both land), lists keep to the
// subtree asked for, and the stamp moves with every apply.
func testPolicyDocuments(ctx context.Context, t *testing.T, h *Harness) {
	if _, err := h.Store.PolicyDocumentGet(ctx, store.RootTenant); err == nil {
		t.Fatal("a fresh store has a root policy document")
	} else {
		wantErr(t, err, store.ErrNotFound)
	}
	stamp0 := must(h.Store.PolicyStamp(ctx))
	child := must(h.Store.TenantCreate(ctx, &store.TenantCreateParams{Name: "policy-child", ParentID: store.RootTenant}))

	_, err := h.Store.PolicyDocumentPut(ctx, &store.PolicyDocument{TenantID: child.ID, Document: "x"}, 3)
	wantErr(t, err, store.ErrConflict)
	d1 := must(h.Store.PolicyDocumentPut(ctx, &store.PolicyDocument{TenantID: child.ID, Document: "policies: []\n",
		Names: []string{"a", "b"}, UpdatedBy: "token:tok_1"}, 0))
	if d1.Version != 1 || !slices.Equal(d1.Names, []string{"a", "b"}) || d1.UpdatedBy != "token:tok_1" || d1.UpdatedAt.IsZero() {
		t.Fatalf("first put = %+v", d1)
	}
	_, err = h.Store.PolicyDocumentPut(ctx, &store.PolicyDocument{TenantID: child.ID, Document: "y"}, 0)
	wantErr(t, err, store.ErrConflict)
	d2 := must(h.Store.PolicyDocumentPut(ctx, &store.PolicyDocument{TenantID: child.ID, Document: "two"}, 1))
	_, err = h.Store.PolicyDocumentPut(ctx, &store.PolicyDocument{TenantID: child.ID, Document: "lost"}, 1)
	wantErr(t, err, store.ErrConflict)
	d3 := must(h.Store.PolicyDocumentPut(ctx, &store.PolicyDocument{TenantID: child.ID, Document: "three"}, store.AnyPolicyVersion))
	if d2.Version != 2 || d3.Version != 3 || len(d2.Names) != 0 {
		t.Fatalf("versions %d, %d (names %q)", d2.Version, d3.Version, d2.Names)
	}
	if got := must(h.Store.PolicyDocumentGet(ctx, child.ID)); got.Document != "three" || got.Version != 3 {
		t.Fatalf("get = %+v", got)
	}
	must(h.Store.PolicyDocumentPut(ctx, &store.PolicyDocument{TenantID: store.RootTenant, Document: "root"}, store.AnyPolicyVersion))
	if s := must(h.Store.PolicyStamp(ctx)); s != stamp0+4 {
		t.Fatalf("stamp %d after four applies from %d", s, stamp0)
	}
	all := must(h.Store.PolicyDocumentList(ctx, &store.ListParams{}))
	within := must(h.Store.PolicyDocumentList(ctx, &store.ListParams{Within: child.Path}))
	if len(all) < 2 || len(within) != 1 || within[0].TenantID != child.ID {
		t.Fatalf("list: all %d, within the child %d", len(all), len(within))
	}
}
