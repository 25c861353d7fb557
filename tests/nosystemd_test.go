package tests

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/tests/testenv"
)

// noSystemdShell is a machine that systemd does not run, as a container or
// a VM with another init is: it runs in new PID, mount and UTS namespaces
// (unshare --pid --fork --mount-proc) inside the machine's network
// namespace, with a private, empty /run (no /run/systemd/system, no bus),
// though the systemctl binary is there. The folders the install script
// writes to, /usr/local, /var/lib and /etc/systemd, are the test's own
// folders under $1, bound over them in that mount namespace only, so the
// script runs as on a real machine (no BCD_ROOT, no stubs) and the test
// sees what it wrote.
const noSystemdShell = `r=$1; shift
mount -t tmpfs tmpfs /run &&
mount --bind "$r/usr/local" /usr/local &&
mount --bind "$r/var/lib" /var/lib &&
{ [ ! -d /etc/systemd ] || mount --bind "$r/etc/systemd" /etc/systemd; } &&
hostname gpu-no-systemd && exec "$@"`

// TestInstallWithoutSystemd: README.md's pasted install line on a machine
// that systemd does not run stops before it changes anything (no file
// written, no node joined, the token unused), naming the run to make
// instead; that run (the same line with --no-service) installs bcd and
// joins, and prints the bcd node line, which, run in the foreground as
// another supervisor would, brings the node to ready.
func TestInstallWithoutSystemd(t *testing.T) {
	t.Parallel()
	link := testenv.NewLink(t)
	cp, m2 := link.A, link.B
	bc := testenv.Binary(t, "better-compute")
	dir := t.TempDir()
	dist := filepath.Join(dir, "dist")
	copyFile(t, bcdAt(t, "0.1.0"), filepath.Join(dist, "0.1.0", buildDir("bcd"), "bcd"), 0o755)

	// The control plane, as README.md runs it.
	env := []string{"BETTER_COMPUTE_DATA_DIR=" + filepath.Join(dir, "data"), "BETTER_COMPUTE_DOWNLOADS_DIR=" + dist}
	bin, args := cp.Wrap(bc, "serve", "--public-url", fmt.Sprintf("https://%s:8443", cp.Addr))
	serve := testenv.Start(t, env, bin, args...)
	serve.WaitLine(`msg="API listening" addr=\S+ .*scheme=https`, 90*time.Second)
	serve.WaitLine(`msg="Gateway listening"`, 30*time.Second)
	// Its banner: what runs, the API with the admin token's file, the gateway.
	serve.WaitLine(`^Better Compute serve: all roles \(data directory `, 10*time.Second)
	serve.WaitLine(`^\s+API\s+https://`+regexp.QuoteMeta(cp.Addr.String())+`:3000/api\s+\(admin token in \S+/admin-token\)$`, 10*time.Second)
	serve.WaitLine(`^\s+gateway\s+https://`+regexp.QuoteMeta(cp.Addr.String())+`:8443$`, 10*time.Second)
	onCP := func(args ...string) string {
		t.Helper()
		bin, a := cp.Wrap(bc, args...)
		code, out, stderr := testenv.Run(t, env, "", bin, a...)
		if code != 0 {
			t.Fatalf("better-compute %s: exit %d\n%s%s", strings.Join(args, " "), code, out, stderr)
		}
		return out
	}
	type node struct {
		ID       string `json:"id"`
		Hostname string `json:"hostname"`
		State    string `json:"state"`
	}
	nodes := func() []node {
		t.Helper()
		var list struct {
			Nodes []node `json:"nodes"`
		}
		out := onCP("nodes", "list", "-o", "json")
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("nodes list -o json: %v\n%s", err, out)
		}
		return list.Nodes
	}
	line := strings.TrimSpace(onCP("nodes", "add", "--pool", "default"))

	// The machine's folders, empty.
	root := filepath.Join(dir, "machine")
	for _, d := range []string{"usr/local", "var/lib", "etc/systemd", "home"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	onMachine := func(bin string, args ...string) (string, []string) {
		a := []string{"netns", "exec", m2.Name, "unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts",
			"--propagation", "private", "--", "sh", "-c", noSystemdShell, "machine", root, bin}
		return "ip", append(a, args...)
	}
	written := func() []string {
		var files []string
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				rel, _ := filepath.Rel(root, p)
				if !strings.HasPrefix(rel, "home/") {
					files = append(files, rel)
				}
			}
			return nil
		})
		return files
	}
	home := filepath.Join(root, "home")

	// The line as pasted: it stops before any change, in one line that
	// names the run to make instead.
	bin, args = onMachine("sh", "-c", "cd "+home+" && "+line)
	code, stdout, stderr := testenv.Run(t, nil, "", bin, args...)
	t.Logf("the pasted line: exit %d\n%s%s", code, stdout, stderr)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if code == 0 || len(lines) != 1 || !strings.Contains(lines[0], "install-bcd: error: systemd does not run this machine") ||
		!strings.Contains(lines[0], "sh install-bcd.sh --no-service") || !strings.Contains(lines[0], "nothing was changed") {
		t.Fatalf("the pasted line without systemd: exit %d, want a failure and one line naming --no-service:\n%s", code, stderr)
	}
	if files := written(); len(files) != 0 {
		t.Fatalf("the refused install wrote %v", files)
	}
	if n := nodes(); len(n) != 0 {
		t.Fatalf("the refused install joined: %+v", n)
	}

	// The run it names: the same line with --no-service at its end.
	bin, args = onMachine("sh", "-c", "cd "+home+" && "+line+" --no-service")
	code, stdout, stderr = testenv.Run(t, nil, "", bin, args...)
	t.Logf("the line with --no-service: exit %d\n%s%s", code, stdout, stderr)
	if code != 0 {
		t.Fatalf("the line with --no-service: exit %d\n%s%s", code, stdout, stderr)
	}
	out := strings.Split(strings.TrimSpace(stdout), "\n")
	bcdLine := out[len(out)-1]
	if bcdLine != "/usr/local/bin/bcd node --data-dir /var/lib/bcd" {
		t.Fatalf("the line with --no-service ends with %q, want the bcd node line to run", bcdLine)
	}
	files := strings.Join(written(), " ")
	if !strings.Contains(files, "usr/local/bin/bcd") || !strings.Contains(files, "var/lib/bcd/identity.json") || strings.Contains(files, "etc/") {
		t.Fatalf("--no-service wrote %s; want bcd and its identity, and no unit", files)
	}

	// The printed line, run in the foreground, as another supervisor would.
	f := strings.Fields(bcdLine)
	bin, args = onMachine(f[0], f[1:]...)
	testenv.Start(t, nil, bin, args...).WaitLine(`msg="Session established"`, 90*time.Second)
	testenv.Eventually(t, 60*time.Second, func() bool {
		n := nodes()
		return len(n) == 1 && n[0].Hostname == "gpu-no-systemd" && n[0].State == "ready"
	}, func() string { return fmt.Sprintf("nodes: %+v", nodes()) })
}
