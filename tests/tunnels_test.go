package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// tunnelTarget is a control plane with a real bcd node for the tunnel
// scenario: where the CLI reaches the API, an admin token, the node.
type tunnelTarget struct {
	bc     string
	env    []string // BETTER_COMPUTE_URL and _TOKEN (admin)
	admin  *client.Client
	st     store.Store
	nodeID string
	bcd    *testenv.Proc
}

// TestTunnelsAllInOne: nodes shell and nodes port-forward to a real bcd
// node through the embedded default (one process: the api opens the
// tunnel on its own gateway).
func TestTunnelsAllInOne(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, backendSQLite)
	file, _ := d.joinToken(1, time.Hour)
	m := newMachine(t, "tunnel-aio")
	nodeID := m.mustJoin(d.gatewayURL, file)
	bcd := m.node()
	bcd.WaitLine(sessionEstablished.String(), 30*time.Second)
	tunnelScenario(t, &tunnelTarget{bc: d.bc, env: []string{"BETTER_COMPUTE_URL=" + d.api, "BETTER_COMPUTE_TOKEN=" + d.adminToken},
		admin: &client.Client{BaseURL: d.api + "/api", Token: d.adminToken}, st: d.st, nodeID: nodeID, bcd: bcd})
}

// TestTunnelsSplitRoles: the same through split roles on PostgreSQL: the
// api process relays each tunnel over the internal control API to the
// gateway process holding the node's session.
func TestTunnelsSplitRoles(t *testing.T) {
	t.Parallel()
	d := newSplitDeploymentWith(t, 1, 0, internalAPIConfig(t))
	m, nodeID := d.joinMachine("tunnel-split", d.gateways[0])
	bcd := m.node()
	d.waitSession(nodeID, d.gateways[0])
	tunnelScenario(t, &tunnelTarget{bc: d.bin, env: []string{"BETTER_COMPUTE_URL=" + strings.TrimSuffix(d.api, "/api"), "BETTER_COMPUTE_TOKEN=" + d.admin.Token},
		admin: d.admin, st: d.st, nodeID: nodeID, bcd: bcd})
}

// TestTunnelRootShellThroughHelper: nodes shell --as-root to a real bcd
// running unprivileged as a fresh system user beside a real root bcd
// helper: the shell runs as root through the helper's "shell" operation
// under a grant for the tunnel, a plain shell as the helper's command user
// (not the node user), and the exit status comes back.
func TestTunnelRootShellThroughHelper(t *testing.T) {
	t.Parallel()
	u := newNodeUser(t)
	d := newDeployment(t, backendSQLite)
	file, _ := d.joinToken(1, time.Hour)
	token, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	bcdBin := testenv.Binary(t, "bcd")
	base := openDir(t)
	data := filepath.Join(base, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(data, int(u.uid), int(u.gid)); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(base, "run", "helper.sock")
	code, out, errOut := testenv.RunAs(t, u.cred(), []string{"BCD_JOIN_TOKEN=" + strings.TrimSpace(string(token))}, "", bcdBin,
		"join", "--gateway", d.gatewayURL, "--data-dir", data)
	if code != 0 {
		t.Fatalf("bcd join as %s: exit %d: %s %s", u.name, code, out, errOut)
	}
	cu := newNodeUser(t) // the helper's command user
	hp := testenv.Start(t, nil, bcdBin, "helper", "--node-user", u.name, "--command-user", cu.name, "--data-dir", data, "--socket", sock)
	hp.WaitLine(`Root helper listening`, 30*time.Second)
	node := testenv.StartAs(t, u.cred(), nil, bcdBin, "node", "--unprivileged", "--helper-socket", sock, "--data-dir", data)
	node.WaitLine(sessionEstablished.String(), 30*time.Second)
	nodeID := node.WaitLine(`msg="Session established" node_id=(\S+)`, time.Second)[1]
	tt := &tunnelTarget{bc: d.bc, env: []string{"BETTER_COMPUTE_URL=" + d.api, "BETTER_COMPUTE_TOKEN=" + d.adminToken}, nodeID: nodeID, bcd: node}

	sh := startShell(t, tt, 24, 80, "--as-root")
	sh.send(t, "echo uid=$(id -u)\r")
	sh.expect(t, regexp.MustCompile(`uid=0\r`))
	sh.send(t, "exit 4\r")
	if code := sh.exit(t, 15*time.Second); code != 4 {
		t.Fatalf("root shell exited %d, want 4\n%s", code, sh.output())
	}
	sh = startShell(t, tt, 24, 80)
	sh.send(t, "echo uid=$(id -u)\r")
	sh.expect(t, regexp.MustCompile(`uid=`+strconv.Itoa(int(cu.uid))+`\r`))
	sh.send(t, "exit\r")
	if code := sh.exit(t, 15*time.Second); code != 0 {
		t.Fatalf("command user's shell exited %d, want 0\n%s", code, sh.output())
	}
}

// tunnelScenario: a shell on a PTY (tty, stty size after a resize, exit 3
// as the CLI's exit status), a port forward to a TCP echo server on the
// node, refused tickets (used twice, another token, a viewer), the audit
// and events of a tunnel, the shell's recording, and last a revoked node's
// open shell closing within 5 s.
func tunnelScenario(t *testing.T, tt *tunnelTarget) {
	ctx := context.Background()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bcd's output:\n%s", tt.bcd.Output())
		}
	})

	// The shell, driven through a PTY as a person's terminal.
	sh := startShell(t, tt, 30, 100)
	sh.send(t, "tty\r")
	sh.expect(t, regexp.MustCompile(`/dev/pts/\d+`))
	if err := pty.Setsize(sh.pty, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	// SIGWINCH reaches the CLI, which sends the new size; stty reads it
	// from the node's PTY.
	testenv.Eventually(t, 10*time.Second, func() bool {
		sh.send(t, "stty size\r")
		return sh.wait(regexp.MustCompile(`[^0-9]40 120\r?\n`), time.Second)
	}, func() string { return "stty size never printed 40 120:\n" + sh.output() })
	sh.send(t, "exit 3\r")
	if code := sh.exit(t, 15*time.Second); code != 3 {
		t.Fatalf("nodes shell exited %d after exit 3, want 3\n%s", code, sh.output())
	}

	// Its audit row and events: exit status 3, bytes both ways.
	var closed map[string]any
	// 30 s: the row is written by the api process once both relays have
	// ended; on a loaded CI machine (split roles, race detector) that has
	// taken over 10 s.
	testenv.Eventually(t, 30*time.Second, func() bool {
		entries, err := tt.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "tunnels.close", Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			var d map[string]any
			if json.Unmarshal(e.Details, &d) == nil && d["exitCode"] == float64(3) {
				closed = d
				return true
			}
		}
		return false
	}, func() string { return "no tunnels.close audit row with exit code 3" })
	if closed["nodeId"] != tt.nodeID || closed["kind"] != "shell" || closed["bytesIn"].(float64) <= 0 || closed["bytesOut"].(float64) <= 0 {
		t.Fatalf("tunnels.close audit details = %v", closed)
	}
	// The shell was recorded at the api process that relayed it.
	// Its end is written just after the tunnel's (tunnels.close first).
	recID, _ := closed["recordingId"].(string)
	var rec *store.Recording
	eventually(t, 30*time.Second, func() bool {
		r, err := tt.st.RecordingGet(ctx, recID)
		rec = r
		return err == nil && r.State != store.RecordingRecording
	}, func() string { return fmt.Sprintf("the shell's recording %q is still recording: %+v", recID, rec) })
	if rec.State != store.RecordingComplete || rec.Bytes <= 0 || rec.NodeID != tt.nodeID {
		t.Fatalf("the shell's recording %q: %+v; want it complete, with bytes", recID, rec)
	}
	if n := countEvents(t, tt.st, "com.better-compute.tunnel.closed"); n < 1 {
		t.Fatal("no tunnel.closed event")
	}

	// A port forward to a TCP echo server on the node.
	echo := echoServer(t)
	pf := testenv.Start(t, tt.env, tt.bc, "nodes", "port-forward", tt.nodeID, fmt.Sprintf("0:%d", echo))
	local := pf.WaitLine(`Forwarding (127\.0\.0\.1:\d+) ->`, 30*time.Second)[1]
	for i := range 2 {
		conn, err := net.DialTimeout("tcp", local, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		msg := fmt.Sprintf("hello through the tunnel %d\n", i)
		if _, err := conn.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil || got != msg {
			t.Fatalf("echo through port-forward = %q, %v; want %q", got, err, msg)
		}
		conn.Close()
	}
	pf.Kill()

	// Tickets: used once only, by the token that made it, never by a
	// viewer.
	resp, err := tt.admin.TunnelsCreate(ctx, &apiv1.CreateTunnelRequest{Node: tt.nodeID, Kind: "port", Port: int32(echo)})
	if err != nil {
		t.Fatal(err)
	}
	viewerSecret, _, err := iam.Create(ctx, tt.st, iam.CreateParams{Role: store.RoleViewer, Description: "tunnel viewer"})
	if err != nil {
		t.Fatal(err)
	}
	viewer := &client.Client{BaseURL: tt.admin.BaseURL, Token: viewerSecret}
	wantRefused(t, "a viewer's tunnels.create", func() error {
		_, err := viewer.TunnelsCreate(ctx, &apiv1.CreateTunnelRequest{Node: tt.nodeID, Kind: "shell"})
		return err
	}, 403)
	wantRefused(t, "the admin's ticket with a viewer token", func() error { _, err := viewer.DialTunnel(ctx, resp.GetPath(), nil); return err }, 403)
	wantRefused(t, "the ticket without a token", func() error {
		_, err := (&client.Client{BaseURL: tt.admin.BaseURL}).DialTunnel(ctx, resp.GetPath(), nil)
		return err
	}, 401)
	tun, err := tt.admin.DialTunnel(ctx, resp.GetPath(), nil)
	if err != nil {
		t.Fatalf("first use of the ticket: %v", err)
	}
	tun.Close()
	wantRefused(t, "the ticket used a second time", func() error { _, err := tt.admin.DialTunnel(ctx, resp.GetPath(), nil); return err }, 403)

	// Last: revoking the node closes its open shell at once.
	sh = startShell(t, tt, 24, 80)
	sh.send(t, "echo ready-$((6*7))\r")
	sh.expect(t, regexp.MustCompile(`ready-42`))
	start := time.Now()
	if err := tt.admin.Call(ctx, "pki.revoke", &apiv1.RevokeCertificateRequest{NodeId: tt.nodeID}, &apiv1.RevokeCertificateResponse{}); err != nil {
		t.Fatal(err)
	}
	code := sh.exit(t, 10*time.Second)
	took := time.Since(start)
	t.Logf("the revoked node's shell closed %v after pki.revoke (exit %d)", took.Round(time.Millisecond), code)
	if took > 5*time.Second {
		t.Errorf("the shell closed %v after the revocation, want within 5 s", took)
	}
	if code == 0 {
		t.Errorf("nodes shell exited 0 when its node was revoked, want a failure")
	}
}

// wantRefused checks that call fails with an API error of HTTP status.
func wantRefused(t *testing.T, what string, call func() error, status int) {
	t.Helper()
	err := call()
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Status != status {
		t.Fatalf("%s: %v, want HTTP %d", what, err, status)
	}
}

// countEvents counts outbox events of typ.
func countEvents(t *testing.T, st store.Store, typ string) int {
	t.Helper()
	entries, err := st.OutboxList(context.Background(), 0, store.MaxListLimit)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.Topic == typ {
			n++
		}
	}
	return n
}

// echoServer listens on loopback (the node's, since bcd runs here) and
// echoes every connection; it returns the port.
func echoServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// shellProc is nodes shell running on a PTY the test holds.
type shellProc struct {
	cmd  *exec.Cmd
	pty  *os.File
	mu   sync.Mutex
	buf  bytes.Buffer
	more chan struct{}
	done chan struct{}
}

func startShell(t *testing.T, tt *tunnelTarget, rows, cols uint16, extra ...string) *shellProc {
	t.Helper()
	cmd := exec.Command(tt.bc, append([]string{"nodes", "shell", tt.nodeID}, extra...)...)
	cmd.Env = append(os.Environ(), append(tt.env, "TERM=xterm")...)
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
	if err != nil {
		t.Fatal(err)
	}
	s := &shellProc{cmd: cmd, pty: f, more: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		b := make([]byte, 4096)
		for {
			n, err := f.Read(b)
			if n > 0 {
				s.mu.Lock()
				s.buf.Write(b[:n])
				s.mu.Unlock()
				select {
				case s.more <- struct{}{}:
				default:
				}
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		f.Close()
	})
	return s
}

func (s *shellProc) send(t *testing.T, keys string) {
	t.Helper()
	if _, err := s.pty.Write([]byte(keys)); err != nil {
		t.Fatal(err)
	}
}

func (s *shellProc) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// wait reports whether re matches the output within d.
func (s *shellProc) wait(re *regexp.Regexp, d time.Duration) bool {
	deadline := time.After(d)
	for {
		if re.MatchString(s.output()) {
			return true
		}
		select {
		case <-s.more:
		case <-s.done:
			return re.MatchString(s.output())
		case <-deadline:
			return false
		}
	}
}

func (s *shellProc) expect(t *testing.T, re *regexp.Regexp) {
	t.Helper()
	if !s.wait(re, 20*time.Second) {
		t.Fatalf("the shell never printed %s:\n%s", re, s.output())
	}
}

// exit waits for nodes shell to exit and returns its status.
func (s *shellProc) exit(t *testing.T, within time.Duration) int {
	t.Helper()
	waited := make(chan error, 1)
	go func() { waited <- s.cmd.Wait() }()
	select {
	case err := <-waited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(within):
		t.Fatalf("nodes shell did not exit within %v:\n%s", within, s.output())
	}
	return -1
}
