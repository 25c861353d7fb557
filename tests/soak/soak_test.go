package soak

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/better-compute/better-compute/controlplane/reconcilers/sweeper"
	"github.com/better-compute/better-compute/controlplane/store"
)

// The fleet's size.
const (
	realNodes = 20
	fakeNodes = 200
)

// cycleLength is the schedule's natural length: one cycle of every fault
// per this much of SOAK_DURATION.
const cycleLength = 8 * time.Minute

// leaseTTL is the workers' shard and singleton lease TTL (DESIGN.md, "The
// control plane roles"); a paused worker stays stopped past it.
const leaseTTL = 15 * time.Second

// recoveryLimit bounds the wait for the fleet's recovery after each fault.
const recoveryLimit = 3 * time.Minute

// soakDuration reads SOAK_DURATION; the test is skipped without it.
func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("SOAK_DURATION")
	if v == "" {
		t.Skip("SOAK_DURATION is not set (./tests/run sets 8m): the soak test runs only when asked for")
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Minute {
		t.Fatalf("SOAK_DURATION=%q: want a Go duration of at least 1m", v)
	}
	return d
}

// certTTLFor is the node certificate life for a run of d: 60 s, or an
// eighth of d below 8 minutes (at least 10 s), so that the outage of three
// lifetimes fits.
func certTTLFor(d time.Duration) time.Duration {
	return max(10*time.Second, min(time.Minute, (d/8).Truncate(time.Second)))
}

// logFolder makes the folder for the processes' logs: SOAK_LOG_DIR, or a
// temporary folder removed when the test passes.
func logFolder(t *testing.T) string {
	if dir := os.Getenv("SOAK_LOG_DIR"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	dir, err := os.MkdirTemp("", "bc-soak-logs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the processes' logs are kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}

// fault is one injection of the schedule and what followed it.
type fault struct {
	cycle     int
	name      string
	detail    string
	start     time.Time     // injected
	end       time.Time     // the fault itself over (process back, outage ended)
	recovered time.Duration // from end to every node present and every role up
	ok        bool          // recovered within recoveryLimit
	waited    bool          // recovered and ok are set
}

// soak is one run: the deployment, the fleet, the observer and the stream.
type soak struct {
	t      *testing.T
	cp     *controlPlane
	f      *fleet
	obs    *observer
	stream *commandStream
	began  time.Time

	faults []*fault
	// paused is the SIGSTOP fault's worker process name, the leases it
	// held at the stop (name → epoch) and when it was resumed.
	paused    string
	stale     map[string]int64
	resumedAt time.Time
	outages   [][2]time.Time // the control plane's stops and starts
}

// TestSoak runs the soak (package doc).
func TestSoak(t *testing.T) {
	dur := soakDuration(t)
	certTTL := certTTLFor(dur)
	logDir := logFolder(t)
	s := &soak{t: t, began: time.Now()}
	t.Logf("soak of %v: certificate TTL %v, logs in %s", dur, certTTL, logDir)

	s.cp = newControlPlane(t, certTTL, logDir)
	s.f = newFleet(t, s.cp, realNodes, fakeNodes)
	s.obs = observe(s.cp)
	setup := time.Now()
	s.waitRecovered(&fault{name: "setup", end: setup}, nil)
	t.Logf("deployment up and %d nodes present %v after the start", len(s.f.nodeIDs()), time.Since(s.began).Round(time.Second))

	s.stream = startCommands(s.cp, s.f, 250*time.Millisecond, 200*time.Millisecond)
	s.schedule(dur)
	intents := s.stream.stop()
	s.settle()
	absences := s.obs.finish()

	s.checkNodes()
	states := s.checkCommands(intents)
	s.checkNodeFiles()
	fenced := s.checkFencing()
	s.summary(dur, certTTL, intents, states, absences, fenced)
}

// step is one fault of the schedule: fixed is how long it keeps the fault
// on by design (a pause, an outage), beside its share of the cycle.
type step struct {
	name  string
	fixed func(s *soak) time.Duration
	run   func(s *soak, f *fault)
}

func none(*soak) time.Duration { return 0 }

// steps is one cycle of the schedule, in order.
var steps = []step{
	{"kill -9 api", none, (*soak).killAPI},
	{"kill -9 gateway", none, (*soak).killGateway},
	{"kill -9 worker", none, (*soak).killWorker},
	{"kill -9 bcd node", none, (*soak).killNode},
	{"SIGSTOP worker past lease TTL", func(*soak) time.Duration { return leaseTTL + 5*time.Second }, (*soak).pauseWorker},
	{"gateway replaced", none, (*soak).replaceGateway},
	{"control plane stopped 3 cert lifetimes", func(s *soak) time.Duration { return 3 * s.cp.certTTL }, (*soak).outage},
	{"clone of a node joins", none, (*soak).cloneJoins},
}

// schedule runs cycles of steps over dur: one per cycleLength, at least
// one, each step at its share of its cycle (later when recoveries run
// long).
func (s *soak) schedule(dur time.Duration) {
	cycles := max(1, int((dur+cycleLength/2)/cycleLength))
	per := dur / time.Duration(cycles)
	start := time.Now()
	for c := range cycles {
		cycleStart := start.Add(time.Duration(c) * per)
		var fixed time.Duration
		for _, st := range steps {
			fixed += st.fixed(s)
		}
		gap := max(0, (per-fixed)/time.Duration(len(steps)))
		next := cycleStart.Add(gap / 2)
		for _, st := range steps {
			time.Sleep(time.Until(next))
			f := &fault{cycle: c + 1, name: st.name, start: time.Now()}
			s.t.Logf("%v: %s (cycle %d)", time.Since(s.began).Round(time.Second), st.name, c+1)
			st.run(s, f)
			if f.end.IsZero() {
				f.end = time.Now()
			}
			if !f.waited {
				s.waitRecovered(f, nil)
			}
			s.faults = append(s.faults, f)
			s.t.Logf("%v: %s: %s; recovered %v after", time.Since(s.began).Round(time.Second), st.name, f.detail, f.recovered.Round(100*time.Millisecond))
			next = f.start.Add(gap + st.fixed(s))
		}
		time.Sleep(time.Until(cycleStart.Add(per)))
	}
}

// waitRecovered waits until every node is present at a sample taken after
// f.end, every control-plane process runs, the shards are held by the
// running workers and extra (when not nil) holds; it notes how long that
// took from f.end.
func (s *soak) waitRecovered(f *fault, extra func() bool) {
	f.waited = true
	deadline := f.end.Add(recoveryLimit)
	var missing, last []string
	for time.Now().Before(deadline) {
		ok := s.obs.sampledAfter(f.end)
		if ok {
			if ok, missing = s.obs.allPresent(s.f.nodeIDs()); len(missing) > 0 {
				last = missing
			}
		}
		ok = ok && s.cp.allRunning() && s.cp.shardsSettled() && s.cp.apiUp() && (extra == nil || extra())
		if ok {
			f.recovered, f.ok = time.Since(f.end), true
			if len(last) > 0 && len(last) <= 3 {
				f.detail += fmt.Sprintf("; the last back: %s", strings.Join(last, ", "))
			}
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	f.recovered = time.Since(f.end)
	if len(missing) > 8 {
		missing = append(missing[:8], fmt.Sprintf("and %d more", len(missing)-8))
	}
	s.t.Errorf("%s: not recovered within %v: nodes away %v; processes running %v, shards settled %v, api up %v",
		f.name, recoveryLimit, missing, s.cp.allRunning(), s.cp.shardsSettled(), s.cp.apiUp())
}

// killAPI: kill -9 of the api, restarted 2 s later.
func (s *soak) killAPI(f *fault) {
	_, created, _ := s.stream.stats()
	s.cp.kill(s.cp.api)
	time.Sleep(2 * time.Second)
	s.cp.start(s.cp.api)
	f.end = time.Now()
	f.detail = "restarted after 2 s"
	// Recovered when the stream creates commands again.
	s.waitRecovered(f, func() bool { _, now, _ := s.stream.stats(); return now > created })
}

// killGateway: kill -9 of the gateway holding the most sessions,
// restarted at once on its port (with a new id).
func (s *soak) killGateway(f *fault) {
	var victim *cpProc
	most := -1
	for _, g := range s.cp.liveGateways() {
		_, id := s.cp.running(g)
		var n int
		if err := s.cp.db.QueryRow(context.Background(), `SELECT count(*) FROM sessions WHERE gateway_id = $1`, id).Scan(&n); err != nil {
			s.t.Fatal(err)
		}
		if n > most {
			victim, most = g, n
		}
	}
	s.cp.kill(victim)
	s.cp.start(victim)
	f.detail = fmt.Sprintf("%s with %d sessions, restarted at once", victim.name, most)
}

// killWorker: kill -9 of the worker holding the command sweeper,
// restarted 2 s later.
func (s *soak) killWorker(f *fault) {
	holder, _ := s.cp.leaseHolder(sweeper.LeaseName)
	victim := s.cp.worker(holder)
	f.detail = fmt.Sprintf("%s, the command sweeper's holder, restarted after 2 s", cmp.Or(victim, &cpProc{name: "?"}).name)
	if victim == nil {
		victim = s.cp.workers[0]
		f.detail = fmt.Sprintf("%s (no worker held the command sweeper), restarted after 2 s", victim.name)
	}
	s.cp.kill(victim)
	time.Sleep(2 * time.Second)
	s.cp.start(victim)
}

// killNode: kill -9 of a real bcd node (process group and all), one with a
// command running when there is one, restarted 2 s later; recovered when
// it holds a new session.
func (s *soak) killNode(f *fault) {
	ctx := context.Background()
	nodes := s.f.realNodes()
	victim := nodes[rand.IntN(len(nodes))]
	var running string
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.id
	}
	_ = s.cp.db.QueryRow(ctx, `SELECT node_id FROM commands WHERE node_id = ANY($1) AND state = 'running' LIMIT 1`, ids).Scan(&running)
	for _, n := range nodes {
		if n.id == running {
			victim = n
		}
	}
	var session string
	_ = s.cp.db.QueryRow(ctx, `SELECT session_id FROM sessions WHERE node_id = $1`, victim.id).Scan(&session)
	victim.p.Kill()
	time.Sleep(2 * time.Second)
	s.f.start(victim)
	f.end = time.Now()
	f.detail = fmt.Sprintf("%s (a command running: %v), restarted after 2 s", victim.name, running != "")
	s.waitRecovered(f, func() bool {
		var now string
		_ = s.cp.db.QueryRow(ctx, `SELECT session_id FROM sessions WHERE node_id = $1`, victim.id).Scan(&now)
		return now != "" && now != session
	})
}

// pauseWorker: SIGSTOP of the worker holding the command sweeper until
// every lease it held has passed to the other worker at a higher epoch (at
// least the leases' TTL and 5 s), then SIGCONT.
func (s *soak) pauseWorker(f *fault) {
	holder, _ := s.cp.leaseHolder(sweeper.LeaseName)
	w := cmp.Or(s.cp.worker(holder), s.cp.workers[0])
	_, id := s.cp.running(w)
	held := s.cp.leasesOf(id)
	stoppedAt := time.Now()
	w.p.Signal(syscall.SIGSTOP)
	for name, epoch := range s.cp.leasesOf(id) {
		held[name] = max(held[name], epoch)
	}
	time.Sleep(leaseTTL + 5*time.Second)
	moved := func() bool {
		for name, epoch := range held {
			h, e := s.cp.leaseHolder(name)
			if h == id || e <= epoch {
				return false
			}
		}
		return true
	}
	for !moved() && time.Since(stoppedAt) < 60*time.Second {
		time.Sleep(500 * time.Millisecond)
	}
	allMoved := moved()
	if !allMoved {
		s.t.Errorf("SIGSTOP of %s: its %d leases had not all passed to the other worker at higher epochs after %v",
			w.name, len(held), time.Since(stoppedAt).Round(time.Second))
	}
	s.resumedAt = time.Now()
	w.p.Signal(syscall.SIGCONT)
	if s.stale == nil {
		s.paused, s.stale = w.name, held
	}
	f.end = time.Now()
	f.detail = fmt.Sprintf("%s stopped %v holding %d leases, all taken over at higher epochs: %v",
		w.name, s.resumedAt.Sub(stoppedAt).Round(time.Second), len(held), allMoved)
	// Recovered when the resumed worker holds shards again.
	s.waitRecovered(f, func() bool {
		_, id := s.cp.running(w)
		n := 0
		for name := range s.cp.leasesOf(id) {
			if strings.HasPrefix(name, "shard:") {
				n++
			}
		}
		return n > 0
	})
}

// replaceGateway: a new gateway is added on a port of its own, then the
// oldest is stopped (SIGTERM: Drain) and removed for good.
func (s *soak) replaceGateway(f *fault) {
	old := s.cp.liveGateways()[0]
	added := s.cp.addGateway()
	s.cp.start(added)
	s.cp.remove(old)
	f.detail = fmt.Sprintf("%s added, %s drained and removed", added.name, old.name)
}

// outage: every control-plane process stopped (SIGTERM) for three
// certificate lifetimes, then started again.
func (s *soak) outage(f *fault) {
	procs := s.cp.procs()
	done := make(chan struct{}, len(procs))
	for _, p := range procs {
		go func() { s.cp.stop(p); done <- struct{}{} }()
	}
	for range procs {
		<-done
	}
	stopped := time.Now()
	time.Sleep(3 * s.cp.certTTL)
	s.cp.startAll()
	f.end = time.Now()
	s.outages = append(s.outages, [2]time.Time{f.start, f.end})
	f.detail = fmt.Sprintf("%d processes stopped for %v (all down after %v)", len(procs),
		f.end.Sub(stopped).Round(time.Second), stopped.Sub(f.start).Round(100*time.Millisecond))
}

// cloneJoins: a clone of a real node (its hostname and machine id, a data
// dir of its own) joins and runs beside it.
func (s *soak) cloneJoins(f *fault) {
	var originals []*realNode
	for _, n := range s.f.realNodes() {
		if !strings.Contains(n.name, "-clone-") {
			originals = append(originals, n)
		}
	}
	orig := originals[rand.IntN(len(originals))]
	gws := s.cp.liveGateways()
	c := s.f.clone(orig, gws[rand.IntN(len(gws))].url)
	f.detail = fmt.Sprintf("%s joined as %s beside %s (%s)", c.name, c.id, orig.name, orig.id)
	if c.id == orig.id {
		s.t.Errorf("the clone %s joined as its original's node %s; want a node of its own", c.name, c.id)
	}
}

// settle waits, after the stream stops, until no command is left open and
// every node is present.
func (s *soak) settle() {
	ctx := context.Background()
	deadline := time.Now().Add(commandTimeout + time.Minute)
	var open int
	for time.Now().Before(deadline) {
		if err := s.cp.db.QueryRow(ctx, `SELECT count(*) FROM commands
			WHERE state NOT IN ('succeeded', 'failed', 'cancelled', 'expired', 'lost')`).Scan(&open); err != nil {
			s.t.Fatal(err)
		}
		if open == 0 {
			break
		}
		time.Sleep(time.Second)
	}
	if open > 0 {
		s.t.Errorf("%d commands still not terminal %v after their deadline", open, time.Minute)
	}
	s.waitRecovered(&fault{name: "end of the run", end: time.Now()}, nil)
}

// checkNodes: every node of the fleet is present and ready, no other node
// exists, every FakeDaemon runs and every bcd node process runs.
func (s *soak) checkNodes() {
	ctx := context.Background()
	ids := s.f.nodeIDs()
	var n int
	if err := s.cp.db.QueryRow(ctx, `SELECT count(*) FROM nodes`).Scan(&n); err != nil {
		s.t.Fatal(err)
	}
	if n != len(ids) {
		s.t.Errorf("%d nodes in the database, want the fleet's %d", n, len(ids))
	}
	if ok, missing := s.obs.allPresent(ids); !ok {
		s.t.Errorf("nodes not ready and present at the end, with no operator action: %v", missing)
	}
	var notReady int
	if err := s.cp.db.QueryRow(ctx, `SELECT count(*) FROM nodes WHERE state <> 'ready'`).Scan(&notReady); err != nil {
		s.t.Fatal(err)
	}
	if notReady > 0 {
		s.t.Errorf("%d nodes not ready at the end", notReady)
	}
	s.f.mu.Lock()
	failed := slices.Clone(s.f.failed)
	s.f.mu.Unlock()
	if len(failed) > 0 {
		s.t.Errorf("%d FakeDaemons stopped: %v", len(failed), failed)
	}
	for _, rn := range s.f.realNodes() {
		select {
		case <-rn.p.Done():
			s.t.Errorf("bcd node %s (%s) exited: %d", rn.name, rn.id, rn.p.Wait(time.Second))
		default:
		}
	}
}

// checkCommands: every command reached exactly one terminal state (one
// transition into one, none out of one, by the write log), each intent's
// key made exactly one command per target however often its call was
// retried, and every command was one the stream asked for. It returns the
// commands by state.
func (s *soak) checkCommands(intents []*intent) map[string]int {
	ctx := context.Background()
	type row struct{ node, key, state string }
	cmds := map[string]row{}
	rows, err := s.cp.db.Query(ctx, `SELECT id, node_id, coalesce(idempotency_key, ''), state FROM commands`)
	if err != nil {
		s.t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var r row
		if err := rows.Scan(&id, &r.node, &r.key, &r.state); err != nil {
			s.t.Fatal(err)
		}
		cmds[id] = r
	}
	rows.Close()
	log, err := commandTransitions(ctx, s.cp.db, store.IsTerminal)
	if err != nil {
		s.t.Fatal(err)
	}
	byKey := map[string]map[string]int{} // key → node → commands
	states := map[string]int{}
	bad := 0
	for id, r := range cmds {
		states[r.state]++
		if byKey[r.key] == nil {
			byKey[r.key] = map[string]int{}
		}
		byKey[r.key][r.node]++
		l := log[id]
		if l == nil {
			l = &commandLog{}
		}
		if !store.IsTerminal(r.state) || l.into != 1 || l.outOf != 0 {
			if bad++; bad <= 10 {
				s.t.Errorf("command %s (%s on %s): state %s, %d transitions into a terminal state and %d out of one; want one terminal state, 1 and 0",
					id, r.key, r.node, r.state, l.into, l.outOf)
			}
		}
	}
	if bad > 10 {
		s.t.Errorf("and %d more commands not ended exactly once", bad-10)
	}
	asked := map[string]*intent{}
	for _, in := range intents {
		asked[in.key] = in
		got := byKey[in.key]
		if len(in.ids) > 0 && len(got) != len(in.nodes) {
			s.t.Errorf("intent %s for %v: commands on %v, want one per target", in.key, in.nodes, got)
		}
		for node, n := range got {
			if n != 1 {
				s.t.Errorf("intent %s made %d commands on %s (after %d calls), want 1", in.key, n, node, in.calls)
			}
		}
		for _, id := range in.ids {
			if _, ok := cmds[id]; !ok {
				s.t.Errorf("command %s, created through the API for %s, is not in commands", id, in.key)
			}
		}
	}
	for key := range byKey {
		if asked[key] == nil {
			s.t.Errorf("commands with key %q, which the stream never asked for", key)
		}
	}
	if len(cmds) < 200 {
		s.t.Errorf("only %d commands in the run; the checks need a steady stream", len(cmds))
	}
	return states
}

// checkNodeFiles: no key appears twice in a real node's file (no command
// ran twice), every line is a command of that node, and every command that
// succeeded on a real node appears there exactly once.
func (s *soak) checkNodeFiles() {
	ctx := context.Background()
	for _, n := range s.f.realNodes() {
		lines := map[string]int{}
		fh, err := os.Open(n.file)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			s.t.Fatal(err)
		}
		if err == nil {
			sc := bufio.NewScanner(fh)
			for sc.Scan() {
				lines[sc.Text()]++
			}
			fh.Close()
		}
		rows, err := s.cp.db.Query(ctx, `SELECT id, coalesce(idempotency_key, ''), state FROM commands WHERE node_id = $1`, n.id)
		if err != nil {
			s.t.Fatal(err)
		}
		mine := map[string]string{} // key → state
		ids := map[string]string{}
		for rows.Next() {
			var id, key, state string
			if err := rows.Scan(&id, &key, &state); err != nil {
				s.t.Fatal(err)
			}
			mine[key], ids[key] = state, id
		}
		rows.Close()
		for key, count := range lines {
			switch {
			case mine[key] == "":
				s.t.Errorf("%s's file has %q, not a command of node %s", n.name, key, n.id)
			case count > 1:
				s.t.Errorf("command %s (%s) ran %d times on %s (%s): want at most once", ids[key], key, count, n.name, n.id)
			}
		}
		for key, state := range mine {
			if state == store.CommandSucceeded && lines[key] != 1 {
				s.t.Errorf("command %s (%s) succeeded on %s but appears %d times in its file, want once", ids[key], key, n.name, lines[key])
			}
		}
	}
}

// fencing is what the fencing check saw.
type fencing struct {
	rows       int            // fenced rows in the write log
	byApp      map[string]int // fenced rows by process
	afterPause int            // fenced rows the paused worker wrote after SIGCONT
	probe      bool           // the check caught a stale write added to the log
}

// checkFencing: no fenced row of the write log was written after its lease
// had passed; the log holds fenced writes of the gateways and both workers
// (the paused one after its SIGCONT), so the check is not vacuous; and the
// check catches a stale write added to the log, in a transaction rolled
// back.
func (s *soak) checkFencing() fencing {
	ctx := context.Background()
	stale, total, err := staleWrites(ctx, s.cp.db, 20)
	if err != nil {
		s.t.Fatal(err)
	}
	for _, w := range stale {
		s.t.Errorf("fenced write landed under a passed lease: %s %s %s by %s at %s under %q, the lease then %q (write log id %d)",
			w.Op, w.Table, w.Key, w.App, w.At.Format(time.RFC3339Nano), w.Fence, w.LeaseNow, w.ID)
	}
	if total > len(stale) {
		s.t.Errorf("and %d more fenced writes under passed leases", total-len(stale))
	}
	fr := fencing{byApp: map[string]int{}}
	rows, err := s.cp.db.Query(ctx, `SELECT app, count(*) FROM soak_writes WHERE kind = 'fenced' GROUP BY app`)
	if err != nil {
		s.t.Fatal(err)
	}
	for rows.Next() {
		var app string
		var n int
		if err := rows.Scan(&app, &n); err != nil {
			s.t.Fatal(err)
		}
		name := strings.TrimSuffix(app, "."+s.cp.tag)
		fr.byApp[name] = n
		fr.rows += n
	}
	rows.Close()
	for _, name := range []string{"gateway-1", "worker-1", "worker-2"} {
		if fr.byApp[name] == 0 {
			s.t.Errorf("the write log holds no fenced write of %s: the fencing check would see nothing", name)
		}
	}
	if s.paused != "" {
		if err := s.cp.db.QueryRow(ctx, `SELECT count(*) FROM soak_writes WHERE kind = 'fenced' AND app = $1 AND at > $2`,
			s.cp.app(s.paused), s.resumedAt).Scan(&fr.afterPause); err != nil {
			s.t.Fatal(err)
		}
		if fr.afterPause == 0 {
			s.t.Errorf("the paused %s made no fenced write after SIGCONT: the check of its writes is vacuous", s.paused)
		}
	}

	// The check's own control: a write under a lease the paused worker
	// held at its stop, at the old epoch, after the takeover.
	var lease, holder string
	var epoch int64
	err = s.cp.db.QueryRow(ctx, `SELECT key, split_part(new_val, '@', 1), split_part(new_val, '@', 2)::bigint
		FROM soak_writes WHERE kind = 'lease' AND key LIKE 'shard:%' AND new_val IS NOT NULL
		ORDER BY id LIMIT 1`).Scan(&lease, &holder, &epoch)
	if err != nil {
		s.t.Fatal(err)
	}
	tx, err := s.cp.db.Begin(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO soak_writes (kind, tbl, op, key, app, fence) VALUES ('fenced', 'nodes', 'UPDATE', 'probe', 'soak-probe', $1)`,
		fmt.Sprintf("%s %s %d", lease, holder, epoch)); err != nil {
		s.t.Fatal(err)
	}
	probed, _, err := staleWrites(ctx, tx, 1000)
	if err != nil {
		s.t.Fatal(err)
	}
	fr.probe = slices.ContainsFunc(probed, func(w staleWrite) bool { return w.App == "soak-probe" })
	if !fr.probe {
		s.t.Errorf("the fencing check missed a write added under %s at its first epoch %d, long passed", lease, epoch)
	}
	return fr
}

// summary prints the run's table: faults and recoveries, commands, and
// the longest absences.
func (s *soak) summary(dur, certTTL time.Duration, intents []*intent, states map[string]int, absences []absence, fr fencing) {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "\nsoak summary: SOAK_DURATION %v, %v in all; %d real bcd nodes (%d clones), %d FakeDaemons; certificate TTL %v\n",
		dur, time.Since(s.began).Round(time.Second), len(s.f.realNodes()), s.f.clones, len(s.f.fakes), certTTL)
	fmt.Fprintln(w, "cycle\tfault\tat\trecovered after\tdetail")
	counts := map[string]int{}
	for _, f := range s.faults {
		ok := ""
		if !f.ok {
			ok = " (NOT within limit)"
		}
		fmt.Fprintf(w, "%d\t%s\t%v\t%v%s\t%s\n", f.cycle, f.name, f.start.Sub(s.began).Round(time.Second),
			f.recovered.Round(100*time.Millisecond), ok, f.detail)
		counts[f.name]++
	}
	w.Flush()
	_, created, failures := s.stream.stats()
	calls := 0
	for _, in := range intents {
		calls += in.calls
	}
	var stateList []string
	total := 0
	for st, n := range states {
		stateList = append(stateList, fmt.Sprintf("%s %d", st, n))
		total += n
	}
	sort.Strings(stateList)
	fmt.Fprintf(&b, "faults injected: %d (%d kinds)\n", len(s.faults), len(counts))
	fmt.Fprintf(&b, "commands: %d requests (%d created, %d API calls, %d failed and retried with their key); %d commands by state: %s\n",
		len(intents), created, calls, failures, total, strings.Join(stateList, ", "))
	fmt.Fprintf(&b, "fenced writes in the write log: %d (%v); by the paused worker after SIGCONT: %d; stale: none found, probe caught: %v\n",
		fr.rows, fr.byApp, fr.afterPause, fr.probe)

	// Absences: the longest of all, and the longest outside the control
	// plane's deliberate outages (those overlapping one are recovered
	// from its end).
	inOutage := func(a absence) bool {
		for _, o := range s.outages {
			if a.from.Before(o[1]) && a.to.After(o[0]) {
				return true
			}
		}
		return false
	}
	var longest, longestOther absence
	for _, a := range absences {
		if a.to.Sub(a.from) > longest.to.Sub(longest.from) {
			longest = a
		}
		if !inOutage(a) && a.to.Sub(a.from) > longestOther.to.Sub(longestOther.from) {
			longestOther = a
		}
	}
	fmt.Fprintf(&b, "recoveries: %d absences of nodes in all; longest time any node was away: %v (%s, from %v); outside the outages: %v (%s, from %v)\n",
		len(absences), longest.to.Sub(longest.from).Round(time.Second), longest.node, longest.from.Sub(s.began).Round(time.Second),
		longestOther.to.Sub(longestOther.from).Round(time.Second), longestOther.node, longestOther.from.Sub(s.began).Round(time.Second))
	s.t.Log(b.String())
}
