package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// TestCommandsAsRootNeedsAdmin: exec with asRoot is an admin's right, the
// rule of a root shell (issue 27): an operator is refused 403 on field
// exec.asRoot, audited, with no command written; the operator's exec
// without asRoot and the admin's with it are created.
func TestCommandsAsRootNeedsAdmin(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	srv := api.New(api.Config{Secret: strings.Repeat("s", 32)}, st, nil)
	admin, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	operator, opTok, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	site, _ := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "default"})
	pool, _ := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_r", PoolID: pool.ID, Hostname: "r", MachineID: "m"}); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, st: st, srv: srv}
	root := `{"nodeIds":["node_r"],"kind":"exec","exec":{"argv":["id","-u"],"asRoot":true}}`
	r := f.call("commands.create", operator, root, peer)
	if r.Code != 403 || r.Body["code"] != apiv1.CodePermissionDenied || r.Body["field"] != "exec.asRoot" {
		t.Fatalf("an operator's asRoot exec = %d %v, want 403 PERMISSION_DENIED on exec.asRoot", r.Code, r.Body)
	}
	entries, err := st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "commands.create", Actor: "token:" + opTok.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Outcome != apiv1.CodePermissionDenied {
		t.Fatalf("audit rows of the refusal = %+v, want one PERMISSION_DENIED", entries)
	}
	if cmds, err := st.CommandList(ctx, &store.CommandListParams{}); err != nil || len(cmds) != 0 {
		t.Fatalf("commands after the refusal: %d (%v), want none", len(cmds), err)
	}
	if r := f.call("commands.create", operator, strings.Replace(root, "true", "false", 1), peer); r.Code != 200 {
		t.Fatalf("an operator's exec without asRoot = %d %v, want 200", r.Code, r.Body)
	}
	if r := f.call("commands.create", admin, root, peer); r.Code != 200 {
		t.Fatalf("an admin's asRoot exec = %d %v, want 200", r.Code, r.Body)
	}
}
