package tests

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/tests/testenv"
)

// A plain serve reachable from other machines: serve --public-url on an
// address that is not loopback, the API on HTTPS (--api-tls auto), nodes add
// printing the line to paste, and that line, run as printed, installing bcd
// from the downloads folder under BCD_ROOT and joining. The lead's
// network-namespace test drives the same line on a second machine.

// publicAddr is an address of this machine that other machines could reach
// (the first IPv4 address that is neither loopback nor link-local), or
// 127.0.0.2 where it has none (which serve treats as loopback, so the test
// asks for --api-tls auto either way).
func publicAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			return ipn.IP.String()
		}
	}
	return "127.0.0.2"
}

// freePortOn is a TCP port free on addr a moment ago.
func freePortOn(t *testing.T, addr string) int {
	t.Helper()
	return testenv.FreePortOn(t, addr)
}

// publicServe is a serve --public-url with its data and downloads folders.
type publicServe struct {
	t              *testing.T
	bc, data, dist string
	cfg            string // host.listen, for the CLI's doctor
	env            []string
	api, gateway   string // https://ADDR:PORT
	proc           *testenv.Proc
}

// startPublicServe starts serve --public-url https://addr:port
// --gateway-listen addr:port --api-tls tls, with the API on addr too and
// extraYAML (top-level keys other than host) in its configuration.
func startPublicServe(t *testing.T, addr, dist, tls, extraYAML string) *publicServe {
	t.Helper()
	dir := t.TempDir()
	s := &publicServe{t: t, bc: testenv.Binary(t, "better-compute"), data: filepath.Join(dir, "data"), dist: dist}
	gwPort, apiPort := freePortOn(t, addr), freePortOn(t, addr)
	s.gateway = fmt.Sprintf("https://%s:%d", addr, gwPort)
	s.env = []string{"BETTER_COMPUTE_DATA_DIR=" + s.data, "BETTER_COMPUTE_DOWNLOADS_DIR=" + dist}
	s.cfg = testenv.WriteFile(t, "better-compute.yaml", fmt.Sprintf("host:\n  listen: %s\n%s", net.JoinHostPort(addr, fmt.Sprint(apiPort)), extraYAML))
	s.proc = testenv.Start(t, s.env, s.bc, "serve", "--config", s.cfg, "--public-url", s.gateway,
		"--gateway-listen", net.JoinHostPort(addr, fmt.Sprint(gwPort)), "--api-tls", tls)
	m := s.proc.WaitLine(`msg="API listening" addr=(\S+) .*scheme=(\S+)`, 60*time.Second)
	s.api = m[2] + "://" + m[1]
	s.proc.WaitLine(`msg="Gateway listening"`, 30*time.Second)
	return s
}

// cli runs better-compute against the serve's data folder; it returns the
// exit code and output.
func (s *publicServe) cli(args ...string) (int, string, string) {
	s.t.Helper()
	return testenv.Run(s.t, s.env, "", s.bc, args...)
}

func TestNodesAddOverHTTPS(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/bin/curl"); err != nil {
		t.Fatal("curl is needed: the printed line runs it")
	}
	addr := publicAddr(t)
	// The downloads folder holds a signed release; downloads.releasePins
	// makes the served script pin its digests.
	dist := filepath.Join(t.TempDir(), "dist")
	copyFile(t, bcdAt(t, "0.1.0"), filepath.Join(dist, "0.1.0", buildDir("bcd"), "bcd"), 0o755)
	releasePin := signRelease(t, filepath.Join(dist, "0.1.0"), "0.1.0")
	s := startPublicServe(t, addr, dist, "auto", "downloads:\n  releasePins: ["+releasePin+"]\n")
	if !strings.HasPrefix(s.api, "https://"+addr+":") {
		t.Fatalf("API on %s, want https on %s", s.api, addr)
	}
	// Both certificates name the public address.
	for _, what := range []string{"Gateway certificate issued", "API certificate issued from the gateway serving CA"} {
		if !regexp.MustCompile(`msg="` + what + `" .*names=\S*\b` + regexp.QuoteMeta(addr) + `\b`).MatchString(s.proc.Output()) {
			t.Fatalf("no %q for %s in the log:\n%s", what, addr, s.proc.Output())
		}
	}

	// nodes add over HTTPS: the CLI trusts the data folder's pki/api.crt.
	code, line, stderr := s.cli("nodes", "add", "--pool", "default", "--server", s.api)
	if code != 0 {
		t.Fatalf("nodes add: exit %d\n%s%s", code, line, stderr)
	}
	line = strings.TrimSpace(line)
	m := regexp.MustCompile(`^curl -fsS -k --pinnedpubkey '(sha256//[A-Za-z0-9+/]{43}=)' -o install-bcd\.sh '(https://[^']+/api/install\.sh)' && BCD_JOIN_TOKEN='(bct1\.[^']+)' sh install-bcd\.sh$`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("nodes add printed %q", line)
	}
	pin, scriptURL, token := m[1], m[2], m[3]
	if !strings.HasPrefix(scriptURL, s.api+"/") || strings.Contains(scriptURL, token) {
		t.Fatalf("script URL %s", scriptURL)
	}
	if !strings.Contains(stderr, "pool default") {
		t.Errorf("stderr %q does not name the pool", stderr)
	}

	t.Run("the pinned curl fetches the script, a wrong pin fails", func(t *testing.T) {
		fetch, _, _ := strings.Cut(line, " && ")
		dir := t.TempDir()
		code, _, stderr := testenv.Run(t, nil, "", "sh", "-c", "cd "+dir+" && "+fetch)
		b, _ := os.ReadFile(filepath.Join(dir, "install-bcd.sh"))
		script := string(b)
		if code != 0 || !strings.HasPrefix(script, "#!/bin/sh") || !strings.Contains(script, pin) || strings.Contains(script, token) ||
			!strings.Contains(script, releasePin) {
			t.Fatalf("fetch: exit %d\n%.500s%s", code, script, stderr)
		}
		// The whole line with a wrong pin: curl's 90 is the line's status,
		// and nothing runs.
		h := newHost(t)
		wrong := strings.Replace(line, pin, "sha256//"+strings.Repeat("A", 43)+"=", 1)
		dir = t.TempDir()
		code, out, stderr := testenv.Run(t, []string{"BCD_ROOT=" + h.root, "STUB_LOG=" + h.log, "PATH=" + h.stubs + ":" + os.Getenv("PATH")}, "", "sh", "-c", "cd "+dir+" && "+wrong)
		if code != 90 || out != "" || len(h.files()) != 0 || len(h.calls()) != 0 {
			t.Fatalf("a wrong pin: exit %d (want curl's 90, public key does not match), files %v, calls %v\n%s%s", code, h.files(), h.calls(), out, stderr)
		}
		// Without the pin and -k the private CA is not trusted.
		if code, _, _ := testenv.Run(t, nil, "", "curl", "-fsS", scriptURL); code == 0 {
			t.Fatal("curl without the pin trusted the API")
		}
	})

	t.Run("the printed line installs and joins", func(t *testing.T) {
		h := newHost(t)
		code, stdout, stderr := testenv.Run(t, []string{"BCD_ROOT=" + h.root, "STUB_LOG=" + h.log, "PATH=" + h.stubs + ":" + os.Getenv("PATH")}, "", "sh", "-c", "cd "+t.TempDir()+" && "+line)
		if code != 0 {
			t.Fatalf("the line: exit %d\n%s%s", code, stdout, stderr)
		}
		if strings.Contains(stdout+stderr, token) {
			t.Error("the token was printed")
		}
		for _, f := range []string{"usr/local/bin/bcd", "etc/systemd/system/bcd.service", "var/lib/bcd/identity.json",
			"etc/bcd/release-pins", "var/lib/bcd/release/manifest.json"} {
			if _, err := os.Stat(filepath.Join(h.root, f)); err != nil {
				t.Errorf("%s not installed: %v", f, err)
			}
		}
		node := testenv.Start(t, nil, filepath.Join(h.root, "usr/local/bin/bcd"), "node", "--data-dir", filepath.Join(h.root, "var/lib/bcd"))
		node.WaitLine(`msg="Session established"`, 60*time.Second)
		var ident struct {
			NodeID string `json:"node_id"`
		}
		b, _ := os.ReadFile(filepath.Join(h.root, "var/lib/bcd/identity.json"))
		if err := json.Unmarshal(b, &ident); err != nil || ident.NodeID == "" {
			t.Fatalf("identity.json: %s %v", b, err)
		}
		code, out, stderr := s.cli("commands", "run", "--server", s.api, "--node", ident.NodeID, "--", "echo", "joined over https")
		if code != 0 || !strings.Contains(out, "joined over https") {
			t.Fatalf("commands run: exit %d\n%s%s", code, out, stderr)
		}
		// The token had one use.
		code, _, stderr = testenv.Run(t, []string{"BCD_ROOT=" + t.TempDir(), "STUB_LOG=" + h.log, "PATH=" + h.stubs + ":" + os.Getenv("PATH")}, "", "sh", "-c", "cd "+t.TempDir()+" && "+line)
		if code == 0 || !strings.Contains(stderr, "token") {
			t.Fatalf("the line again: exit %d, want a refused token\n%s", code, stderr)
		}
		t.Logf("the line again: %s", stderr)
	})

	t.Run("refusals", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			code int
			want string
		}{
			{[]string{"--pool", "nosuchpool"}, 1, "no pool nosuchpool"},
			{[]string{"--pool", "default", "--ttl", "30s"}, 2, "--ttl"},
			{[]string{"--pool", "default", "--site", "nosuchsite"}, 1, "no site nosuchsite"},
			{[]string{}, 2, "--pool is required"},
		} {
			code, out, stderr := s.cli(append([]string{"nodes", "add", "--server", s.api}, tc.args...)...)
			if code != tc.code || !strings.Contains(stderr, tc.want) || out != "" {
				t.Errorf("nodes add %v: exit %d, %q; want exit %d and %q", tc.args, code, out+stderr, tc.code, tc.want)
			}
		}
	})

	t.Run("json", func(t *testing.T) {
		code, out, stderr := s.cli("nodes", "add", "--pool", "default", "--server", s.api, "--unprivileged", "-o", "json")
		var res struct {
			JoinTokenID, Token, ExpiresAt, Pool, InstallCommand, ScriptURL, Pin string
		}
		if code != 0 || json.Unmarshal([]byte(out), &res) != nil {
			t.Fatalf("exit %d\n%s%s", code, out, stderr)
		}
		if res.Pool != "default" || res.Pin != pin || !strings.HasSuffix(res.ScriptURL, "install.sh?unprivileged=1") ||
			!strings.Contains(res.InstallCommand, res.Token) || res.JoinTokenID == "" || res.ExpiresAt == "" {
			t.Fatalf("json %s", out)
		}
	})

	t.Run("doctor", func(t *testing.T) {
		_, out, stderr := testenv.Run(t, append([]string{"BETTER_COMPUTE_API_TLS=auto"}, s.env...), "", s.bc, "--config", s.cfg, "doctor")
		if !regexp.MustCompile(`(?m)^api\.tls\s+ok\s+the API serves HTTPS`).MatchString(out) {
			t.Fatalf("doctor:\n%s%s", out, stderr)
		}
	})
}

// TestNodesAddRefusesPlainHTTP: on plain HTTP off loopback serve warns at
// start and nodes add prints no line.
func TestNodesAddRefusesPlainHTTP(t *testing.T) {
	t.Parallel()
	addr := publicAddr(t)
	if addr == "127.0.0.2" {
		t.Skip("this machine has no address off loopback")
	}
	dist := filepath.Join(t.TempDir(), "dist")
	copyFile(t, bcdAt(t, "0.1.0"), filepath.Join(dist, "0.1.0", buildDir("bcd"), "bcd"), 0o755)
	s := startPublicServe(t, addr, dist, "off", "")
	s.proc.WaitLine(`level=WARN msg="The API serves plain HTTP on an address other machines reach`, 10*time.Second)
	code, out, stderr := s.cli("nodes", "add", "--pool", "default", "--server", s.api)
	if code != 1 || out != "" || !strings.Contains(stderr, "plain HTTP") || !strings.Contains(stderr, "--api-tls auto") {
		t.Fatalf("nodes add on plain HTTP: exit %d\n%s%s", code, out, stderr)
	}
	_, out, stderr = testenv.Run(t, append([]string{"BETTER_COMPUTE_API_TLS=off"}, s.env...), "", s.bc, "--config", s.cfg, "doctor")
	if !regexp.MustCompile(`(?m)^api\.tls\s+warn\s+.*clear text`).MatchString(out) {
		t.Fatalf("doctor:\n%s%s", out, stderr)
	}
}

// signRelease makes a release key, writes the manifest of the release in
// folder dir and signs it, as docs/install.md's air-gapped walk-through
// does; it returns the key's pin for downloads.releasePins.
func signRelease(t *testing.T, dir, version string) string {
	t.Helper()
	bc := testenv.Binary(t, "better-compute")
	keys := filepath.Join(t.TempDir(), "keys")
	var pin string
	// docs/install.md's commands ("An air-gapped site"), as written.
	for _, args := range [][]string{{"release", "keygen", "--out", filepath.Join(keys, "release.key")},
		{"release", "manifest", "--dist", dir, "--version", version, "--expires", "720h"},
		{"release", "sign", "--key", filepath.Join(keys, "release.key"), "--in", filepath.Join(dir, "manifest.json")}} {
		code, out, stderr := testenv.Run(t, nil, "", bc, args...)
		if code != 0 {
			t.Fatalf("better-compute %v: exit %d\n%s%s", args, code, out, stderr)
		}
		if m := regexp.MustCompile(`pin:\s+(sha256/\S+)`).FindStringSubmatch(out); m != nil {
			pin = m[1]
		}
	}
	if pin == "" {
		t.Fatal("release keygen printed no pin")
	}
	return pin
}
