package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/installer/manifest"
	"github.com/better-compute/better-compute/tests/testenv"
)

// The install script end to end: a real better-compute serve hands out a
// fixture dist through downloads.dir, the generated script runs under dash
// (and bash) in a temporary BCD_ROOT with systemctl and useradd replaced by
// recording stubs, and joins through the real gateway with a real token.

// installEnv is a control plane serving releases, with a site, a pool and
// a release key.
type installEnv struct {
	t          *testing.T
	dir        string
	bc         string // better-compute binary
	cfg        string
	env        []string
	api        string // http://127.0.0.1:port
	gatewayURL string
	dist       string
	keys       string
	pin        string
}

// freePort is a loopback TCP port free a moment ago (testenv.FreePort).
func freePort(t *testing.T) int {
	t.Helper()
	return testenv.FreePort(t)
}

func newInstallEnv(t *testing.T) *installEnv {
	t.Helper()
	dir := t.TempDir()
	e := &installEnv{t: t, dir: dir, bc: testenv.Binary(t, "better-compute"),
		dist: filepath.Join(dir, "dist"), keys: filepath.Join(dir, "keys")}
	if err := os.MkdirAll(e.dist, 0o755); err != nil {
		t.Fatal(err)
	}
	// The gateway's public URL is what joined daemons dial, so it listens on
	// a known port.
	port := freePort(t)
	e.gatewayURL = fmt.Sprintf("https://localhost:%d", port)
	e.cfg = testenv.WriteFile(t, "better-compute.yaml", fmt.Sprintf("host:\n  listen: 127.0.0.1:0\n  gateway:\n    listen: 127.0.0.1:%d\n", port))
	e.env = []string{"BETTER_COMPUTE_DATA_DIR=" + filepath.Join(dir, "data"), "BETTER_COMPUTE_DOWNLOADS_DIR=" + e.dist}
	p := testenv.Start(t, e.env, e.bc, "serve", "--config", e.cfg)
	e.api = "http://" + p.WaitLine(`msg="API listening" addr=(\S+)`, 60*time.Second)[1]
	p.WaitLine(`msg="Gateway listening"`, 30*time.Second)
	// API commands (install-script checks --pool and --site) call this one.
	e.env = append(e.env, "BETTER_COMPUTE_URL="+e.api)
	out := e.cli("release", "keygen", "--out", filepath.Join(e.keys, "release.key"))
	e.pin = regexp.MustCompile(`pin:\s+(sha256/\S+)`).FindStringSubmatch(out)[1]
	e.cli("sites", "create", "--name", "site-e2e", "--region", "default")
	e.cli("pools", "create", "--name", "pool-e2e", "--site", "site-e2e")
	return e
}

// cli runs better-compute with the environment's configuration and fails
// the test when it fails.
func (e *installEnv) cli(args ...string) string {
	e.t.Helper()
	code, stdout, stderr := testenv.Run(e.t, e.env, "", e.bc, append([]string{"--config", e.cfg}, args...)...)
	if code != 0 {
		e.t.Fatalf("better-compute %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
	}
	return stdout
}

// token creates a join token file for the pool.
func (e *installEnv) token(maxUses int) string {
	e.t.Helper()
	p := filepath.Join(e.t.TempDir(), "join-token")
	e.cli("join-tokens", "create", "--pool", "pool-e2e", "--ttl", "1h", "--max-uses", fmt.Sprint(maxUses), "--out", p)
	return p
}

// buildDir is goreleaser's build folder name for this machine's arch.
func buildDir(program string) string {
	variant := map[string]string{"amd64": "_v1", "arm64": "_v8.0"}[runtime.GOARCH]
	return program + "_linux_" + runtime.GOARCH + variant
}

// bcdBuilds caches bcd built at a version, once per test process.
var bcdBuilds sync.Map // version -> func() (string, error)

// bcdAt builds bcd with main.version set, as a release would be.
func bcdAt(t *testing.T, version string) string {
	t.Helper()
	f, _ := bcdBuilds.LoadOrStore(version, sync.OnceValues(func() (string, error) {
		dir, err := os.MkdirTemp("", "bc-e2e-bcd-")
		if err != nil {
			return "", err
		}
		out := filepath.Join(dir, "bcd")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-X main.version="+version+" -X main.commit=e2e", "-o", out, "./bcd/cmd/bcd")
		cmd.Dir = repoRoot()
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("build bcd %s: %v\n%s", version, err, b)
		}
		return out, nil
	}))
	p, err := f.(func() (string, error))()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

func copyFile(t *testing.T, src, dst string, mode fs.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

// release lays out dist/<version>/ with bcd in goreleaser's build folder,
// a manifest and its signature, and returns the manifest.
func (e *installEnv) release(version, bcd string) *manifest.Manifest {
	e.t.Helper()
	dir := filepath.Join(e.dist, version)
	copyFile(e.t, bcd, filepath.Join(dir, buildDir("bcd"), "bcd"), 0o755)
	e.cli("release", "manifest", "--dist", dir, "--version", version, "--expires", "24h")
	e.cli("release", "sign", "--key", filepath.Join(e.keys, "release.key"), "--in", filepath.Join(dir, "manifest.json"))
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		e.t.Fatal(err)
	}
	m, err := manifest.Parse(b)
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

// script generates the install script for a version.
func (e *installEnv) script(version string, extra ...string) string {
	e.t.Helper()
	out := filepath.Join(e.t.TempDir(), "install.sh")
	args := []string{"daemon", "install-script", "--pool", "pool-e2e", "--site", "site-e2e",
		"--gateway-url", e.gatewayURL, "--base-url", e.api, "--bcd-version", version,
		"--release-manifest", filepath.Join(e.dist, version, "manifest.json"), "--release-pins", e.pin, "--out", out}
	e.cli(append(args, extra...)...)
	return out
}

// host is a temporary install root with its stubs.
type host struct {
	t     *testing.T
	root  string
	stubs string
	log   string // systemctl and useradd calls, one a line
}

const systemctlStub = `#!/bin/sh
# Records its calls; is-enabled and is-active answer from what was recorded,
# is-system-running as a booted systemd does.
echo "systemctl $*" >>"$STUB_LOG"
case "$1" in
is-system-running) echo running ;;
is-enabled | is-active)
	for u; do :; done
	grep -q "^systemctl enable --now.* $u\( \|\$\)" "$STUB_LOG"
	;;
esac
`

const useraddStub = `#!/bin/sh
# Records its calls; with --root DIR it adds the user to DIR/etc/passwd.
echo "useradd $*" >>"$STUB_LOG"
root=
while [ $# -gt 1 ]; do
	case "$1" in --root) root=$2; shift ;; esac
	shift
done
[ -n "$root" ] || exit 1
mkdir -p "$root/etc"
echo "$1:x:999:999::/var/lib/bcd:/usr/sbin/nologin" >>"$root/etc/passwd"
`

func newHost(t *testing.T) *host {
	t.Helper()
	dir := t.TempDir()
	testenv.PassThrough(t, dir) // the command user reaches its HOME in root/var/lib/bcd
	h := &host{t: t, root: filepath.Join(dir, "root"), stubs: filepath.Join(dir, "stubs"), log: filepath.Join(dir, "calls.log")}
	// var/lib is there, 0755, as on every machine (bcd join would make it
	// 0700, which would keep the command user from its HOME), and the root
	// is a machine systemd booted (sd_booted(3): /run/systemd/system).
	for _, d := range []string{h.root, h.stubs, filepath.Join(h.root, "var", "lib"), filepath.Join(h.root, "run/systemd/system")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h.stub("systemctl", systemctlStub)
	h.stub("useradd", useraddStub)
	return h
}

func (h *host) stub(name, body string) {
	h.t.Helper()
	if err := os.WriteFile(filepath.Join(h.stubs, name), []byte(body), 0o755); err != nil {
		h.t.Fatal(err)
	}
}

// run runs the script with shell in the root and returns the exit code,
// standard output and standard error.
func (h *host) run(shell, script string, env []string, args ...string) (int, string, string) {
	h.t.Helper()
	env = append([]string{"BCD_ROOT=" + h.root, "STUB_LOG=" + h.log, "PATH=" + h.stubs + ":" + os.Getenv("PATH")}, env...)
	code, stdout, stderr := testenv.Run(h.t, env, "", shell, append([]string{script}, args...)...)
	h.t.Logf("%s %s: exit %d\n%s%s", shell, filepath.Base(script), code, stdout, stderr)
	return code, stdout, stderr
}

// calls returns the recorded stub calls.
func (h *host) calls() []string {
	b, err := os.ReadFile(h.log)
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// files lists the regular files under the root, with their modification
// times.
func (h *host) files() map[string]time.Time {
	h.t.Helper()
	out := map[string]time.Time{}
	filepath.WalkDir(h.root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			fi, _ := d.Info()
			rel, _ := filepath.Rel(h.root, p)
			out[rel] = fi.ModTime()
		}
		return nil
	})
	return out
}

// refused checks a refusal: a non-zero exit, exactly one line on standard
// error naming the reason, and nothing installed.
func (h *host) refused(code int, stderr, reason string) {
	h.t.Helper()
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if code == 0 || len(lines) != 1 || !strings.HasPrefix(lines[0], "install-bcd: error: ") || !strings.Contains(lines[0], reason) {
		h.t.Errorf("want one error line about %q and a failure, got exit %d and:\n%s", reason, code, stderr)
	}
	if files := h.files(); len(files) != 0 {
		h.t.Errorf("a refused install left files: %v", files)
	}
	for _, c := range h.calls() {
		if c != "" && !strings.HasPrefix(c, "systemctl is-") {
			h.t.Errorf("a refused install called %q", c)
		}
	}
}

func sha256File(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func TestInstallScript(t *testing.T) {
	t.Parallel()
	e := newInstallEnv(t)
	m1 := e.release("0.1.0", bcdAt(t, "0.1.0"))
	bin1, _ := m1.Find(manifest.KindBinary, "bcd", "linux", runtime.GOARCH)
	script := e.script("0.1.0")
	if _, err := exec.LookPath("shellcheck"); err == nil {
		if out, err := exec.Command("shellcheck", "-s", "sh", script).CombinedOutput(); err != nil {
			t.Fatalf("shellcheck: %v\n%s", err, out)
		}
	} else if os.Getenv("CI") == "true" {
		t.Fatal("shellcheck is not installed (tests/run installs it from Debian's packages)")
	}
	tokenFile := e.token(1)
	tokenBytes, _ := os.ReadFile(tokenFile)
	token := strings.TrimSpace(string(tokenBytes))

	h := newHost(t)
	t.Run("dry run", func(t *testing.T) {
		code, stdout, _ := h.run("dash", script, nil, "--dry-run")
		if code != 0 || !strings.Contains(stdout, "would join pool pool-e2e") || !strings.Contains(stdout, "would install "+h.root+"/usr/local/bin/bcd") ||
			!strings.Contains(stdout, "would run systemctl enable --now bcd.service") {
			t.Fatalf("dry run: exit %d\n%s", code, stdout)
		}
		if files := h.files(); len(files) != 0 {
			t.Fatalf("dry run wrote %v", files)
		}
	})

	t.Run("install", func(t *testing.T) {
		code, stdout, stderr := h.run("dash", script, nil, "--token-file", tokenFile)
		if code != 0 {
			t.Fatalf("install: exit %d\n%s%s", code, stdout, stderr)
		}
		if strings.Contains(stdout+stderr, token) {
			t.Error("the token was printed")
		}
		// The token decides the pool; the script says which it joined.
		if !regexp.MustCompile(`install-bcd: Placed in pool pool-e2e \(pool_\S+\), site site-e2e \(site_\S+\), region default\n`).MatchString(stdout) ||
			!regexp.MustCompile(`installed and running, joined as node \S+ in pool pool-e2e \(pool_\S+\), site site-e2e \(site_\S+\)\n`).MatchString(stdout) {
			t.Errorf("the script does not say where the node joined:\n%s", stdout)
		}
		files := h.files()
		for _, f := range []string{"usr/local/bin/bcd", "etc/systemd/system/bcd.service", "var/lib/bcd/identity.json",
			"etc/bcd/release-pins", "var/lib/bcd/release/manifest.json", "var/lib/bcd/release/manifest.json.minisig"} {
			if _, ok := files[f]; !ok {
				t.Errorf("%s not installed", f)
			}
		}
		for f := range files {
			if b, _ := os.ReadFile(filepath.Join(h.root, f)); strings.Contains(string(b), token) {
				t.Errorf("the token is on disk in %s", f)
			}
		}
		if got := sha256File(t, filepath.Join(h.root, "usr/local/bin/bcd")); got != bin1.SHA256 {
			t.Errorf("installed bcd sha256 %s, manifest %s", got, bin1.SHA256)
		}
		unit, _ := os.ReadFile(filepath.Join(h.root, "etc/systemd/system/bcd.service"))
		if !strings.Contains(string(unit), "ExecStart=/usr/local/bin/bcd node --data-dir /var/lib/bcd") {
			t.Errorf("bcd.service:\n%s", unit)
		}
		calls := strings.Join(h.calls(), "\n")
		// The command user, which commands without asRoot run as (issue 27).
		if !regexp.MustCompile(`(?m)^useradd --root \S+ --system --user-group --home-dir /var/lib/bcd/home .* bcd-cmd$`).MatchString(calls) {
			t.Errorf("no useradd of bcd-cmd:\n%s", calls)
		}
		if !strings.Contains(calls, "systemctl daemon-reload") || !strings.Contains(calls, "systemctl enable --now bcd.service") {
			t.Errorf("systemctl calls:\n%s", calls)
		}
	})

	t.Run("installed bcd connects", func(t *testing.T) {
		p := testenv.Start(t, nil, filepath.Join(h.root, "usr/local/bin/bcd"), "node", "--data-dir", filepath.Join(h.root, "var/lib/bcd"))
		p.WaitLine(`msg="Session established"`, 60*time.Second)
		p.Stop(syscallTERM, 10*time.Second)
	})

	t.Run("second run changes nothing", func(t *testing.T) {
		before, ncalls := h.files(), len(h.calls())
		code, stdout, stderr := h.run("bash", script, nil) // no token: already joined
		if code != 0 || !strings.Contains(stdout, "nothing to change") {
			t.Fatalf("second run: exit %d\n%s%s", code, stdout, stderr)
		}
		after := h.files()
		if len(after) != len(before) {
			t.Errorf("files changed: %v -> %v", before, after)
		}
		for f, mt := range before {
			if !after[f].Equal(mt) {
				t.Errorf("%s was rewritten", f)
			}
		}
		for _, c := range h.calls()[ncalls:] {
			if !strings.HasPrefix(c, "systemctl is-") {
				t.Errorf("second run called %q", c)
			}
		}
	})

	t.Run("upgrade by script", func(t *testing.T) {
		m2 := e.release("0.2.0", bcdAt(t, "0.2.0"))
		bin2, _ := m2.Find(manifest.KindBinary, "bcd", "linux", runtime.GOARCH)
		ncalls := len(h.calls())
		code, stdout, stderr := h.run("dash", e.script("0.2.0"), nil)
		if code != 0 {
			t.Fatalf("upgrade: exit %d\n%s%s", code, stdout, stderr)
		}
		if got := sha256File(t, filepath.Join(h.root, "usr/local/bin/bcd")); got != bin2.SHA256 {
			t.Errorf("bcd after upgrade %s, want %s", got, bin2.SHA256)
		}
		if calls := strings.Join(h.calls()[ncalls:], "\n"); !strings.Contains(calls, "systemctl try-restart bcd.service") {
			t.Errorf("upgrade calls:\n%s", calls)
		}
	})

	t.Run("wget when there is no curl", func(t *testing.T) {
		if _, err := exec.LookPath("wget"); err != nil {
			t.Skip("wget is not installed")
		}
		h := newHost(t)
		// PATH: the stubs, then every tool of the system but curl.
		nocurl := filepath.Join(t.TempDir(), "bin")
		os.MkdirAll(nocurl, 0o755)
		for _, d := range filepath.SplitList(os.Getenv("PATH")) {
			entries, _ := os.ReadDir(d)
			for _, de := range entries {
				if de.Name() != "curl" {
					os.Symlink(filepath.Join(d, de.Name()), filepath.Join(nocurl, de.Name())) // the first wins
				}
			}
		}
		code, stdout, stderr := testenv.Run(t, []string{"BCD_ROOT=" + h.root, "STUB_LOG=" + h.log, "PATH=" + h.stubs + ":" + nocurl},
			"", "dash", script, "--dry-run")
		if code != 0 || !strings.Contains(stdout, "downloaded and verified") {
			t.Fatalf("dry run with wget: exit %d\n%s%s", code, stdout, stderr)
		}
	})

	t.Run("refused: exhausted token", func(t *testing.T) {
		h := newHost(t)
		// bcd join stores the node's key in the data directory before it
		// calls the gateway; the script never removes that directory after
		// a failed join, so a retry is the same joiner (DESIGN.md, "Join is
		// idempotent per key"). A marker file stands for what an earlier
		// try left there.
		dataDir := filepath.Join(h.root, "var/lib/bcd")
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			t.Fatal(err)
		}
		marker := filepath.Join(dataDir, "earlier-try")
		if err := os.WriteFile(marker, []byte("kept\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		code, _, stderr := h.run("dash", script, nil, "--token-file", tokenFile)
		lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
		if code == 0 || len(lines) != 1 || !strings.HasPrefix(lines[0], "install-bcd: error: bcd join failed: ") ||
			!strings.Contains(lines[0], "stays in "+dataDir) || !strings.Contains(lines[0], "running this script again") ||
			!strings.Contains(lines[0], "better-compute nodes reinstall") {
			t.Errorf("want one error line about the failed join and what to do, got exit %d and:\n%s", code, stderr)
		}
		if strings.Contains(stderr, token) {
			t.Error("the token was printed")
		}
		if b, err := os.ReadFile(marker); err != nil || string(b) != "kept\n" {
			t.Errorf("the data directory after a failed join: %q %v", b, err)
		}
		for f := range h.files() {
			if !strings.HasPrefix(f, "var/lib/bcd/") {
				t.Errorf("a failed join left %s", f)
			}
		}
		for _, c := range h.calls() {
			if c != "" && !strings.HasPrefix(c, "systemctl is-") {
				t.Errorf("a failed join called %q", c)
			}
		}
	})

	t.Run("refused: dead proxy", func(t *testing.T) {
		h := newHost(t)
		dead := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		code, _, stderr := h.run("dash", script, []string{"BCD_JOIN_TOKEN=" + token, "http_proxy=" + dead})
		h.refused(code, stderr, "cannot download the release manifest from "+e.api+"/api/downloads/bcd/0.1.0/manifest.json through the proxy "+dead+" (http_proxy): curl: (7)")
	})

	t.Run("refused at generation: unknown pool", func(t *testing.T) {
		code, _, stderr := testenv.Run(t, e.env, "", e.bc, "--config", e.cfg, "daemon", "install-script", "--pool", "nosuchpool",
			"--gateway-url", e.gatewayURL, "--base-url", e.api, "--bcd-version", "0.1.0", "--release-manifest", filepath.Join(e.dist, "0.1.0", "manifest.json"),
			"--release-pins", e.pin, "--out", filepath.Join(t.TempDir(), "x.sh"))
		if code != 2 || !regexp.MustCompile(`--pool nosuchpool: no such pool on the control plane; pools: (.*, )?pool-e2e \(pool_\S+\)(, .*)?\n$`).MatchString(stderr) {
			t.Errorf("--pool nosuchpool: exit %d %q", code, stderr)
		}
	})

	t.Run("refused: unknown arch", func(t *testing.T) {
		h := newHost(t)
		uname, err := exec.LookPath("uname")
		if err != nil {
			t.Fatal(err)
		}
		h.stub("uname", "#!/bin/sh\nif [ \"$1\" = -m ]; then echo riscv64; else exec "+uname+" \"$@\"; fi\n")
		code, _, stderr := h.run("dash", script, []string{"BCD_JOIN_TOKEN=" + token})
		h.refused(code, stderr, "unsupported architecture riscv64")
	})

	t.Run("refused: unreachable server", func(t *testing.T) {
		h := newHost(t)
		b, _ := os.ReadFile(script)
		dead := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		s := strings.ReplaceAll(string(b), "DOWNLOADS_URL='"+e.api+"/api/downloads'", "DOWNLOADS_URL='"+dead+"/api/downloads'")
		p := filepath.Join(t.TempDir(), "install.sh")
		os.WriteFile(p, []byte(s), 0o755)
		code, _, stderr := h.run("dash", p, []string{"BCD_JOIN_TOKEN=" + token})
		h.refused(code, stderr, "cannot download the release manifest from "+dead)
	})

	t.Run("refused: tampered binary", func(t *testing.T) {
		e.release("0.1.1", bcdAt(t, "0.1.0"))
		s := e.script("0.1.1")
		bin := filepath.Join(e.dist, "0.1.1", buildDir("bcd"), "bcd")
		f, err := os.OpenFile(bin, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.Write([]byte("tampered"))
		f.Close()
		h := newHost(t)
		code, _, stderr := h.run("dash", s, []string{"BCD_JOIN_TOKEN=" + token})
		h.refused(code, stderr, "refusing to install it")
	})

	t.Run("refused: manifest signed by an unpinned key", func(t *testing.T) {
		// At generation: the CLI verifies against the pins.
		other := filepath.Join(t.TempDir(), "keys")
		e.cli("release", "keygen", "--out-dir", other)
		e.release("0.1.2", bcdAt(t, "0.1.0"))
		mf := filepath.Join(e.dist, "0.1.2", "manifest.json")
		s := e.script("0.1.2")
		e.cli("release", "sign", "--key", filepath.Join(other, "release.key"), "--in", mf)
		code, _, stderr := testenv.Run(t, e.env, "", e.bc, "daemon", "install-script", "--pool", "pool-e2e", "--site", "site-e2e",
			"--gateway-url", e.gatewayURL, "--base-url", e.api, "--bcd-version", "0.1.2",
			"--release-manifest", mf, "--release-pins", e.pin, "--out", filepath.Join(t.TempDir(), "x.sh"))
		if code == 0 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, "not pinned") {
			t.Errorf("generator with an unpinned key: exit %d %q", code, stderr)
		}
		// On the machine: the server now holds a manifest signed by the
		// other key, with another binary in it.
		copyFile(t, bcdAt(t, "0.2.0"), filepath.Join(e.dist, "0.1.2", buildDir("bcd"), "bcd"), 0o755)
		e.cli("release", "manifest", "--dist", filepath.Join(e.dist, "0.1.2"), "--version", "0.1.2")
		e.cli("release", "sign", "--key", filepath.Join(other, "release.key"), "--in", mf)
		h := newHost(t)
		code, _, stderr = h.run("dash", s, []string{"BCD_JOIN_TOKEN=" + token})
		h.refused(code, stderr, "is not the one verified against the pins")
	})

	t.Run("unprivileged", func(t *testing.T) {
		h := newHost(t)
		s := e.script("0.1.0", "--unprivileged")
		tok := e.token(1)
		code, stdout, stderr := h.run("dash", s, nil, "--token-file", "-")
		h.refused(code, stderr, "no join token") // stdin is empty
		_ = stdout
		// A garbled token is refused before anything is downloaded.
		for _, bad := range []string{"not-a-token", "bct1.abc.d$f.ghi"} {
			code, _, stderr = h.run("dash", s, []string{"BCD_JOIN_TOKEN=" + bad})
			h.refused(code, stderr, "the join token from BCD_JOIN_TOKEN is malformed")
		}
		code, stdout, stderr = h.run("dash", s, nil, "--token-file", tok)
		if code != 0 {
			t.Fatalf("unprivileged install: exit %d\n%s%s", code, stdout, stderr)
		}
		calls := strings.Join(h.calls(), "\n")
		for _, want := range []string{"useradd --root " + h.root + " --system", "systemctl enable --now bcd-helper.service bcd.service"} {
			if !strings.Contains(calls, want) {
				t.Errorf("calls lack %q:\n%s", want, calls)
			}
		}
		unit, _ := os.ReadFile(filepath.Join(h.root, "etc/systemd/system/bcd.service"))
		helper, _ := os.ReadFile(filepath.Join(h.root, "etc/systemd/system/bcd-helper.service"))
		if !strings.Contains(string(unit), "User=bcd") || !strings.Contains(string(unit), "ProtectSystem=strict") || !strings.Contains(string(helper), "bcd helper") {
			t.Errorf("units:\n%s\n%s", unit, helper)
		}
		ncalls := len(h.calls())
		code, stdout, _ = h.run("dash", s, nil)
		if code != 0 || !strings.Contains(stdout, "nothing to change") {
			t.Errorf("second unprivileged run: exit %d\n%s", code, stdout)
		}
		for _, c := range h.calls()[ncalls:] {
			if !strings.HasPrefix(c, "systemctl is-") {
				t.Errorf("second run called %q", c)
			}
		}
	})
}
