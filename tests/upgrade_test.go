package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/installer/manifest"
	"github.com/better-compute/better-compute/tests/testenv"
)

// The self-upgrade end to end: a real control plane serves a fixture dist
// (bcd built at 0.1.0 and 0.2.0, a binary that exits 1 as 0.3.0, and 0.4.0
// signed by a key no pin names) through downloads.dir; a bcd installed by the
// install script runs as 0.1.0 and takes `better-compute nodes upgrade`.

// exitingBinary builds a tiny program that exits 1 at once: a release whose
// bcd cannot start.
func exitingBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nimport \"os\"\n\nfunc main() { os.Exit(1) }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "bcd")
	cmd := exec.Command("go", "build", "-o", out, src)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the exiting binary: %v\n%s", err, b)
	}
	return out
}

// nodeJSON is what the test reads of `nodes get -o json`.
type nodeJSON struct {
	ID         string `json:"id"`
	BcdVersion string `json:"bcdVersion"`
	State      string `json:"state"`
}

// commandJSON is what the test reads of `commands get -o json`.
type commandJSON struct {
	State  string            `json:"state"`
	Error  string            `json:"error"`
	Result map[string]any    `json:"result"`
	Spec   map[string]string `json:"upgrade"`
}

func TestUpgrade(t *testing.T) {
	t.Parallel()
	e := newInstallEnv(t)
	mA := e.release("0.1.0", bcdAt(t, "0.1.0"))
	mB := e.release("0.2.0", bcdAt(t, "0.2.0"))
	e.release("0.3.0", exitingBinary(t))
	e.release("0.4.0", bcdAt(t, "0.1.0"))
	other := filepath.Join(t.TempDir(), "keys")
	e.cli("release", "keygen", "--out-dir", other)
	e.cli("release", "sign", "--key", filepath.Join(other, "release.key"), "--in", filepath.Join(e.dist, "0.4.0", "manifest.json"))
	binA, _ := mA.Find(manifest.KindBinary, "bcd", "linux", runtime.GOARCH)
	binB, _ := mB.Find(manifest.KindBinary, "bcd", "linux", runtime.GOARCH)

	// bcd 0.1.0, installed and joined by the install script.
	h := newHost(t)
	if code, stdout, stderr := h.run("dash", e.script("0.1.0"), nil, "--token-file", e.token(1)); code != 0 {
		t.Fatalf("install: exit %d\n%s%s", code, stdout, stderr)
	}
	bin := filepath.Join(h.root, "usr/local/bin/bcd")
	p := testenv.Start(t, nil, bin, "node", "--data-dir", filepath.Join(h.root, "var/lib/bcd"),
		"--release-pins-file", filepath.Join(h.root, "etc/bcd/release-pins"), "--upgrade-health-timeout", "30s")
	p.WaitLine(`msg="Session established"`, 60*time.Second)
	// API calls go to the control plane's API (the admin token is the
	// embedded default's).
	apiEnv := append(append([]string{}, e.env...), "BETTER_COMPUTE_URL="+e.api)
	api := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := testenv.Run(t, apiEnv, "", e.bc, append([]string{"--config", e.cfg}, args...)...)
		if code != 0 {
			t.Fatalf("better-compute %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
		}
		return stdout
	}
	var list struct{ Nodes []nodeJSON }
	if err := json.Unmarshal([]byte(api("nodes", "list", "-o", "json")), &list); err != nil || len(list.Nodes) != 1 {
		t.Fatalf("nodes list: %v %+v", err, list)
	}
	nodeID := list.Nodes[0].ID
	getNode := func() nodeJSON {
		t.Helper()
		var n nodeJSON
		if err := json.Unmarshal([]byte(api("nodes", "get", nodeID, "-o", "json")), &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := getNode(); n.BcdVersion != "0.1.0" {
		t.Fatalf("before: bcd %s", n.BcdVersion)
	}
	upgrade := func(version string) (int, string, string) {
		t.Helper()
		code, stdout, stderr := testenv.Run(t, apiEnv, "", e.bc, "--config", e.cfg, "nodes", "upgrade", "--node", nodeID,
			"--version", version, "--timeout", "3m")
		t.Logf("nodes upgrade --version %s: exit %d\n%s%s", version, code, stdout, stderr)
		return code, stdout, stderr
	}
	command := func(stdout string) commandJSON {
		t.Helper()
		id := regexp.MustCompile(`cmd_[a-z0-9]+`).FindString(stdout)
		var c commandJSON
		if err := json.Unmarshal([]byte(api("commands", "get", id, "-o", "json")), &c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	pid := p.Pid()
	// printed waits for a line of bcd's output, failing only the subtest.
	printed := func(t *testing.T, pattern string) {
		t.Helper()
		re := regexp.MustCompile(pattern)
		for deadline := time.Now().Add(10 * time.Second); !re.MatchString(p.Output()); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("bcd printed no line matching %q", pattern)
				return
			}
		}
	}

	t.Run("0.1.0 to 0.2.0", func(t *testing.T) {
		code, stdout, _ := upgrade("0.2.0")
		if code != 0 || !strings.Contains(stdout, "succeeded") {
			t.Fatalf("upgrade to 0.2.0: exit %d", code)
		}
		if n := getNode(); n.BcdVersion != "0.2.0" {
			t.Errorf("after: nodes get says bcd %s", n.BcdVersion)
		}
		c := command(stdout)
		if c.State != "succeeded" || c.Spec["version"] != "0.2.0" || !strings.HasSuffix(c.Spec["baseUrl"], "/api/downloads") {
			t.Errorf("command: %+v", c)
		}
		if c.Result != nil && (c.Result["from"] != "0.1.0" || c.Result["to"] != "0.2.0") {
			t.Errorf("result: %v, want from 0.1.0 to 0.2.0", c.Result)
		}
		if got := sha256File(t, bin); got != binB.SHA256 {
			t.Errorf("bcd on disk has sha256 %s, want 0.2.0's %s", got, binB.SHA256)
		}
		if got := sha256File(t, bin+".prev"); got != binA.SHA256 {
			t.Errorf("bcd.prev has sha256 %s, want 0.1.0's %s", got, binA.SHA256)
		}
		if _, err := os.Stat(filepath.Join(h.root, "var/lib/bcd/upgrade/pending.json")); !os.IsNotExist(err) {
			t.Errorf("the upgrade marker is still there: %v", err)
		}
		if b, _ := os.ReadFile(filepath.Join(h.root, "var/lib/bcd/release/manifest.json")); !strings.Contains(string(b), `"version": "0.2.0"`) {
			t.Errorf("the installed release's manifest is not 0.2.0's")
		}
		// The same process (re-executed), reporting the new version.
		printed(t, `msg="Starting node agent" .*version=0\.2\.0`)
		if p.Pid() != pid {
			t.Errorf("pid %d, was %d", p.Pid(), pid)
		}
		select {
		case <-p.Done():
			t.Fatal("bcd exited")
		default:
		}
	})

	t.Run("a binary that fails to start is rolled back", func(t *testing.T) {
		code, stdout, stderr := upgrade("0.3.0")
		if code == 0 || !strings.Contains(stderr, "bcd 0.3.0 failed to start") || !strings.Contains(stderr, "rolled back to 0.2.0") {
			t.Fatalf("upgrade to 0.3.0: exit %d %q", code, stderr)
		}
		if n := getNode(); n.BcdVersion != "0.2.0" {
			t.Errorf("after the rollback: nodes get says bcd %s", n.BcdVersion)
		}
		if got := sha256File(t, bin); got != binB.SHA256 {
			t.Errorf("bcd on disk has sha256 %s, want 0.2.0's %s", got, binB.SHA256)
		}
		if c := command(stdout); c.State != "failed" || c.Result != nil && c.Result["rolled_back"] != true {
			t.Errorf("command: %+v", c)
		}
		printed(t, `msg="Running the previous bcd again after a failed upgrade"`)
	})

	t.Run("a manifest signed by an unpinned key changes nothing", func(t *testing.T) {
		before, prev := sha256File(t, bin), sha256File(t, bin+".prev")
		restarts := strings.Count(p.Output(), "Restarting into the installed bcd")
		code, _, stderr := upgrade("0.4.0")
		if code == 0 || !strings.Contains(stderr, "upgrade to 0.4.0 refused") || !strings.Contains(stderr, "not pinned") {
			t.Fatalf("upgrade to 0.4.0: exit %d %q", code, stderr)
		}
		if sha256File(t, bin) != before || sha256File(t, bin+".prev") != prev {
			t.Error("a refused upgrade changed the binaries")
		}
		if n := strings.Count(p.Output(), "Restarting into the installed bcd"); n != restarts {
			t.Error("a refused upgrade restarted bcd")
		}
		if n := getNode(); n.BcdVersion != "0.2.0" || n.State != "ready" {
			t.Errorf("after the refusal: %+v", n)
		}
	})
	p.Stop(syscallTERM, 10*time.Second)
}
