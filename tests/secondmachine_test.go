package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/tests/testenv"
)

// A real second machine joins a plain serve with the two commands README.md
// gives: `serve --public-url` on the control plane, `nodes add --pool` there
// printing a line, and that line pasted on the new machine. The control
// plane and the new machine each run in a network namespace the test makes,
// joined by a veth pair, so everything between them crosses that link: the
// script's download (HTTPS, the API's key pinned), bcd's download from the
// downloads route, the join and the session. The new machine has a hostname
// and machine id of its own. Two ways: the downloads route trusted through
// the pinned TLS key alone, and an air-gapped site whose downloads folder
// holds a signed release manifest that the control plane verifies against
// downloads.releasePins and the script then pins digest by digest.
func TestSecondMachineJoins(t *testing.T) {
	for _, signed := range []bool{false, true} {
		name := map[bool]string{false: "downloads route", true: "downloads route with a signed manifest"}[signed]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			secondMachine(t, signed)
		})
	}
}

func secondMachine(t *testing.T, signed bool) {
	link := testenv.NewLink(t)
	cp, m2 := link.A, link.B
	bc := testenv.Binary(t, "better-compute")
	dir := t.TempDir()
	dist := filepath.Join(dir, "dist")
	copyFile(t, bcdAt(t, "0.1.0"), filepath.Join(dist, "0.1.0", buildDir("bcd"), "bcd"), 0o755)

	// The control plane: the commands of README.md (plain) or of
	// docs/install.md's air-gapped site (signed) as written, in its
	// namespace (where port 3000 and 8443 are its own). The public URL's
	// host is not loopback, so the API serves HTTPS on its own.
	env := []string{"BETTER_COMPUTE_DATA_DIR=" + filepath.Join(dir, "data")}
	publicURL := fmt.Sprintf("https://%s:8443", cp.Addr)
	serveArgs := []string{"serve", "--public-url", publicURL}
	if signed {
		// docs/install.md: downloads.dir and downloads.releasePins in
		// better-compute.yaml, then serve --config better-compute.yaml
		// --public-url https://HOST:8443.
		pin := signRelease(t, filepath.Join(dist, "0.1.0"), "0.1.0")
		cfg := testenv.WriteFile(t, "better-compute.yaml", "downloads:\n  dir: "+dist+"\n  releasePins: ["+pin+"]\n")
		serveArgs = []string{"serve", "--config", cfg, "--public-url", publicURL}
	} else {
		// README.md: BETTER_COMPUTE_DOWNLOADS_DIR=$PWD/dist bin/better-compute
		// serve --public-url https://HOST:8443.
		env = append(env, "BETTER_COMPUTE_DOWNLOADS_DIR="+dist)
	}
	bin, args := cp.Wrap(bc, serveArgs...)
	serve := testenv.Start(t, env, bin, args...)
	serve.WaitLine(`msg="API listening" addr=\S+ .*scheme=https`, 90*time.Second)
	serve.WaitLine(`msg="Gateway listening"`, 30*time.Second)
	api := fmt.Sprintf("https://%s:3000", cp.Addr)
	onCP := func(args ...string) string {
		t.Helper()
		bin, a := cp.Wrap(bc, args...)
		code, out, stderr := testenv.Run(t, env, "", bin, a...)
		if code != 0 {
			t.Fatalf("better-compute %s: exit %d\n%s%s", strings.Join(args, " "), code, out, stderr)
		}
		return out
	}
	line := strings.TrimSpace(onCP("nodes", "add", "--pool", "default"))
	// The line README.md and docs/install.md show, word for word but for
	// the pin, the host and the token.
	lineRE := regexp.MustCompile(`^curl -fsS -k --pinnedpubkey 'sha256//[A-Za-z0-9+/]{43}=' -o install-bcd.sh '` +
		regexp.QuoteMeta(api+"/api/install.sh") + `' && BCD_JOIN_TOKEN='bct1[^']+' sh install-bcd.sh$`)
	if !lineRE.MatchString(line) {
		t.Fatalf("nodes add printed %q, want the line of README.md (%s)", line, lineRE)
	}

	// The new machine: the second command, pasted into a shell there, with
	// the install rooted in a folder and systemctl recording its calls.
	machine := testenv.NewMachine(t, "gpu-node-2")
	h := newHost(t)
	bin, args = machine.RunIn(m2, "sh", "-c", "cd "+t.TempDir()+" && "+line)
	code, stdout, stderr := testenv.Run(t, []string{"BCD_ROOT=" + h.root, "STUB_LOG=" + h.log, "PATH=" + h.stubs + ":" + os.Getenv("PATH")}, "", bin, args...)
	if code != 0 {
		t.Fatalf("the pasted line: exit %d\n%s%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "in pool default (pool_") {
		t.Errorf("the script does not say which pool it joined:\n%s", stdout)
	}
	if signed {
		if _, err := os.Stat(filepath.Join(h.root, "var/lib/bcd/release/manifest.json")); err != nil {
			t.Errorf("the signed manifest is not installed beside bcd: %v", err)
		}
	}
	var calls []string
	for _, c := range h.calls() {
		if strings.HasPrefix(c, "systemctl enable") {
			calls = append(calls, c)
		}
	}
	if len(calls) == 0 {
		t.Errorf("the script enabled no unit; calls: %v", h.calls())
	}

	// bcd as its unit would run it, on the new machine.
	bin, args = machine.RunIn(m2, filepath.Join(h.root, "usr/local/bin/bcd"), "node", "--data-dir", filepath.Join(h.root, "var/lib/bcd"))
	node := testenv.Start(t, nil, bin, args...)
	node.WaitLine(`msg="Session established"`, 90*time.Second)
	var ident struct {
		NodeID string `json:"node_id"`
	}
	b, err := os.ReadFile(filepath.Join(h.root, "var/lib/bcd/identity.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &ident); err != nil || ident.NodeID == "" {
		t.Fatalf("identity.json: %s %v", b, err)
	}

	// A command from the control plane runs on the second machine: it
	// answers with its own hostname and machine id.
	out := onCP("commands", "run", "--node", ident.NodeID, "--", "sh", "-c", "hostname; cat /etc/machine-id")
	id, err := os.ReadFile(machine.IDFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "gpu-node-2") || !strings.Contains(out, strings.TrimSpace(string(id))) {
		t.Fatalf("commands run on the second machine printed:\n%s", out)
	}
	if got := onCP("nodes", "get", ident.NodeID); !strings.Contains(got, "gpu-node-2") {
		t.Fatalf("nodes get does not show the second machine's hostname:\n%s", got)
	}
}
