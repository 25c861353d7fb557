package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/store"
)

// TestPKIRotationMethods: start, status with counts, an advance refused
// with what is missing, a forced one, rollback, and the caller's mistakes
// refused with their field.
func TestPKIRotationMethods(t *testing.T) {
	f := newFixture(t)
	wantCode(t, f.call("pki.rotationStatus", f.admin, `{}`, peer), http.StatusNotFound, "NOT_FOUND", "")
	if _, err := bootstrap.InitBundle(context.Background(), f.st, strings.Repeat("s", 32), "td.example"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, f.call("pki.rotationStart", f.admin, `{"ca":"release"}`, peer), http.StatusBadRequest, "INVALID_ARGUMENT", "ca")
	wantCode(t, f.call("pki.rotationStart", f.admin, `{"threshold":1.5}`, peer), http.StatusBadRequest, "INVALID_ARGUMENT", "threshold")
	wantCode(t, f.call("pki.rotationStart", f.admin, `{"reason":"`+strings.Repeat("x", 201)+`"}`, peer), http.StatusBadRequest, "INVALID_ARGUMENT", "reason")
	wantCode(t, f.call("pki.rotationAdvance", f.admin, `{}`, peer), http.StatusNotFound, "NOT_FOUND", "")
	if r := f.call("pki.rotationStart", f.token(store.RoleOperator, 0), `{}`, peer); r.Code != http.StatusForbidden {
		t.Fatalf("pki.rotationStart as operator = %d %v", r.Code, r.Body)
	}

	r := f.call("pki.rotationStart", f.admin, `{"threshold":1}`, peer)
	ro, _ := r.Body["rotation"].(map[string]any)
	if r.Code != http.StatusOK || ro["phase"] != store.RotationPropagating || ro["newCaId"] == ro["oldCaId"] {
		t.Fatalf("pki.rotationStart = %d %v", r.Code, r.Body)
	}
	wantCode(t, f.call("pki.rotationStart", f.admin, `{}`, peer), http.StatusConflict, "CONFLICT", "")
	// No live node is no proof: advance refuses, saying so, and --force
	// moves on; an activated rotation with no node certificate left on the
	// old CA retires at once.
	r = f.call("pki.rotationAdvance", f.admin, `{}`, peer)
	wantCode(t, r, http.StatusConflict, "CONFLICT", "")
	if msg, _ := r.Body["message"].(string); !strings.Contains(msg, "0 of 0 live nodes acknowledged") {
		t.Fatalf("refused advance with no live node says %q", msg)
	}
	for _, step := range []struct{ body, want string }{{`{"force":true}`, store.RotationActivated}, {`{}`, store.RotationRetired}} {
		r = f.call("pki.rotationAdvance", f.admin, step.body, peer)
		if ro, _ := r.Body["rotation"].(map[string]any); r.Code != http.StatusOK || ro["phase"] != step.want {
			t.Fatalf("pki.rotationAdvance %s = %d %v, want %s", step.body, r.Code, r.Body, step.want)
		}
	}
	wantCode(t, f.call("pki.rotationRollback", f.admin, `{}`, peer), http.StatusNotFound, "NOT_FOUND", "")

	// A node on the old CA holds the next retire back until forced.
	site, _ := f.st.SiteCreate(context.Background(), &store.SiteCreateParams{Name: "s", Region: "r"})
	pool, _ := f.st.PoolCreate(context.Background(), &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	future := time.Now().Add(24 * time.Hour)
	if _, err := f.st.NodeUpsert(context.Background(), &store.NodeUpsertParams{ID: "node_a", PoolID: pool.ID, Hostname: "a",
		CertSerial: "01", CertNotAfter: &future, CertCAID: "someca"}); err != nil {
		t.Fatal(err)
	}
	f.call("pki.rotationStart", f.admin, `{}`, peer)
	f.call("pki.rotationAdvance", f.admin, `{"force":true}`, peer) // no live node: forced
	r = f.call("pki.rotationAdvance", f.admin, `{}`, peer)
	wantCode(t, r, http.StatusConflict, "CONFLICT", "")
	if msg, _ := r.Body["message"].(string); !strings.Contains(msg, "1 nodes hold a valid certificate from another CA") {
		t.Fatalf("refused advance says %q, want what is missing", msg)
	}
	r = f.call("pki.rotationStatus", f.admin, `{}`, peer)
	if ro, _ := r.Body["rotation"].(map[string]any); ro["nodesOffNewCa"] != 1.0 || ro["ready"] == true {
		t.Fatalf("status = %v", r.Body)
	}
	r = f.call("pki.rotationRollback", f.admin, `{"reason":"test"}`, peer)
	if ro, _ := r.Body["rotation"].(map[string]any); r.Code != http.StatusOK || ro["phase"] != store.RotationRolledBack {
		t.Fatalf("pki.rotationRollback = %d %v", r.Code, r.Body)
	}
}

// TestPKIGatewayRotationMethods: a gateway-CA rotation through the API,
// beside the node CA's: join tokens made while it is open pin both CAs,
// and status names the tokens made before it that pin only the old one.
func TestPKIGatewayRotationMethods(t *testing.T) {
	f := newFixture(t)
	if _, err := bootstrap.InitBundle(context.Background(), f.st, strings.Repeat("s", 32), "td.example"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, f.call("pki.rotationStatus", f.admin, `{"ca":"gateway"}`, peer), http.StatusNotFound, "NOT_FOUND", "")
	if r := f.call("sites.create", f.admin, `{"name":"s1","region":"r"}`, peer); r.Code != http.StatusOK {
		t.Fatalf("sites.create = %d %v", r.Code, r.Body)
	}
	if r := f.call("pools.create", f.admin, `{"name":"default","site":"s1"}`, peer); r.Code != http.StatusOK {
		t.Fatalf("pools.create = %d %v", r.Code, r.Body)
	}
	mk := func() (token, id string) {
		t.Helper()
		r := f.call("joinTokens.create", f.admin, `{"pool":"default","maxUses":2}`, peer)
		jt, _ := r.Body["joinToken"].(map[string]any)
		token, _ = r.Body["token"].(string)
		id, _ = jt["id"].(string)
		if r.Code != http.StatusOK || token == "" {
			t.Fatalf("joinTokens.create = %d %v", r.Code, r.Body)
		}
		return token, id
	}
	before, beforeID := mk()
	if !strings.HasPrefix(before, "bct1.") {
		t.Fatalf("a token outside a gateway-CA rotation is %.5s, want bct1", before)
	}
	r := f.call("pki.rotationStart", f.admin, `{"ca":"gateway","reason":"test"}`, peer)
	ro, _ := r.Body["rotation"].(map[string]any)
	if r.Code != http.StatusOK || ro["ca"] != store.RotationCAGateway || ro["phase"] != store.RotationPropagating {
		t.Fatalf("pki.rotationStart gateway = %d %v", r.Code, r.Body)
	}
	wantCode(t, f.call("pki.rotationStart", f.admin, `{"ca":"gateway"}`, peer), http.StatusConflict, "CONFLICT", "")
	wantCode(t, f.call("pki.rotationStatus", f.admin, `{}`, peer), http.StatusNotFound, "NOT_FOUND", "")
	if during, _ := mk(); !strings.HasPrefix(during, "bct2.") {
		t.Fatalf("a token made while a gateway-CA rotation is open is %.5s, want bct2 (two pins)", during)
	}
	r = f.call("pki.rotationAdvance", f.admin, `{"ca":"gateway","force":true}`, peer)
	if ro, _ := r.Body["rotation"].(map[string]any); r.Code != http.StatusOK || ro["phase"] != store.RotationActivated {
		t.Fatalf("pki.rotationAdvance gateway --force = %d %v", r.Code, r.Body)
	}
	r = f.call("pki.rotationStatus", f.admin, `{"ca":"gateway"}`, peer)
	ro, _ = r.Body["rotation"].(map[string]any)
	if ids, _ := ro["oldPinTokenIds"].([]any); len(ids) != 1 || ids[0] != beforeID {
		t.Fatalf("status names old-pin tokens %v, want [%s]", ro["oldPinTokenIds"], beforeID)
	}
	r = f.call("pki.rotationAdvance", f.admin, `{"ca":"gateway"}`, peer)
	wantCode(t, r, http.StatusConflict, "CONFLICT", "")
	if msg, _ := r.Body["message"].(string); !strings.Contains(msg, beforeID) {
		t.Fatalf("refused retire says %q, want the token %s named", msg, beforeID)
	}
}
