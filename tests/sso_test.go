package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/oidcprovider"
	"github.com/better-compute/better-compute/tests/testenv"
)

// Single sign-on for people (issue 47, docs/sso.md) against a real OpenID
// provider (zitadel's op package, tests/oidcprovider) on loopback.

const (
	ssoClientID     = "better-compute"
	ssoClientSecret = "sso-client-secret-for-tests"
	ssoPassword     = "correct horse battery staple"
)

// ssoDeployment is a deployment whose iam.oidc names provider p, with the
// groups gpu-ops (operator) and fleet-viewers (viewer) of tenant team-a,
// and a token life of tokenTTL.
func ssoDeployment(t *testing.T, tokenTTL time.Duration) (*deployment, *oidcprovider.Provider, string) {
	t.Helper()
	p := oidcprovider.Start(t, oidcprovider.Config{})
	p.AddClient(oidcprovider.Client{ID: ssoClientID, Secret: ssoClientSecret})
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{top: fmt.Sprintf(`iam:
  oidc:
    issuer: %s
    clientId: %s
    clientSecret: %s
    groups:
      - {group: gpu-ops, tenant: team-a, role: operator}
      - {group: fleet-viewers, tenant: team-a, role: viewer}
    tokenTTL: %s
    sessionTTL: 1h
`, p.Issuer(), ssoClientID, ssoClientSecret, tokenTTL)})
	// The page's callback is at the API's public URL, which defaults to
	// localhost on the API's port (host.publicURL).
	if err := p.SetRedirectURIs(ssoClientID, publicAPI(d)+"/watch/sso/callback"); err != nil {
		t.Fatal(err)
	}
	admin := &client.Client{BaseURL: d.api + "/api", Token: d.adminToken}
	team, err := admin.TenantsCreate(context.Background(), &apiv1.CreateTenantRequest{Name: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	return d, p, team.GetId()
}

// publicAPI is the API's default public URL (host.publicURL: localhost on
// the API's port), where a browser reaches the page.
func publicAPI(d *deployment) string {
	return strings.Replace(d.api, "127.0.0.1", "localhost", 1)
}

// person is someone's shell on their own workstation: the CLI with only the
// server's URL and a home of their own.
type person struct {
	t    *testing.T
	d    *deployment
	home string
}

func (u *person) env() []string {
	return []string{"HOME=" + u.home, "BETTER_COMPUTE_URL=" + u.d.api}
}

func (u *person) run(args ...string) (int, string, string) {
	u.t.Helper()
	return testenv.Run(u.t, u.env(), "", u.d.bc, args...)
}

// credential is the sign-in the CLI keeps for the deployment.
func (u *person) credential() map[string]any {
	u.t.Helper()
	b, err := os.ReadFile(filepath.Join(u.home, ".config", "better-compute", "credentials.json"))
	if err != nil {
		u.t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(u.home, ".config", "better-compute", "credentials.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		u.t.Fatalf("the credentials file: %v, mode %v; want 0600", err, fi.Mode())
	}
	var c struct {
		Servers map[string]map[string]any `json:"servers"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		u.t.Fatal(err)
	}
	return c.Servers[u.d.api+"/api"]
}

// login runs `better-compute login --no-browser` and approves its code at
// the provider as username, as the person would in a browser.
func (u *person) login(p *oidcprovider.Provider, username string) string {
	u.t.Helper()
	proc := testenv.Start(u.t, u.env(), u.d.bc, "login", "--no-browser")
	m := proc.WaitLine(`open (\S+) and enter the code (\S+)`, 60*time.Second)
	if !strings.HasPrefix(m[1], p.Issuer()) {
		u.t.Fatalf("login sends the person to %s, want the provider %s", m[1], p.Issuer())
	}
	if err := p.ApproveDevice(context.Background(), m[2], username, ssoPassword); err != nil {
		u.t.Fatalf("approve the device code at the provider: %v", err)
	}
	if code := proc.Wait(60 * time.Second); code != 0 {
		u.t.Fatalf("login exited %d\n%s", code, proc.Output())
	}
	return proc.Output()
}

// TestOIDCDeviceLoginMapsGroupsAndLosesThemAtRefresh: `better-compute
// login` with the device flow against a real provider maps the person's
// group claim to a role in a tenant; the CLI keeps a short-lived token and
// refreshes it by itself; a group changed at the provider changes the role
// at the next refresh (the earlier tokens are revoked), and a group
// removed there signs the person out at the next refresh.
func TestOIDCDeviceLoginMapsGroupsAndLosesThemAtRefresh(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, p, teamA := ssoDeployment(t, 2*time.Second)
	p.AddUser("alice", ssoPassword, "gpu-ops", "unrelated")
	p.AddUser("mallory", ssoPassword, "contractors")
	alice := &person{t: t, d: d, home: t.TempDir()}

	// Before any sign-in the CLI has no token for the server.
	if code, stdout, stderr := alice.run("nodes", "list"); code == 0 {
		t.Fatalf("nodes list before login: exit 0\n%s%s", stdout, stderr)
	}
	out := alice.login(p, "alice")
	if !strings.Contains(out, "operator in tenant team-a") || !strings.Contains(out, "alice@example.test") {
		t.Fatalf("login printed:\n%s\nwant alice signed in as operator of team-a", out)
	}
	cred := alice.credential()
	first, _ := cred["token"].(string)
	if cred["role"] != "operator" || cred["tenant"] != "team-a" || first == "" {
		t.Fatalf("the kept sign-in = %v", cred)
	}
	tok, err := d.st.APITokenBySecret(ctx, iam.Hash(first))
	if err != nil || tok.TenantID != teamA || tok.Role != "operator" || tok.SessionID == "" ||
		tok.Subject != p.Issuer()+"#"+p.Subject("alice") || !slices.Equal(tok.Groups, []string{"gpu-ops", "unrelated"}) {
		t.Fatalf("the session's token = %+v, %v; want alice's, operator of %s", tok, err, teamA)
	}
	if tok.ExpiresAt == nil || tok.ExpiresAt.Sub(tok.CreatedAt) > 3*time.Second {
		t.Fatalf("the session's token expires at %v (made %v); want iam.oidc.tokenTTL (2 s) after", tok.ExpiresAt, tok.CreatedAt)
	}

	// The role holds in team-a only: an operator reads, but may not make
	// tenants (admin).
	if code, stdout, stderr := alice.run("nodes", "list"); code != 0 {
		t.Fatalf("alice's nodes list: exit %d\n%s%s", code, stdout, stderr)
	}
	if code, _, stderr := alice.run("tenants", "create", "team-x"); code != 1 || !strings.Contains(stderr, "role operator may not call tenants.create") {
		t.Fatalf("alice's tenants create: exit %d\n%s\nwant refused: an operator", code, stderr)
	}
	// The person's groups reach the tenant's policies: team-a denies
	// events.list to the group gpu-ops.
	policyFile := testenv.WriteFile(t, "team-a-policy.yaml", `policies:
  - name: gpu-ops-no-events
    bind: {groups: [gpu-ops]}
    statements:
      - {effect: deny, actions: [events.list]}
tests:
  - {name: gpu-ops may not list events, caller: {role: operator, groups: [gpu-ops]}, action: events.list, expect: deny}
  - {name: others may, caller: {role: operator, groups: [fleet-viewers]}, action: events.list, expect: allow}
`)
	d.cli(d.viaAPI("policy", "apply", "--tenant", "team-a", policyFile)...)
	if code, _, stderr := alice.run("events", "list"); code != 1 || !strings.Contains(stderr, "events.list refused") || !strings.Contains(stderr, "gpu-ops-no-events") {
		t.Fatalf("alice's events list (gpu-ops, denied by policy): exit %d\n%s", code, stderr)
	}
	// Every command refreshed the 2-second token: the first one is
	// replaced, and the audit names the person, not a token.
	if now := alice.credential()["token"]; now == first {
		t.Fatal("the kept token was not refreshed although it expired")
	}
	rows, err := d.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "sso.refresh", Limit: 5})
	if err != nil || len(rows) == 0 || rows[0].Actor != "user:"+p.Issuer()+"#"+p.Subject("alice") {
		t.Fatalf("audit of the refreshes: %v, %v; want rows by user:%s#%s", rows, err, p.Issuer(), p.Subject("alice"))
	}

	// A group changed at the provider: viewer at the next refresh, and the
	// operator's tokens are revoked (what they opened closes).
	if err := p.SetGroups("alice", "fleet-viewers"); err != nil {
		t.Fatal(err)
	}
	if code, stdout, stderr := alice.run("nodes", "list"); code != 0 {
		t.Fatalf("alice's nodes list as a viewer: exit %d\n%s%s", code, stdout, stderr)
	}
	if cred := alice.credential(); cred["role"] != "viewer" {
		t.Fatalf("after the group change the sign-in = %v; want role viewer", cred)
	}
	if old, err := d.st.APITokenBySecret(ctx, iam.Hash(first)); err != nil || old.RevokedAt == nil {
		t.Fatalf("the operator's first token after the change: %+v, %v; want revoked", old, err)
	}
	if code, _, stderr := alice.run("nodes", "cordon", "node_none"); code != 1 || !strings.Contains(stderr, "role viewer may not call nodes.cordon") {
		t.Fatalf("alice's cordon as a viewer: exit %d\n%s", code, stderr)
	}
	if code, stdout, stderr := alice.run("events", "list"); code != 0 {
		t.Fatalf("alice's events list out of gpu-ops (the policy no longer binds her): exit %d\n%s%s", code, stdout, stderr)
	}

	// Commands run side by side refresh one at a time: all succeed, and
	// the sign-in stays (a refresh secret works once; so does the
	// provider's refresh token).
	waitExpired := func() {
		exp, _ := time.Parse(time.RFC3339Nano, alice.credential()["expiresAt"].(string))
		for time.Now().Before(exp) {
			time.Sleep(time.Until(exp) + 50*time.Millisecond)
		}
	}
	waitExpired()
	results := make(chan string, 4)
	for range 4 {
		go func() {
			code, _, stderr := testenv.Run(t, alice.env(), "", d.bc, "nodes", "list")
			results <- fmt.Sprintf("exit %d %s", code, stderr)
		}()
	}
	for range 4 {
		if r := <-results; !strings.HasPrefix(r, "exit 0 ") {
			t.Fatalf("one of 4 commands run side by side after the token expired: %s", r)
		}
	}

	// An event stream outlives its token while the session lives (the
	// control plane asks the provider itself while the CLI sits in the
	// stream), and ends once the provider takes the group away.
	stream := testenv.Start(t, alice.env(), d.bc, "events", "watch")
	select {
	case <-stream.Done():
		t.Fatalf("alice's event stream ended while her session lived:\n%s", stream.Output())
	case <-time.After(3 * 2 * time.Second): // three token lives
	}
	if err := p.SetGroups("alice"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stream.Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("alice's event stream still open 60 s after her groups were removed:\n%s", stream.Output())
	}
	if out := stream.Output(); !strings.Contains(out, "none of your groups") {
		t.Fatalf("alice's event stream ended with:\n%s\nwant the reason: none of her groups gives a role", out)
	}

	// Every group removed at the provider: signed out (here by the control
	// plane's own refresh for the stream; the CLI's next refresh says why).
	code, _, stderr := alice.run("nodes", "list")
	if code != 1 || !strings.Contains(stderr, "ended") || !strings.Contains(stderr, "none of your groups") || !strings.Contains(stderr, "better-compute login") {
		t.Fatalf("alice's nodes list with no group left: exit %d\n%s\nwant signed out, naming the groups and login", code, stderr)
	}
	if cred := alice.credential(); cred != nil {
		t.Fatalf("the CLI kept a sign-in the control plane ended: %v", cred)
	}
	viewerTok := &client.Client{BaseURL: d.api + "/api", Token: first}
	if _, err := viewerTok.NodesList(ctx, &apiv1.ListNodesRequest{}); refusedWith(err, apiv1.CodeUnauthenticated) != nil {
		t.Fatalf("a token of the ended session: %v; want UNAUTHENTICATED", err)
	}

	// Someone whose groups map to nothing is refused at sign-in.
	mallory := &person{t: t, d: d, home: t.TempDir()}
	proc := testenv.Start(t, mallory.env(), d.bc, "login", "--no-browser")
	m := proc.WaitLine(`enter the code (\S+)`, 60*time.Second)
	if err := p.ApproveDevice(ctx, m[1], "mallory", ssoPassword); err != nil {
		t.Fatal(err)
	}
	if code := proc.Wait(60 * time.Second); code != 1 || !strings.Contains(proc.Output(), "none of your groups at the provider (contractors) gives a role") {
		t.Fatalf("mallory's login: exit %d\n%s\nwant refused, naming her groups", code, proc.Output())
	}

	// Logout ends the session at the control plane.
	if err := p.SetGroups("alice", "gpu-ops"); err != nil {
		t.Fatal(err)
	}
	alice.login(p, "alice")
	signedIn := alice.credential()["token"].(string)
	if code, stdout, stderr := alice.run("logout"); code != 0 || !strings.Contains(stdout, "Signed out") {
		t.Fatalf("logout: exit %d\n%s%s", code, stdout, stderr)
	}
	if tok, err := d.st.APITokenBySecret(ctx, iam.Hash(signedIn)); err != nil || tok.RevokedAt == nil {
		t.Fatalf("the token after logout: %+v, %v; want revoked", tok, err)
	}
}

// TestOIDCPageLoginInChromium: the fleet page's sign-in (authorization
// code with PKCE) in a real headless Chromium: the login form's single
// sign-on link, the provider's own login form, back to the fleet; the
// server refreshes the page's short-lived token by itself, and a group
// removed at the provider ends the page session at the next refresh.
func TestOIDCPageLoginInChromium(t *testing.T) {
	t.Parallel()
	d, p, _ := ssoDeployment(t, 2*time.Second)
	p.AddUser("bob", ssoPassword, "fleet-viewers")
	page := newPage(t, t.Context(), publicAPI(d))
	page.do("open the login form", 30*time.Second, chromedp.Navigate(publicAPI(d)+"/watch"), chromedp.WaitVisible(chromedp.CSS("#sso")))
	page.do("follow the single sign-on link", 30*time.Second, chromedp.Click(chromedp.CSS("#sso")))
	page.do("sign in at the provider", 60*time.Second,
		chromedp.WaitVisible(chromedp.CSS("#username")),
		chromedp.SendKeys(chromedp.CSS("#username"), "bob"),
		chromedp.SendKeys(chromedp.CSS("#password"), ssoPassword),
		chromedp.Click(chromedp.CSS("button[type=submit]")),
		chromedp.WaitVisible(chromedp.CSS("#live.on")))
	if loc := page.eval("where the sign-in ends", `document.location.pathname`); loc != "/watch" {
		t.Fatalf("after the sign-in the browser is at %s, want /watch", loc)
	}
	// The token lives 2 s: the page keeps working past several of them,
	// the server refreshing it (the person does nothing).
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		page.do("reload the fleet page", 30*time.Second, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#live.on")))
	}
	// The group removed at the provider: the next refresh ends the page
	// session, and the page shows the login form again.
	if err := p.SetGroups("bob"); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(30 * time.Second); ; {
		page.do("reload the fleet page", 30*time.Second, chromedp.Reload(), chromedp.WaitReady(chromedp.CSS("body")))
		if page.eval("is it the login form", `String(!!document.querySelector("#token"))`) == "true" {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("30 s after bob's group was removed the page still shows the fleet:\n%s", page.eval("the page", `document.body.innerText.slice(0, 2000)`))
		}
	}
}
