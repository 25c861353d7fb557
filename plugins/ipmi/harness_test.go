package ipmi_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/plugin"
)

// requireTools skips the test when a program it needs is missing, except
// under CI=true, where a missing program fails it (tests/run installs them).
func requireTools(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s not found and CI=true: install ipmitool and openipmi (tests/run does)", n)
			}
			t.Skipf("%s not found: install ipmitool and openipmi to run this test", n)
		}
	}
}

var build struct {
	once sync.Once
	dir  string
	err  error
	out  []byte
}

// pluginDir returns a plugin directory holding a bcx-ipmi built from this
// module, built once per test binary.
func pluginDir(t *testing.T) string {
	t.Helper()
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "bcx-ipmi-test-")
		if build.err != nil {
			return
		}
		cmd := exec.Command("go", "build", "-ldflags", "-X main.version=0.0.0-test",
			"-o", filepath.Join(build.dir, "bcx-ipmi"), "./cmd/bcx-ipmi")
		build.out, build.err = cmd.CombinedOutput()
	})
	if build.err != nil {
		t.Fatalf("build bcx-ipmi: %v\n%s", build.err, build.out)
	}
	return build.dir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if build.dir != "" {
		_ = os.RemoveAll(build.dir)
	}
	os.Exit(code)
}

// capture is a log handler that keeps every record as text, for the checks
// that no secret was logged.
type capture struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
	h   slog.Handler
}

func newCapture() *capture {
	buf := &bytes.Buffer{}
	mu := &sync.Mutex{}
	return &capture{mu: mu, buf: buf, h: slog.NewTextHandler(lockedWriter{mu, buf}, &slog.HandlerOptions{Level: slog.LevelDebug})}
}

type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (c *capture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

func (c *capture) logger() *slog.Logger { return slog.New(c.h) }

// newHost returns a plugin host over dir, closed when the test ends.
func newHost(t *testing.T, dir string, log *slog.Logger) *plugin.Host {
	t.Helper()
	h, err := plugin.New(plugin.Config{
		Dir:        dir,
		Logger:     log,
		MinBackoff: 200 * time.Millisecond,
		MaxBackoff: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// freeUDPPort returns a UDP port on 127.0.0.1 nothing listens on (a moment
// ago).
func freeUDPPort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := c.LocalAddr().(*net.UDPAddr).Port
	_ = c.Close()
	return port
}

// sim is a running ipmi_sim.
type sim struct {
	port  int
	state string // the chassis_control script's state directory
}

const (
	simUser     = "admin"
	simPassword = "bc-sim-Pa55word" // testdata/lan.conf
)

// startSim starts ipmi_sim on 127.0.0.1 with testdata's configuration and
// waits until it answers ipmitool; it is stopped when the test ends.
func startSim(t *testing.T) *sim {
	t.Helper()
	requireTools(t, "ipmi_sim", "ipmitool")
	abs, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := &sim{port: freeUDPPort(t), state: filepath.Join(dir, "chassis")}
	if err := os.Mkdir(s.state, 0o755); err != nil {
		t.Fatal(err)
	}
	conf, err := os.ReadFile(filepath.Join(abs, "lan.conf"))
	if err != nil {
		t.Fatal(err)
	}
	conf = []byte(strings.NewReplacer(
		"@PORT@", strconv.Itoa(s.port),
		"@CHASSIS_CONTROL@", filepath.Join(abs, "chassis_control"),
		"@STATE@", s.state,
	).Replace(string(conf)))
	if err := os.WriteFile(filepath.Join(dir, "lan.conf"), conf, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sim"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := exec.Command("ipmi_sim", "-c", filepath.Join(dir, "lan.conf"), "-f", filepath.Join(abs, "sim.emu"),
		"-s", filepath.Join(dir, "sim"), "-n")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start ipmi_sim: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		probe := exec.CommandContext(ctx, "ipmitool", "-I", "lanplus", "-C", "3", "-H", "127.0.0.1",
			"-p", strconv.Itoa(s.port), "-U", simUser, "-E", "chassis", "power", "status")
		probe.Env = []string{"IPMITOOL_PASSWORD=" + simPassword}
		b, err := probe.CombinedOutput()
		cancel()
		if err == nil {
			return s
		}
		select {
		case <-exited:
			t.Fatalf("ipmi_sim exited: %s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("ipmi_sim on port %d does not answer: %v: %s\nipmi_sim: %s", s.port, err, b, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// read returns the content of a chassis state file ("power", "boot").
func (s *sim) read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.state, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// childNamed returns the pid of a child of ppid whose command is name, or 0.
func childNamed(ppid int, name string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(b)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		fields := strings.Fields(s[closing+1:])
		if len(fields) < 2 || s[open+1:closing] != name {
			continue
		}
		if p, _ := strconv.Atoi(fields[1]); p == ppid {
			return pid
		}
	}
	return 0
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z'
}
