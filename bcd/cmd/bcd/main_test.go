package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
)

// result is the outcome of one bcd invocation.
type result struct {
	code           int
	stdout, stderr string
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a running
// node and the reads of a test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func bcd(ctx context.Context, stdin string, environ map[string]string, args ...string) result {
	return bcdAs(ctx, os.Geteuid(), stdin, environ, args...)
}

// bcdAs runs bcd as if its effective uid were euid.
func bcdAs(ctx context.Context, euid int, stdin string, environ map[string]string, args ...string) result {
	var out, errb syncBuffer
	code := run(ctx, args, env{
		stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb,
		getenv:  func(k string) string { return environ[k] },
		geteuid: func() int { return euid },
	})
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	r := bcd(t.Context(), "", nil, "version")
	if r.code != 0 || !strings.Contains(r.stdout, "bcd "+version) || !strings.Contains(r.stdout, runtime.Version()) {
		t.Errorf("version: %+v", r)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tok := sessiontest.NewPKI(t).NewToken(t)
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{}, nil, "no command"},
		{[]string{"frobnicate"}, nil, `unknown command "frobnicate"`},
		{[]string{"version", "extra"}, nil, "takes no arguments"},
		{[]string{"join", "--bogus"}, nil, "unknown flag"},
		{[]string{"join", "--token-file", "x"}, nil, "--gateway is required"},
		{[]string{"join", "--gateway", "https://gw"}, nil, "no join token"},
		{[]string{"join", "--gateway", "https://gw", "--token-file", filepath.Join(dir, "missing")}, nil, "--token-file"},
		{[]string{"join", "--gateway", "https://gw"}, map[string]string{tokenEnv: "bct1.nope"}, "join token"},
		{[]string{"join", "--gateway", "https://gw", "--ca-file", "a", "--ca-pin", "b"}, nil, "exclude each other"},
		{[]string{"join", "--gateway", "https://gw", "--ca-pin", "sha256/xyz"}, map[string]string{tokenEnv: tok}, "--ca-pin"},
		{[]string{"join", "--gateway", "https://gw", "--ca-file", filepath.Join(dir, "missing")}, map[string]string{tokenEnv: tok}, "--ca-file"},
		{[]string{"join", "--gateway", "https://gw", "--timeout", "soon"}, nil, "invalid argument"},
		{[]string{"join", "--gateway", "http://gw:8443", "--data-dir", filepath.Join(dir, "never")}, map[string]string{tokenEnv: tok}, "https"},
		{[]string{"join", "--gateway", "https://gw/path", "--data-dir", filepath.Join(dir, "never")}, map[string]string{tokenEnv: tok}, "https://host[:port]"},
		{[]string{"join", "--gateway", "https://gw", "--data-dir", ""}, map[string]string{tokenEnv: tok}, "--data-dir"},
		{[]string{"node", "--data-dir", ""}, nil, "--data-dir"},
		{[]string{"doctor", "--data-dir", ""}, nil, "--data-dir"},
		{[]string{"node", "--log-level", "loud"}, nil, "--log-level"},
		{[]string{"node", "--inventory-interval", "0s"}, nil, "--inventory-interval"},
		{[]string{"node", "--sysfs-root", ""}, nil, "--sysfs-root"},
		{[]string{"node", "--sysfs-root", "/nonexistent-sysfs"}, nil, "not a directory"},
		{[]string{"helper"}, nil, "--node-user is required"},
	} {
		r := bcd(t.Context(), "", tc.env, tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || strings.Count(r.stderr, "\n") != 1 {
			t.Errorf("bcd %v: code %d stderr %q, want exit 2 and one line with %q", tc.args, r.code, r.stderr, tc.want)
		}
		if strings.Contains(r.stderr, tok) {
			t.Errorf("bcd %v printed the token", tc.args)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "never")); err == nil {
		t.Error("a join refused for its --gateway created the data directory")
	}
}

func TestNodeNotJoined(t *testing.T) {
	t.Parallel()
	r := bcd(t.Context(), "", nil, "node", "--data-dir", t.TempDir())
	if r.code != exitNotJoined || !strings.Contains(r.stderr, "run bcd join first") {
		t.Errorf("node without identity: %+v", r)
	}
}

// listenNotify binds a unixgram socket and points NOTIFY_SOCKET at it.
func listenNotify(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	t.Setenv("WATCHDOG_USEC", "")
	return conn
}

// readNotify returns the next notification that starts with prefix.
func readNotify(t *testing.T, conn *net.UnixConn, prefix string) string {
	t.Helper()
	buf := make([]byte, 512)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := conn.SetReadDeadline(deadline); err != nil {
			t.Fatal(err)
		}
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("no %q notification: %v", prefix, err)
		}
		if s := string(buf[:n]); strings.HasPrefix(s, prefix) {
			return s
		}
	}
}

// TestJoinThenNode joins through a test gateway with the token from the
// environment, runs the node until READY=1 and stops it as a signal would.
// Not parallel: it sets NOTIFY_SOCKET.
func TestJoinThenNode(t *testing.T) {
	notify := listenNotify(t)
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	tok := p.NewToken(t)
	g.AddToken(tok)
	dir := filepath.Join(t.TempDir(), "data")

	r := bcd(t.Context(), "", map[string]string{tokenEnv: tok}, "join", "--gateway", g.URL, "--data-dir", dir, "--label", "rack=r1")
	if r.code != 0 || !strings.Contains(r.stdout, "Joined as node node-1") || !strings.Contains(r.stdout, "Placed in pool pool-test, site ") {
		t.Fatalf("join: %+v", r)
	}
	if strings.Contains(r.stdout+r.stderr, tok) {
		t.Error("join printed the token")
	}
	if fi, err := os.Stat(filepath.Join(dir, identity.KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v %v", fi, err)
	}

	// A second join without --force is refused and keeps the identity.
	r = bcd(t.Context(), "", map[string]string{tokenEnv: tok}, "join", "--gateway", g.URL, "--data-dir", dir)
	if r.code != exitFailure || !strings.Contains(r.stderr, "--force") {
		t.Errorf("second join: %+v", r)
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan result, 1)
	go func() { done <- bcd(ctx, "", nil, "node", "--data-dir", dir) }()
	readNotify(t, notify, "READY=1")
	s := g.NextSession(t, 10*time.Second)
	if s.Hello.GetBcdVersion() != bcdVersion() {
		t.Errorf("hello version %q", s.Hello.GetBcdVersion())
	}
	// A second bcd node on the same data directory stops at once.
	if r := bcd(t.Context(), "", nil, "node", "--data-dir", dir); r.code != exitFailure || !strings.Contains(r.stderr, "in use by another bcd node") {
		t.Errorf("second node on %s: %+v", dir, r)
	}
	cancel()
	select {
	case r := <-done:
		if r.code != 0 {
			t.Errorf("node after cancellation: %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("node did not stop")
	}
	readNotify(t, notify, "STOPPING=1")
}

func TestJoinFromStdinWithCAFileAndNodeRevoked(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	tok := p.NewToken(t)
	g.AddToken(tok)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "gw-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.GatewayCA.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	// As an editor may save it: a byte order mark and CRLF.
	r := bcd(t.Context(), "\ufeff"+tok+"\r\n", nil, "join", "--gateway", g.URL, "--token-file", "-", "--data-dir", data, "--ca-file", caFile)
	if r.code != 0 {
		t.Fatalf("join: %+v", r)
	}
	id, err := identity.NewStore(data).Load()
	if err != nil {
		t.Fatal(err)
	}
	if len(id.GatewayCAs) != 1 || id.GatewayPin != "" {
		t.Errorf("identity trust: pin %q, %d CAs", id.GatewayPin, len(id.GatewayCAs))
	}
	g.Revoke(id.NodeID, "retired")
	r = bcd(t.Context(), "", nil, "node", "--data-dir", data, "--log-level", "error")
	if r.code != exitRevoked || !strings.Contains(r.stderr, "bcd: node identity revoked") {
		t.Errorf("revoked node: %+v", r)
	}
}

func TestJoinRefusesUntrustedGateway(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	tok := p.NewToken(t)
	g.AddToken(tok)
	other := sessiontest.NewPKI(t)
	data := filepath.Join(t.TempDir(), "data")
	r := bcd(t.Context(), "", map[string]string{tokenEnv: tok}, "join", "--gateway", g.URL, "--data-dir", data, "--ca-pin", other.Pin())
	if r.code != exitFailure || !strings.Contains(r.stderr, "not trusted") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("join with a wrong pin: %+v", r)
	}
	if ok, _ := identity.NewStore(data).Exists(); ok {
		t.Error("identity written after a refused join")
	}
}

func TestNodeExpiredCertificate(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	key := sessiontest.NewKey(t)
	now := time.Now()
	cert := p.NodeCertificate(t, key, "node-9", now.Add(-20*time.Hour), now.Add(-2*time.Hour))
	// Exit 4 only once the gateway says the re-attestation grace is over;
	// an unreachable gateway is retried (session tests).
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{ReattestRefused: true})
	data := t.TempDir()
	id := identity.FromJoin(&session.JoinResult{
		NodeID: "node-9", Chain: []*x509.Certificate{cert}, NodeCARoots: []*x509.Certificate{p.NodeCA},
		Gateways: []string{g.URL}, Trust: session.Trust{Pin: p.Pin()},
	}, key, nil, now)
	if err := identity.NewStore(data).Save(id); err != nil {
		t.Fatal(err)
	}
	r := bcd(t.Context(), "", nil, "node", "--data-dir", data, "--log-level", "error")
	if r.code != exitExpired || !strings.Contains(r.stderr, "node certificate expired") ||
		!strings.Contains(r.stderr, "nodes reinstall node-9") || !strings.Contains(r.stderr, "--force --data-dir "+data+"`") {
		t.Errorf("expired node past the grace: %+v", r)
	}
}

func TestHelperRefusals(t *testing.T) {
	t.Parallel()
	r := bcdAs(t.Context(), 1000, "", nil, "helper", "--node-user", "bcd")
	if r.code != exitFailure || !strings.Contains(r.stderr, "must run as root") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("helper as uid 1000: %+v", r)
	}
	r = bcdAs(t.Context(), 0, "", nil, "helper", "--node-user", "root")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--node-user root is root") {
		t.Errorf("helper for root: %+v", r)
	}
	r = bcdAs(t.Context(), 0, "", nil, "helper", "--node-user", "no-such-user-bc", "--socket", filepath.Join(t.TempDir(), "h.sock"))
	if r.code != exitFailure || !strings.Contains(r.stderr, `node user "no-such-user-bc" does not exist`) {
		t.Errorf("helper for an unknown user: %+v", r)
	}
}
