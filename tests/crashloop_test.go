package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// bcd rolls itself back from a crash loop (issue 30), with or without the
// control plane. Release relCrash is the crashafter test build of bcd
// (bcd/cmd/bcd/crashafter.go): it passes its trial, connects, and exits
// with status 1 a set time after each start. The test plays systemd: it
// starts bcd again after each exit (Restart=always, RestartSec=1).

const relCrash = "0.5.0" // the crashafter build: exits crashAfter after each start

// crashingBcd builds bcd at version with the crashafter tag, exiting after
// after each start (cached per version and time).
func crashingBcd(t *testing.T, version string, after time.Duration) string {
	t.Helper()
	f, _ := bcdBuilds.LoadOrStore("crashafter "+version+" "+after.String(), sync.OnceValues(func() (string, error) {
		dir, err := os.MkdirTemp("", "bc-e2e-bcd-")
		if err != nil {
			return "", err
		}
		out := filepath.Join(dir, "bcd")
		cmd := exec.Command("go", "build", "-trimpath", "-tags", "crashafter", "-ldflags",
			"-X main.version="+version+" -X main.commit=e2e -X main.crashAfter="+after.String(), "-o", out, "./bcd/cmd/bcd")
		cmd.Dir = repoRoot()
		if b, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("build the crashafter bcd %s: %v\n%s", version, err, b)
		}
		return out, nil
	}))
	p, err := f.(func() (string, error))()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// supervised is a real bcd node that the test restarts after every exit,
// as systemd would.
type supervised struct {
	t       *testing.T
	name    string
	id      string // the node's id
	bin     string // the installed binary (bcd.prev beside it)
	args    []string
	mu      sync.Mutex
	procs   []*testenv.Proc // every start, the current last
	stopped bool
	done    chan struct{}
}

// superviseNode installs bcd A in its own folder, joins it with token and
// runs `bcd node` under supervision until the test ends.
func (e *rolloutEnv) superviseNode(t *testing.T, name, token string, extra ...string) *supervised {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	s := &supervised{t: t, name: name, bin: filepath.Join(dir, "bin", "bcd"), done: make(chan struct{})}
	copyFile(t, bcdAt(t, relA), s.bin, 0o755)
	tokFile := testenv.WriteFile(t, name+"-token", token)
	data := filepath.Join(dir, "data")
	runOK(t, nil, s.bin, "join", "--gateway", e.gateways[0].url, "--token-file", tokFile, "--data-dir", data)
	s.args = append([]string{"node", "--data-dir", data, "--release-pins-file", e.pins, "--upgrade-health-timeout", "20s"}, extra...)
	p := testenv.Start(t, nil, s.bin, s.args...)
	s.procs = append(s.procs, p)
	go s.run(p)
	t.Cleanup(func() {
		s.mu.Lock()
		s.stopped = true
		cur := s.procs[len(s.procs)-1]
		s.mu.Unlock()
		cur.Stop(syscall.SIGTERM, 10*time.Second)
		<-s.done
	})
	s.id = p.WaitLine(`msg="Session established" node_id=(node_[a-z0-9]+)`, 60*time.Second)[1]
	return s
}

// run restarts the node one second after each exit (RestartSec=1).
func (s *supervised) run(p *testenv.Proc) {
	defer close(s.done)
	for {
		<-p.Done()
		time.Sleep(time.Second) // systemd's RestartSec
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			return
		}
		p = testenv.Start(s.t, nil, s.bin, s.args...)
		s.procs = append(s.procs, p)
		s.mu.Unlock()
	}
}

// output is everything the node printed, over all its starts.
func (s *supervised) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, p := range s.procs {
		b.WriteString(p.Output())
		b.WriteString("\n")
	}
	return b.String()
}

// starts is how many times the test started the node.
func (s *supervised) starts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.procs)
}

// stopNodeFacing stops the gateways and workers of the deployment: no
// node can reach the control plane (the api serves only callers).
func (d *splitDeployment) stopNodeFacing() {
	for _, g := range d.gateways {
		g.p.Stop(syscall.SIGTERM, 15*time.Second)
	}
	for _, w := range d.workers {
		w.p.Stop(syscall.SIGTERM, 15*time.Second)
	}
}

// restartGateway starts gateway g again on the same address, so the nodes
// that joined through it find it.
func (d *splitDeployment) restartGateway(g *splitProc) {
	d.t.Helper()
	g.p.Stop(syscall.SIGTERM, 15*time.Second)
	env := append([]string{}, d.env...)
	env = append(env, "BETTER_COMPUTE_DATABASE_URL="+d.url+"&application_name="+d.app(g.name),
		"BETTER_COMPUTE_GATEWAY_LISTEN="+strings.TrimPrefix(g.url, "https://"))
	g.p = testenv.Start(d.t, env, d.bin, "serve", "--config", d.cfgFile, "--roles", "gateway", "--no-migrate")
	g.p.WaitLine(`msg="Gateway listening"`, 60*time.Second)
}

// localRollbacks returns the node.rolled-back-locally events of node.
func (d *splitDeployment) localRollbacks(t *testing.T, node string) []events.NodeRolledBackLocallyData {
	t.Helper()
	entries, err := d.st.OutboxQuery(context.Background(), &store.OutboxQueryParams{Key: node, Ascending: true, Limit: store.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	var out []events.NodeRolledBackLocallyData
	for _, en := range entries {
		env, err := events.Parse(en.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if env.Type != events.NodeRolledBackLocally {
			continue
		}
		var data events.NodeRolledBackLocallyData
		if err := json.Unmarshal(env.Data, &data); err != nil {
			t.Fatal(err)
		}
		out = append(out, data)
	}
	return out
}

// TestBcdCrashLoopWithoutControlPlane: three real bcd upgraded to a
// release that exits 25 s after each start; the control plane stops before
// the first exit. Each bcd counts its starts of the new release in
// <data-dir>/upgrade, restores A (bcd.prev) by itself after its third
// exit and restarts into it; once the control plane is back, the next
// Hello of each reports it: one node.rolled-back-locally each, and the
// nodes run A.
func TestBcdCrashLoopWithoutControlPlane(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t)
	ctx := context.Background()
	crash := crashingBcd(t, relCrash, 25*time.Second)
	e.release(t, relCrash, crash)
	pool, token := e.newPool(t, "crash", 3)
	var nodes []*supervised
	for i := range 3 {
		nodes = append(nodes, e.superviseNode(t, fmt.Sprintf("crash-%d", i+1), token))
	}

	// All three to the crashing release at once; the command succeeds
	// once each restarted bcd has connected on it.
	code, stdout, stderr := e.cli(t, "nodes", "upgrade", "--pool", "crash", "--version", relCrash, "--timeout", "2m")
	if code != 0 {
		t.Fatalf("nodes upgrade: exit %d\n%s%s", code, stdout, stderr)
	}
	upgradedAt := time.Now()
	// The control plane goes away before the first exit (25 s after the
	// restart into the new release, which came after the trial).
	e.stopNodeFacing()
	if since := time.Since(upgradedAt); since > 20*time.Second {
		t.Fatalf("stopping the control plane took %v: the crash loop may have begun before", since)
	}
	for _, s := range nodes {
		if !strings.Contains(s.output(), "version="+relCrash) {
			t.Fatalf("%s never ran %s", s.name, relCrash)
		}
	}

	// Each bcd: start 1 (connected) and starts 2 and 3 (no control plane)
	// exit; start 4 restores A and re-executes it.
	startedA := regexp.MustCompile(`msg="Starting node agent" .*version=` + regexp.QuoteMeta(relA) + ` `)
	for _, s := range nodes {
		eventually(t, 3*time.Minute, func() bool {
			out := s.output()
			i := strings.Index(out, `msg="The new bcd is crash-looping; rolling back"`)
			return i >= 0 && startedA.MatchString(out[i:])
		}, func() string { return fmt.Sprintf("%s did not roll itself back (%d starts)", s.name, s.starts()) })
		if got := sha256File(t, s.bin); got != sha256File(t, bcdAt(t, relA)) {
			t.Errorf("%s: the installed bcd is not A", s.name)
		}
		if n := s.starts(); n != 4 {
			t.Errorf("%s: started %d times, want 4 (3 exits, then the rollback)", s.name, n)
		}
		t.Logf("%s rolled back by itself after %d starts, %v after the upgrade", s.name, s.starts(), time.Since(upgradedAt).Round(time.Second))
	}
	for _, s := range nodes {
		if got := e.localRollbacks(t, s.id); len(got) != 0 {
			t.Fatalf("%s: %d local rollbacks recorded with the control plane down", s.name, len(got))
		}
	}

	// The control plane comes back: the next Hello of each reports it.
	e.restartGateway(e.gateways[0])
	for _, s := range nodes {
		id := s.id
		var got []events.NodeRolledBackLocallyData
		eventually(t, 90*time.Second, func() bool {
			got = e.localRollbacks(t, id)
			n, err := e.st.NodeGet(ctx, id)
			return len(got) > 0 && err == nil && n.BCDVersion == relA
		}, func() string { return s.name + ": no node.rolled-back-locally, or not on " + relA })
		r := got[0]
		if len(got) != 1 || r.FromVersion != relCrash || r.ToVersion != relA || r.Starts != 3 || r.PoolID != pool.ID ||
			!strings.Contains(r.Reason, "3 starts of "+relCrash) {
			t.Errorf("%s: events %+v", s.name, got)
		}
		t.Logf("%s: node.rolled-back-locally %+v", s.name, r)
	}
	// Reported once: a later session does not report it again.
	sessions := map[string]int{}
	for _, s := range nodes {
		sessions[s.name] = strings.Count(s.output(), `msg="Session established"`)
	}
	e.restartGateway(e.gateways[0])
	for _, s := range nodes {
		id := s.id
		eventually(t, 60*time.Second, func() bool {
			return strings.Count(s.output(), `msg="Session established"`) > sessions[s.name]
		}, func() string { return s.name + " did not reconnect" })
		if got := e.localRollbacks(t, id); len(got) != 1 {
			t.Errorf("%s: %d node.rolled-back-locally events after a reconnect, want 1", s.name, len(got))
		}
	}
}
