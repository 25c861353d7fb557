package soak

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// joinedAs is bcd join's line naming the node.
var joinedAs = regexp.MustCompile(`Joined as node (\S+) `)

// realNode is a real bcd node on a machine of its own.
type realNode struct {
	name   string // machine and log file name: node-07, node-07-clone-1
	m      *testenv.Machine
	id     string
	file   string // the file its commands append to
	p      *testenv.Proc
	starts int
}

// fleet is the soak's daemons: real bcd nodes and FakeDaemons.
type fleet struct {
	t         *testing.T
	cp        *controlPlane
	tokenFile string
	token     string

	mu     sync.Mutex
	real   []*realNode
	clones int
	fakes  []*sim.FakeDaemon
	failed []string // FakeDaemons whose Run returned an error

	stopFakes context.CancelFunc
	fakesDone sync.WaitGroup
}

// newFleet creates the site and pool, a join token for every daemon the
// soak may join (clones included), joins real bcd nodes and fakes
// FakeDaemons, half through each of the first two gateways, and runs them.
func newFleet(t *testing.T, cp *controlPlane, real, fakes int) *fleet {
	t.Helper()
	ctx := context.Background()
	site, err := cp.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "soak", Region: "default"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := cp.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "default", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := bootstrap.LoadBundle(ctx, cp.st, soakSecret)
	if err != nil {
		t.Fatal(err)
	}
	token, _, err := api.CreateJoinToken(ctx, cp.st, bundle.GatewayPin(), pool.ID, 48*time.Hour, real+fakes+100, "soak", "")
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, cp: cp, token: token, tokenFile: filepath.Join(t.TempDir(), "join-token")}
	if err := os.WriteFile(f.tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gws := cp.liveGateways()

	// Real nodes join one by one (bcd join is a process each) and start.
	for i := range real {
		n := &realNode{name: fmt.Sprintf("node-%02d", i+1)}
		n.m = testenv.NewMachine(t, n.name)
		f.join(n, gws[i%len(gws)].url)
		f.start(n)
		f.real = append(f.real, n)
	}

	// FakeDaemons join through each gateway, logging warnings only.
	log, err := os.Create(filepath.Join(cp.logDir, "fakedaemons.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: log}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for i, g := range gws {
		n := fakes / len(gws)
		if i == 0 {
			n += fakes % len(gws)
		}
		fl, err := sim.NewFleet(sim.FleetConfig{GatewayURL: g.url, Token: token, N: n, NamePrefix: "sim-" + g.name,
			NoInventory: true, Logger: logger, Session: session.Config{StartJitter: time.Second, Logger: logger}})
		if err != nil {
			t.Fatal(err)
		}
		if err := fl.Join(ctx); err != nil {
			t.Fatal(err)
		}
		f.fakes = append(f.fakes, fl.Daemons()...)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	f.stopFakes = cancel
	for _, d := range f.fakes {
		f.fakesDone.Go(func() {
			if err := d.Run(runCtx); err != nil {
				f.mu.Lock()
				f.failed = append(f.failed, fmt.Sprintf("%s (%s): %v", d.Name(), d.NodeID(), err))
				f.mu.Unlock()
			}
		})
	}
	t.Cleanup(func() { cancel(); f.fakesDone.Wait() })
	return f
}

// join runs bcd join for n through gatewayURL and notes its node id.
func (f *fleet) join(n *realNode, gatewayURL string) {
	f.t.Helper()
	bin, args := n.m.Argv("join", "--gateway", gatewayURL, "--token-file", f.tokenFile, "--data-dir", n.m.DataDir)
	code, stdout, stderr := testenv.Run(f.t, nil, "", bin, args...)
	m := joinedAs.FindStringSubmatch(stdout)
	if code != 0 || m == nil {
		f.t.Fatalf("bcd join on %s: exit %d\n%s%s", n.name, code, stdout, stderr)
	}
	n.id = m[1]
	n.file = filepath.Join(filepath.Dir(n.m.DataDir), "commands.log")
	// Commands run as the command user bcd-cmd (issue 27), which may pass
	// through the machine's folder but not write in it: the file it
	// appends to is made for it, writable by all.
	if fl, err := os.OpenFile(n.file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666); err != nil {
		f.t.Fatal(err)
	} else if err := fl.Close(); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Chmod(n.file, 0o666); err != nil {
		f.t.Fatal(err)
	}
}

// start runs bcd node for n, its output appended to its log file.
func (f *fleet) start(n *realNode) {
	f.t.Helper()
	log, err := os.OpenFile(filepath.Join(f.cp.logDir, n.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { log.Close() })
	fmt.Fprintf(log, "==== start %d at %s\n", n.starts+1, time.Now().UTC().Format(time.RFC3339Nano))
	bin, args := n.m.Argv("node", "--data-dir", n.m.DataDir)
	n.p = testenv.StartLogged(f.t, log, processKeep, nil, bin, args...)
	n.starts++
}

// clone makes a clone of n (its hostname and machine id, an empty data dir
// of its own), joins it through gatewayURL and starts it.
func (f *fleet) clone(n *realNode, gatewayURL string) *realNode {
	f.t.Helper()
	f.mu.Lock()
	f.clones++
	c := &realNode{name: fmt.Sprintf("%s-clone-%d", n.name, f.clones), m: n.m.Clone()}
	f.mu.Unlock()
	f.join(c, gatewayURL)
	f.start(c)
	f.mu.Lock()
	f.real = append(f.real, c)
	f.mu.Unlock()
	return c
}

// realNodes returns the real nodes, clones included.
func (f *fleet) realNodes() []*realNode {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*realNode(nil), f.real...)
}

// nodeIDs returns the ids of every daemon of the fleet.
func (f *fleet) nodeIDs() []string {
	var ids []string
	for _, n := range f.realNodes() {
		ids = append(ids, n.id)
	}
	for _, d := range f.fakes {
		ids = append(ids, d.NodeID())
	}
	return ids
}

// fakeIDs returns the FakeDaemons' node ids.
func (f *fleet) fakeIDs() []string {
	var ids []string
	for _, d := range f.fakes {
		ids = append(ids, d.NodeID())
	}
	return ids
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  *os.File
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
