package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/proto/jointoken"
)

// reinstallFixture is a fixture with a PKI bundle, a node node_rx in pool
// p of site s (region eu-1), and gateways in that region and another.
func reinstallFixture(t *testing.T) (*fixture, *pki.Bundle, *store.Pool) {
	t.Helper()
	f := newFixture(t)
	ctx := context.Background()
	b, err := pki.Init(pki.InitOptions{TrustDomain: "rx.test"})
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := b.SealBundle(strings.Repeat("s", 32))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.st.PKIBundleCreate(ctx, &store.PKIBundle{TrustDomain: "rx.test", Sealed: sealed}); err != nil {
		t.Fatal(err)
	}
	site, err := f.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := f.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_rx", PoolID: pool.ID, Hostname: "h"}); err != nil {
		t.Fatal(err)
	}
	for _, g := range []store.GatewayUpsertParams{
		{ID: "gw-eu", Region: "eu-1", Address: "https://gw-eu.example:8443"},
		{ID: "gw-eu-draining", Region: "eu-1", Address: "https://gw-drain.example:8443", Draining: true},
		{ID: "gw-us", Region: "us-1", Address: "https://gw-us.example:8443"},
	} {
		if _, err := f.st.GatewayUpsert(ctx, &g); err != nil {
			t.Fatal(err)
		}
	}
	return f, b, pool
}

func TestNodesReinstall(t *testing.T) {
	t.Parallel()
	f, b, pool := reinstallFixture(t)
	ctx := context.Background()

	r := f.call("nodes.reinstall", f.admin, `{"node":"node_rx","ttl":"1800s"}`, peer)
	if r.Code != http.StatusOK {
		t.Fatalf("nodes.reinstall = %d %v", r.Code, r.Body)
	}
	secret, _ := r.Body["token"].(string)
	tok, err := jointoken.Parse(secret)
	if err != nil {
		t.Fatalf("token %q: %v", secret, err)
	}
	if tok.Pin() != b.GatewayPin() {
		t.Fatalf("token pin %s, want the gateway CA's %s", tok.Pin(), b.GatewayPin())
	}
	jt, _ := r.Body["joinToken"].(map[string]any)
	if jt["id"] != tok.ID() || jt["nodeId"] != "node_rx" || jt["poolId"] != pool.ID || jt["maxUses"] != float64(1) {
		t.Fatalf("joinToken = %v", jt)
	}
	if gws, _ := r.Body["gatewayUrls"].([]any); len(gws) != 1 || gws[0] != "https://gw-eu.example:8443" {
		t.Fatalf("gatewayUrls = %v, want the live gateway of the node's region only", r.Body["gatewayUrls"])
	}

	// The stored token: one use, bound to the node, in its pool, only the
	// secret's hash kept, expiring after the ttl.
	rec, err := f.st.JoinTokenGet(ctx, tok.ID())
	if err != nil {
		t.Fatal(err)
	}
	if rec.NodeID != "node_rx" || rec.PoolID != pool.ID || rec.MaxUses != 1 || rec.Uses != 0 {
		t.Fatalf("stored token = %+v", rec)
	}
	if left := time.Until(rec.ExpiresAt); left < 29*time.Minute || left > 31*time.Minute {
		t.Fatalf("token expires in %v, want about 30 min", left)
	}

	// The default ttl is 2 h; each call makes a new token.
	r = f.call("nodes.reinstall", f.admin, `{"node":"node_rx"}`, peer)
	if r.Code != http.StatusOK || r.Body["token"] == secret {
		t.Fatalf("second nodes.reinstall = %d %v", r.Code, r.Body)
	}
	id2 := r.Body["joinToken"].(map[string]any)["id"].(string)
	rec2, err := f.st.JoinTokenGet(ctx, id2)
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(rec2.ExpiresAt); left < apiv1.DefaultJoinTokenTTL-time.Minute || left > apiv1.DefaultJoinTokenTTL {
		t.Fatalf("default ttl: expires in %v", left)
	}

	// Audited, naming the node, never holding the token.
	rows, err := f.st.AuditList(ctx, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	last := rows[len(rows)-1]
	if last.Action != "nodes.reinstall" || last.Resource != "node_rx" || last.Outcome != "ok" || strings.Contains(string(last.Details), secret) {
		t.Fatalf("audit row = %+v", last)
	}

	// joinTokens.list shows the binding.
	r = f.call("joinTokens.list", f.admin, `{}`, peer)
	bound := 0
	for _, x := range r.Body["joinTokens"].([]any) {
		if x.(map[string]any)["nodeId"] == "node_rx" {
			bound++
		}
	}
	if bound != 2 {
		t.Fatalf("joinTokens.list = %v, want 2 tokens bound to node_rx", r.Body)
	}
}

func TestNodesReinstallRefusals(t *testing.T) {
	t.Parallel()
	f, _, _ := reinstallFixture(t)
	for _, tc := range []struct {
		body, field string
	}{
		{`{}`, "node"},
		{`{"node":""}`, "node"},
		{`{"node":"../node_rx"}`, "node"},
		{`{"node":"node_rx","ttl":"0s"}`, "ttl"},
		{`{"node":"node_rx","ttl":"-60s"}`, "ttl"},
		{`{"node":"node_rx","ttl":"0.000000001s"}`, "ttl"},
		{`{"node":"node_rx","ttl":"59s"}`, "ttl"},
		{`{"node":"node_rx","ttl":"2592001s"}`, "ttl"},
		{`{"node":"node_rx","maxUses":3}`, "maxUses"},
		{`{"node":"node_rx","ttl":"soon"}`, ""},
	} {
		t.Run(tc.body, func(t *testing.T) {
			wantCode(t, f.call("nodes.reinstall", f.admin, tc.body, peer), http.StatusBadRequest, apiv1.CodeInvalidArgument, tc.field)
		})
	}
	wantCode(t, f.call("nodes.reinstall", f.admin, `{"node":"node_missing"}`, peer), http.StatusNotFound, apiv1.CodeNotFound, "node")

	// Only an admin may make a token that takes over a node.
	for _, role := range []string{store.RoleViewer, store.RoleOperator} {
		wantCode(t, f.call("nodes.reinstall", f.token(role, 0), `{"node":"node_rx"}`, peer), http.StatusForbidden, apiv1.CodePermissionDenied, "")
	}
	toks, err := f.st.JoinTokenList(context.Background(), &store.ListParams{})
	if err != nil || len(toks) != 0 {
		t.Fatalf("refused calls made tokens: %v %v", toks, err)
	}

	// Without a PKI no token can carry a pin.
	g := newFixture(t)
	ctx := context.Background()
	site, _ := g.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	pool, _ := g.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if _, err := g.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_np", PoolID: pool.ID, Hostname: "h"}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, g.call("nodes.reinstall", g.admin, `{"node":"node_np"}`, peer), http.StatusServiceUnavailable, apiv1.CodeUnavailable, "")
}
