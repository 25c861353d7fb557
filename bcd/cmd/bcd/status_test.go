package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/nodestate"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
)

// writeState writes a state file into a new data directory, as a bcd node
// of process pid would; with locked, the directory's lock is held until
// the test ends, as a running bcd node holds it.
func writeState(t *testing.T, s *nodestate.State, locked bool) string {
	t.Helper()
	dir := t.TempDir()
	if err := nodestate.Write(dir, s); err != nil {
		t.Fatal(err)
	}
	release, err := identity.NewStore(dir).Lock()
	if err != nil {
		t.Fatal(err)
	}
	if locked {
		t.Cleanup(release)
	} else {
		release()
	}
	return dir
}

// stateAt is a state of this process, connected or not, written at now.
func stateAt(now time.Time, connected bool) *nodestate.State {
	notAfter := now.Add(20 * time.Hour).Truncate(time.Second)
	s := &nodestate.State{
		PID: os.Getpid(), UpdatedAt: now, Since: now.Add(-5 * time.Minute), Gateway: "https://gw-1.example.com:8443",
		LastError: "gateway https://gw-1.example.com:8443: connection refused", LastErrorAt: now.Add(-5 * time.Minute),
		CertNotAfter: notAfter, CertRenewAfter: notAfter.Add(-8 * time.Hour),
		ReattestGraceSeconds: 7 * 24 * 3600, ReattestGraceFrom: nodestate.GraceFromDefault,
		ReattestDeadline: notAfter.Add(7 * 24 * time.Hour),
	}
	if connected {
		s.Connected, s.SessionID = true, "sess-42"
	}
	return s
}

func TestStatus(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, tc := range []struct {
		name   string
		state  *nodestate.State
		locked bool
		code   int
		stdout []string
		stderr string
	}{
		{name: "connected", state: stateAt(now, true), locked: true, code: exitOK,
			stdout: []string{"running (pid ", "state           connected", "gateway         https://gw-1.example.com:8443", "session         sess-42",
				"certificate     expires ", "re-attestation  7d", "the default, assumed"}},
		{name: "disconnected", state: stateAt(now, false), locked: true, code: exitFailure,
			stdout: []string{"state           disconnected", "session         -", "ago): gateway https://gw-1.example.com:8443: connection refused"},
			stderr: "bcd: not connected: disconnected since "},
		{name: "stale lock", state: stateAt(now, true), code: exitFailure,
			stdout: []string{"agent           not running: no bcd node holds the data directory lock"},
			stderr: "bcd: bcd node is not running: no bcd node holds the data directory lock (bcd.lock); its last state was written at "},
		{name: "stale pid", state: func() *nodestate.State { s := stateAt(now, true); s.PID = math.MaxInt32; return s }(), locked: true, code: exitFailure,
			stdout: []string{"not running: process 2147483647 that wrote it is gone"},
			stderr: "bcd: bcd node is not running: process 2147483647"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := writeState(t, tc.state, tc.locked)
			r := bcd(t.Context(), "", nil, "status", "--data-dir", dir)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d: %+v", r.code, tc.code, r)
			}
			for _, s := range tc.stdout {
				if !strings.Contains(r.stdout, s) {
					t.Errorf("stdout lacks %q:\n%s", s, r.stdout)
				}
			}
			if tc.stderr == "" && r.stderr != "" || !strings.HasPrefix(r.stderr, tc.stderr) || strings.Count(r.stderr, "\n") > 1 {
				t.Errorf("stderr %q, want one line starting %q", r.stderr, tc.stderr)
			}
		})
	}
}

func TestStatusJSON(t *testing.T) {
	t.Parallel()
	now := time.Now()
	dir := writeState(t, stateAt(now, false), true)
	r := bcd(t.Context(), "", nil, "status", "--data-dir", dir, "-o", "json")
	if r.code != exitFailure {
		t.Fatalf("exit %d: %+v", r.code, r)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &m); err != nil {
		t.Fatalf("%v in %s", err, r.stdout)
	}
	for k, want := range map[string]any{
		"version": float64(nodestate.Version), "pid": float64(os.Getpid()), "running": true, "connected": false,
		"gateway": "https://gw-1.example.com:8443", "last_error": "gateway https://gw-1.example.com:8443: connection refused",
		"reattest_grace_seconds": float64(7 * 24 * 3600), "reattest_grace_from": "default",
	} {
		if m[k] != want {
			t.Errorf("%s = %#v, want %#v", k, m[k], want)
		}
	}
	for _, k := range []string{"since", "updated_at", "last_error_at", "cert_not_after", "cert_renew_after", "reattest_deadline", "now",
		"cert_left_seconds", "reattest_left_seconds"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, r.stdout)
		}
	}
	if left, _ := m["cert_left_seconds"].(float64); left < 19*3600 || left > 20*3600 {
		t.Errorf("cert_left_seconds = %v, want about 20 h", m["cert_left_seconds"])
	}
}

func TestStatusMissingAndUsage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := bcd(t.Context(), "", nil, "status", "--data-dir", dir)
	if r.code != exitFailure || r.stdout != "" || !strings.Contains(r.stderr, "no bcd node state in "+dir) ||
		!strings.Contains(r.stderr, "not running") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("status without state: %+v", r)
	}
	for _, args := range [][]string{{"status", "-o", "yaml"}, {"status", "--data-dir", ""}, {"status", "extra"}, {"status", "--bogus"}} {
		if r := bcd(t.Context(), "", nil, args...); r.code != exitUsage {
			t.Errorf("bcd %v: exit %d, want 2: %+v", args, r.code, r)
		}
	}
	// A file that is not a state reads as an error, not as a node.
	if err := os.WriteFile(filepath.Join(dir, nodestate.File), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := bcd(t.Context(), "", nil, "status", "--data-dir", dir); r.code != exitFailure || !strings.Contains(r.stderr, "read node state") {
		t.Errorf("status with a broken file: %+v", r)
	}
}

// TestPrintStatus renders a report judged at a fixed moment.
func TestPrintStatus(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC)
	dir := writeState(t, stateAt(at, false), true)
	r, err := nodestate.Inspect(dir, at.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := printStatus(&b, r); err != nil {
		t.Fatal(err)
	}
	want := `agent           running (pid ` + strconv.Itoa(os.Getpid()) + `)
state           disconnected
since           2025-06-01T09:55:00Z (1h5m ago)
gateway         https://gw-1.example.com:8443
session         -
last error      2025-06-01T09:55:00Z (1h5m ago): gateway https://gw-1.example.com:8443: connection refused
clock           agrees with the gateway's (within 1m), or not measured yet
certificate     expires 2025-06-02T06:00:00Z (19h0m left)
renew after     2025-06-01T22:00:00Z
re-attestation  7d19h left (until 2025-06-09T06:00:00Z; grace 7d0h, the default, assumed: the gateway has not said its grace)
updated         2025-06-01T10:00:00Z (1h0m ago)
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
}

// TestNodeStatusWhileDisconnected runs a node, takes its gateway away and
// checks what it says: STATUS=, bcd status, bcd doctor; and that WATCHDOG=1
// keeps coming while it is disconnected. Not parallel: it sets
// NOTIFY_SOCKET.
func TestNodeStatusWhileDisconnected(t *testing.T) {
	notify := listenNotify(t)
	t.Setenv("WATCHDOG_USEC", "200000") // a ping every 100 ms
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	tok := p.NewToken(t)
	g.AddToken(tok)
	dir := filepath.Join(t.TempDir(), "data")
	if r := bcd(t.Context(), "", map[string]string{tokenEnv: tok}, "join", "--gateway", g.URL, "--data-dir", dir); r.code != 0 {
		t.Fatalf("join: %+v", r)
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan result, 1)
	go func() { done <- bcd(ctx, "", nil, "node", "--data-dir", dir, "--log-level", "error") }()
	// The agent's STATUS= comes before bcd node's READY=1.
	readNotify(t, notify, "STATUS=connected to "+g.URL+" since ")
	readNotify(t, notify, "READY=1")
	if r := bcd(t.Context(), "", nil, "status", "--data-dir", dir); r.code != exitOK || !strings.Contains(r.stdout, "state           connected") {
		t.Errorf("status while connected: %+v", r)
	}

	g.Close()
	line := readNotify(t, notify, "STATUS=disconnected since ")
	if !strings.Contains(line, "; certificate valid until ") {
		t.Errorf("status line %q", line)
	}
	for range 2 {
		readNotify(t, notify, "WATCHDOG=1") // sent after the disconnect: the datagrams keep their order
	}
	r := bcd(t.Context(), "", nil, "status", "--data-dir", dir)
	if r.code != exitFailure || !strings.Contains(r.stdout, "state           disconnected") || !strings.Contains(r.stdout, "running (pid ") ||
		!strings.HasPrefix(r.stderr, "bcd: not connected: disconnected since ") {
		t.Errorf("status while disconnected: %+v", r)
	}
	r = bcd(t.Context(), "", nil, "doctor", "--data-dir", dir, "--plugin-dir", filepath.Join(dir, "plugins"), "--timeout", "2s")
	if !strings.Contains(r.stdout, "node.session") || !strings.Contains(r.stdout, "disconnected since ") {
		t.Errorf("doctor while disconnected:\n%s", r.stdout)
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
	r = bcd(t.Context(), "", nil, "status", "--data-dir", dir)
	if r.code != exitFailure || !strings.Contains(r.stderr, "bcd node is not running: no bcd node holds the data directory lock") ||
		!strings.Contains(r.stdout, "last error") || !strings.Contains(r.stdout, "bcd node stopped") {
		t.Errorf("status after the node stopped: %+v", r)
	}
}
