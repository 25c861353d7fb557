package tests

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/tests/testenv"
)

// The install script piped to sh and cut short: a download that breaks off
// gives sh a prefix of the script. Every prefix cut at a line boundary (just
// after a newline and just before it), cuts inside lines, and every cut
// inside the last line (the call of main) must change nothing under
// BCD_ROOT, call nothing but systemctl's read-only checks, print nothing on
// standard output and spend no use of the join token; the whole script
// then installs and joins with that same one-use token.

// treeState describes every entry under root: type, mode, size and a hash
// of a file's content.
func treeState(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		desc := fmt.Sprintf("%v %d", fi.Mode(), fi.Size())
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" %x", sha256.Sum256(b))
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// tokenUses lists the environment's join tokens' uses by id.
func (e *installEnv) tokenUses() map[string]int {
	e.t.Helper()
	var list struct {
		JoinTokens []struct {
			ID   string `json:"id"`
			Uses int    `json:"uses"`
		} `json:"joinTokens"`
	}
	out := e.cli("join-tokens", "list", "-o", "json")
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		e.t.Fatalf("join-tokens list: %v\n%s", err, out)
	}
	uses := map[string]int{}
	for _, tok := range list.JoinTokens {
		uses[tok.ID] = tok.Uses
	}
	return uses
}

// cut is a prefix of the script: its first n bytes.
type cut struct {
	n    int
	what string
}

// cuts returns the prefixes to try: after each newline and just before it
// (line boundaries), the middle of every fifth line, and every cut inside
// the last line. The whole script and the script without only its final
// newline are not cuts.
func cuts(script []byte) []cut {
	var out []cut
	line, start := 1, 0
	lastStart := bytes.LastIndexByte(script[:len(script)-1], '\n') + 1
	for i, b := range script {
		if b != '\n' {
			continue
		}
		if i+1 < len(script) {
			out = append(out, cut{i + 1, fmt.Sprintf("after line %d", line)})
		}
		if i > start && i < len(script)-1 {
			out = append(out, cut{i, fmt.Sprintf("before the newline of line %d", line)})
		}
		if line%5 == 0 && i-start > 2 {
			out = append(out, cut{start + (i-start)/2, fmt.Sprintf("in the middle of line %d", line)})
		}
		line, start = line+1, i+1
	}
	for n := lastStart + 1; n < len(script)-1; n++ {
		out = append(out, cut{n, fmt.Sprintf("last line cut to %q", script[lastStart:n])})
	}
	return out
}

func TestInstallScriptCut(t *testing.T) {
	t.Parallel()
	e := newInstallEnv(t)
	e.release("0.1.0", bcdAt(t, "0.1.0"))
	scriptPath := e.script("0.1.0")
	script, err := os.ReadFile(scriptPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(script, []byte("\nmain \"$@\" --end-of-install-script\n")) {
		t.Fatalf("the script does not end with the call of main:\n%s", script[len(script)-200:])
	}
	tokenBytes, err := os.ReadFile(e.token(1))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tokenBytes))
	before := e.tokenUses()
	if len(before) != 1 {
		t.Fatalf("want one join token, have %v", before)
	}

	shells := []string{"dash", "bash"}
	all := cuts(script)
	type job struct {
		c     cut
		shell string
	}
	jobs := make(chan job)
	// Failures by kind: how many, and the first few.
	var mu sync.Mutex
	counts, examples := map[string]int{}, map[string][]string{}
	var kinds []string
	fail := func(kind, format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if counts[kind] == 0 {
			kinds = append(kinds, kind)
		}
		counts[kind]++
		if len(examples[kind]) < 3 {
			examples[kind] = append(examples[kind], fmt.Sprintf(format, args...))
		}
	}
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for range 4 {
		// Each worker has its own host; a prefix that changed it would
		// show in the next comparison too, so only the first is blamed.
		h := newHost(t)
		tmp := t.TempDir()
		env := append(testenv.BaseEnv(), "BCD_ROOT="+h.root, "STUB_LOG="+h.log, "PATH="+h.stubs+":"+os.Getenv("PATH"),
			"BCD_JOIN_TOKEN="+token, "TMPDIR="+tmp)
		empty := treeState(t, h.root)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				cmd := exec.CommandContext(ctx, j.shell)
				cmd.Env = env
				cmd.Stdin = bytes.NewReader(script[:j.c.n])
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				err := cmd.Run()
				code := cmd.ProcessState.ExitCode()
				if err != nil && code <= 0 {
					fail("did not run", "%s, %s: %v", j.c.what, j.shell, err)
					continue
				}
				if got := treeState(t, h.root); !sameTree(got, empty) {
					fail("changed BCD_ROOT", "%s, %s: exit %d and BCD_ROOT changed: %v\n%s", j.c.what, j.shell, code, got, stderr.String())
					os.RemoveAll(h.root)
					os.MkdirAll(filepath.Join(h.root, "run/systemd/system"), 0o755)
				}
				if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
					fail("left files in TMPDIR", "%s, %s: exit %d and left %d entries in TMPDIR", j.c.what, j.shell, code, len(entries))
				}
				if stdout.Len() != 0 {
					fail("printed on standard output", "%s, %s: exit %d and printed:\n%s", j.c.what, j.shell, code, stdout.String())
				}
				for _, c := range h.calls() {
					if c != "" && !strings.HasPrefix(c, "systemctl is-") {
						fail("called a command that changes the machine", "%s, %s: exit %d and called %q", j.c.what, j.shell, code, c)
					}
				}
				if strings.Contains(stderr.String(), token) {
					fail("printed the token", "%s, %s: the token was printed", j.c.what, j.shell)
				}
			}
		}()
	}
	start := time.Now()
	for _, c := range all {
		for _, sh := range shells {
			jobs <- job{c, sh}
		}
	}
	close(jobs)
	wg.Wait()
	t.Logf("%d prefixes under %s in %v", len(all), strings.Join(shells, " and "), time.Since(start).Round(time.Millisecond))
	for _, k := range kinds {
		t.Errorf("%d of %d runs %s, for example:\n%s", counts[k], len(all)*len(shells), k, strings.Join(examples[k], "\n"))
	}
	if after := e.tokenUses(); !sameUses(after, before) {
		t.Fatalf("the prefixes spent token uses: before %v, after %v", before, after)
	}

	// The whole script, piped to sh the same way, installs and joins with
	// the one use the token still has.
	h := newHost(t)
	code, stdout, stderr := testenv.Run(t, []string{"BCD_ROOT=" + h.root, "STUB_LOG=" + h.log,
		"PATH=" + h.stubs + ":" + os.Getenv("PATH"), "BCD_JOIN_TOKEN=" + token}, string(script), "sh")
	if code != 0 {
		t.Fatalf("whole script: exit %d\n%s%s", code, stdout, stderr)
	}
	for _, f := range []string{"usr/local/bin/bcd", "etc/systemd/system/bcd.service", "var/lib/bcd/identity.json"} {
		if _, err := os.Stat(filepath.Join(h.root, f)); err != nil {
			t.Errorf("whole script: %v", err)
		}
	}
	if !strings.Contains(stdout, "install-bcd: Placed in pool pool-e2e (pool_") || !strings.Contains(stdout, ", joined as node ") {
		t.Errorf("the script does not say where the token placed the node:\n%s", stdout)
	}
	for id, n := range e.tokenUses() {
		if n != 1 {
			t.Errorf("token %s: %d uses after the whole script, want 1", id, n)
		}
	}
}

func sameUses(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
