package tests

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// splitExampleDir is the copyable split deployment the test runs.
const splitExampleDir = "docs/examples/split-roles"

// TestSplitRolesExample runs docs/examples/split-roles/README.md as an
// operator would: its files copied with the test's own paths, ports and
// database (and gw.compute.example.com as localhost), every command of
// its "Commands" block run in order. What needs a real system the test
// does itself: the units' ExecStart run as plain processes with their
// EnvironmentFile (StateDirectory made, NOTIFY_SOCKET bound so that
// "systemctl enable --now" returns on READY=1 as systemd would), and the
// test PgBouncer of tests/pgbouncer.sh stands in for the example's
// pgbouncer.ini (its transaction mode and port are checked against
// better-compute.yaml). Each process's doctor --strict line exits 0, then a
// FakeDaemon fleet joins through the gateway and runs a command through
// the api, and doctor passes again with the fleet.
func TestSplitRolesExample(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct, bouncer := pgtest.Database(t)
	bin := testenv.Binary(t, "better-compute")
	src := filepath.Join(repoRoot(), splitExampleDir)
	root := t.TempDir()
	apiPort, gwPort, internalPort := freePort(t), freePort(t), freePort(t)
	repl := strings.NewReplacer(
		"postgres://better-compute@127.0.0.1:6432/better_compute?default_query_exec_mode=exec", bouncer,
		"postgres://better-compute@127.0.0.1:5432/better_compute", direct,
		"/etc/better-compute", filepath.Join(root, "etc"),
		"/var/lib/better-compute", filepath.Join(root, "var"),
		"/usr/bin/better-compute", bin,
		"127.0.0.1:3000", fmt.Sprintf("127.0.0.1:%d", apiPort),
		"0.0.0.0:8443", fmt.Sprintf("127.0.0.1:%d", gwPort),
		"gw.compute.example.com:8443", fmt.Sprintf("localhost:%d", gwPort),
		"gw.compute.example.com", "localhost",
		":8444", fmt.Sprintf(":%d", internalPort),
	)
	checkExamplePgBouncer(t, src)

	// The example's folder, as the operator has it, with the test's names.
	work := filepath.Join(root, "example")
	if err := os.MkdirAll(work, 0o700); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(work, e.Name()), []byte(repl.Replace(string(b))), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	env := []string{}
	var doctorLines [][]string
	procs := map[string]*testenv.Proc{}
	t.Cleanup(func() {
		if t.Failed() {
			for name, p := range procs {
				t.Logf("%s's output:\n%s", name, p.Output())
			}
		}
	})
	ownerOpt := regexp.MustCompile(`\s-[og]\s+\S+`)
	for _, l := range readmeCommands(t, filepath.Join(src, "README.md")) {
		line := repl.Replace(l)
		switch {
		case strings.Contains(line, "pgbouncer"):
			// The test PgBouncer (tests/pgbouncer.sh) stands in.
		case strings.HasPrefix(line, "chown "), line == "systemctl daemon-reload",
			strings.HasPrefix(line, "install ") && strings.Contains(line, ".service"):
			// No better-compute user here; the units are read where they are.
		case strings.HasPrefix(line, "systemctl enable --now "):
			for _, unit := range strings.Fields(strings.TrimPrefix(line, "systemctl enable --now ")) {
				procs[unit] = startUnit(t, filepath.Join(work, unit+".service"))
			}
		case strings.HasPrefix(line, "set -a; . "):
			file := strings.Fields(strings.TrimPrefix(line, "set -a; . "))[0]
			env = append(env, readEnvFile(t, strings.TrimSuffix(file, ";"))...)
		case strings.HasPrefix(line, "better-compute "):
			args := strings.Fields(line)[1:]
			if slices.Contains(args, "doctor") {
				doctorLines = append(doctorLines, args)
				runDoctorLine(t, bin, env, args)
				continue
			}
			if code, out, errOut := testenv.Run(t, env, "", bin, args...); code != 0 {
				t.Fatalf("README: %s: exit %d\n%s%s", l, code, out, errOut)
			}
		default:
			// install, echo, chmod: as written, without the owner and group
			// options (no better-compute user on the test machine).
			cmd := exec.Command("bash", "-euc", ownerOpt.ReplaceAllString(line, ""))
			cmd.Dir = work
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("README: %s: %v\n%s", l, err, out)
			}
		}
	}
	if len(procs) != 3 || len(doctorLines) != 3 {
		t.Fatalf("the README started %d units and ran %d doctor lines, want 3 and 3", len(procs), len(doctorLines))
	}

	// A FakeDaemon fleet joins through the gateway; a command runs
	// through the api.
	secret := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "BETTER_COMPUTE_SECRET="); ok {
			secret = v
		}
	}
	st, err := backend.Open(ctx, direct, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "dc1", Region: "default"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "default", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := bootstrap.LoadBundle(ctx, st, secret)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	token, _, err := api.CreateJoinToken(ctx, st, bundle.GatewayPin(), pool.ID, time.Hour, n, "split example", "")
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := sim.NewFleet(sim.FleetConfig{GatewayURL: fmt.Sprintf("https://localhost:%d", gwPort), Token: token, N: n, NoInventory: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := fleet.Join(ctx); err != nil {
		t.Fatalf("FakeDaemons join through the example's gateway: %v", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	fleetDone := make(chan error, 1)
	go func() { fleetDone <- fleet.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-fleetDone })
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := fleet.WaitFor(wctx, func(s sim.FleetStats) bool { return s.Connected == n }); err != nil {
		t.Fatalf("FakeDaemons connected: %+v (%v)", fleet.Stats(), err)
	}
	adminToken, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleAdmin, Description: "split example"})
	if err != nil {
		t.Fatal(err)
	}
	admin := &client.Client{BaseURL: fmt.Sprintf("http://127.0.0.1:%d/api", apiPort), Token: adminToken}
	var ids []string
	for _, d := range fleet.Daemons() {
		ids = append(ids, d.NodeID())
	}
	resp := &apiv1.CreateCommandsResponse{}
	if err := admin.Call(ctx, "commands.create", &apiv1.CreateCommandsRequest{NodeIds: ids, Kind: "exec",
		Exec: &apiv1.ExecSpec{Argv: []string{"echo", "split"}}, Timeout: durationpb.New(30 * time.Second)}, resp); err != nil {
		t.Fatalf("commands.create through the example's api: %v", err)
	}
	for _, c := range resp.GetCommands() {
		var got *store.Command
		eventually(t, 60*time.Second, func() bool {
			got, err = st.CommandGet(ctx, c.GetId())
			return err == nil && got.State == store.CommandSucceeded
		}, func() string { return fmt.Sprintf("command %s on %s: %+v, %v", c.GetId(), c.GetNodeId(), got, err) })
	}
	for _, args := range doctorLines {
		runDoctorLine(t, bin, env, args)
	}
}

// readmeCommands returns the lines of the sh block under "## Commands" in
// the README at path, comments and blank lines left out.
func readmeCommands(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n## Commands\n")
	_, rest, ok2 := strings.Cut(rest, "```sh\n")
	block, _, ok3 := strings.Cut(rest, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatalf("%s has no sh block under ## Commands", path)
	}
	var out []string
	for _, l := range strings.Split(block, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// runDoctorLine runs a README doctor line until it exits 0 (the processes
// just told READY=1; the workers' first sweep may still be due), failing
// the test with its report after a minute.
func runDoctorLine(t *testing.T, bin string, env, args []string) {
	t.Helper()
	var code int
	var out, errOut string
	eventually(t, 60*time.Second, func() bool {
		code, out, errOut = testenv.Run(t, env, "", bin, args...)
		return code == 0
	}, func() string {
		return fmt.Sprintf("README: better-compute %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	})
}

// startUnit runs a unit's ExecStart as a plain process with its
// EnvironmentFile, its StateDirectory made, and returns once the process
// told READY=1 on NOTIFY_SOCKET, as systemctl start does for Type=notify.
func startUnit(t *testing.T, path string) *testenv.Proc {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var argv []string
	var env []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, val, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok || strings.HasPrefix(key, "#") {
			continue
		}
		switch key {
		case "ExecStart":
			argv = strings.Fields(val)
		case "EnvironmentFile":
			env = append(env, readEnvFile(t, val)...)
		case "Environment":
			env = append(env, strings.Fields(val)...)
		case "Type":
			if val != "notify" {
				t.Fatalf("%s: Type=%s, want notify", path, val)
			}
		}
	}
	if len(argv) == 0 {
		t.Fatalf("%s has no ExecStart", path)
	}
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ready := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			if strings.Contains("\n"+string(buf[:n])+"\n", "\nREADY=1\n") {
				close(ready)
				return
			}
		}
	}()
	p := testenv.Start(t, append(env, "NOTIFY_SOCKET="+sock), argv[0], argv[1:]...)
	select {
	case <-ready:
	case <-p.Done():
		t.Fatalf("%s: %s exited before READY=1:\n%s", filepath.Base(path), strings.Join(argv, " "), p.Output())
	case <-time.After(120 * time.Second):
		t.Fatalf("%s: no READY=1 within 2 min:\n%s", filepath.Base(path), p.Output())
	}
	return p
}

// readEnvFile reads KEY=VALUE lines as systemd's EnvironmentFile= does.
func readEnvFile(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(strings.TrimPrefix(path, "-"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") && strings.Contains(l, "=") {
			out = append(out, l)
		}
	}
	return out
}

// checkExamplePgBouncer checks that the example's pgbouncer.ini is what
// the test PgBouncer stands in for: transaction mode, on the port of
// better-compute.yaml's database.url.
func checkExamplePgBouncer(t *testing.T, dir string) {
	t.Helper()
	ini, err := os.ReadFile(filepath.Join(dir, "pgbouncer.ini"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "better-compute.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, l := range strings.Split(string(ini), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(strings.TrimSpace(l), ";") {
			settings[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	port := regexp.MustCompile(`url: postgres://[^@]+@[^:]+:(\d+)/`).FindSubmatch(cfg)
	if settings["pool_mode"] != "transaction" || port == nil || settings["listen_port"] != string(port[1]) {
		t.Fatalf("pgbouncer.ini: pool_mode %q, listen_port %q; better-compute.yaml's database.url port %q", settings["pool_mode"], settings["listen_port"], port)
	}
	if _, err := strconv.Atoi(settings["listen_port"]); err != nil {
		t.Fatalf("pgbouncer.ini listen_port %q", settings["listen_port"])
	}
}
