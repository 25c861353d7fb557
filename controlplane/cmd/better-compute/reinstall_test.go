package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	"github.com/better-compute/better-compute/proto/jointoken"
)

// TestNodesReinstall runs nodes reinstall against an in-process API.
func TestNodesReinstall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	secret := strings.Repeat("s", 32)
	b, err := pki.Init(pki.InitOptions{TrustDomain: "rx.test"})
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := b.SealBundle(secret)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PKIBundleCreate(ctx, &store.PKIBundle{TrustDomain: "rx.test", Sealed: sealed}); err != nil {
		t.Fatal(err)
	}
	_, pool := mustSitePool(t, st, "s", "p")
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_rx", PoolID: pool.ID, Hostname: "h"}); err != nil {
		t.Fatal(err)
	}
	operator := mustToken(t, st, store.RoleOperator)
	c := apiCLI(t, st, secret, mustToken(t, st, store.RoleAdmin))

	// No live gateway: the token on stdout, the join command with a
	// placeholder gateway on stderr.
	code, out, errOut := c.run("nodes", "reinstall", "node_rx")
	if code != 0 {
		t.Fatalf("nodes reinstall: exit %d: %s", code, errOut)
	}
	tok, err := jointoken.Parse(strings.TrimSpace(out))
	if err != nil || tok.Pin() != b.GatewayPin() {
		t.Fatalf("stdout %q is not a token with the gateway pin: %v", out, err)
	}
	wantCmd := "BCD_JOIN_TOKEN=" + tok.String() + " bcd join --gateway " + placeholderGateway
	if !strings.Contains(errOut, wantCmd) || !strings.Contains(errOut, "node_rx") || !strings.Contains(errOut, "no gateway") {
		t.Fatalf("stderr %q, want the join command %q", errOut, wantCmd)
	}
	rec, err := st.JoinTokenGet(ctx, tok.ID())
	if err != nil || rec.NodeID != "node_rx" || rec.MaxUses != 1 {
		t.Fatalf("stored token %+v %v", rec, err)
	}

	// A live gateway of the region goes into the join command.
	if _, err := st.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: "gw", Region: "eu-1", Address: "https://gw.example:8443"}); err != nil {
		t.Fatal(err)
	}
	var res reinstallJSON
	c.json(&res, "nodes", "reinstall", "node_rx", "--ttl", "30m")
	if res.NodeID != "node_rx" || res.PoolID != pool.ID || res.Token == "" || res.File != "" ||
		res.JoinCommand != "BCD_JOIN_TOKEN="+res.Token+" bcd join --gateway https://gw.example:8443" {
		t.Fatalf("-o json = %+v", res)
	}

	// --out: the token in a 0600 file, where it is and the command printed,
	// never the token.
	file := filepath.Join(t.TempDir(), "node_rx.token")
	out = c.ok("nodes", "reinstall", "node_rx", "--out", file)
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	tok, err = jointoken.Parse(strings.TrimSpace(string(data)))
	if err != nil || mode(t, file) != 0o600 {
		t.Fatalf("--out file: %v, mode %v", err, mode(t, file))
	}
	if strings.Contains(out, tok.String()) || !strings.Contains(out, file) ||
		!strings.Contains(out, "bcd join --gateway https://gw.example:8443 --token-file "+file) {
		t.Fatalf("--out output:\n%s", out)
	}

	// Bad input.
	c.fails(exitUsage, "accepts 1 arg", "nodes", "reinstall")
	c.fails(exitUsage, "--ttl", "nodes", "reinstall", "node_rx", "--ttl", "0s")
	c.fails(exitUsage, "--ttl", "nodes", "reinstall", "node_rx", "--ttl", "721h")
	c.fails(exitUsage, "--ttl", "nodes", "reinstall", "node_rx", "--ttl", "soon")
	c.fails(exitUsage, "does not exist", "nodes", "reinstall", "node_rx", "--out", filepath.Join(t.TempDir(), "no", "such", "f"))
	c.fails(exitUsage, "--output", "nodes", "reinstall", "node_rx", "-o", "yaml")
	c.fails(1, "no node node_missing", "nodes", "reinstall", "node_missing")
	c.fails(1, "PERMISSION_DENIED", "nodes", "reinstall", "node_rx", "--token", operator)
	toks, err := st.JoinTokenList(ctx, &store.ListParams{})
	if err != nil || len(toks) != 3 {
		t.Fatalf("tokens after the refusals: %d %v, want the 3 made above", len(toks), err)
	}
}
