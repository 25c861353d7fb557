package api_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/better-compute/better-compute/controlplane/store"
)

// TestAuditList: admin only, newest first, filtered, paged by cursor, each
// row naming the caller's token; bad filters are INVALID_ARGUMENT.
func TestAuditList(t *testing.T) {
	f := newFixture(t)
	for _, name := range []string{"a-1", "a-2", "a-3"} {
		if r := f.call("sites.create", f.admin, fmt.Sprintf(`{"name":%q,"region":"eu-1"}`, name), peer); r.Code != http.StatusOK {
			t.Fatalf("sites.create %s: %d %v", name, r.Code, r.Body)
		}
	}
	f.call("sites.create", f.admin, `{"name":"a-1","region":"eu-1"}`, peer) // CONFLICT
	f.call("pools.create", f.admin, `{"name":"p","site":"a-2"}`, peer)

	wantCode(t, f.call("audit.list", f.token(store.RoleOperator, 0), `{}`, peer), http.StatusForbidden, "PERMISSION_DENIED", "")

	entries := func(body string) ([]map[string]any, string) {
		t.Helper()
		r := f.call("audit.list", f.admin, body, peer)
		if r.Code != http.StatusOK {
			t.Fatalf("audit.list %s: %d %v", body, r.Code, r.Body)
		}
		var out []map[string]any
		list, _ := r.Body["entries"].([]any)
		for _, e := range list {
			out = append(out, e.(map[string]any))
		}
		next, _ := r.Body["nextCursor"].(string)
		return out, next
	}
	all, next := entries(`{}`)
	if len(all) != 5 || next != "" || all[0]["action"] != "pools.create" || all[1]["outcome"] != "CONFLICT" || all[4]["resource"] != "a-1" {
		t.Fatalf("audit.list = %v (next %q)", all, next)
	}
	actor, _ := all[0]["actor"].(string)
	if len(actor) < 7 || actor[:6] != "token:" || all[0]["sourceIp"] != "192.0.2.10" || all[0]["details"] == nil {
		t.Fatalf("newest row = %v", all[0])
	}
	if got, _ := entries(`{"actionPrefix":"sites.","outcome":"ok"}`); len(got) != 3 {
		t.Fatalf("sites. ok = %v", got)
	}
	if got, _ := entries(`{"resource":"a-1","actor":"` + actor + `"}`); len(got) != 2 {
		t.Fatalf("resource a-1 = %v", got)
	}
	if got, _ := entries(`{"since":"2999-01-01T00:00:00Z"}`); len(got) != 0 {
		t.Fatalf("since the future = %v", got)
	}
	if got, _ := entries(`{"until":"2000-01-01T00:00:00Z"}`); len(got) != 0 {
		t.Fatalf("until 2000 = %v", got)
	}

	// Pages of two follow the cursor to the oldest row.
	var ids []any
	cursor := ""
	for range 10 {
		page, next := entries(fmt.Sprintf(`{"page":{"limit":2,"cursor":%q}}`, cursor))
		for _, e := range page {
			ids = append(ids, e["id"])
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if len(ids) != 5 || ids[0] != all[0]["id"] || ids[4] != all[4]["id"] {
		t.Fatalf("paged ids %v, want those of %v", ids, all)
	}

	wantCode(t, f.call("audit.list", f.admin, `{"page":{"cursor":"abc"}}`, peer), http.StatusBadRequest, "INVALID_ARGUMENT", "page.cursor")
	wantCode(t, f.call("audit.list", f.admin, `{"since":"2026-01-02T00:00:00Z","until":"2026-01-01T00:00:00Z"}`, peer),
		http.StatusBadRequest, "INVALID_ARGUMENT", "until")
	long := make([]byte, 300)
	for i := range long {
		long[i] = 'a'
	}
	wantCode(t, f.call("audit.list", f.admin, `{"actor":"`+string(long)+`"}`, peer), http.StatusBadRequest, "INVALID_ARGUMENT", "actor")
	// Reading the log is not itself audited.
	if after, _ := entries(`{}`); len(after) != 5 {
		t.Fatalf("audit.list wrote audit rows: %v", after)
	}
}

// TestPKIRevokeSerial: pki.revoke spells a serial as the CA does and says
// when it was revoked already.
func TestPKIRevokeSerial(t *testing.T) {
	f := newFixture(t)
	r := f.call("pki.revoke", f.admin, `{"serial":"0x00AB:CD"}`, peer)
	if r.Code != http.StatusOK || fmt.Sprint(r.Body["serials"]) != "[0000000000000000000000000000abcd]" || r.Body["alreadyRevoked"] != nil {
		t.Fatalf("pki.revoke = %d %v", r.Code, r.Body)
	}
	if r := f.call("pki.revoke", f.admin, `{"serial":"abcd"}`, peer); r.Body["alreadyRevoked"] != true {
		t.Fatalf("second pki.revoke = %d %v", r.Code, r.Body)
	}
	wantCode(t, f.call("pki.revoke", f.admin, `{"serial":"xyz"}`, peer), http.StatusBadRequest, "INVALID_ARGUMENT", "serial")
	wantCode(t, f.call("pki.revoke", f.admin, `{"serial":"00"}`, peer), http.StatusBadRequest, "INVALID_ARGUMENT", "serial")
}
