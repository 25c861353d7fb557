package tests

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// keptConn is one HTTP/1.1 connection kept open across requests, so that a
// request needs no new descriptor in the server.
type keptConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialKept(t *testing.T, addr string) *keptConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &keptConn{c: c, r: bufio.NewReader(c)}
}

// get sends GET path on the kept connection and returns the status and body.
func (k *keptConn) get(t *testing.T, path string, header string) (int, string) {
	t.Helper()
	_ = k.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(k.c, "GET %s HTTP/1.1\r\nHost: test\r\n%s\r\n", path, header); err != nil {
		t.Fatalf("GET %s on the kept connection: %v", path, err)
	}
	resp, err := http.ReadResponse(k.r, nil)
	if err != nil {
		t.Fatalf("GET %s on the kept connection: %v", path, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// TestGatewayPortSurvivesDescriptorExhaustion (issue 28): with the
// WebSocket fallback on, serve runs out of file descriptors (its
// RLIMIT_NOFILE lowered below what it has open) while a node dials the
// gateway's direct port. Every accept fails; /readyz, asked on a connection
// opened before, answers not ready once that has gone on for more than
// 10 s, naming the listener, and /metrics counts the failures. Once the
// limit is raised again, the direct port completes a TLS handshake within
// 2 s, and the log tells the episode's end with its count. (Before, the
// merged listener's loop of the direct port returned on the first failed
// accept and the port never accepted again, with /readyz ready.)
func TestGatewayPortSurvivesDescriptorExhaustion(t *testing.T) {
	t.Parallel()
	const token = "listeners-metrics-token-0123456789"
	wsPort := freePort(t)
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: fmt.Sprintf("    ws:\n      publicURL: wss://localhost:%d/v1/session\n      listen: 127.0.0.1:%d\n      tls: \"off\"\n", wsPort, wsPort),
		host:    "  metrics:\n    bearerToken: " + token + "\n",
	})
	api := strings.TrimPrefix(d.api, "http://")
	kept := dialKept(t, api)
	if code, body := kept.get(t, "/readyz", ""); code != http.StatusOK {
		t.Fatalf("/readyz before: %d %s", code, body)
	}
	handshake := func(within time.Duration) error {
		c, err := net.DialTimeout("tcp", d.gwAddr, within)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(within))
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}) //nolint:gosec // the port's accepting is tested, not its certificate
		return tc.Handshake()
	}
	if err := handshake(10 * time.Second); err != nil {
		t.Fatalf("TLS handshake on the gateway's direct port before: %v", err)
	}

	pid := d.serve.Pid()
	var old unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old); err != nil {
		t.Fatalf("read serve's RLIMIT_NOFILE: %v", err)
	}
	restore := func() {
		if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &old, nil); err != nil {
			t.Errorf("restore serve's RLIMIT_NOFILE: %v", err)
		}
	}
	t.Cleanup(restore)
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Below what it has open, so that the descriptors it closes meanwhile
	// (database connections) do not make room for an accept.
	low := unix.Rlimit{Cur: uint64(len(fds) / 2), Max: old.Max}
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &low, nil); err != nil {
		t.Fatalf("lower serve's RLIMIT_NOFILE to %d: %v", low.Cur, err)
	}
	limited := time.Now()
	t.Logf("serve's RLIMIT_NOFILE lowered to %d; it has %d descriptors open", low.Cur, len(fds))
	// A node dials the direct port: the kernel completes the connection
	// into the backlog, and every accept of it fails with EMFILE.
	waiting, err := net.Dial("tcp", d.gwAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer waiting.Close()

	var notReadyAfter time.Duration
	var body string
	for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		var code int
		code, body = kept.get(t, "/readyz", "")
		if code == http.StatusServiceUnavailable {
			notReadyAfter = time.Since(limited)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still answers %d %q %s after the gateway's port stopped accepting", code, body, time.Since(limited).Round(time.Second))
		}
	}
	t.Logf("/readyz not ready after %s: %s", notReadyAfter.Round(time.Millisecond), strings.TrimSpace(body))
	if notReadyAfter < 10*time.Second || !strings.Contains(body, "listener gateway") || !strings.Contains(body, "too many open files") {
		t.Fatalf("/readyz answered not ready after %s with %q: want after 10 s, naming listener gateway and the error", notReadyAfter, body)
	}
	d.serve.WaitLine(`Listener failing to accept.*listener=gateway`, 10*time.Second)
	code, metrics := kept.get(t, "/metrics", "Authorization: Bearer "+token+"\r\n")
	m := regexp.MustCompile(`(?m)^bettercompute_listener_accept_errors_total\{listener="gateway"\} (\S+)$`).FindStringSubmatch(metrics)
	if code != http.StatusOK || m == nil {
		t.Fatalf("/metrics: %d, no bettercompute_listener_accept_errors_total{listener=\"gateway\"}", code)
	}
	if n, _ := strconv.ParseFloat(m[1], 64); n < 2 {
		t.Fatalf("bettercompute_listener_accept_errors_total{listener=\"gateway\"} = %s, want the failed accepts counted", m[1])
	}
	t.Logf("failed accepts counted: %s", m[1])

	restore()
	freed := time.Now()
	if err := handshake(2 * time.Second); err != nil {
		t.Fatalf("TLS handshake on the gateway's direct port within 2 s of the limit raised: %v", err)
	}
	t.Logf("the direct port accepted again %s after the limit was raised", time.Since(freed).Round(time.Millisecond))
	d.serve.WaitLine(`Listener accepting again.*listener=gateway.*failed_accepts=\d+`, 10*time.Second)
	eventually(t, 10*time.Second, func() bool {
		code, _ := kept.get(t, "/readyz", "")
		return code == http.StatusOK
	}, func() string { return "/readyz not ready again after the port accepted" })
}
