package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/config"
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

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestStoreCommandsEmbedded(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	c := cli{t: t, env: map[string]string{config.EnvDataDir: dataDir, "HOME": t.TempDir()}}

	c.fails(exitUsage, "--trust-domain", "pki", "init", "--trust-domain", "Compute.Example.com/x")
	var initRes struct{ TrustDomain, GatewayPin, AdminToken string }
	c.json(&initRes, "pki", "init", "--trust-domain", "compute.example.com")
	if initRes.TrustDomain != "compute.example.com" || !strings.HasPrefix(initRes.GatewayPin, "sha256/") || !strings.HasPrefix(initRes.AdminToken, "bcat_") {
		t.Fatalf("pki init = %+v, want the first admin token printed once", initRes)
	}
	c.fails(1, "already holds a PKI bundle", "pki", "init", "--trust-domain", "other.example.com")

	outDir := filepath.Join(t.TempDir(), "gw")
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

	var site struct{ ID, Name, Region string }
	c.json(&site, "sites", "create", "--name", "ams-1", "--region", "eu-1")
	if site.ID == "" || site.Region != "eu-1" {
		t.Fatalf("site = %+v", site)
	}
	c.fails(1, "exists already", "sites", "create", "--name", "ams-1", "--region", "eu-1")
	c.fails(exitUsage, "--region", "sites", "create", "--name", "x")
	if out := c.ok("sites", "list"); !strings.Contains(out, "ams-1") || !strings.Contains(out, "REGION") {
		t.Fatalf("sites list:\n%s", out)
	}
	c.fails(1, "no site", "pools", "create", "--name", "gpu", "--site", "nowhere")
	var pool struct{ ID, SiteID string }
	c.json(&pool, "pools", "create", "--name", "gpu", "--site", "ams-1")
	if pool.SiteID != site.ID {
		t.Fatalf("pool = %+v", pool)
	}
	var pools []struct{ ID, Name string }
	c.json(&pools, "pools", "list")
	if len(pools) != 1 || pools[0].Name != "gpu" {
		t.Fatalf("pools = %+v", pools)
	}

	// A token printed once: only its hash is stored.
	out := c.ok("join-tokens", "create", "--pool", "gpu", "--ttl", "1h", "--max-uses", "3")
	tok, err := jointoken.Parse(out)
	if err != nil || tok.Pin() != initRes.GatewayPin {
		t.Fatalf("printed token %q: %v", out, err)
	}
	file := filepath.Join(t.TempDir(), "join-token")
	var created struct {
		ID, File, Token string
		MaxUses         int
	}
	c.json(&created, "join-tokens", "create", "--pool", pool.ID, "--out", file)
	fileTok, _ := os.ReadFile(file)
	if created.Token != "" || created.File != file || created.MaxUses != 8 || mode(t, file) != 0o600 {
		t.Fatalf("token to file = %+v", created)
	}
	if parsed, err := jointoken.Parse(string(fileTok)); err != nil || parsed.ID() != created.ID {
		t.Fatalf("token file: %v", err)
	}
	c.fails(exitUsage, "--max-uses", "join-tokens", "create", "--pool", "gpu", "--max-uses", "0")
	c.fails(1, "no pool", "join-tokens", "create", "--pool", "nope")

	c.ok("join-tokens", "revoke", tok.ID())
	c.fails(1, "no join token", "join-tokens", "revoke", "jt_unknown")
	var tokens []struct{ ID, State string }
	c.json(&tokens, "join-tokens", "list")
	states := map[string]string{}
	for _, t := range tokens {
		states[t.ID] = t.State
	}
	if len(tokens) != 2 || states[tok.ID()] != "revoked" || states[created.ID] != "active" {
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
	for _, tk := range tokens {
		if tk.State != "revoked" {
			t.Fatalf("after revoking the whole token: %+v", tokens)
		}
	}

	// Revocation by node and by serial.
	ctx := context.Background()
	st, err := backend.Open(ctx, "", dataDir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node-1", PoolID: pool.ID, Hostname: "gpu-01", CertSerial: "00000000000000000000000000000abc"})
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	c.fails(exitUsage, "exactly one", "pki", "revoke", "--node", "node-1", "--serial", "ab")
	c.fails(1, "no node", "pki", "revoke", "--node", "node-404")
	var rev struct{ Serial, NodeID string }
	c.json(&rev, "pki", "revoke", "--node", "node-1")
	if rev.Serial != "00000000000000000000000000000abc" || rev.NodeID != "node-1" {
		t.Fatalf("revoke --node = %+v", rev)
	}
	rev.NodeID = ""
	c.json(&rev, "pki", "revoke", "--serial", "AB:CD")
	if rev.Serial != "0000000000000000000000000000abcd" || rev.NodeID != "" {
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
		Serial         string
		AlreadyRevoked bool
	}
	c.json(&again, "pki", "revoke", "--serial", "0x"+strings.Repeat("0", 37)+"abcd")
	if again.Serial != "0000000000000000000000000000abcd" || !again.AlreadyRevoked {
		t.Fatalf("revoke --serial with extra zeros = %+v", again)
	}
	if out := c.ok("pki", "revoke", "--serial", "ef"); !strings.Contains(out, "revoked certificate 000000000000000000000000000000ef") {
		t.Fatalf("revoke --serial ef: %q", out)
	}
	if out := c.ok("pki", "revoke", "--serial", "EF"); !strings.Contains(out, "already revoked") {
		t.Fatalf("second revoke --serial EF: %q", out)
	}
}

func TestStoreCommandsPostgres(t *testing.T) {
	t.Parallel()
	c := cli{t: t, env: map[string]string{
		config.EnvDatabaseURL: pgtest.URL(t), config.EnvSecret: "cli-test-secret-cli-test-secret-cli-test",
		config.EnvDataDir: t.TempDir(), "HOME": t.TempDir(),
	}}
	c.fails(1, "run better-compute migrate", "sites", "list")
	c.ok("migrate")
	c.ok("sites", "create", "--name", "fra-1", "--region", "eu-2")
	c.ok("pools", "create", "--name", "cpu", "--site", "fra-1")
	c.fails(1, "pki init", "join-tokens", "create", "--pool", "cpu")
	c.fails(1, "pki init", "pki", "issue-gateway", "--dns", "gw.example.com", "--out-dir", t.TempDir())
	c.ok("pki", "init", "--trust-domain", "compute.example.com")
	if _, err := jointoken.Parse(c.ok("join-tokens", "create", "--pool", "cpu")); err != nil {
		t.Fatal(err)
	}
	if out := c.ok("join-tokens", "list"); !strings.Contains(out, "0/8") || !strings.Contains(out, "active") {
		t.Fatalf("join-tokens list:\n%s", out)
	}
}
