// Package testenv starts the real binaries for end-to-end tests: it builds
// better-compute and bcd once per test binary and runs them as processes,
// with their output routed through the test log.
package testenv

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// packages maps binary names to their main packages.
var packages = map[string]string{
	"better-compute": "./controlplane/cmd/better-compute",
	"bcd":            "./bcd/cmd/bcd",
	"bcx-ipmi":       "./plugins/ipmi/cmd/bcx-ipmi",
}

// builds caches the binaries of one test process, each built once.
var builds = struct {
	mu   sync.Mutex
	dir  string
	done map[string]func() (string, error)
}{done: map[string]func() (string, error){}}

// moduleRoot is the repository root (this file is tests/testenv/testenv.go).
func moduleRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// Binary returns the path of a binary built from this tree, once per test
// process: "better-compute", "bcd" or "bcx-ipmi".
func Binary(t testing.TB, name string) string {
	t.Helper()
	return BinaryTags(t, name)
}

// BinaryTags is Binary built with the given build tags, once per test
// process and set of tags, beside the plain build: for example
// BinaryTags(t, "bcd", "nvmlmock"), the bcd whose NVML is go-nvml's mock
// DGX A100 (docs/gpu-health.md, "Test hook"). No tags: Binary.
func BinaryTags(t testing.TB, name string, tags ...string) string {
	t.Helper()
	key := strings.Join(append([]string{name}, tags...), "-")
	builds.mu.Lock()
	build, ok := builds.done[key]
	if !ok {
		build = sync.OnceValues(func() (string, error) { return buildBinary(name, key, tags) })
		builds.done[key] = build
	}
	builds.mu.Unlock()
	p, err := build()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// BinaryOverlay is Binary built with files laid over the tree (go build
// -overlay; go:embed sees them too): files maps a path relative to the
// repository root to its content, and key names this build among the
// others of the test process, which builds it once. For example a
// migration that stands for a release's own contract migration
// (tests/rolling_upgrade_test.go).
func BinaryOverlay(t testing.TB, name, key string, files map[string]string) string {
	t.Helper()
	key = name + "-overlay-" + key
	builds.mu.Lock()
	build, ok := builds.done[key]
	if !ok {
		build = sync.OnceValues(func() (string, error) {
			dir, err := os.MkdirTemp("", "bc-e2e-overlay-")
			if err != nil {
				return "", err
			}
			replace := map[string]string{}
			i := 0
			for rel, body := range files {
				i++
				f := filepath.Join(dir, fmt.Sprintf("%d-%s", i, filepath.Base(rel)))
				if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
					return "", err
				}
				replace[filepath.Join(moduleRoot(), rel)] = f
			}
			b, err := json.Marshal(map[string]any{"Replace": replace})
			if err != nil {
				return "", err
			}
			overlay := filepath.Join(dir, "overlay.json")
			if err := os.WriteFile(overlay, b, 0o644); err != nil {
				return "", err
			}
			return buildBinary(name, key, nil, "-overlay", overlay)
		})
		builds.done[key] = build
	}
	builds.mu.Unlock()
	p, err := build()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// buildBinary builds binary name with tags (and more go build flags) into
// the build directory as file.
func buildBinary(name, file string, tags []string, flags ...string) (string, error) {
	pkg, ok := packages[name]
	if !ok {
		return "", fmt.Errorf("no package for binary %q", name)
	}
	builds.mu.Lock()
	if builds.dir == "" {
		dir, err := os.MkdirTemp("", "bc-e2e-bin-")
		if err == nil {
			// Readable by all, so that tests can run the binaries as
			// other users (StartAs, RunAs).
			err = os.Chmod(dir, 0o755)
		}
		if err != nil {
			builds.mu.Unlock()
			return "", err
		}
		builds.dir = dir
	}
	dir := builds.dir
	builds.mu.Unlock()
	out := filepath.Join(dir, file)
	args := []string{"build", "-ldflags", "-X main.version=0.0.0-e2e", "-o", out}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	args = append(args, flags...)
	cmd := exec.Command("go", append(args, pkg)...)
	cmd.Dir = moduleRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", name, err, b)
	}
	return out, nil
}

// Proc is a running process of a test.
type Proc struct {
	t    testing.TB
	cmd  *exec.Cmd
	done chan struct{}
	err  error

	mu    sync.Mutex
	lines []string
	wait  []lineWaiter
	log   io.Writer // StartLogged: output goes here, not to the test log
	keep  int       // StartLogged: lines kept for WaitLine and Output
}

type lineWaiter struct {
	re *regexp.Regexp
	ch chan []string
}

// Start runs bin with args and env (added to a minimal environment) and
// stops it (SIGTERM, then SIGKILL after 10 s) when the test ends.
func Start(t testing.TB, env []string, bin string, args ...string) *Proc {
	t.Helper()
	return StartAs(t, nil, env, bin, args...)
}

// StartAs is Start with the process running as cred's user and groups
// (the test must run as root); a nil cred keeps the test's own.
func StartAs(t testing.TB, cred *syscall.Credential, env []string, bin string, args ...string) *Proc {
	t.Helper()
	return start(t, &Proc{t: t}, cred, env, bin, args...)
}

// StartLogged is Start with the process's output written to log, each line
// prefixed as in the test log, instead of to the test log, and only the
// last keep lines of it kept for WaitLine and Output: for processes that
// run long enough to fill the test log (tests/soak).
func StartLogged(t testing.TB, log io.Writer, keep int, env []string, bin string, args ...string) *Proc {
	t.Helper()
	return start(t, &Proc{t: t, log: log, keep: keep}, nil, env, bin, args...)
}

func start(t testing.TB, p *Proc, cred *syscall.Credential, env []string, bin string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(BaseEnv(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	p.cmd, p.done = cmd, make(chan struct{})
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	var wg sync.WaitGroup
	name := filepath.Base(bin)
	for _, r := range []io.Reader{stdout, stderr} {
		wg.Go(func() { p.read(name, r) })
	}
	go func() {
		wg.Wait()
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.Stop(syscall.SIGTERM, 10*time.Second) })
	return p
}

// BaseEnv is the environment every process gets: PATH and a HOME of its own
// are enough; nothing of the developer's environment leaks in.
func BaseEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir(), "TZ=UTC"}
}

func (p *Proc) read(name string, r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		p.mu.Lock()
		if p.log != nil {
			fmt.Fprintf(p.log, "%s[%d]: %s\n", name, p.cmd.Process.Pid, line)
		} else {
			p.t.Logf("%s[%d]: %s", name, p.cmd.Process.Pid, line)
		}
		p.lines = append(p.lines, line)
		if p.keep > 0 && len(p.lines) >= 2*p.keep {
			p.lines = append([]string(nil), p.lines[len(p.lines)-p.keep:]...)
		}
		keep := p.wait[:0]
		for _, w := range p.wait {
			if m := w.re.FindStringSubmatch(line); m != nil {
				w.ch <- m
			} else {
				keep = append(keep, w)
			}
		}
		p.wait = keep
		p.mu.Unlock()
	}
}

// WaitLine waits for an output line matching pattern (also one already
// printed) and returns its submatches.
func (p *Proc) WaitLine(pattern string, timeout time.Duration) []string {
	p.t.Helper()
	m, err := p.Await(pattern, timeout)
	if err != nil {
		p.t.Fatal(err)
	}
	return m
}

// Await is WaitLine returning an error rather than failing the test, for
// goroutines other than the test's.
func (p *Proc) Await(pattern string, timeout time.Duration) ([]string, error) {
	re := regexp.MustCompile(pattern)
	ch := make(chan []string, 1)
	p.mu.Lock()
	for _, l := range p.lines {
		if m := re.FindStringSubmatch(l); m != nil {
			p.mu.Unlock()
			return m, nil
		}
	}
	p.wait = append(p.wait, lineWaiter{re: re, ch: ch})
	p.mu.Unlock()
	select {
	case m := <-ch:
		return m, nil
	case <-p.done:
		select {
		case m := <-ch:
			return m, nil
		default:
		}
		return nil, fmt.Errorf("process exited (%v) before printing %q", p.err, pattern)
	case <-time.After(timeout):
		return nil, fmt.Errorf("no line matching %q within %v", pattern, timeout)
	}
}

// Output returns everything printed so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// Wait waits for the process to exit and returns its exit code.
func (p *Proc) Wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("process still running after %v", timeout)
	}
	return p.cmd.ProcessState.ExitCode()
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

// Kill sends SIGKILL to the process group and waits for it.
func (p *Proc) Kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Stop sends sig and, after grace, SIGKILL to the process group.
func (p *Proc) Stop(sig syscall.Signal, grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}

// Run runs bin to completion and returns its exit code, stdout and stderr.
func Run(t testing.TB, env []string, stdin string, bin string, args ...string) (int, string, string) {
	t.Helper()
	return RunAs(t, nil, env, stdin, bin, args...)
}

// RunAs is Run with the process running as cred's user and groups (the
// test must run as root); a nil cred keeps the test's own.
func RunAs(t testing.TB, cred *syscall.Credential, env []string, stdin string, bin string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(BaseEnv(), env...)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil && cmd.ProcessState == nil {
		t.Fatalf("run %s: %v", bin, err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// Get fetches url and returns the status code and body.
func Get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Eventually polls cond every 100 ms until it holds or timeout passes, then
// fails the test with what describe says.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, describe func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", timeout, describe())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WriteFile writes a file in a fresh temporary folder and returns its path.
func WriteFile(t testing.TB, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// FreePort returns a loopback TCP port that was free a moment ago
// (FreePortOn 127.0.0.1).
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePortOn(t, "127.0.0.1")
}

// Ports handed out by FreePortOn lie below the kernel's ephemeral range
// (ip_local_port_range, 32768 and up by default), so that neither an
// outgoing connection of another test nor a node dialling a stopped
// server's port (TCP's self-connect, when the source port chosen equals
// the destination) takes a port between its test's stop and restart of a
// server; and no port is handed out twice in one test binary.
const (
	testPortLow  = 20000
	testPortHigh = 32767
)

var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// FreePortOn returns a TCP port free on addr a moment ago, in
// [testPortLow, testPortHigh] and never one it returned before in this
// process.
func FreePortOn(t testing.TB, addr string) int {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 2000 {
		p := testPortLow + rand.IntN(testPortHigh-testPortLow+1)
		if handedOut.ports[p] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(addr, strconv.Itoa(p)))
		if err != nil {
			continue
		}
		ln.Close()
		handedOut.ports[p] = true
		return p
	}
	t.Fatalf("no free TCP port on %s in %d-%d", addr, testPortLow, testPortHigh)
	return 0
}
