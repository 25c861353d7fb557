package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/proto/jointoken"
)

// cli runs better-compute with env as its whole environment.
type cli struct {
	t   *testing.T
	env map[string]string
}

func (c cli) run(args ...string) (code int, stdout, stderr string) {
	c.t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut, func(k string) string { return c.env[k] })
	return code, out.String(), errOut.String()
}

// ok runs args and fails the test unless they succeed.
func (c cli) ok(args ...string) string {
	c.t.Helper()
	code, out, errOut := c.run(args...)
	if code != 0 {
		c.t.Fatalf("%v: exit %d: %s", args, code, errOut)
	}
	return out
}

// fails runs args and fails the test unless they exit with code and say
// what in stderr.
func (c cli) fails(code int, what string, args ...string) {
	c.t.Helper()
	got, _, errOut := c.run(args...)
	if got != code || !strings.Contains(errOut, what) {
		c.t.Fatalf("%v: exit %d, stderr %q; want exit %d saying %q", args, got, errOut, code, what)
	}
}

func (c cli) json(v any, args ...string) {
	c.t.Helper()
	out := c.ok(append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		c.t.Fatalf("%v: %v in %s", args, err, out)
	}
}

// with is c with more environment.
func (c cli) with(kv ...string) cli {
	env := map[string]string{}
	for k, v := range c.env {
		env[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		env[kv[i]] = kv[i+1]
	}
	return cli{t: c.t, env: env}
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// serveAPI serves the API of the deployment in dataDir (or at databaseURL)
// in-process and returns its URL.
func serveAPI(t *testing.T, databaseURL, dataDir, secret string) (string, store.Store) {
	t.Helper()
	st, err := backend.Open(context.Background(), databaseURL, dataDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv := httptest.NewServer(api.New(api.Config{Secret: secret}, st, nil).Handler())
	t.Cleanup(srv.Close)
	return srv.URL, st
}

// onlyTokenID is the id of the one API token in st, as audit rows name it.
func onlyTokenID(t *testing.T, st store.Store) string {
	t.Helper()
	toks, err := st.APITokenList(context.Background(), &store.ListParams{})
	if err != nil || len(toks) != 1 {
		t.Fatalf("API tokens %v: %v, want one", toks, err)
	}
	return toks[0].ID
}

// TestStoreCommandsEmbedded runs the commands that open the database (pki
// init, pki issue-gateway) and then, through an API over that database,
// those that must go through it (sites, pools, join-tokens, pki revoke,
// audit list).
func TestStoreCommandsEmbedded(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	c := cli{t: t, env: map[string]string{config.EnvDataDir: dataDir, "HOME": t.TempDir()}}

	c.fails(exitUsage, "--trust-domain", "pki", "init", "--trust-domain", "Compute.Example.com/x")
	outDir := filepath.Join(t.TempDir(), "gw")
	// issue-gateway reads a deployment; it never makes one.
	c.fails(1, "no deployment in "+dataDir, "pki", "issue-gateway", "--dns", "gw.example.com", "--out-dir", outDir)
	if entries, _ := os.ReadDir(dataDir); len(entries) != 0 {
		t.Fatalf("issue-gateway without a deployment wrote %v", entries)
	}
	var initRes struct{ TrustDomain, GatewayPin, AdminToken string }
	c.json(&initRes, "pki", "init", "--trust-domain", "compute.example.com")
	if initRes.TrustDomain != "compute.example.com" || !strings.HasPrefix(initRes.GatewayPin, "sha256/") || !strings.HasPrefix(initRes.AdminToken, "bcat_") {
		t.Fatalf("pki init = %+v, want the first admin token printed once", initRes)
	}
	c.fails(1, "already holds a PKI bundle", "pki", "init", "--trust-domain", "other.example.com")

	c.fails(exitUsage, "--dns", "pki", "issue-gateway", "--out-dir", outDir)
	var issued struct{ Cert, Key, GatewayPin string }
	c.json(&issued, "pki", "issue-gateway", "--dns", "gw.example.com,gw2.example.com", "--ip", "10.0.0.1", "--out-dir", outDir)
	if issued.GatewayPin != initRes.GatewayPin || mode(t, issued.Cert) != 0o600 || mode(t, issued.Key) != 0o600 {
		t.Fatalf("issue-gateway = %+v", issued)
	}
	certPEM, _ := os.ReadFile(issued.Cert)
	blk, _ := pem.Decode(certPEM)
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil || len(leaf.DNSNames) != 2 || len(leaf.IPAddresses) != 1 {
		t.Fatalf("gateway certificate: %v %v", leaf, err)
	}

	secret, err := os.ReadFile(filepath.Join(dataDir, config.SecretFile))
	if err != nil {
		t.Fatal(err)
	}
	url, st := serveAPI(t, "", dataDir, strings.TrimSpace(string(secret)))
	// The API's address and the admin token pki init printed; the data
	// directory is not read for them.
	c = c.with(envURL, url, envToken, initRes.AdminToken)
	admin := "token:" + onlyTokenID(t, st)

	var site struct{ ID, Name, Region string }
	c.json(&site, "sites", "create", "--name", "ams-1", "--region", "eu-1")
	if site.ID == "" || site.Region != "eu-1" {
		t.Fatalf("site = %+v", site)
	}
	c.fails(1, "CONFLICT: name: a site named ams-1 exists", "sites", "create", "--name", "ams-1", "--region", "eu-1")
	c.fails(exitUsage, "--region", "sites", "create", "--name", "x")
	if out := c.ok("sites", "list"); !strings.Contains(out, "ams-1") || !strings.Contains(out, "REGION") {
		t.Fatalf("sites list:\n%s", out)
	}
	c.fails(1, "NOT_FOUND: site: no site nowhere", "pools", "create", "--name", "gpu", "--site", "nowhere")
	var pool struct{ ID, SiteID string }
	c.json(&pool, "pools", "create", "--name", "gpu", "--site", "ams-1")
	if pool.SiteID != site.ID {
		t.Fatalf("pool = %+v", pool)
	}
	var pools struct{ Pools []struct{ ID, Name string } }
	c.json(&pools, "pools", "list")
	if len(pools.Pools) != 1 || pools.Pools[0].Name != "gpu" {
		t.Fatalf("pools = %+v", pools)
	}
	if out := c.ok("pools", "list"); !strings.Contains(out, "ams-1") {
		t.Fatalf("pools list names no site:\n%s", out)
	}

	// A token printed once: only its hash is stored.
	out := c.ok("join-tokens", "create", "--pool", "gpu", "--ttl", "1h", "--max-uses", "3")
	tok, err := jointoken.Parse(out)
	if err != nil || tok.Pin() != initRes.GatewayPin {
		t.Fatalf("printed token %q: %v", out, err)
	}
	file := filepath.Join(t.TempDir(), "join-token")
	var created struct {
		JoinToken struct {
			ID      string
			MaxUses int
			State   string
		}
		Token string
	}
	c.json(&created, "join-tokens", "create", "--pool", pool.ID, "--out", file)
	fileTok, _ := os.ReadFile(file)
	if created.Token != "" || created.JoinToken.MaxUses != 8 || created.JoinToken.State != "active" || mode(t, file) != 0o600 {
		t.Fatalf("token to file = %+v", created)
	}
	if parsed, err := jointoken.Parse(string(fileTok)); err != nil || parsed.ID() != created.JoinToken.ID {
		t.Fatalf("token file: %v", err)
	}
	c.fails(exitUsage, "--max-uses", "join-tokens", "create", "--pool", "gpu", "--max-uses", "0")
	c.fails(exitUsage, "--ttl", "join-tokens", "create", "--pool", "gpu", "--ttl", "1s")
	c.fails(1, "no pool nope", "join-tokens", "create", "--pool", "nope")

	var revoked struct{ JoinToken struct{ ID, State string } }
	c.json(&revoked, "join-tokens", "revoke", tok.ID())
	if revoked.JoinToken.ID != tok.ID() || revoked.JoinToken.State != "revoked" {
		t.Fatalf("revoke -o json = %+v", revoked)
	}
	c.fails(1, "no join token jt_unknown", "join-tokens", "revoke", "jt_unknown")
	var tokens struct{ JoinTokens []struct{ ID, State string } }
	c.json(&tokens, "join-tokens", "list")
	states := map[string]string{}
	for _, t := range tokens.JoinTokens {
		states[t.ID] = t.State
	}
	if len(tokens.JoinTokens) != 2 || states[tok.ID()] != "revoked" || states[created.JoinToken.ID] != "active" {
		t.Fatalf("tokens = %+v", tokens)
	}
	list := c.ok("join-tokens", "list")
	if strings.Contains(list, tok.String()) || !strings.Contains(list, "revoked") {
		t.Fatalf("join-tokens list:\n%s", list)
	}
	if strings.Contains(c.ok("join-tokens", "list", "-o", "json"), tok.String()) {
		t.Fatal("join-tokens list shows a secret")
	}
	// Revoke takes a whole token too (its id is used); a mangled one is
	// refused without being repeated.
	whole := strings.TrimSpace(string(fileTok))
	mangled := whole[:len(whole)-3]
	if code, out, errOut := c.run("join-tokens", "revoke", mangled); code != exitUsage || strings.Contains(out+errOut, mangled[10:]) {
		t.Fatalf("revoke of a mangled token: exit %d, output %q %q", code, out, errOut)
	}
	c.ok("join-tokens", "revoke", whole)
	c.json(&tokens, "join-tokens", "list")
	for _, tk := range tokens.JoinTokens {
		if tk.State != "revoked" {
			t.Fatalf("after revoking the whole token: %+v", tokens)
		}
	}

	// Revocation by node and by serial, through pki.revoke.
	ctx := context.Background()
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node-1", PoolID: pool.ID, Hostname: "gpu-01", CertSerial: "00000000000000000000000000000abc"}); err != nil {
		t.Fatal(err)
	}
	c.fails(exitUsage, "exactly one", "pki", "revoke", "--node", "node-1", "--serial", "ab")
	c.fails(1, "no node node-404", "pki", "revoke", "--node", "node-404")
	var rev struct {
		Serials        []string
		NodeID         string
		AlreadyRevoked bool
	}
	c.json(&rev, "pki", "revoke", "--node", "node-1")
	if len(rev.Serials) != 1 || rev.Serials[0] != "00000000000000000000000000000abc" || rev.NodeID != "node-1" || rev.AlreadyRevoked {
		t.Fatalf("revoke --node = %+v", rev)
	}
	rev.NodeID = ""
	c.json(&rev, "pki", "revoke", "--serial", "AB:CD")
	if len(rev.Serials) != 1 || rev.Serials[0] != "0000000000000000000000000000abcd" || rev.NodeID != "" {
		t.Fatalf("revoke --serial = %+v", rev)
	}
	c.fails(exitUsage, "not a hexadecimal", "pki", "revoke", "--serial", "xyz")
	c.fails(exitUsage, "may hold only", "sites", "create", "--name", "  ", "--region", "eu-1")
	c.fails(exitUsage, "1 to 63 characters", "sites", "create", "--name", strings.Repeat("a", 64), "--region", "eu-1")
	c.fails(exitUsage, "may hold only", "sites", "create", "--name", "fra-2", "--region", "EU 1")
	c.fails(exitUsage, "may hold only", "pools", "create", "--name", "rack 1 ", "--site", "ams-1")
	c.fails(exitUsage, "positive number", "pki", "revoke", "--serial", "00:00")
	c.fails(exitUsage, "positive number", "pki", "revoke", "--serial", strings.Repeat("f", 41))
	// Extra leading zeros are spelled away, so the serial matches the one
	// the CA issued; a second revocation says it was one already.
	var again struct {
		Serials        []string
		AlreadyRevoked bool
	}
	c.json(&again, "pki", "revoke", "--serial", "0x"+strings.Repeat("0", 37)+"abcd")
	if len(again.Serials) != 1 || again.Serials[0] != "0000000000000000000000000000abcd" || !again.AlreadyRevoked {
		t.Fatalf("revoke --serial with extra zeros = %+v", again)
	}
	if out := c.ok("pki", "revoke", "--serial", "ef"); !strings.Contains(out, "revoked certificate 000000000000000000000000000000ef") {
		t.Fatalf("revoke --serial ef: %q", out)
	}
	if out := c.ok("pki", "revoke", "--serial", "EF"); !strings.Contains(out, "already revoked") {
		t.Fatalf("second revoke --serial EF: %q", out)
	}

	// Every change above is audited under the caller's token; only the
	// commands that hold the CA keys are the operating-system user's.
	var log struct {
		Entries []struct{ Actor, Action, Resource, Outcome string }
	}
	c.json(&log, "audit", "list", "--limit", "0")
	byAction := map[string][]string{}
	for _, e := range log.Entries {
		byAction[e.Action] = append(byAction[e.Action], e.Actor)
	}
	for _, action := range []string{"sites.create", "pools.create", "joinTokens.create", "joinTokens.revoke", "pki.revoke"} {
		actors := byAction[action]
		if len(actors) == 0 {
			t.Errorf("no audit row for %s in %+v", action, log.Entries)
		}
		for _, a := range actors {
			if a != admin {
				t.Errorf("%s audited as %s, want %s", action, a, admin)
			}
		}
	}
	for _, action := range []string{"pki.init", "pki.issue-gateway"} {
		if a := byAction[action]; len(a) != 1 || !strings.HasPrefix(a[0], "cli:") {
			t.Errorf("%s audited as %v, want the cli user", action, a)
		}
	}
	// Newest first, filtered by method prefix, object and outcome.
	c.json(&log, "audit", "list", "--method", "joinTokens.", "--outcome", "ok")
	if len(log.Entries) != 4 || log.Entries[0].Action != "joinTokens.revoke" || log.Entries[3].Action != "joinTokens.create" {
		t.Fatalf("audit list --method joinTokens. = %+v", log.Entries)
	}
	c.json(&log, "audit", "list", "--object", "ams-1", "--actor", admin, "--since", "1h")
	if len(log.Entries) != 2 || log.Entries[0].Outcome != "CONFLICT" || log.Entries[1].Outcome != "ok" {
		t.Fatalf("audit list --object ams-1 = %+v", log.Entries)
	}
	log.Entries = nil
	c.json(&log, "audit", "list", "--until", "1h")
	if len(log.Entries) != 0 {
		t.Fatalf("audit list --until 1h = %+v", log.Entries)
	}
	if out := c.ok("audit", "list", "--limit", "2"); !strings.Contains(out, "OUTCOME") || strings.Count(out, "\n") != 3 {
		t.Fatalf("audit list --limit 2:\n%s", out)
	}
	c.fails(exitUsage, "--since", "audit", "list", "--since", "yesterday")
	c.with(envToken, mustToken(t, st, store.RoleViewer)).fails(1, "PERMISSION_DENIED", "audit", "list")
}

func TestStoreCommandsPostgres(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	const secret = "cli-test-secret-cli-test-secret-cli-test"
	c := cli{t: t, env: map[string]string{
		config.EnvDatabaseURL: dbURL, config.EnvSecret: secret,
		config.EnvDataDir: t.TempDir(), "HOME": t.TempDir(),
	}}
	c.fails(1, "run better-compute migrate", "pki", "issue-gateway", "--dns", "gw.example.com", "--out-dir", t.TempDir())
	c.ok("migrate")
	c.fails(1, "pki init", "pki", "issue-gateway", "--dns", "gw.example.com", "--out-dir", t.TempDir())
	// No admin-token file beside PostgreSQL: the CLI asks for a token.
	c.fails(exitUsage, "no API token", "sites", "list")
	var initRes struct{ AdminToken string }
	c.json(&initRes, "pki", "init", "--trust-domain", "compute.example.com")
	url, _ := serveAPI(t, dbURL, "", secret)
	c = c.with(envURL, url, envToken, initRes.AdminToken)
	c.ok("sites", "create", "--name", "fra-1", "--region", "eu-2")
	c.ok("pools", "create", "--name", "cpu", "--site", "fra-1")
	if _, err := jointoken.Parse(c.ok("join-tokens", "create", "--pool", "cpu")); err != nil {
		t.Fatal(err)
	}
	if out := c.ok("join-tokens", "list"); !strings.Contains(out, "0/8") || !strings.Contains(out, "active") {
		t.Fatalf("join-tokens list:\n%s", out)
	}
	if out := c.ok("audit", "list", "--method", "pools."); !strings.Contains(out, "pools.create") || strings.Contains(out, "sites.create") {
		t.Fatalf("audit list --method pools.:\n%s", out)
	}
}
