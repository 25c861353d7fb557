package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/controlplane/store/transfer"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestStoreCopyToSplitRoles is issue 38's move from one machine to many:
// serve on the embedded default with a real bcd and 50 FakeDaemons, their
// command history and events; serve stopped; store copy into an empty
// PostgreSQL schema; the same deployment up again as split roles (api, a
// gateway, two workers) on PostgreSQL with the same secret, the same
// gateway address and API port. The real bcd is ready again without
// joining (its identity file untouched) and runs a new command; every
// FakeDaemon reconnects as the node it was; the old commands read the same
// through the new API; every table's count and checksum are equal.
func TestStoreCopyToSplitRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{gateway: "    drainDelay: 1s\n"})
	tokenFile, _ := d.joinToken(60, time.Hour)
	m := newMachine(t, "copied-real")
	realID := m.mustJoin(d.gatewayURL, tokenFile)
	identity := identityOf(t, m)
	bcd := m.node()
	bcd.WaitLine(sessionEstablished.String(), 30*time.Second)

	fl, err := sim.NewFleet(sim.FleetConfig{GatewayURL: d.gatewayURL, Token: strings.TrimSpace(readFile(t, tokenFile)), N: 50,
		NamePrefix: "copied", NoInventory: true,
		Session: session.Config{StartJitter: -1, BackoffBase: 200 * time.Millisecond, BackoffMax: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fl.Join(ctx); err != nil {
		t.Fatal(err)
	}
	runDaemons(t, fl.Daemons())
	ids := []string{realID}
	for _, fd := range fl.Daemons() {
		ids = append(ids, fd.NodeID())
	}
	allReady := func() bool {
		n := d.nodes()
		for _, id := range ids {
			if n[id].State != "ready" {
				return false
			}
		}
		return len(n) == len(ids)
	}
	eventually(t, 60*time.Second, allReady, func() string { return fmt.Sprintf("not every node ready on the embedded default: %v", d.nodes()) })

	// History: a command on every node, and one with output on the real bcd.
	if code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, d.viaAPI("--config", d.cfgFile, "commands", "run", "--pool", "default", "--", "true")...); code != 0 {
		t.Fatalf("commands run on the pool: exit %d\n%s%s", code, stdout, stderr)
	}
	before := d.runNoWait(realID, nil, "echo", "before the copy")
	eventually(t, 30*time.Second, func() bool { return d.command(before).State == "succeeded" }, func() string { return "the command before the copy did not succeed" })
	old := d.command(before)
	cmds, err := d.st.CommandList(ctx, &store.CommandListParams{ListParams: store.ListParams{Limit: store.MaxListLimit}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) < len(ids)+1 {
		t.Fatalf("%d commands in the history, want at least %d", len(cmds), len(ids)+1)
	}

	// Stop; copy.
	d.serve.Stop(syscall.SIGTERM, 30*time.Second)
	stopped := time.Now()
	url := pgtest.URL(t)
	copyStart := time.Now()
	out := d.cli("store", "copy", "--to", url)
	t.Logf("store copy took %.1f s:\n%s", time.Since(copyStart).Seconds(), out)
	for _, want := range []string{`(?m)^nodes\s+51\s+[0-9a-f]{16}\s+equal$`, `(?m)^pki_bundle\s+1\s`, `verified`,
		`better-compute pki issue-gateway .*--dns localhost`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("store copy's output does not match %s", want)
		}
	}
	cmp, err := transfer.Compare(ctx, filepath.Join(d.dataDir, backend.EmbeddedFile), url)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cmp {
		if !c.Equal() {
			t.Errorf("table %s: %d rows, checksum %s in SQLite; %d rows, checksum %s in PostgreSQL",
				c.Name, c.SourceRows, c.SourceChecksum, c.TargetRows, c.TargetChecksum)
		}
		if c.Name == "outbox" && c.SourceRows == 0 {
			t.Error("no events (outbox) were copied")
		}
	}

	// The same deployment as split roles on PostgreSQL.
	secret := d.secret()
	env := []string{"BETTER_COMPUTE_SECRET=" + secret, "BETTER_COMPUTE_DATABASE_URL=" + url,
		"BETTER_COMPUTE_DATA_DIR=" + filepath.Join(t.TempDir(), "unused")}
	certDir := t.TempDir()
	if code, stdout, stderr := testenv.Run(t, env, "", d.bc, "pki", "issue-gateway", "--dns", "localhost", "--ip", "127.0.0.1", "--out-dir", certDir); code != 0 {
		t.Fatalf("pki issue-gateway on the copy: exit %d\n%s%s", code, stdout, stderr)
	}
	cfg := testenv.WriteFile(t, "split.yaml", fmt.Sprintf("host:\n  listen: 127.0.0.1:0\n  gateway:\n    listen: 127.0.0.1:0\n    drainDelay: 1s\n"+
		"    tlsFiles:\n      cert: %s\n      key: %s\n", filepath.Join(certDir, "gateway.crt"), filepath.Join(certDir, "gateway.key")))
	apiPort := strings.TrimPrefix(d.api, "http://127.0.0.1:")
	start := func(args ...string) *testenv.Proc {
		return testenv.Start(t, env, d.bc, append([]string{"serve", "--config", cfg, "--no-migrate"}, args...)...)
	}
	api := start("--roles", "api", "--host", "127.0.0.1", "--port", apiPort)
	gw := start("--roles", "gateway", "--gateway-listen", d.gwAddr, "--public-url", d.gatewayURL)
	workers := []*testenv.Proc{start("--roles", workerRoles), start("--roles", workerRoles)}
	api.WaitLine(`msg="API listening"`, 60*time.Second)
	gw.WaitLine(`msg="Gateway listening" .*addr=`+regexp.QuoteMeta(d.gwAddr), 60*time.Second)
	for _, w := range workers {
		w.WaitLine(`msg="Worker roles running"`, 60*time.Second)
	}
	pg, err := backend.Open(ctx, url, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })

	// Every node back, each under its own id, none joined again.
	reconnected := func() bool {
		for _, id := range ids {
			s, err := pg.SessionGet(ctx, id)
			if err != nil || s.ConnectedAt.Before(stopped) {
				return false
			}
		}
		return allReady()
	}
	eventually(t, 120*time.Second, reconnected, func() string {
		back := 0
		for _, id := range ids {
			if s, err := pg.SessionGet(ctx, id); err == nil && s.ConnectedAt.After(stopped) {
				back++
			}
		}
		return fmt.Sprintf("%d of %d nodes reconnected to the PostgreSQL deployment", back, len(ids))
	})
	t.Logf("every node back %.1f s after serve stopped", time.Since(stopped).Seconds())
	nodes, err := pg.NodeList(ctx, &store.NodeListParams{ListParams: store.ListParams{Limit: store.MaxListLimit}})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != len(ids) {
		t.Errorf("%d nodes on PostgreSQL, want %d: a node joined again", len(nodes), len(ids))
	}
	if got := identityOf(t, m); got != identity {
		t.Errorf("the real bcd's identity is %s now, was %s: it joined again", got, identity)
	}
	for _, fd := range fl.Daemons() {
		if !slices.ContainsFunc(nodes, func(n *store.Node) bool { return n.ID == fd.NodeID() && n.Hostname == fd.Name() }) {
			t.Errorf("FakeDaemon %s (node %s) is not its node on PostgreSQL", fd.Name(), fd.NodeID())
		}
	}

	// History intact, and a new command on the real bcd.
	if got := d.command(before); got.State != old.State || got.Stdout != old.Stdout || got.ExitCode == nil || old.ExitCode == nil || *got.ExitCode != *old.ExitCode {
		t.Errorf("the command before the copy reads %+v on PostgreSQL, was %+v", got, old)
	}
	for _, c := range cmds {
		got, err := pg.CommandGet(ctx, c.ID)
		if err != nil {
			t.Fatalf("command %s from before the copy: %v", c.ID, err)
		}
		if got.State != c.State || got.NodeID != c.NodeID || !got.CreatedAt.Equal(c.CreatedAt) {
			t.Errorf("command %s: %s on %s created %s, was %s on %s created %s", c.ID, got.State, got.NodeID, got.CreatedAt, c.State, c.NodeID, c.CreatedAt)
		}
	}
	after := d.runNoWait(realID, nil, "echo", "after the copy")
	eventually(t, 30*time.Second, func() bool { return d.command(after).State == "succeeded" },
		func() string { return fmt.Sprintf("the command after the copy: %+v", d.command(after)) })
	if got := d.command(after).Stdout; got != "after the copy\n" {
		t.Errorf("the command after the copy printed %q", got)
	}
}

// TestStoreCopyRefusals: store copy refuses a deployment that runs (naming
// the process), a wrong secret and a target that holds rows, each before
// it writes anything; --replace then copies over the rows.
func TestStoreCopyRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDeployment(t, backendSQLite)
	url := pgtest.URL(t)
	copyTo := func(env []string, args ...string) (int, string, string) {
		return testenv.Run(t, append(slices.Clone(d.env), env...), "", d.bc, append([]string{"--config", d.cfgFile, "store", "copy", "--to", url}, args...)...)
	}
	targetTables := func() int {
		pg, err := backend.Open(ctx, url, "")
		if err != nil {
			t.Fatal(err)
		}
		defer pg.Close()
		st, err := pg.MigrationStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(st.Applied)
	}

	code, stdout, stderr := copyTo(nil)
	pid := fmt.Sprintf("better-compute serve (pid %d)", d.serve.Pid())
	if code != 1 || !strings.Contains(stderr, pid) || !strings.Contains(stderr, "stop it first") {
		t.Errorf("store copy of a running deployment: exit %d, stdout %q, stderr %q; want exit 1 naming %s", code, stdout, stderr, pid)
	}
	if n := targetTables(); n != 0 {
		t.Errorf("the refused copy (running source) migrated the target: %d migrations", n)
	}
	d.serve.Stop(syscall.SIGTERM, 30*time.Second)

	code, stdout, stderr = copyTo([]string{"BETTER_COMPUTE_SECRET=" + strings.Repeat("w", 40)})
	if code != 1 || !strings.Contains(stderr, "does not open the PKI bundle") || !strings.Contains(stderr, "nothing was written") {
		t.Errorf("store copy with a wrong secret: exit %d, stdout %q, stderr %q; want exit 1 saying the secret does not open the PKI bundle", code, stdout, stderr)
	}
	if n := targetTables(); n != 0 {
		t.Errorf("the refused copy (wrong secret) migrated the target: %d migrations", n)
	}

	if code, stdout, stderr = copyTo(nil); code != 0 {
		t.Fatalf("store copy: exit %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = copyTo(nil)
	if code != 1 || !strings.Contains(stderr, "already holds a deployment") || !strings.Contains(stderr, "--replace") {
		t.Errorf("store copy into a target that holds rows: exit %d, stdout %q, stderr %q; want exit 1 naming --replace", code, stdout, stderr)
	}
	if code, stdout, stderr = copyTo(nil, "--replace"); code != 0 || !strings.Contains(stdout, "verified") {
		t.Errorf("store copy --replace: exit %d\n%s%s", code, stdout, stderr)
	}
}

// identityOf is the node id and join time in m's identity file.
func identityOf(t *testing.T, m *machine) string {
	t.Helper()
	var id struct {
		NodeID   string    `json:"node_id"`
		JoinedAt time.Time `json:"joined_at"`
	}
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join(m.dataDir, "identity.json"))), &id); err != nil {
		t.Fatal(err)
	}
	return id.NodeID + " joined at " + id.JoinedAt.String()
}
