package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/tests/testenv"
)

// readmeBlock returns the command lines of the first ```sh block after the
// heading "## "+heading in README.md, each split into the command and its
// comment (after two or more blanks and "#").
func readmeBlock(t *testing.T, heading string) [][2]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", heading)
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatalf("README.md section %q has no sh block", heading)
	}
	comment := regexp.MustCompile(`\s{2,}#\s?`)
	var lines [][2]string
	for _, l := range strings.Split(block, "\n") {
		if l = strings.TrimSpace(l); l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		cmd, note := l, ""
		if loc := comment.FindStringIndex(l); loc != nil {
			cmd, note = l[:loc[0]], l[loc[1]:]
		}
		lines = append(lines, [2]string{cmd, note})
	}
	return lines
}

// TestReadmeCommands runs the commands of README.md's "Two commands" (the
// first, with the built binary in place of the cold `go run`; not the
// test command itself) and "Look at the fleet" as written, in bash, in the
// folder where bin/better-compute is, and checks that each prints what the
// README says it prints. dev runs in a network namespace of its own, so
// that ports 3000 and 8443 and `curl localhost:3000` are the README's;
// BETTER_COMPUTE_DATA_DIR points the data directory (README: the default
// one) at the test's. A command added to the README without a check here
// fails the test. "Join a second machine" is TestSecondMachineJoins and
// TestInstallWithoutSystemd.
func TestReadmeCommands(t *testing.T) {
	t.Parallel()
	ns := testenv.NewLink(t).A
	dir := t.TempDir()
	copyFile(t, testenv.Binary(t, "better-compute"), filepath.Join(dir, "bin", "better-compute"), 0o755)
	env := []string{"BETTER_COMPUTE_DATA_DIR=" + filepath.Join(dir, "data"), "HOME=" + dir}
	bash := func(line string) (string, []string) { return ns.Wrap("bash", "-c", "cd "+dir+" && "+line) }
	run := func(line string) (int, string, string) {
		t.Helper()
		bin, args := bash(line)
		code, out, errOut := testenv.Run(t, env, "", bin, args...)
		t.Logf("$ %s\nexit %d\n%s%s", line, code, out, errOut)
		return code, out, errOut
	}

	// "Two commands": the first, with the built binary.
	var devLine string
	for _, l := range readmeBlock(t, "Two commands") {
		if rest, ok := strings.CutPrefix(l[0], "go run ./controlplane/cmd/better-compute "); ok {
			devLine = "exec bin/better-compute " + rest
		} else if l[0] != "./tests/run" {
			t.Errorf("README.md's first block runs %q, which this test does not know", l[0])
		}
	}
	if devLine != "exec bin/better-compute dev --sim 3" {
		t.Fatalf("README.md's first command is %q, want dev --sim 3", devLine)
	}
	bin, args := bash(devLine)
	dev := testenv.Start(t, env, bin, args...)
	// A line per step: the data directory, the database, then the API,
	// the gateway and the simulated daemons.
	dev.WaitLine(`^Starting Better Compute dev in \S+/data$`, 90*time.Second)
	dev.WaitLine(`^\s+database\s+SQLite opened; applying migrations`, 90*time.Second)
	dev.WaitLine(`^\s+API\s+http://127\.0\.0\.1:3000/api\s`, 90*time.Second)
	dev.WaitLine(`^\s+gateway\s+https://localhost:8443$`, 10*time.Second)
	dev.WaitLine(`^\s+joining 3 simulated daemon\(s\) through the gateway \(0 kept from an earlier run\)$`, 30*time.Second)
	dev.WaitLine(`^3 simulated daemons connected \(8 GPUs each\)`, 90*time.Second)

	// The viewer token of the paragraph after it.
	if code, out, _ := run("bin/better-compute tokens create --role viewer --server http://127.0.0.1:3000"); code != 0 || !strings.Contains(out, "bcat_") {
		t.Errorf("tokens create --role viewer: exit %d, want a bcat_ token:\n%s", code, out)
	}

	type node struct {
		ID    string `json:"id"`
		State string `json:"state"`
		GPUs  []struct {
			Name string `json:"name"`
		} `json:"gpus"`
	}
	nodesJSON := func(out string) []node {
		t.Helper()
		var list struct {
			Nodes []node `json:"nodes"`
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("nodes list -o json: %v\n%s", err, out)
		}
		return list.Nodes
	}
	_, out, _ := run("bin/better-compute nodes list -o json")
	nodes := nodesJSON(out)
	if len(nodes) != 3 {
		t.Fatalf("dev --sim 3 shows %d nodes: %s", len(nodes), out)
	}
	nodeID := nodes[0].ID

	// ok: exit 0 and each pattern in what the command printed.
	ok := func(want ...string) func(int, string, string) string {
		return func(code int, out, errOut string) string {
			if code != 0 {
				return fmt.Sprintf("exit %d", code)
			}
			for _, w := range want {
				// "no rollouts" and the like go to standard error.
				if !regexp.MustCompile(w).MatchString(out + errOut) {
					return fmt.Sprintf("no %q in its output", w)
				}
			}
			return ""
		}
	}
	refusedSimulated := func(code int, out, errOut string) string {
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		if code != 1 || out != "" || len(lines) != 1 || !strings.Contains(lines[0], "node "+nodeID+" is simulated") {
			return fmt.Sprintf("exit %d, want 1, nothing on stdout and one line saying the node is simulated", code)
		}
		return ""
	}
	checks := map[string]func(code int, out, errOut string) string{
		"bin/better-compute nodes list": ok(`(?m)^ID\s+HOSTNAME\s+STATE`,
			`(?m)^node_\S+\s+sim-0000\d\s+ready\s.*8x NVIDIA A100`),
		"bin/better-compute nodes list --gpu-model A100 --min-gpus 8 -o json": func(code int, out, errOut string) string {
			if code != 0 {
				return fmt.Sprintf("exit %d", code)
			}
			n := nodesJSON(out)
			if len(n) != 3 || len(n[0].GPUs) != 8 || !strings.Contains(n[0].GPUs[0].Name, "A100") {
				return "want three nodes of 8 A100s"
			}
			return ""
		},
		"bin/better-compute commands run --pool default -- uname -a": func(code int, out, errOut string) string {
			if n := len(regexp.MustCompile(`(?m)^node_\S+: simulated sim-0000\d: uname -a$`).FindAllString(out, -1)); code != 0 || n != 3 {
				return fmt.Sprintf("exit %d and %d simulated answers, want 0 and 3", code, n)
			}
			return ""
		},
		"bin/better-compute doctor":            ok(`(?m)^schema\s+ok`, `\d+ ok, \d+ warn, 0 fail`),
		"curl localhost:3000/healthz":          ok(`\Aok\n`),
		"curl localhost:3000/readyz":           ok(`^ready`),
		"curl localhost:3000/api/health":       ok(`^\{"status":"ok","database":"ok","latencyMs":[0-9.]+,"time":"[^"]+"\}`),
		"curl localhost:3000/api/openapi.json": ok(`"openapi":\s*"3\.`),
		"source <(bin/better-compute completion bash)": func(code int, out, errOut string) string {
			// The line registers the completion; TAB is the completion
			// function on "bin/better-compute nodes get ", which needs
			// bash-completion's _get_comp_words_by_ref.
			const bc = "/usr/share/bash-completion/bash_completion"
			if _, err := os.Stat(bc); err != nil {
				if os.Getenv("CI") == "true" {
					return "Debian's bash-completion is not installed (tests/run installs it)"
				}
				t.Logf("bash-completion is not installed: TAB not checked")
				return ok(`complete .*better-compute`)(run("source <(bin/better-compute completion bash) && complete -p better-compute"))
			}
			code, out, errOut = run(". " + bc + " && source <(bin/better-compute completion bash) && " +
				`COMP_WORDS=(bin/better-compute nodes get ""); COMP_CWORD=3; COMP_LINE="bin/better-compute nodes get "; COMP_POINT=${#COMP_LINE}; ` +
				`__start_better-compute && printf '%s\n' "${COMPREPLY[@]}"`)
			if code != 0 || !strings.Contains(out, nodeID) {
				return fmt.Sprintf("TAB after nodes get: exit %d, offers %q, not node %s", code, out, nodeID)
			}
			return ""
		},
		"bin/better-compute audit list --since 1h":                 ok(`tokens\.create`, `node\.join`),
		"bin/better-compute events list --since 1h":                ok(`command\.succeeded`, `node\.`),
		"bin/better-compute sinks dead-letters":                    ok(`^no dead letters`),
		"bin/better-compute pools get default":                     ok(`(?m)^ID\s+NAME\s+SITE\s+NODES\s+BUDGET`, `(?m)^pool_\S+\s+default\s+default\s+3\s`),
		"bin/better-compute pools set-budget default --budget 20%": ok(`\(20%\)`),
		"bin/better-compute rollouts list":                         ok(`^no rollouts`),
		"bin/better-compute recordings list":                       ok(`^no recordings`),
		"bin/better-compute access list --state pending":           ok(`(?m)^ID +STATE +POLICY +RESOURCE +REQUESTER +FOR`),
		"bin/better-compute remediation list":                      ok(`(?m)^no remediation cases`, `(?m)^POOL +BREAKER`),
		"bin/better-compute gpus list":                             ok(`(?m)^UUID +NODE +POOL +MODEL +SERIAL +HEALTH`, `(?m)^GPU-\S+ +node_\S+ +pool_\S+ +NVIDIA A100-SXM4-40GB `),
		"bin/better-compute nodes shell NODE":                      refusedSimulated,
		"bin/better-compute nodes port-forward NODE 8080":          refusedSimulated,
	}
	var watch *testenv.Proc
	for _, l := range readmeBlock(t, "Look at the fleet") {
		line := l[0]
		if line == "go build -o bin/better-compute ./controlplane/cmd/better-compute" {
			continue // built by the test: tests/testenv
		}
		if line == "bin/better-compute events watch --type node." {
			// Ctrl-C stops it: it runs until the node event below.
			bin, args := bash("exec " + line)
			watch = testenv.Start(t, env, bin, args...)
			watch.WaitLine(`watching events`, 30*time.Second)
			continue
		}
		check, known := checks[line]
		if !known {
			t.Errorf("README.md runs %q (%s), which this test does not check: add its check", line, l[1])
			continue
		}
		delete(checks, line)
		code, out, errOut := run(strings.ReplaceAll(line, "NODE", nodeID))
		if why := check(code, out, errOut); why != "" {
			t.Errorf("README.md's %q (%s): %s\n%s%s", line, l[1], why, out, errOut)
		}
	}
	for line := range checks {
		t.Errorf("README.md no longer runs %q: drop its check", line)
	}
	if watch == nil {
		t.Fatal("README.md no longer runs events watch")
	}

	// kill -USR1 of the dev process stops one simulated daemon: commands
	// run to the pool says it waits for that node (every 10 s with
	// --progress) and names it at the deadline; its node turns
	// unreachable, which events watch shows; Ctrl-C stops the watch.
	dev.Signal(syscall.SIGUSR1)
	stopped := dev.WaitLine(`^Stopped simulated daemon sim-\d+ \(node (node_\S+)\)$`, 30*time.Second)[1]
	code, out, errOut := run("bin/better-compute commands run --pool default --progress --timeout 12s -- uname -a")
	if code != 1 || !regexp.MustCompile(`(?m)^waited 1\ds for 1 of 3 node\(s\): `+stopped+` \(\w+\)$`).MatchString(errOut) ||
		!strings.Contains(errOut, "no result before the deadline (--timeout) from 1 node(s): "+stopped) {
		t.Errorf("commands run with node %s stopped: exit %d, want 1, a line naming it while waiting and one at the deadline:\n%s%s", stopped, code, out, errOut)
	}
	watch.WaitLine(`node\.unreachable\s+`+stopped, 90*time.Second)
	watch.Signal(syscall.SIGINT)
	if code := watch.Wait(30 * time.Second); code != 130 {
		t.Errorf("events watch after Ctrl-C: exit %d, want 130", code)
	}
}
