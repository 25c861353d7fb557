package api_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	"github.com/better-compute/better-compute/installer/manifest"
)

// TestReleasePinMethods: release.pinsAdd accepts only a statement signed by
// a pinned key and of its action (admin only); the pins in force follow
// the accepted statements; release.pinsRemove is refused while a live node
// holds no pin of the current release's signer, naming it, and for the
// signer itself; the caller's mistakes are INVALID_ARGUMENT with their
// field.
func TestReleasePinMethods(t *testing.T) {
	t.Parallel()
	key := func() ([]byte, string) {
		_, priv, pin, err := manifest.GenerateKey("")
		if err != nil {
			t.Fatal(err)
		}
		return priv, pin
	}
	oldKey, oldPin := key()
	newKey, newPin := key()
	otherKey, _ := key()
	stmt := func(priv []byte, action, pin string) string {
		t.Helper()
		sk, err := manifest.ParsePrivateKey(priv, "")
		if err != nil {
			t.Fatal(err)
		}
		doc, sig, err := manifest.SignPinStatement(action, pin, sk, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return `{"statement":"` + base64.StdEncoding.EncodeToString(doc) + `","signature":"` + base64.StdEncoding.EncodeToString(sig) + `"}`
	}
	st := sqlitetest.Open(t)
	ctx := context.Background()
	f := &fixture{t: t, st: st, srv: api.New(api.Config{Secret: strings.Repeat("s", 32),
		Releases: signedReleases{"0.2.0": signRelease(t, newKey, "0.2.0")}, ReleasePins: []string{oldPin}}, st, nil)}
	f.admin = f.token(store.RoleAdmin, 0)

	wantCode(t, f.call("release.pinsAdd", f.admin, stmt(otherKey, "add", newPin), peer), http.StatusBadRequest, "INVALID_ARGUMENT", "statement")
	wantCode(t, f.call("release.pinsAdd", f.admin, stmt(newKey, "add", otherKeyPin(t, otherKey)), peer), http.StatusBadRequest, "INVALID_ARGUMENT", "statement")
	wantCode(t, f.call("release.pinsAdd", f.admin, stmt(oldKey, "remove", newPin), peer), http.StatusBadRequest, "INVALID_ARGUMENT", "statement")
	wantCode(t, f.call("release.pinsAdd", f.admin, `{"signature":"eA=="}`, peer), http.StatusBadRequest, "INVALID_ARGUMENT", "statement")
	wantCode(t, f.call("release.pinsAdd", f.admin, `{"statement":"eA==","signature":"`+base64.StdEncoding.EncodeToString(make([]byte, 4<<10))+`"}`, peer),
		http.StatusBadRequest, "INVALID_ARGUMENT", "signature")
	wantCode(t, f.call("release.pinsStatus", f.admin, `{"pin":"sha256/short"}`, peer), http.StatusBadRequest, "INVALID_ARGUMENT", "pin")
	if r := f.call("release.pinsAdd", f.token(store.RoleOperator, 0), stmt(oldKey, "add", newPin), peer); r.Code != http.StatusForbidden {
		t.Fatalf("release.pinsAdd as operator = %d %v", r.Code, r.Body)
	}

	r := f.call("release.pinsAdd", f.admin, stmt(oldKey, "add", newPin), peer)
	if pins, _ := r.Body["pins"].([]any); r.Code != http.StatusOK || len(pins) != 2 || pins[1] != newPin || r.Body["statements"] != 1.0 {
		t.Fatalf("release.pinsAdd = %d %v", r.Code, r.Body)
	}
	sts, err := st.ReleasePinStatements(ctx)
	if err != nil || len(sts) != 1 || sts[0].Pin != newPin || sts[0].Action != "add" || !strings.HasPrefix(sts[0].AddedBy, "token:") {
		t.Fatalf("stored statements = %+v, %v", sts, err)
	}

	// A live node that holds only the old pin cannot verify 0.2.0 (the
	// new key's) without it: removing the old pin is refused, naming it.
	site, _ := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	pool, _ := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_a", PoolID: pool.ID, Hostname: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.SessionOpen(ctx, &store.SessionOpenParams{NodeID: "node_a", SessionID: "sess_a", GatewayID: "gw-1"}); err != nil {
		t.Fatal(err)
	}
	if err := st.NodeReleasePinsSet(ctx, "node_a", []string{oldPin}, nil); err != nil {
		t.Fatal(err)
	}
	r = f.call("release.pinsStatus", f.admin, `{"pin":"`+newPin+`"}`, peer)
	if ids, _ := r.Body["missingNodeIds"].([]any); r.Code != http.StatusOK || r.Body["liveNodes"] != 1.0 || len(ids) != 1 || ids[0] != "node_a" {
		t.Fatalf("release.pinsStatus = %d %v", r.Code, r.Body)
	}
	r = f.call("release.pinsRemove", f.admin, stmt(newKey, "remove", oldPin), peer)
	wantCode(t, r, http.StatusConflict, "CONFLICT", "")
	if msg, _ := r.Body["message"].(string); !strings.Contains(msg, "node_a") || !strings.Contains(msg, "0.2.0") {
		t.Fatalf("refused remove says %q, want the node and the release", msg)
	}
	// Removing the signer of the current release: refused.
	r = f.call("release.pinsRemove", f.admin, stmt(oldKey, "remove", newPin), peer)
	wantCode(t, r, http.StatusConflict, "CONFLICT", "")
	if msg, _ := r.Body["message"].(string); !strings.Contains(msg, "signed by the key of "+newPin) {
		t.Fatalf("refused remove of the signer says %q", msg)
	}

	// Once the node holds the new pin, the old one goes.
	if err := st.NodeReleasePinsSet(ctx, "node_a", []string{oldPin, newPin}, nil); err != nil {
		t.Fatal(err)
	}
	r = f.call("release.pinsRemove", f.admin, stmt(newKey, "remove", oldPin), peer)
	if pins, _ := r.Body["pins"].([]any); r.Code != http.StatusOK || len(pins) != 1 || pins[0] != newPin {
		t.Fatalf("release.pinsRemove = %d %v", r.Code, r.Body)
	}
	// The old key is no longer pinned by the deployment: it signs nothing.
	wantCode(t, f.call("release.pinsAdd", f.admin, stmt(oldKey, "add", otherKeyPin(t, otherKey)), peer), http.StatusBadRequest, "INVALID_ARGUMENT", "statement")
}

// otherKeyPin is the pin of a private key.
func otherKeyPin(t *testing.T, priv []byte) string {
	t.Helper()
	sk, err := manifest.ParsePrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	pk, err := manifest.PublicKeyOf(sk)
	if err != nil {
		t.Fatal(err)
	}
	return manifest.Pin(pk)
}
