package tests

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/tests/testenv"
)

// TestCompletion: better-compute's shell completion offers the node ids
// and pool names of a running control plane, read through its API with the
// server and data directory the command line names; both binaries print
// completion scripts bash accepts.
func TestCompletion(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, "better-compute")
	bcd := testenv.Binary(t, "bcd")
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("bash is needed to check the completion scripts: %v", err)
	}
	for _, b := range []string{bin, bcd} {
		for _, shell := range []string{"bash", "zsh", "fish"} {
			code, script, errOut := testenv.Run(t, nil, "", b, "completion", shell)
			if code != 0 || !strings.Contains(script, "__complete") {
				t.Fatalf("%s completion %s: exit %d, %d bytes\n%s", b, shell, code, len(script), errOut)
			}
			if shell != "bash" {
				continue
			}
			check := exec.Command("bash", "-n")
			check.Stdin = strings.NewReader(script)
			if out, err := check.CombinedOutput(); err != nil {
				t.Fatalf("bash -n on %s completion bash: %v\n%s", b, err, out)
			}
		}
	}

	dataDir := t.TempDir()
	p := testenv.Start(t, testenv.BaseEnv(), bin, "dev", "--sim", "2", "--port", "0", "--gateway-port", "0", "--data-dir", dataDir)
	api := p.WaitLine(`API\s+(http://\S+?)/api\s`, 60*time.Second)[1]
	p.WaitLine(`2 simulated daemons connected`, 90*time.Second)
	defer p.Stop(syscall.SIGTERM, 20*time.Second)
	flags := []string{"--server", api, "--data-dir", dataDir}

	code, out, errOut := testenv.Run(t, nil, "", bin, append([]string{"nodes", "list", "-o", "json"}, flags...)...)
	if code != 0 {
		t.Fatalf("nodes list: exit %d\n%s%s", code, out, errOut)
	}
	var list struct {
		Nodes []struct {
			ID string `json:"id"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Nodes) != 2 {
		t.Fatalf("nodes list -o json: %v, want 2 nodes: %s", err, out)
	}

	// complete runs cobra's hidden completion command on the command
	// path words (the API flags after them, where they are defined) and
	// the words being completed, and returns the values it offers (without
	// descriptions) and its directive line.
	complete := func(args ...string) ([]string, string) {
		t.Helper()
		argv := []string{"__complete", args[0], args[1]}
		argv = append(append(argv, flags...), args[2:]...)
		code, out, errOut := testenv.Run(t, nil, "", bin, argv...)
		if code != 0 {
			t.Fatalf("__complete %v: exit %d\n%s%s", args, code, out, errOut)
		}
		var values []string
		directive := ""
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if strings.HasPrefix(line, ":") {
				directive = line
				continue
			}
			v, _, _ := strings.Cut(line, "\t")
			values = append(values, v)
		}
		return values, directive
	}
	wantNodes := func(args ...string) {
		t.Helper()
		got, directive := complete(args...)
		if directive != ":4" { // ShellCompDirectiveNoFileComp
			t.Errorf("__complete %v: directive %q, want :4 (no file names)", args, directive)
		}
		for _, n := range list.Nodes {
			if !slices.Contains(got, n.ID) {
				t.Errorf("__complete %v: offers %v, not node %s", args, got, n.ID)
			}
		}
	}
	wantNodes("nodes", "get", "")
	wantNodes("nodes", "cordon", "")
	wantNodes("commands", "run", "--node", "")
	if got, _ := complete("nodes", "get", list.Nodes[0].ID); len(got) != 1 || got[0] != list.Nodes[0].ID {
		t.Errorf("__complete nodes get %s (a whole id): offers %v, want that one id", list.Nodes[0].ID, got)
	}
	if got, _ := complete("nodes", "get", list.Nodes[0].ID, ""); len(got) != 0 {
		t.Errorf("__complete for a second NODE_ID offers %v, want nothing", got)
	}
	for _, args := range [][]string{{"nodes", "list", "--pool", ""}, {"commands", "run", "--pool", ""}, {"nodes", "add", "--pool", ""}} {
		if got, _ := complete(args...); !slices.Contains(got, "default") {
			t.Errorf("__complete %v: offers %v, not the pool default", args, got)
		}
	}
	// A server that does not answer: nothing offered, no error.
	if code, out, errOut := testenv.Run(t, nil, "", bin, "__complete", "nodes", "get", "--server", "http://127.0.0.1:1", "--token", "x", ""); code != 0 || strings.TrimSpace(out) != ":4" {
		t.Errorf("__complete against no server: exit %d, %q %s", code, out, errOut)
	}
}
