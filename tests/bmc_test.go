package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// The BMC commands end to end: a real control plane (serve, SQLite), a real
// `bcd node --unprivileged` as a fresh system user beside a real root
// `bcd helper`, the real bcx-ipmi in the helper's plugin directory, and
// OpenIPMI's ipmi_sim as the BMC on 127.0.0.1 (plugins/ipmi/testdata).

const (
	simUser     = "admin"
	simPassword = "bc-sim-Pa55word" // plugins/ipmi/testdata/lan.conf
	badPassword = "Wr0ng-Pa55-e2e-7k"
)

// requireIPMITools skips the test when ipmi_sim or ipmitool is missing,
// except under CI=true, where it fails (tests/run installs them).
func requireIPMITools(t *testing.T) {
	t.Helper()
	for _, n := range []string{"ipmi_sim", "ipmitool"} {
		if _, err := exec.LookPath(n); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s not found and CI=true: install ipmitool and openipmi (tests/run does)", n)
			}
			t.Skipf("%s not found: install ipmitool and openipmi to run this test", n)
		}
	}
}

// ipmiSim is a running ipmi_sim.
type ipmiSim struct {
	port  int
	state string // the chassis_control script's state directory
}

func freeUDP(t *testing.T) int {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// startIPMISim starts ipmi_sim on 127.0.0.1 with plugins/ipmi/testdata's
// configuration and waits until ipmitool gets an answer.
func startIPMISim(t *testing.T) *ipmiSim {
	t.Helper()
	return startIPMISimWith(t, "")
}

// startIPMISimWith is startIPMISim with chassisControl as the chassis
// control program ("": plugins/ipmi/testdata/chassis_control), run as
// "chassisControl STATE get|set ...".
func startIPMISimWith(t *testing.T, chassisControl string) *ipmiSim {
	t.Helper()
	requireIPMITools(t)
	td := filepath.Join(repoRoot(), "plugins", "ipmi", "testdata")
	if chassisControl == "" {
		chassisControl = filepath.Join(td, "chassis_control")
	}
	dir := t.TempDir()
	s := &ipmiSim{port: freeUDP(t), state: filepath.Join(dir, "chassis")}
	for _, d := range []string{s.state, filepath.Join(dir, "sim")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conf, err := os.ReadFile(filepath.Join(td, "lan.conf"))
	if err != nil {
		t.Fatal(err)
	}
	conf = []byte(strings.NewReplacer("@PORT@", strconv.Itoa(s.port), "@CHASSIS_CONTROL@", chassisControl,
		"@STATE@", s.state).Replace(string(conf)))
	if err := os.WriteFile(filepath.Join(dir, "lan.conf"), conf, 0o600); err != nil {
		t.Fatal(err)
	}
	p := testenv.Start(t, nil, "ipmi_sim", "-c", filepath.Join(dir, "lan.conf"), "-f", filepath.Join(td, "sim.emu"),
		"-s", filepath.Join(dir, "sim"), "-n")
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		probe := exec.CommandContext(ctx, "ipmitool", "-I", "lanplus", "-C", "3", "-H", "127.0.0.1",
			"-p", strconv.Itoa(s.port), "-U", simUser, "-E", "chassis", "power", "status")
		probe.Env = []string{"IPMITOOL_PASSWORD=" + simPassword}
		out, err := probe.CombinedOutput()
		cancel()
		if err == nil {
			return s
		}
		select {
		case <-p.Done():
			t.Fatalf("ipmi_sim exited: %s", p.Output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("ipmi_sim on port %d does not answer: %v: %s", s.port, err, out)
		}
	}
}

// read returns a chassis state file ("power": 0 or 1, "boot").
func (s *ipmiSim) read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.state, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// bmcView is a command as `bmc ... -o json` prints it.
type bmcView struct {
	ID     string         `json:"id"`
	State  string         `json:"state"`
	Error  string         `json:"error"`
	Result map[string]any `json:"result"`
}

// bmcRun is one `better-compute bmc` run.
type bmcRun struct {
	code           int
	stdout, stderr string
	took           time.Duration
	cmd            bmcView
}

// childOf returns the pid of a child of ppid whose command is name, or 0.
func childOf(ppid int, name string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || s[open+1:end] != name {
			continue
		}
		if f := strings.Fields(s[end+1:]); len(f) > 1 && f[1] == strconv.Itoa(ppid) {
			return pid
		}
	}
	return 0
}

func TestBMCEndToEnd(t *testing.T) {
	t.Parallel()
	sim := startIPMISim(t)
	u := newNodeUser(t)
	bcd := testenv.Binary(t, "bcd")
	d := newDeployment(t, backendSQLite)

	// The node: joined as the node user, run unprivileged beside a root
	// helper that holds the BMC file and the plugin directory.
	base := openDir(t)
	data := filepath.Join(base, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(data, int(u.uid), int(u.gid)); err != nil {
		t.Fatal(err)
	}
	tokenFile, _ := d.joinToken(1, time.Hour)
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	code, jout, jerr := testenv.RunAs(t, u.cred(), []string{"BCD_JOIN_TOKEN=" + strings.TrimSpace(string(tok))}, "", bcd,
		"join", "--gateway", d.gatewayURL, "--data-dir", data)
	if code != 0 {
		t.Fatalf("bcd join: exit %d: %s %s", code, jout, jerr)
	}
	m := regexp.MustCompile(`Joined as node (\S+) `).FindStringSubmatch(jout)
	if m == nil {
		t.Fatalf("bcd join printed no node id: %q", jout)
	}
	node := m[1]

	root := t.TempDir()
	pluginDir := filepath.Join(root, "plugins")
	copyFile(t, testenv.Binary(t, "bcx-ipmi"), filepath.Join(pluginDir, "bcx-ipmi"), 0o755)
	if err := os.Chmod(pluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	closed := freeUDP(t)
	bmcFile := filepath.Join(root, "bmc.yaml")
	target := func(name, password string, port int, timeout string) string {
		return fmt.Sprintf("  - name: %s\n    address: 127.0.0.1\n    username: %s\n    password: %q\n    providers: [ipmitool]\n    ipmiPort: %d\n    timeout: %s\n",
			name, simUser, password, port, timeout)
	}
	body := "bmcs:\n" + target("sim", simPassword, sim.port, "10s") + target("wrong-password", badPassword, sim.port, "10s") +
		target("unreachable", simPassword, closed, "3s") + target("hang", simPassword, closed, "60s")
	if err := os.WriteFile(bmcFile, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(base, "run", "helper.sock")
	hp := testenv.Start(t, nil, bcd, "helper", "--node-user", u.name, "--socket", sock, "--bmc-file", bmcFile, "--plugin-dir", pluginDir)
	hp.WaitLine(`Root helper listening`, 30*time.Second)
	np := testenv.StartAs(t, u.cred(), nil, bcd, "node", "--unprivileged", "--helper-socket", sock, "--data-dir", data)
	np.WaitLine(sessionEstablished.String(), 30*time.Second)

	var transcript strings.Builder // every CLI output, checked for passwords at the end
	bmcCLI := func(args ...string) bmcRun {
		t.Helper()
		start := time.Now()
		code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, d.viaAPI(append([]string{"--config", d.cfgFile, "bmc"}, args...)...)...)
		r := bmcRun{code: code, stdout: stdout, stderr: stderr, took: time.Since(start)}
		fmt.Fprintf(&transcript, "$ bmc %s\n%s%s", strings.Join(args, " "), stdout, stderr)
		if i := indexOf(args, "-o"); i >= 0 && code <= 1 {
			var resp struct{ Commands []bmcView }
			if err := json.Unmarshal([]byte(stdout), &resp); err != nil || len(resp.Commands) != 1 {
				t.Fatalf("bmc %s -o json: %v\n%s%s", strings.Join(args, " "), err, stdout, stderr)
			}
			r.cmd = resp.Commands[0]
		}
		t.Logf("bmc %s: exit %d in %v: %s %s", strings.Join(args, " "), code, r.took.Round(time.Millisecond), r.cmd.State, r.cmd.Result)
		return r
	}
	power := func(action string, extra ...string) bmcRun {
		t.Helper()
		r := bmcCLI(append(append([]string{action, "--node", node}, extra...), "-o", "json")...)
		if r.code != 0 || r.cmd.State != "succeeded" {
			t.Fatalf("bmc %s %v: exit %d, %+v\n%s", action, extra, r.code, r.cmd, r.stderr)
		}
		return r
	}
	wantPower := func(r bmcRun, want string) {
		t.Helper()
		if got := r.cmd.Result["power"]; got != want {
			t.Fatalf("power %v, want %s (result %v)", got, want, r.cmd.Result)
		}
	}

	// The node's own BMC, through the credentials sealed for it.
	pwFile := filepath.Join(t.TempDir(), "bmc-password")
	if err := os.WriteFile(pwFile, []byte(simPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cred := bmcCLI("credentials", "set", "--node", node, "--address", "127.0.0.1", "--username", simUser,
		"--password-file", pwFile, "--providers", "ipmitool", "--ipmi-port", strconv.Itoa(sim.port), "--bmc-timeout", "10s")
	if cred.code != 0 || !strings.Contains(cred.stdout, "bmc/"+node) {
		t.Fatalf("bmc credentials set: exit %d\n%s%s", cred.code, cred.stdout, cred.stderr)
	}

	r := power("status")
	wantPower(r, "on")
	if r.cmd.Result["bmc"] != "127.0.0.1" || r.cmd.Result["source"] != "secret" || r.cmd.Result["provider"] != "ipmitool" {
		t.Errorf("status result %v", r.cmd.Result)
	}
	wantPower(power("off"), "off")
	if got := sim.read(t, "power"); got != "0" {
		t.Errorf("simulated chassis power %q after off, want 0", got)
	}
	wantPower(power("status"), "off")
	// The node's own BMC said off: powered-off, not unreachable.
	if st := d.nodes()[node].State; st != "powered-off" {
		t.Errorf("node state after its BMC powered it off: %s, want powered-off", st)
	}
	wantPower(power("on"), "on")
	wantPower(power("status"), "on")
	// Its bcd never stopped heartbeating: liveness clears powered-off at
	// once, without a reconnect (issue 15).
	eventually(t, 60*time.Second, func() bool { return d.nodes()[node].State == "ready" },
		func() string { return "node still " + d.nodes()[node].State + " after power on, while heartbeating" })
	// ipmi_sim's cycle powers off, then on again after about a second.
	power("cycle")
	for deadline := time.Now().Add(60 * time.Second); power("status").cmd.Result["power"] != "on"; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the machine did not come back on within 60 s of the cycle")
		}
	}
	r = power("boot", "--device", "pxe")
	if got := sim.read(t, "boot"); got != "pxe" || r.cmd.Result["device"] != "pxe" || r.cmd.Result["persistent"] != false {
		t.Errorf("after boot --device pxe: simulated boot device %q, result %v", got, r.cmd.Result)
	}
	// The table for people.
	if tr := bmcCLI("status", "--node", node); tr.code != 0 || !strings.Contains(tr.stdout, "POWER") ||
		!strings.Contains(tr.stdout, "Chassis Power is on") {
		t.Errorf("bmc status table: exit %d\n%s%s", tr.code, tr.stdout, tr.stderr)
	}

	// A named BMC of the helper's file.
	r = power("status", "--bmc", "sim")
	wantPower(r, "on")
	if r.cmd.Result["name"] != "sim" || r.cmd.Result["source"] != "file "+bmcFile {
		t.Errorf("named status result %v", r.cmd.Result)
	}

	// A wrong password: a clear error naming the BMC.
	r = bmcCLI("status", "--node", node, "--bmc", "wrong-password", "-o", "json")
	if r.code != 1 || r.cmd.State != "failed" || r.cmd.Result["reason"] != "AUTH_FAILED" ||
		!strings.Contains(r.cmd.Error, "bmc wrong-password") || !strings.Contains(r.cmd.Error, "127.0.0.1") ||
		!strings.Contains(r.cmd.Error, "password") {
		t.Errorf("wrong password: exit %d, %+v", r.code, r.cmd)
	}
	t.Logf("wrong password: %s", r.cmd.Error)

	// An unreachable BMC fails on its 3 s timeout (reason TIMEOUT: the
	// plugin's deadline ended it, not a hang); how long it took is printed,
	// not asserted (a busy machine adds seconds end to end).
	r = bmcCLI("status", "--node", node, "--bmc", "unreachable", "-o", "json")
	if r.code != 1 || r.cmd.State != "failed" || r.cmd.Result["reason"] != "TIMEOUT" {
		t.Errorf("unreachable BMC: exit %d after %v, %+v", r.code, r.took, r.cmd)
	}
	took, _ := r.cmd.Result["took_ms"].(float64)
	t.Logf("unreachable BMC (timeout 3s): failed on the node after %v ms, %v end to end: %s", took, r.took.Round(time.Millisecond), r.cmd.Error)

	// The plugin killed mid-call: the command fails at once, and the next
	// one runs on a restarted plugin.
	hang := testenv.Start(t, d.env, d.bc, d.viaAPI("--config", d.cfgFile, "bmc", "status", "--node", node, "--bmc", "hang", "-o", "json")...)
	var plugin, ipmitool int
	for deadline := time.Now().Add(60 * time.Second); ipmitool == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the plugin started no ipmitool within 60 s")
		}
		if plugin = childOf(hp.Pid(), "bcx-ipmi"); plugin != 0 {
			ipmitool = childOf(plugin, "ipmitool")
		}
	}
	killed := time.Now()
	if err := syscall.Kill(plugin, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := hang.Wait(60 * time.Second); code != 1 {
		t.Errorf("bmc status on the killed plugin: exit %d, want 1\n%s", code, hang.Output())
	}
	t.Logf("command on the plugin killed mid-call ended %v after the kill", time.Since(killed).Round(time.Millisecond))
	transcript.WriteString(hang.Output())
	var killedView struct{ Commands []bmcView }
	if out := hang.Output(); !strings.Contains(out, "{") ||
		json.NewDecoder(strings.NewReader(out[strings.Index(out, "{"):])).Decode(&killedView) != nil || len(killedView.Commands) != 1 ||
		killedView.Commands[0].State != "failed" || killedView.Commands[0].Result["reason"] != "PLUGIN_CRASHED" ||
		!strings.Contains(killedView.Commands[0].Error, "exited during the call") {
		t.Errorf("command on the killed plugin:\n%s", out)
	}
	start := time.Now()
	wantPower(power("status"), "on")
	t.Logf("next command after the kill (plugin restarted): %v", time.Since(start).Round(time.Millisecond))

	// No password anywhere: CLI output, command results and errors, the
	// audit log, the processes' logs, the control plane's data directory.
	var everything bytes.Buffer
	everything.WriteString(transcript.String())
	for _, p := range []*testenv.Proc{d.serve, hp, np} {
		everything.WriteString(p.Output())
	}
	cmds, err := d.st.CommandList(context.Background(), &store.CommandListParams{NodeID: node, ListParams: store.ListParams{Limit: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		fmt.Fprintf(&everything, "%s %s %s %s\n", c.Kind, c.SessionSpec, c.Error, c.Result)
	}
	audit, err := d.st.AuditList(context.Background(), 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range audit {
		fmt.Fprintf(&everything, "%+v %s\n", *e, e.Details)
	}
	_ = filepath.WalkDir(d.dataDir, func(p string, de fs.DirEntry, err error) error {
		if err == nil && de.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			everything.Write(b)
		}
		return nil
	})
	for _, pw := range []string{simPassword, badPassword} {
		if i := bytes.Index(everything.Bytes(), []byte(pw)); i >= 0 {
			lo, hi := max(0, i-200), min(everything.Len(), i+200)
			t.Errorf("password %q leaked:\n...%s...", pw, everything.Bytes()[lo:hi])
		}
	}
	if len(cmds) < 12 {
		t.Errorf("%d commands recorded for the node, want at least 12", len(cmds))
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}
