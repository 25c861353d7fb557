package api_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	"github.com/better-compute/better-compute/installer/manifest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// signedReleases is a downloads folder of signed releases: version to
// manifest and signature.
type signedReleases map[string][2][]byte

func (r signedReleases) Versions(string) []string {
	var out []string
	for v := range r {
		out = append(out, v)
	}
	return out
}

func (r signedReleases) Manifest(v string) ([]byte, []byte, error) {
	m, ok := r[v]
	if !ok {
		return nil, nil, errors.New("no signed release manifest")
	}
	return m[0], m[1], nil
}

// signRelease signs a manifest of version listing a linux/amd64 bcd.
func signRelease(t *testing.T, priv []byte, version string) [2][]byte {
	t.Helper()
	sum := sha256.Sum256([]byte(version))
	now := time.Now().UTC().Truncate(time.Second)
	m := &manifest.Manifest{Version: version, CreatedAt: now.Add(-time.Hour), Artifacts: []manifest.Artifact{{
		Name: "bcd_linux_amd64/bcd", OS: "linux", Arch: "amd64", SHA256: hex.EncodeToString(sum[:]), Size: 7,
		Kind: manifest.KindBinary, Binary: "bcd"}}}
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	sk, err := manifest.ParsePrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	sig, err := manifest.Sign(b, sk, now)
	if err != nil {
		t.Fatal(err)
	}
	return [2][]byte{b, sig}
}

// TestRolloutsCreateVerifiesTheRelease: a rollout is refused, with a
// clear INVALID_ARGUMENT naming version, when the release is missing, is
// signed by an unpinned key, or when no key is pinned; a good one is
// created (operator role, audited), a second on the pool is CONFLICT, and
// pause, resume and abort move it only from the states they allow.
func TestRolloutsCreateVerifiesTheRelease(t *testing.T) {
	t.Parallel()
	_, good, pin, err := manifest.GenerateKey("")
	if err != nil {
		t.Fatal(err)
	}
	_, other, _, err := manifest.GenerateKey("")
	if err != nil {
		t.Fatal(err)
	}
	rel := signedReleases{"0.2.0": signRelease(t, good, "0.2.0"), "0.3.0": signRelease(t, other, "0.3.0")}
	st := sqlitetest.Open(t)
	ctx := context.Background()
	site, _ := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"node_a", "node_b"} {
		if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: id, MachineID: id, OS: "linux", Arch: "amd64", BCDVersion: "0.1.0"}); err != nil {
			t.Fatal(err)
		}
	}
	mk := func(cfg api.Config) *fixture {
		cfg.Secret = strings.Repeat("s", 32)
		cfg.DownloadsURL = "https://compute.example.com/api/downloads"
		f := &fixture{t: t, st: st, srv: api.New(cfg, st, nil)}
		f.admin = f.token(store.RoleAdmin, 0)
		return f
	}
	f := mk(api.Config{Releases: rel, ReleasePins: []string{pin}})
	op := f.token(store.RoleOperator, 0)
	viewer := f.token(store.RoleViewer, 0)

	for _, c := range []struct{ body, field, says string }{
		{`{"version":"0.9.0","pool":"p"}`, "version", "not in the downloads folder"},
		{`{"version":"0.3.0","pool":"p"}`, "version", "does not verify against downloads.releasePins"},
		{`{"version":"v1","pool":"p"}`, "version", "not a release version"},
		{`{"version":"0.2.0","pool":"nope"}`, "pool", "no pool"},
		{`{"version":"0.2.0","pool":"p","wave":"0"}`, "wave", "want a count"},
		{`{"version":"0.2.0","pool":"p","maxUnavailable":"200%"}`, "maxUnavailable", "1% to 100%"},
		{`{"version":"0.2.0","pool":"p","timeout":"0s"}`, "timeout", "must be"},
		{`{"version":"0.2.0","pool":"p","canary":1000}`, "canary", "must be"},
		{`{"version":"0.2.0","pool":"p","baseUrl":"ftp://x/downloads"}`, "baseUrl", "http(s)://host/path"},
	} {
		r := f.call("rollouts.create", op, c.body, peer)
		status, code := http.StatusBadRequest, apiv1.CodeInvalidArgument
		if c.field == "pool" {
			status, code = http.StatusNotFound, apiv1.CodeNotFound
		}
		wantCode(t, r, status, code, c.field)
		if msg, _ := r.Body["message"].(string); !strings.Contains(msg, c.says) {
			t.Errorf("%s: message %q, want it to say %q", c.body, msg, c.says)
		}
	}
	unpinned := mk(api.Config{Releases: rel})
	r := unpinned.call("rollouts.create", unpinned.admin, `{"version":"0.2.0","pool":"p"}`, peer)
	wantCode(t, r, http.StatusBadRequest, apiv1.CodeInvalidArgument, "version")
	noDownloads := mk(api.Config{ReleasePins: []string{pin}})
	wantCode(t, noDownloads.call("rollouts.create", noDownloads.admin, `{"version":"0.2.0","pool":"p"}`, peer),
		http.StatusBadRequest, apiv1.CodeInvalidArgument, "version")
	// With no downloads at all the release is what is missing, not a
	// base URL (naming baseUrl sent callers to a flag that cannot help).
	bare := &fixture{t: t, st: st, srv: api.New(api.Config{Secret: strings.Repeat("s", 32)}, st, nil)}
	bare.admin = bare.token(store.RoleAdmin, 0)
	wantCode(t, bare.call("rollouts.create", bare.admin, `{"version":"0.2.0","pool":"p"}`, peer),
		http.StatusBadRequest, apiv1.CodeInvalidArgument, "version")
	wantCode(t, f.call("rollouts.create", viewer, `{"version":"0.2.0","pool":"p"}`, peer), http.StatusForbidden, apiv1.CodePermissionDenied, "")

	r = f.call("rollouts.create", op, `{"version":"0.2.0","pool":"p","canary":1,"wave":"50%","soak":"30s","drain":false}`, peer)
	if r.Code != http.StatusOK {
		t.Fatalf("create: %d %v", r.Code, r.Body)
	}
	ro := r.Body["rollout"].(map[string]any)
	id := ro["id"].(string)
	if ro["state"] != "pending" || ro["wave"] != "50%" || ro["maxUnavailable"] != "50%" || ro["soak"] != "30s" || ro["timeout"] != "600s" ||
		ro["drain"] != nil || ro["baseUrl"] != "https://compute.example.com/api/downloads" || len(r.Body["nodes"].([]any)) != 2 {
		t.Fatalf("created rollout = %v", r.Body)
	}
	r = f.call("rollouts.create", op, `{"version":"0.2.0","pool":"p"}`, peer)
	wantCode(t, r, http.StatusConflict, apiv1.CodeConflict, "pool")
	if msg, _ := r.Body["message"].(string); !strings.Contains(msg, id) {
		t.Errorf("conflict message %q does not name %s", msg, id)
	}
	// pending: pause and resume refused, abort allowed.
	wantCode(t, f.call("rollouts.pause", op, `{"id":"`+id+`"}`, peer), http.StatusConflict, apiv1.CodeConflict, "id")
	wantCode(t, f.call("rollouts.resume", op, `{"id":"`+id+`"}`, peer), http.StatusConflict, apiv1.CodeConflict, "id")
	wantCode(t, f.call("rollouts.get", viewer, `{"id":"roll_none"}`, peer), http.StatusNotFound, apiv1.CodeNotFound, "id")
	if r := f.call("rollouts.get", viewer, `{"id":"`+id+`"}`, peer); r.Code != http.StatusOK {
		t.Fatalf("get: %v", r.Body)
	}
	r = f.call("rollouts.abort", op, `{"id":"`+id+`","reason":"testing"}`, peer)
	if r.Code != http.StatusOK || r.Body["rollout"].(map[string]any)["state"] != "aborted" || r.Body["rollout"].(map[string]any)["reason"] != "testing" {
		t.Fatalf("abort: %v", r.Body)
	}
	wantCode(t, f.call("rollouts.abort", op, `{"id":"`+id+`"}`, peer), http.StatusConflict, apiv1.CodeConflict, "id")
	if r := f.call("rollouts.list", viewer, `{"pool":"p"}`, peer); r.Code != http.StatusOK || len(r.Body["rollouts"].([]any)) != 1 {
		t.Fatalf("list: %v", r.Body)
	}
	// Every mutating call was audited, refused ones included.
	rows, err := st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "rollouts.", Limit: store.MaxListLimit})
	if err != nil || len(rows) < 14 {
		t.Fatalf("audit rows for rollouts.*: %d (%v)", len(rows), err)
	}
}
