package tests

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// poolAOnlyPolicy binds token tokenID (an operator's) to drain and open
// shells on pool a only: an allow on a, and a deny on every resource that
// is not in a (docs/policies.md, "Allowing only on a pool"). Its own
// tests say so.
func poolAOnlyPolicy(tokenID string) string {
	return fmt.Sprintf(`policies:
  - name: pool-a-only
    description: this operator drains and opens shells on pool a only
    bind: {tokens: [%[1]s]}
    statements:
      - effect: allow
        actions: [nodes.drain, nodes.shell]
        resources: {pools: [a]}
      - effect: deny
        actions: [nodes.drain, nodes.shell]
        notResources: {pools: [a]}
tests:
  - name: drain on a
    caller: {token: %[1]s, role: operator}
    action: nodes.drain
    resource: {pool: a}
    expect: allow
  - name: shell on b
    caller: {token: %[1]s, role: operator}
    action: nodes.shell
    resource: {pool: b}
    expect: deny
  - name: another operator is not bound
    caller: {token: tok_other, role: operator}
    action: nodes.drain
    resource: {pool: b}
    expect: allow
`, tokenID)
}

// refusedWith is nil when err is the API's code, else what it was.
func refusedWith(err error, code string) error {
	if ae := (*client.Error)(nil); errors.As(err, &ae) && ae.Code == code {
		return nil
	}
	return fmt.Errorf("got %v, want %s", err, code)
}

// TestPolicyScopesNodeOperationsToAPool: an operator token bound by a
// policy that allows nodes.drain and nodes.shell only on pool a is refused
// (403 PERMISSION_DENIED) on a node of pool b and allowed on a node of
// pool a — through the CLI, the API and the fleet page — while another
// operator, whom the policy does not bind, keeps its built-in role. A
// policy file whose own tests fail is refused and changes nothing, and
// the apply is audited with its diff.
func TestPolicyScopesNodeOperationsToAPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{})
	// inA a simulated node, inB a real bcd (a shell needs one), each in
	// its pool; inB moves to pool a at the end for a shell through the CLI.
	sims := joinSims(t, d, "pol", 1)
	file, _ := d.joinToken(1, time.Hour)
	m := newMachine(t, "policy-shell")
	shellNode := m.mustJoin(d.gatewayURL, file)
	m.node().WaitLine(sessionEstablished.String(), 30*time.Second)
	nodes := []string{sims[0], shellNode}
	admin := &client.Client{BaseURL: d.api + "/api", Token: d.adminToken}
	// Pools a and b at the nodes' site (a node moves within its site).
	home, err := d.st.PoolGet(ctx, mustNode(t, d.st, nodes[0]).PoolID)
	if err != nil {
		t.Fatal(err)
	}
	for _, pool := range []string{"a", "b"} {
		if _, err := admin.PoolsCreate(ctx, &apiv1.CreatePoolRequest{Name: pool, Site: home.SiteID}); err != nil {
			t.Fatal(err)
		}
	}
	inA, inB := nodes[0], nodes[1]
	for node, pool := range map[string]string{inA: "a", inB: "b"} {
		if _, err := admin.NodesMove(ctx, &apiv1.MoveNodeRequest{Id: node, Tenant: store.RootTenant, Pool: pool}); err != nil {
			t.Fatalf("move %s to pool %s: %v", node, pool, err)
		}
	}
	opSecret := strings.TrimSpace(d.cli(d.viaAPI("tokens", "create", "--role", "operator", "--description", "pool a only")...))
	otherSecret := strings.TrimSpace(d.cli(d.viaAPI("tokens", "create", "--role", "operator", "--description", "not bound")...))
	opID := tokenID(t, d.st, opSecret)
	op := &client.Client{BaseURL: d.api + "/api", Token: opSecret}
	other := &client.Client{BaseURL: d.api + "/api", Token: otherSecret}
	undrain := func(node string) {
		t.Helper()
		if _, err := admin.NodesUncordon(ctx, &apiv1.NodeRequest{Id: node}); err != nil {
			t.Fatalf("uncordon %s: %v", node, err)
		}
	}

	// A file whose own tests fail is refused and changes nothing.
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	wrong := strings.Replace(poolAOnlyPolicy(opID), "    resource: {pool: b}\n    expect: deny", "    resource: {pool: b}\n    expect: allow", 1)
	if err := os.WriteFile(bad, []byte(wrong), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := testenv.Run(t, nil, "", d.bc, d.viaAPI("policy", "apply", bad)...)
	if code != 2 || !strings.Contains(stderr, `"shell on b" wants allow, got deny`) {
		t.Fatalf("policy apply of a file whose test fails: exit %d\n%s%s\nwant exit 2 naming the failed test", code, stdout, stderr)
	}
	code, stdout, _ = testenv.Run(t, nil, "", d.bc, d.viaAPI("policy", "test", bad)...)
	if code != 1 || !strings.Contains(stdout, "FAIL shell on b") || !strings.Contains(stdout, "ok   drain on a") {
		t.Fatalf("policy test of that file: exit %d\n%s", code, stdout)
	}
	if got, err := admin.PoliciesGet(ctx, &apiv1.PoliciesGetRequest{}); err != nil || got.Version != 0 {
		t.Fatalf("after the refused apply policies.get = %v, %v; want version 0 (nothing applied)", got, err)
	}
	if _, err := op.NodesDrain(ctx, &apiv1.NodeRequest{Id: inB}); err != nil {
		t.Fatalf("before any policy the operator's drain on pool b: %v", err)
	}
	undrain(inB)

	good := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(good, []byte(poolAOnlyPolicy(opID)), 0o600); err != nil {
		t.Fatal(err)
	}
	out := d.cli(d.viaAPI("policy", "apply", good)...)
	if !strings.Contains(out, "applied version 1") || !strings.Contains(out, "pool-a-only") {
		t.Fatalf("policy apply printed %q", out)
	}
	entries, err := d.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "policies.apply", Outcome: "ok", Limit: 5})
	if err != nil || len(entries) != 1 || !strings.Contains(string(entries[0].Details), "pool-a-only") {
		t.Fatalf("audit of the apply: %v, %v; want one row whose details carry the diff", entries, err)
	}

	// CLI.
	code, stdout, stderr = testenv.Run(t, nil, "", d.bc, "--server", d.api, "--token", opSecret, "nodes", "drain", inB)
	if code != 1 || !strings.Contains(stderr, "nodes.drain refused") || !strings.Contains(stderr, "pool-a-only") {
		t.Fatalf("CLI drain on pool b: exit %d\n%s%s\nwant exit 1, refused by pool-a-only", code, stdout, stderr)
	}
	code, stdout, stderr = testenv.Run(t, nil, "", d.bc, "--server", d.api, "--token", opSecret, "nodes", "shell", inB)
	if code != 1 || !strings.Contains(stderr, "nodes.shell refused") {
		t.Fatalf("CLI shell on pool b: exit %d\n%s%s\nwant exit 1, nodes.shell refused", code, stdout, stderr)
	}
	if code, stdout, stderr = testenv.Run(t, nil, "", d.bc, "--server", d.api, "--token", opSecret, "nodes", "drain", inA); code != 0 {
		t.Fatalf("CLI drain on pool a: exit %d\n%s%s", code, stdout, stderr)
	}
	undrain(inA)

	// API.
	if err := refusedWith(func() error { _, err := op.NodesDrain(ctx, &apiv1.NodeRequest{Id: inB}); return err }(), apiv1.CodePermissionDenied); err != nil {
		t.Fatalf("API drain on pool b: %v", err)
	}
	if err := refusedWith(func() error {
		_, err := op.TunnelsCreate(ctx, &apiv1.CreateTunnelRequest{Node: inB, Kind: "shell"})
		return err
	}(), apiv1.CodePermissionDenied); err != nil {
		t.Fatalf("API shell on pool b: %v", err)
	}
	if _, err := op.NodesDrain(ctx, &apiv1.NodeRequest{Id: inA}); err != nil {
		t.Fatalf("API drain on pool a: %v", err)
	}
	undrain(inA)
	if _, err := op.TunnelsCreate(ctx, &apiv1.CreateTunnelRequest{Node: inA, Kind: "shell"}); err != nil {
		t.Fatalf("API shell on pool a: %v", err)
	}
	// A port forward is not in the policy: the built-in operator role
	// still allows it, on b too; another operator is not bound at all.
	if _, err := op.TunnelsCreate(ctx, &apiv1.CreateTunnelRequest{Node: inB, Kind: "port", Port: 22}); err != nil {
		t.Fatalf("API port forward on pool b (not in the policy): %v", err)
	}
	if _, err := other.NodesDrain(ctx, &apiv1.NodeRequest{Id: inB}); err != nil {
		t.Fatalf("the unbound operator's drain on pool b: %v", err)
	}
	undrain(inB)

	// The fleet page: its actions are API calls through the same evaluator.
	p := newPage(t, t.Context(), d.api)
	p.login(opSecret)
	p.openNode(inB)
	if got := p.fetch("drain on b from the page", "/watch/actions/drain", csrfHeader, `{"target":"`+inB+`"}`); !strings.HasPrefix(got, "403 ") || !strings.Contains(got, "pool-a-only") {
		t.Fatalf("the page's drain on pool b: %q, want 403 by pool-a-only", got)
	}
	if got := p.fetch("shell on b from the page", "/watch/actions/shell", csrfHeader, `{"target":"`+inB+`"}`); !strings.HasPrefix(got, "403 ") {
		t.Fatalf("the page's shell on pool b: %q, want 403", got)
	}
	if got := p.fetch("drain on a from the page", "/watch/actions/drain", csrfHeader, `{"target":"`+inA+`"}`); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("the page's drain on pool a: %q, want 200", got)
	}
	if got := p.fetch("shell on a from the page", "/watch/actions/shell", csrfHeader, `{"target":"`+inA+`"}`); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("the page's shell on pool a: %q, want 200", got)
	}
	for _, n := range []string{inA, inB} {
		if node := mustNode(t, d.st, n); (n == inB) == node.Cordoned {
			t.Fatalf("after the page's actions node %s cordoned=%v", n, node.Cordoned)
		}
	}

	// The real node moved to pool a: the same operator's CLI shell opens.
	if _, err := admin.NodesMove(ctx, &apiv1.MoveNodeRequest{Id: inB, Tenant: store.RootTenant, Pool: "a"}); err != nil {
		t.Fatal(err)
	}
	sh := startShell(t, &tunnelTarget{bc: d.bc, env: []string{"BETTER_COMPUTE_URL=" + d.api, "BETTER_COMPUTE_TOKEN=" + opSecret}, nodeID: inB}, 24, 80)
	sh.send(t, "echo policy-$((6*7))\r")
	sh.expect(t, regexp.MustCompile(`policy-42`))
	sh.send(t, "exit 3\r")
	if code := sh.exit(t, 15*time.Second); code != 3 {
		t.Fatalf("the operator's shell on pool a exited %d, want 3\n%s", code, sh.output())
	}
}

// forwardedFor is a client whose every call says it comes through a
// proxy from addr (X-Forwarded-For), as a load balancer in trustedProxies
// would send it.
func forwardedFor(api, token string, addr *string) *client.Client {
	return &client.Client{BaseURL: api + "/api", Token: token, HTTP: &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("X-Forwarded-For", *addr)
		return http.DefaultTransport.RoundTrip(r)
	})}}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestPolicySourceIPThroughTrustedProxy: a policy that denies a viewer's
// nodes.list unless request.sourceIp is in 203.0.113.0/24 holds through a
// configured trusted proxy (127.0.0.1, the test, sending X-Forwarded-For):
// the same token is allowed from 203.0.113.7 and refused from
// 198.51.100.9, alternately many times, so the authentication cache and
// the cache of allowed reads never serve one address's decision to the
// other. Without the proxy trusted the header is ignored and the token,
// calling from 127.0.0.1, is refused.
func TestPolicySourceIPThroughTrustedProxy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{top: "trustedProxies: [\"127.0.0.1\"]\n"})
	viewerSecret := strings.TrimSpace(d.cli(d.viaAPI("tokens", "create", "--role", "viewer", "--description", "office only")...))
	viewerID := tokenID(t, d.st, viewerSecret)
	doc := fmt.Sprintf(`policies:
  - name: office-only
    bind: {tokens: [%[1]s]}
    statements:
      - effect: deny
        actions: ["nodes.*"]
        condition: '!inCidr(request.sourceIp, "203.0.113.0/24")'
tests:
  - name: from the office
    caller: {token: %[1]s, role: viewer}
    action: nodes.list
    sourceIp: 203.0.113.7
    expect: allow
  - name: from elsewhere
    caller: {token: %[1]s, role: viewer}
    action: nodes.list
    sourceIp: 198.51.100.9
    expect: deny
`, viewerID)
	admin := &client.Client{BaseURL: d.api + "/api", Token: d.adminToken}
	if _, err := admin.PoliciesApply(ctx, &apiv1.PoliciesApplyRequest{Document: doc}); err != nil {
		t.Fatal(err)
	}
	// Each X-Forwarded-For the proxy sends, and whether the caller (its
	// right-most hop) is in the office: a client's own left-most hop is
	// not believed.
	calls := []struct {
		xff     string
		allowed bool
	}{
		{"203.0.113.7", true},
		{"198.51.100.9", false},
		{"198.51.100.9, 203.0.113.7", true},
		{"203.0.113.7, 198.51.100.9", false},
	}
	var addr string
	viewer := forwardedFor(d.api, viewerSecret, &addr)
	for i := range 40 {
		c := calls[i%2]
		if i%5 == 4 {
			c = calls[2+i%2]
		}
		addr = c.xff
		_, err := viewer.NodesList(ctx, &apiv1.ListNodesRequest{})
		if c.allowed && err != nil {
			t.Fatalf("call %d through the proxy from %q: %v, want allowed", i, c.xff, err)
		}
		if !c.allowed {
			if err := refusedWith(err, apiv1.CodePermissionDenied); err != nil {
				t.Fatalf("call %d through the proxy from %q: %v", i, c.xff, err)
			}
		}
	}
	// The viewer calling directly (127.0.0.1, no header) is refused.
	direct := &client.Client{BaseURL: d.api + "/api", Token: viewerSecret}
	if err := refusedWith(func() error { _, err := direct.NodesList(ctx, &apiv1.ListNodesRequest{}); return err }(), apiv1.CodePermissionDenied); err != nil {
		t.Fatalf("the viewer from 127.0.0.1: %v", err)
	}
}
