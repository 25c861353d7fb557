package tests

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// Exit statuses both binaries document: better-compute (DESIGN.md,
// "Operator CLI"; README.md) and bcd (docs/bcd.md).
const (
	exitOK        = 0
	exitFailure   = 1
	exitUsage     = 2
	exitRevoked   = 3 // bcd
	exitNotJoined = 5 // bcd
)

// exitCase is one invocation of a command and the exit status it must end
// with.
type exitCase struct {
	// cmd is the command's path, binary first: "better-compute nodes get".
	cmd string
	// args follow the path.
	args []string
	want int
	// env is added to the command's environment.
	env []string
	// last runs the case after every other, in table order: it changes
	// what the others rely on (the node's session, its certificate).
	last bool
	// exit, when set, is the status instead of running cmd (a process
	// the fixture started).
	exit func(t *testing.T) int
}

// exitFixture is what the cases run against: one embedded-default serve
// started once, one real bcd node joined to it and connected, and the ids
// the cases name.
type exitFixture struct {
	d       *deployment
	env     []string // better-compute's environment: the API URL and token too
	node    string   // the connected node's id
	m       *machine
	nodeP   *testenv.Proc
	command string // a finished command's id
	token   string // an API token's id, for tokens revoke
	join    string // a join token's id, for join-tokens revoke
	joinF   string // a join token file, for bcd join
	dir     string // scratch
	bcd     string // the bcd binary
	// access is a tenant of its own with a requestable policy (the policy
	// cases change the root's), its operator's and admin's token
	// environments, and requests to approve, deny and revoke.
	access struct {
		opEnv, adminEnv       []string
		approve, deny, revoke string
	}
}

// TestExitCodes runs every command of better-compute and bcd, found by
// walking each binary's command tree through --help, against exitCases:
// every command needs at least one case there, and every command (bad
// flag) and command group (no command, an unknown one) must exit 2 on a
// usage error. A new command without a case fails this test.
func TestExitCodes(t *testing.T) {
	t.Parallel()
	f := newExitFixture(t)
	cases := exitCases(f)

	bc := testenv.Binary(t, "better-compute")
	leaves, groups := commandTree(t, bc, "better-compute", f.env)
	bl, bg := commandTree(t, f.bcd, "bcd", nil)
	leaves, groups = append(leaves, bl...), append(groups, bg...)
	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.cmd] = true
		if !slices.Contains(leaves, c.cmd) && !slices.Contains(groups, c.cmd) {
			t.Errorf("exit case for %q, which is not a command (%q)", c.cmd, c.args)
		}
	}
	for _, l := range leaves {
		if !covered[l] {
			t.Errorf("%s has no exit case in tests/exitcodes_test.go exitCases: add one (usage, failure, success)", l)
		}
		// A bad flag is a usage error on every command.
		cases = append(cases, exitCase{cmd: l, args: []string{"--no-such-flag"}, want: exitUsage})
	}
	for _, g := range groups {
		cases = append(cases, exitCase{cmd: g, want: exitUsage}, exitCase{cmd: g, args: []string{"no-such-command"}, want: exitUsage})
	}

	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for _, c := range cases {
		if c.last {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			f.check(t, c)
		})
	}
	wg.Wait()
	for _, c := range cases {
		if c.last {
			f.check(t, c)
		}
	}
}

// check runs c and reports a wrong exit status.
func (f *exitFixture) check(t *testing.T, c exitCase) {
	t.Helper()
	if c.exit != nil {
		if got := c.exit(t); got != c.want {
			t.Errorf("%s %s: exit %d, want %d", c.cmd, strings.Join(c.args, " "), got, c.want)
		}
		return
	}
	bin, path, _ := strings.Cut(c.cmd, " ")
	args := append(strings.Fields(path), c.args...)
	var (
		code           int
		stdout, stderr string
	)
	switch {
	case bin == "bcd":
		code, stdout, stderr = testenv.Run(t, nil, "", f.bcd, args...)
	default:
		code, stdout, stderr = testenv.Run(t, append(slices.Clone(f.env), c.env...), "", f.d.bc, append([]string{"--config", f.d.cfgFile}, args...)...)
	}
	if code != c.want {
		t.Errorf("%s %s: exit %d, want %d\nstdout: %s\nstderr: %s", c.cmd, strings.Join(c.args, " "), code, c.want, stdout, stderr)
	}
	if code == exitUsage && strings.Count(strings.TrimSpace(lastLine(stderr)), "\n") != 0 {
		t.Errorf("%s %s: a usage error ends without its one line: %q", c.cmd, strings.Join(c.args, " "), stderr)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

// commandTree walks bin's commands through --help ("Available Commands:")
// and returns the paths of its leaves and of its groups, each starting
// with name. cobra's hidden commands are not listed, so not walked.
func commandTree(t *testing.T, bin, name string, env []string) (leaves, groups []string) {
	t.Helper()
	var walk func(path []string)
	walk = func(path []string) {
		code, stdout, stderr := testenv.Run(t, env, "", bin, append(path, "--help")...)
		if code != 0 {
			t.Fatalf("%s %s --help: exit %d\n%s", name, strings.Join(path, " "), code, stderr)
		}
		var subs []string
		in := false
		for l := range strings.SplitSeq(stdout, "\n") {
			switch {
			case l == "Available Commands:":
				in = true
			case in && strings.TrimSpace(l) == "":
				in = false
			case in:
				subs = append(subs, strings.Fields(l)[0])
			}
		}
		full := strings.Join(append([]string{name}, path...), " ")
		if len(subs) == 0 {
			leaves = append(leaves, full)
			return
		}
		groups = append(groups, full)
		for _, s := range subs {
			walk(append(slices.Clone(path), s))
		}
	}
	walk(nil)
	return leaves, groups
}

func newExitFixture(t *testing.T) *exitFixture {
	t.Helper()
	// The file sink hook is the sink sinks replay names (an unknown sink
	// is NOT_FOUND, issue 29).
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		top: "sinks:\n  files:\n    - name: hook\n      path: " + filepath.Join(t.TempDir(), "events.jsonl") + "\n"})
	f := &exitFixture{d: d, dir: t.TempDir(), bcd: testenv.Binary(t, "bcd")}
	f.env = append(slices.Clone(d.env), "BETTER_COMPUTE_URL="+d.api, "BETTER_COMPUTE_TOKEN="+d.adminToken)
	tokenFile, _ := f.joinToken(t, 1)
	f.m = newMachine(t, "exit-node")
	f.node = f.m.mustJoin(d.gatewayURL, tokenFile)
	f.nodeP = f.m.node()
	f.nodeP.WaitLine(sessionEstablished.String(), 30*time.Second)
	eventually(t, 15*time.Second, func() bool { return d.nodes()[f.node].State == "ready" },
		func() string { return "node " + f.node + " not ready" })
	f.joinF, f.join = f.joinToken(t, 2)

	code, stdout, stderr := testenv.Run(t, f.env, "", d.bc, "--config", d.cfgFile, "commands", "run", "--node", f.node, "-o", "json", "--", "true")
	var run struct {
		Commands []struct {
			ID string `json:"id"`
		} `json:"commands"`
	}
	if err := json.Unmarshal([]byte(stdout), &run); code != 0 || err != nil || len(run.Commands) != 1 {
		t.Fatalf("commands run: exit %d, %v\n%s%s", code, err, stdout, stderr)
	}
	f.command = run.Commands[0].ID
	var tok struct {
		APIToken struct {
			ID string `json:"id"`
		} `json:"apiToken"`
	}
	d.cliJSON(&tok, "tokens", "create", "--role", "viewer", "--description", "exit codes")
	f.token = tok.APIToken.ID
	if f.token == "" {
		t.Fatal("tokens create -o json gave no apiToken.id")
	}
	f.accessFixture(t)
	return f
}

// accessFixture makes the tenant exit-access, its requestable policy
// exit-access, an operator and an admin token of it, and three of the
// operator's requests (docs/access.md).
func (f *exitFixture) accessFixture(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	tn, err := f.d.st.TenantCreate(ctx, &store.TenantCreateParams{Name: "exit-access", ParentID: store.RootTenant})
	if err != nil {
		t.Fatal(err)
	}
	doc := "policies:\n  - name: exit-access\n    request: {requesters: {roles: [operator]}, approvers: {roles: [admin]}}\n" +
		"    statements: [{effect: allow, actions: [nodes.get]}]\n"
	// Through the API: the serve process decides by it at once.
	f.d.cli("policy", "apply", "--tenant", tn.ID, f.file("exit-access-policy", doc))
	env := func(role string) ([]string, string) {
		secret, tok, err := iam.Create(ctx, f.d.st, iam.CreateParams{Role: role, TenantID: tn.ID, Description: "exit codes access"})
		if err != nil {
			t.Fatal(err)
		}
		return []string{"BETTER_COMPUTE_TOKEN=" + secret}, "token:" + tok.ID
	}
	var op string
	f.access.opEnv, op = env(store.RoleOperator)
	f.access.adminEnv, _ = env(store.RoleAdmin)
	for _, dst := range []*string{&f.access.approve, &f.access.deny, &f.access.revoke} {
		r, err := f.d.st.AccessRequestCreate(ctx, &store.AccessRequestCreateParams{TenantID: tn.ID, Requester: op,
			RequesterRole: store.RoleOperator, Policy: "exit-access", Duration: time.Hour, Reason: "exit codes"})
		if err != nil {
			t.Fatal(err)
		}
		*dst = r.ID
	}
}

// joinToken makes a join token for the pool default with joinTokens.create
// and returns its file and id.
func (f *exitFixture) joinToken(t *testing.T, maxUses int) (file, id string) {
	t.Helper()
	file = filepath.Join(t.TempDir(), "join-token")
	var resp struct {
		JoinToken struct {
			ID string `json:"id"`
		} `json:"joinToken"`
	}
	f.d.cliJSON(&resp, "join-tokens", "create", "--pool", "default", "--max-uses", strconv.Itoa(maxUses), "--out", file)
	if resp.JoinToken.ID == "" {
		t.Fatal("join-tokens create -o json gave no joinToken.id")
	}
	return file, resp.JoinToken.ID
}

// withEnv gives c env besides the fixture's (a later value wins).
func withEnv(c exitCase, env []string) exitCase {
	c.env = append(c.env, env...)
	return c
}

// withSecret gives c the deployment secret a database URL needs.
func withSecret(c exitCase) exitCase {
	c.env = append(c.env, "BETTER_COMPUTE_SECRET="+testSecret)
	return c
}

// file writes body to a new file in the fixture's scratch folder.
func (f *exitFixture) file(name, body string) string {
	p := filepath.Join(f.dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		panic(err)
	}
	return p
}

// exitCases is the table: at least one case per command of both binaries
// (a usage error, a failure and a success where one is cheap), besides the
// bad flag every command is run with.
func exitCases(f *exitFixture) []exitCase {
	bc := func(path string, want int, args ...string) exitCase {
		return exitCase{cmd: "better-compute " + path, args: args, want: want}
	}
	scratch := func(name string) string { return filepath.Join(f.dir, name) }
	pw := f.file("bmc-password", "secret\n")
	pwNotUTF8 := f.file("bmc-password-not-utf8", "se\xffcret\n")
	notAFile := f.file("plain-file", "x")
	unreachableDB := "postgres://postgres@127.0.0.1:1/nothing?connect_timeout=2"
	f.file("bad-statement.minisig", "untrusted comment: not a signature\nx\n")
	return []exitCase{
		bc("version", exitOK),
		bc("version", exitUsage, "extra"),
		bc("help", exitOK, "nodes", "get"),
		bc("help", exitUsage, "no-such-topic"),
		bc("completion bash", exitOK),
		bc("completion zsh", exitOK),
		bc("completion fish", exitOK),
		bc("completion powershell", exitUsage, "extra"),
		bc("completion powershell", exitOK),

		bc("serve", exitUsage, "extra"),
		// The deployment's own API port is taken: listening fails.
		bc("serve", exitFailure, "--data-dir", scratch("serve-busy"), "--port", strings.TrimPrefix(f.d.api, "http://127.0.0.1:")),
		bc("migrate", exitOK),
		withSecret(bc("migrate", exitFailure, "--database-url", unreachableDB)),
		bc("migrate", exitUsage, "--database-url", unreachableDB), // no secret: a configuration error
		bc("doctor", exitOK),
		bc("doctor", exitUsage, "-o", "yaml"),
		withSecret(bc("doctor", exitFailure, "--database-url", unreachableDB)),
		bc("dev", exitUsage, "--sim", "-1"),
		bc("dev", exitUsage, "extra"),

		bc("store copy", exitUsage),                          // --to is required
		bc("store copy", exitFailure, "--to", unreachableDB), // the deployment runs: refused, naming serve
		bc("backup", exitUsage),                              // --out is required
		bc("backup", exitOK, "--out", scratch("backup.tar")), // online, beside the running serve
		bc("backup", exitFailure, "--out", filepath.Join(notAFile, "backup.tar")),
		bc("restore", exitUsage, "--data-dir", scratch("restored")), // --from is required
		bc("restore", exitFailure, "--from", notAFile, "--data-dir", scratch("restored")),

		bc("pki init", exitUsage), // --trust-domain is required
		bc("pki init", exitOK, "--data-dir", scratch("pki-init"), "--trust-domain", "exit.test"),
		bc("pki init", exitFailure, "--trust-domain", "again.test"), // already initialised
		bc("pki issue-gateway", exitUsage, "--dns", "localhost"),    // no --out-dir
		bc("pki issue-gateway", exitOK, "--dns", "localhost", "--out-dir", scratch("gw")),
		bc("pki issue-gateway", exitFailure, "--dns", "localhost", "--out-dir", notAFile),
		bc("pki issue-internal", exitUsage, "--out-dir", scratch("int")),                       // no --name
		bc("pki issue-internal", exitUsage, "--name", "Bad Name", "--out-dir", scratch("int")), // invalid name
		bc("pki issue-internal", exitOK, "--name", "cp-1", "--ip", "127.0.0.1", "--out-dir", scratch("int")),
		bc("pki issue-internal", exitFailure, "--name", "cp-1", "--out-dir", notAFile),
		bc("pki revoke", exitUsage),
		bc("pki revoke", exitFailure, "--node", "node_nosuch"),

		bc("sites create", exitUsage, "--region", "r"),
		bc("sites create", exitOK, "--name", "exit-site", "--region", "default"),
		bc("sites list", exitOK),
		bc("sites list", exitUsage, "-o", "yaml"),
		bc("pools create", exitUsage, "--name", "p"),
		// The cases run concurrently: a site the deployment made (the
		// embedded default's), not exit-site, which another case creates.
		bc("pools create", exitOK, "--name", "exit-pool", "--site", "default"),
		bc("pools create", exitFailure, "--name", "exit-pool-2", "--site", "no-such-site"),
		bc("pools list", exitOK),
		bc("pools list", exitUsage, "extra"),
		// The cases run concurrently: the pool the fixture made, not one
		// another case creates.
		bc("pools move", exitUsage, "default"),
		bc("pools move", exitFailure, "no-such-pool", "root"),
		bc("nodes move", exitUsage, "node_x"),
		bc("nodes move", exitFailure, "node_missing", "--tenant", "root"),
		// Tenants and recordings: usage and failure only (the cases run
		// concurrently; none changes what another reads).
		bc("tenants create", exitUsage),
		bc("tenants list", exitOK),
		bc("tenants list", exitUsage, "extra"),
		bc("tenants get", exitOK, "root"),
		bc("tenants get", exitUsage),
		bc("tenants get", exitFailure, "no-such-tenant"),
		bc("tenants suspend", exitUsage),
		bc("tenants suspend", exitUsage, "root"), // INVALID_ARGUMENT: the root is neither suspended nor deleted
		bc("tenants resume", exitUsage),
		bc("tenants delete", exitUsage),
		bc("tenants delete", exitUsage, "root"),
		// policy: a file that does not compile is INVALID_ARGUMENT (a
		// usage error), failing tests of policy test are a failure.
		bc("policy apply", exitUsage),
		bc("policy apply", exitUsage, scratch("no-policy-file")),
		bc("policy apply", exitUsage, f.file("bad-policy", "policies: [x]\n")),
		bc("policy apply", exitOK, f.file("empty-policy", "policies: []\n")),
		bc("policy test", exitUsage),
		bc("policy test", exitOK, f.file("empty-policy-2", "policies: []\n")),
		bc("policy test", exitFailure, f.file("failing-policy", "policies: []\ntests:\n  - {name: t, caller: {role: viewer}, action: nodes.drain, expect: allow}\n")),
		bc("policy get", exitOK),
		bc("policy get", exitUsage, "extra"),
		bc("policy get", exitFailure, "--tenant", "no-such-tenant"),
		bc("login", exitUsage, "extra"),
		bc("login", exitFailure, "--no-browser"), // single sign-on is not configured here: NOT_FOUND
		bc("logout", exitUsage, "extra"),
		bc("logout", exitOK), // not signed in: nothing to end
		bc("policy list", exitOK),
		bc("policy list", exitUsage, "extra"),
		// access: in the tenant exit-access (its own policy), as its
		// operator or admin; a policy that is not requestable, a duration
		// out of bounds and a bad --resource are usage errors, an unknown
		// request a failure.
		withEnv(bc("access request", exitOK, "--policy", "exit-access", "--for", "1h", "--reason", "exit codes"), f.access.opEnv),
		bc("access request", exitUsage),
		bc("access request", exitUsage, "--policy", "p", "--for", "30s", "--reason", "r"),
		bc("access request", exitUsage, "--policy", "p", "--for", "1h"),
		bc("access request", exitUsage, "--policy", "p", "--for", "1h", "--reason", "r", "--resource", "rack:r1"),
		bc("access request", exitUsage, "--policy", "no-such-policy", "--for", "1h", "--reason", "r"),
		bc("access list", exitOK),
		bc("access list", exitOK, "--mine", "--state", "pending"),
		bc("access list", exitUsage, "--state", "bogus"),
		bc("access list", exitUsage, "extra"),
		withEnv(bc("access approve", exitOK, f.access.approve), f.access.adminEnv),
		withEnv(bc("access approve", exitFailure, f.access.deny), f.access.opEnv), // its requester: PERMISSION_DENIED
		bc("access approve", exitUsage),
		bc("access approve", exitFailure, "acr_nosuch"),
		withEnv(bc("access deny", exitOK, f.access.deny, "--reason", "no"), f.access.adminEnv),
		bc("access deny", exitUsage),
		bc("access deny", exitFailure, "acr_nosuch"),
		withEnv(bc("access revoke", exitOK, f.access.revoke), f.access.opEnv),
		bc("access revoke", exitUsage),
		bc("access revoke", exitFailure, "acr_nosuch"),
		bc("recordings list", exitOK),
		bc("recordings list", exitUsage, "extra"),
		bc("recordings play", exitUsage),
		bc("recordings play", exitFailure, "rec_nosuch"),
		// A node-CA rotation: never started here (it would reach every
		// other case's node), so start, advance and rollback are usage
		// cases, and status and advance answer that none is open.
		bc("pki rotate node-ca start", exitUsage, "extra"),
		bc("pki rotate node-ca status", exitUsage, "extra"),
		bc("pki rotate node-ca advance", exitUsage, "extra"),
		bc("pki rotate node-ca rollback", exitUsage, "extra"),
		bc("pki rotate gateway-ca start", exitUsage, "extra"),
		bc("pki rotate gateway-ca status", exitUsage, "extra"),
		bc("pki rotate gateway-ca advance", exitUsage, "extra"),
		bc("pki rotate gateway-ca rollback", exitUsage, "extra"),
		bc("pki rotate internal-ca start", exitUsage, "extra"),
		bc("pki rotate internal-ca status", exitUsage, "extra"),
		bc("pki rotate internal-ca advance", exitUsage, "extra"),
		bc("pki rotate internal-ca rollback", exitUsage, "extra"),
		bc("pools get", exitOK, "default"),
		bc("pools get", exitUsage),
		bc("pools get", exitFailure, "no-such-pool"),
		bc("pools set-budget", exitOK, "default", "--budget", "100%"),
		bc("pools set-budget", exitUsage, "default"),
		bc("pools set-budget", exitUsage, "default", "--budget", "101%"),
		bc("pools set-budget", exitUsage, "default", "--budget", "4294967296"),
		bc("pools set-budget", exitUsage, "default", "--remediation-concurrency", "0"),
		bc("pools set-budget", exitFailure, "no-such-pool", "--budget", "2"),
		bc("join-tokens create", exitUsage),
		bc("join-tokens create", exitOK, "--pool", "default", "--out", scratch("jt")),
		bc("join-tokens create", exitFailure, "--pool", "no-such-pool", "--out", scratch("jt2")),
		bc("join-tokens list", exitOK),
		bc("join-tokens revoke", exitUsage),
		bc("join-tokens revoke", exitFailure, "jt_nosuch"),
		bc("join-tokens revoke", exitOK, f.join),

		bc("gateways list", exitOK),
		bc("gateways list", exitUsage, "-o", "yaml"),
		bc("gateways drain", exitUsage),
		bc("gateways drain", exitFailure, "gw_nosuch"), // NOT_FOUND; the embedded gateway is left serving the other cases
		bc("gateways undrain", exitUsage, "a", "b"),
		bc("gateways undrain", exitFailure, "gw_nosuch"),
		bc("processes list", exitOK),
		bc("processes list", exitUsage, "extra"),

		bc("nodes list", exitOK),
		bc("nodes list", exitUsage, "--state", "weird"), // refused by the API: INVALID_ARGUMENT
		bc("nodes get", exitOK, f.node),
		bc("nodes get", exitUsage),
		bc("nodes get", exitFailure, "node_nosuch"),
		bc("nodes get", exitUsage, "node_\xff"), // not UTF-8: the client refuses to send it, as the API would
		bc("nodes cordon", exitFailure, "node_nosuch"),
		bc("nodes uncordon", exitOK, f.node),
		bc("nodes drain", exitUsage, "a", "b"),
		bc("nodes delete", exitFailure, "node_nosuch"),
		bc("nodes set-gpu-count", exitUsage, f.node),
		bc("nodes set-gpu-count", exitUsage, f.node, "many"),
		bc("nodes set-gpu-count", exitUsage, f.node, "65"), // refused by the API: INVALID_ARGUMENT
		bc("nodes set-gpu-count", exitFailure, "node_nosuch", "8"),
		bc("nodes add", exitUsage),
		// UNAVAILABLE: this deployment serves no downloads (downloads.dir).
		bc("nodes add", exitFailure, "--pool", "default"),
		bc("nodes add", exitFailure, "--pool", "no-such-pool"),
		bc("nodes upgrade", exitUsage, "--node", f.node),                       // no --version
		bc("nodes upgrade", exitUsage, "--node", f.node, "--version", "0.2.0"), // INVALID_ARGUMENT: no downloads, no --base-url
		bc("nodes upgrade", exitFailure, "--node", "node_nosuch", "--version", "0.2.0", "--base-url", "https://example.com/api/downloads"),
		bc("nodes reinstall", exitUsage),
		bc("nodes reinstall", exitFailure, "node_nosuch"),
		bc("nodes reinstall", exitOK, f.node, "--out", scratch("reinstall-token")),
		bc("nodes shell", exitUsage),
		bc("nodes shell", exitFailure, "node_nosuch"),                // NOT_FOUND
		bc("nodes shell", exitOK, f.node),                            // stdin is empty: the shell reads end of input and exits 0
		bc("nodes port-forward", exitUsage, f.node),                  // no port
		bc("nodes port-forward", exitUsage, f.node, "99999"),         // not a port
		bc("nodes port-forward", exitUsage, f.node, "x:80"),          // not a local port
		bc("nodes port-forward", exitUsage, f.node, "127.0.0.1:22"),  // LOCAL is a port, not an address (--address)
		bc("nodes port-forward", exitFailure, "node_nosuch", "0:22"), // refused before it listens (it waited for a connection)

		bc("commands run", exitOK, "--node", f.node, "--", "true"),
		bc("commands run", exitFailure, "--node", f.node, "--", "false"),
		bc("commands run", exitUsage, "--pool", "default"),                                // no argv
		bc("commands run", exitUsage, "--node", f.node, "--timeout", "48h", "--", "true"), // INVALID_ARGUMENT
		bc("commands run", exitFailure, "--node", "node_nosuch", "--", "true"),
		bc("commands run", exitUsage, "--node", f.node, "--", "echo", "\xff"), // argv not UTF-8
		bc("commands get", exitOK, f.command),
		bc("commands get", exitUsage),
		bc("commands get", exitFailure, "cmd_nosuch"),
		bc("commands list", exitOK),
		bc("commands list", exitUsage, "--state", "weird"), // INVALID_ARGUMENT
		bc("commands cancel", exitFailure, "cmd_nosuch"),

		bc("tokens create", exitOK, "--role", "viewer"),
		bc("tokens create", exitUsage, "--role", "emperor"), // INVALID_ARGUMENT
		bc("tokens create", exitUsage, "--role", "viewer", "--description", "a\xffb"),
		bc("tokens list", exitOK),
		bc("tokens revoke", exitUsage),
		bc("tokens revoke", exitFailure, "tok_nosuch"),
		bc("tokens revoke", exitOK, f.token),

		bc("bmc status", exitUsage), // no --node
		bc("bmc status", exitFailure, "--node", "node_nosuch"),
		bc("bmc on", exitFailure, "--node", "node_nosuch"),
		bc("bmc off", exitFailure, "--node", "node_nosuch"),
		bc("bmc soft-off", exitFailure, "--node", "node_nosuch"),
		bc("bmc cycle", exitFailure, "--node", "node_nosuch"),
		bc("bmc reset", exitFailure, "--node", "node_nosuch"),
		bc("bmc boot", exitUsage, "--node", f.node, "--device", "floppy"),
		bc("bmc credentials set", exitUsage, "--node", f.node),
		bc("bmc credentials set", exitUsage, "--node", f.node, "--address", "10.0.0.9", "--username", "admin", "--password-file", pwNotUTF8),
		bc("bmc credentials set", exitOK, "--node", f.node, "--address", "10.0.0.9", "--username", "admin", "--password-file", pw),
		bc("bmc credentials set", exitFailure, "--node", "node_nosuch", "--address", "10.0.0.9", "--username", "admin", "--password-file", pw),
		bc("bmc credentials delete", exitUsage),

		bc("daemon install-script", exitUsage, "--gateway-url", "https://localhost:8443"), // no --out
		bc("daemon install-script", exitOK, "--gateway-url", "https://localhost:8443", "--base-url", "https://localhost",
			"--bcd-version", "0.1.0", "--out", scratch("install.sh")),
		bc("daemon install-script", exitFailure, "--gateway-url", "https://localhost:8443", "--base-url", "https://localhost",
			"--bcd-version", "0.1.0", "--out", filepath.Join(notAFile, "install.sh")),

		bc("release keygen", exitUsage),
		bc("release keygen", exitOK, "--out-dir", scratch("release-keys")),
		bc("release manifest", exitUsage),
		bc("release manifest", exitFailure, "--dist", scratch("no-dist"), "--version", "0.1.0"),
		bc("release sign", exitUsage),
		bc("release sign", exitFailure, "--key", scratch("no-key"), "--in", notAFile),
		bc("release verify", exitUsage),
		bc("release verify", exitFailure, "--pins", "sha256/"+strings.Repeat("A", 43)+"=", "--in", notAFile),
		bc("release pins sign", exitUsage, "--key", scratch("no-key"), "--out", scratch("pin-statement")),                          // neither --add nor --remove
		bc("release pins sign", exitUsage, "--key", scratch("no-key"), "--add", "sha256/short", "--out", scratch("pin-statement")), // malformed pin
		bc("release pins sign", exitFailure, "--key", scratch("no-key"), "--add", "sha256/"+strings.Repeat("A", 43)+"=", "--out", scratch("pin-statement")),
		// release pins add|remove FILE: FILE and FILE.minisig; a statement
		// that does not verify is INVALID_ARGUMENT (a usage error).
		bc("release pins add", exitUsage),
		bc("release pins add", exitUsage, scratch("no-statement")),
		bc("release pins add", exitUsage, f.file("bad-statement", "{}")),
		bc("release pins remove", exitUsage),
		bc("release pins remove", exitUsage, scratch("no-statement")),
		bc("release pins status", exitOK, "sha256/"+strings.Repeat("A", 43)+"="),
		bc("release pins status", exitUsage),
		bc("release pins status", exitUsage, "sha256/short"),

		bc("audit list", exitOK),
		bc("audit list", exitOK, "--method", "tokens.", "-o", "json"),
		bc("audit list", exitUsage, "--since", "last tuesday"),
		bc("audit list", exitUsage, "extra"),

		bc("events list", exitOK),
		bc("events list", exitOK, "--type", "node.", "--since", "1h", "-o", "json"),
		bc("events list", exitUsage, "--since", "yesterday"),
		bc("events list", exitUsage, "--subject", strings.Repeat("s", 300)), // INVALID_ARGUMENT
		bc("events watch", exitUsage, "--after", "x"),
		bc("events watch", exitUsage, "--after", "999999999"), // INVALID_ARGUMENT: no such event yet
		bc("events watch", exitUsage, "--type", ","),

		bc("sinks dead-letters", exitOK),
		bc("sinks dead-letters", exitOK, "--sink", "hook", "-o", "json"),
		bc("sinks dead-letters", exitUsage, "--sink", "Bad Sink!"), // INVALID_ARGUMENT
		bc("sinks dead-letters", exitUsage, "extra"),
		bc("sinks replay", exitOK, "--all", "--sink", "hook"),              // none to replay
		bc("sinks replay", exitFailure, "999999"),                          // NOT_FOUND
		bc("sinks replay", exitFailure, "--all", "--sink", "no-such-sink"), // NOT_FOUND: not configured
		bc("sinks replay", exitUsage),
		bc("sinks replay", exitUsage, "x"),
		bc("sinks replay", exitUsage, "--all"),
		bc("sinks replay", exitUsage, "1", "--all", "--sink", "hook"),
		bc("reservations create", exitOK, "--pool", "default", "--gpus", "1", "--duration", "1h", "--owner", "exit"),
		bc("reservations create", exitOK, "--pool", "default", "--nodes", "1", "--start", "2h", "--end", "3h", "--owner", "exit", "-o", "json"),
		bc("reservations create", exitUsage, "--pool", "default", "--gpus", "1", "--duration", "1h"),                            // no owner
		bc("reservations create", exitUsage, "--pool", "default", "--gpus", "1", "--nodes", "1", "--end", "1h", "--owner", "o"), // both
		bc("reservations create", exitUsage, "--pool", "default", "--gpus", "1", "--end", "tomorrow", "--owner", "o"),
		bc("reservations create", exitUsage, "--pool", "default", "--gpus", "1", "--end", "1h", "--owner", "o", "--min-gpu-memory", "lots"),
		bc("reservations create", exitUsage, "--pool", "default", "--gpus", "5000", "--end", "1h", "--owner", "o"), // INVALID_ARGUMENT
		bc("reservations create", exitFailure, "--pool", "no-such-pool", "--gpus", "1", "--end", "1h", "--owner", "o"),
		bc("reservations list", exitOK),
		bc("reservations list", exitOK, "--pool", "default", "-o", "json"),
		bc("reservations list", exitUsage, "--state", "bogus"), // INVALID_ARGUMENT
		bc("reservations list", exitUsage, "extra"),
		bc("reservations get", exitFailure, "res_nosuch"),
		bc("reservations get", exitUsage),
		bc("reservations cancel", exitFailure, "res_nosuch"),
		bc("reservations cancel", exitUsage),
		bc("reservations extend", exitFailure, "res_nosuch", "--by", "1h"),
		bc("reservations extend", exitUsage, "res_nosuch"),
		bc("reservations extend", exitUsage, "res_nosuch", "--by", "-1h"),
		bc("capacity", exitOK),
		bc("capacity", exitOK, "--pool", "default", "--from", "1h", "--to", "2h", "-o", "json"),
		bc("capacity", exitUsage, "--from", "1h"), // INVALID_ARGUMENT: no --to
		bc("capacity", exitUsage, "--at", "noon"),
		bc("capacity", exitFailure, "--pool", "no-such-pool"),
		bc("capacity", exitUsage, "extra"),
		bc("remediation list", exitOK),
		bc("remediation list", exitOK, "--pool", "default", "--open", "-o", "json"),
		bc("remediation list", exitUsage, "--state", "bogus"), // INVALID_ARGUMENT
		bc("remediation list", exitFailure, "--pool", "no-such-pool"),
		bc("remediation list", exitUsage, "extra"),
		bc("remediation get", exitFailure, "rem_nosuch"),
		bc("remediation get", exitUsage),
		bc("remediation pause", exitFailure, "rem_nosuch"),
		bc("remediation pause", exitUsage),
		bc("remediation resume", exitFailure, "rem_nosuch"),
		bc("remediation resume", exitUsage, "a", "b"),
		bc("remediation return", exitFailure, "rem_nosuch", "--note", "fixed"),
		bc("remediation return", exitUsage),
		bc("remediation return", exitUsage, "rem_nosuch", "--reset-gpu", "--force"), // INVALID_ARGUMENT: one way at most
		bc("remediation stats", exitOK),
		bc("remediation stats", exitOK, "--pool", "default", "-o", "json"),
		bc("remediation stats", exitFailure, "--pool", "no-such-pool"),
		bc("remediation stats", exitUsage, "extra"),
		bc("nodes gpu-reset", exitFailure, "node_nosuch", "--gpu", "0"),
		bc("nodes gpu-reset", exitUsage),
		bc("nodes reboot", exitFailure, "node_nosuch"),
		bc("nodes reboot", exitUsage, "a", "b"),
		bc("remediation reset-breaker", exitOK, "default"),
		bc("remediation reset-breaker", exitFailure, "no-such-pool"),
		bc("remediation reset-breaker", exitUsage),
		bc("remediation history", exitUsage),                                   // neither a node nor --gpu
		bc("remediation history", exitOK, "--gpu", "GPU-nosuch", "-o", "json"), // nothing kept: an empty history
		bc("remediation history", exitUsage, "--gpu", "GPU with spaces"),       // INVALID_ARGUMENT
		bc("remediation history", exitUsage, "a", "b"),
		bc("gpus list", exitOK),
		bc("gpus list", exitOK, "--unhealthy", "--pool", "default", "--model", "NVIDIA A100-SXM4-40GB", "-o", "json"),
		bc("gpus list", exitFailure, "--pool", "no-such-pool"),
		bc("gpus list", exitUsage, "extra"),
		bc("gpus get", exitFailure, "GPU-nosuch"), // NOT_FOUND: no inventory listed it
		bc("gpus get", exitUsage),
		bc("gpus get", exitUsage, "GPU with spaces"), // INVALID_ARGUMENT
		bc("gpus get", exitUsage, "a", "b"),
		bc("rollouts create", exitUsage, "--pool", "default"),                       // no --version
		bc("rollouts create", exitUsage, "--version", "0.2.0", "--pool", "default"), // INVALID_ARGUMENT: no downloads to verify it against
		bc("rollouts create", exitUsage, "--version", "0.2.0", "--pool", "default", "--soak", "soon"),
		bc("rollouts create", exitFailure, "--version", "0.2.0", "--pool", "no-such-pool"),
		bc("rollouts list", exitOK),
		bc("rollouts list", exitOK, "--pool", "default", "--active", "-o", "json"),
		bc("rollouts list", exitFailure, "--pool", "no-such-pool"),
		bc("rollouts list", exitUsage, "extra"),
		bc("rollouts get", exitFailure, "roll_nosuch"),
		bc("rollouts get", exitFailure, "roll_nosuch", "--watch"),
		bc("rollouts get", exitUsage),
		bc("rollouts get", exitUsage, "roll_nosuch", "--every", "0s"),
		bc("rollouts pause", exitFailure, "roll_nosuch"),
		bc("rollouts pause", exitUsage),
		bc("rollouts resume", exitFailure, "roll_nosuch"),
		bc("rollouts resume", exitUsage, "a", "b"),
		bc("rollouts abort", exitFailure, "roll_nosuch", "--reason", "test"),
		bc("rollouts abort", exitUsage),

		{cmd: "bcd version", want: exitOK},
		{cmd: "bcd help", args: []string{"status"}, want: exitOK},
		{cmd: "bcd completion bash", want: exitOK},
		{cmd: "bcd completion zsh", want: exitOK},
		{cmd: "bcd completion fish", want: exitOK},
		{cmd: "bcd completion powershell", want: exitOK},
		{cmd: "bcd completion bash", args: []string{"extra"}, want: exitUsage},
		{cmd: "bcd completion", args: []string{"bogus"}, want: exitUsage},
		{cmd: "bcd status", args: []string{"--data-dir", f.m.dataDir}, want: exitOK},
		{cmd: "bcd status", args: []string{"--data-dir", scratch("bcd-empty")}, want: exitFailure},
		{cmd: "bcd status", args: []string{"-o", "yaml"}, want: exitUsage},
		{cmd: "bcd doctor", args: []string{"extra"}, want: exitUsage},
		{cmd: "bcd helper", args: []string{"--node-user", "root"}, want: exitUsage},
		{cmd: "bcd join", args: []string{"--token-file", f.joinF}, want: exitUsage}, // no --gateway
		{cmd: "bcd join", args: []string{"--gateway", "https://127.0.0.1:1", "--token-file", f.joinF, "--data-dir", scratch("bcd-join")}, want: exitFailure},
		{cmd: "bcd node", args: []string{"--data-dir", scratch("bcd-not-joined")}, want: exitNotJoined},
		{cmd: "bcd node", args: []string{"--log-level", "loud"}, want: exitUsage},

		// Last, in order: these change the node others use.
		{cmd: "better-compute nodes cordon", args: []string{f.node}, want: exitOK, last: true},
		{cmd: "better-compute nodes drain", args: []string{f.node}, want: exitOK, last: true},
		{cmd: "better-compute commands cancel", args: []string{f.command}, want: exitOK, last: true}, // finished already: says so
		{cmd: "better-compute bmc credentials delete", args: []string{"--node", f.node}, want: exitOK, last: true},
		{cmd: "better-compute pki revoke", args: []string{"--node", f.node}, want: exitOK, last: true},
		// The running agent stops for good once its identity is revoked.
		{cmd: "bcd node", want: exitRevoked, last: true, exit: func(t *testing.T) int { return f.nodeP.Wait(30 * time.Second) }},
		// Its state file is left, saying it is no longer running.
		{cmd: "bcd status", args: []string{"--data-dir", f.m.dataDir}, want: exitFailure, last: true},
		{cmd: "better-compute nodes delete", args: []string{f.node}, want: exitOK, last: true},
	}
}
