package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// failoverDaemons is how many FakeDaemons the failover tests run.
const failoverDaemons = 200

// failoverCommandTimeout is the deadline of the failover tests' commands:
// long enough that a command queued just before the kill outlives the
// outage.
const failoverCommandTimeout = 90 * time.Second

// failoverSink is the file sink the failover tests' workers deliver to.
const failoverSink = "archive"

// TestPostgresFailover rides a PostgreSQL failover (docs/scaling.md,
// "Riding a PostgreSQL failover"): a primary and a synchronous streaming
// standby made with initdb and pg_basebackup, every process of the split
// deployment (an api, a gateway, two workers) on the multi-host URL
// host=primary,standby with target_session_attrs=read-write, 200
// FakeDaemons and a steady stream of commands.create calls, each with an
// idempotency key and retried with it after an error. kill -9 of the
// primary's processes, then pg_ctl promote of the standby:
//
//   - /readyz answers not ready, with the reason, during the outage, and
//     ready again after the promotion (the time is printed, with a
//     generous deadline);
//   - every command accepted before or after is in the new primary and
//     reaches exactly one terminal state; no create retried with its key
//     made a second command for a node;
//   - every write a worker made was made while the write log's record of
//     the lease guarding it gave that lease to that worker: none from an
//     old epoch landed; no lease's epoch went back;
//   - the gateway LISTENs again on the new primary;
//   - the file sink's cursor reaches the last outbox entry and the file
//     holds every entry's id up to it (duplicates allowed).
func TestPostgresFailover(t *testing.T) {
	t.Parallel()
	// The promotion after the leases' 15 s TTL: every lease has expired on
	// the new primary, and each is taken at a new epoch.
	runFailover(t, false, 17*time.Second)
}

// TestPostgresFailoverPgBouncer is TestPostgresFailover with PgBouncer in
// transaction mode in front of each server (tests/pgbouncer.sh, one
// instance per server): database.url is the multi-host URL of the two
// PgBouncers with target_session_attrs=read-write (pgx asks each server,
// through its PgBouncer, whether it takes writes), database.notifyURL the
// multi-host URL of the servers themselves for LISTEN.
func TestPostgresFailoverPgBouncer(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("pgbouncer"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("pgbouncer is not installed and CI=true: %v", err)
		}
		t.Skipf("pgbouncer is not installed: %v", err)
	}
	// A quick promotion: the leases outlive it and are renewed.
	runFailover(t, true, 2*time.Second)
}

// failoverURL is the multi-host URL of db on ports.
func failoverURL(db string, ports ...int) string {
	var hosts []string
	for _, p := range ports {
		hosts = append(hosts, fmt.Sprintf("127.0.0.1:%d", p))
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/" + db +
		"?sslmode=disable&connect_timeout=2&target_session_attrs=read-write"
}

// startPgBouncer starts an instance of tests/pgbouncer.sh in dir on port
// in front of the server on serverPort, stopped in t.Cleanup.
func startPgBouncer(t *testing.T, dir string, port, serverPort int) {
	t.Helper()
	env := append(os.Environ(), "PGBOUNCER_DIR="+dir, fmt.Sprintf("PGBOUNCER_PORT=%d", port),
		fmt.Sprintf("PGBOUNCER_SERVER_PORT=%d", serverPort), "PGBOUNCER_DATABASE=bc")
	script, err := filepath.Abs("pgbouncer.sh") // go test runs in tests/
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(script, "start")
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tests/pgbouncer.sh start (port %d): %v\n%s", port, err, out)
	}
	t.Cleanup(func() {
		cmd := exec.Command(script, "stop")
		cmd.Env = env
		_ = cmd.Run()
	})
}

// runFailover runs the scenario, through PgBouncer when bouncer is set,
// promoting the standby promoteAfter after the kill.
func runFailover(t *testing.T, bouncer bool, promoteAfter time.Duration) {
	ctx := context.Background()
	began := time.Now()
	pair := newPGPair(t, "bc")
	p1, p2 := pair.ports()
	direct := failoverURL("bc", p1, p2)
	url := direct
	d := &splitDeployment{t: t, tag: fmt.Sprintf("%08x", rand.Uint32()), bin: testenv.Binary(t, "better-compute")}
	d.env = []string{"BETTER_COMPUTE_SECRET=" + testSecret}
	if bouncer {
		b1, b2 := freePort(t), freePort(t)
		startPgBouncer(t, filepath.Join(pair.dir, "bouncer-1"), b1, p1)
		startPgBouncer(t, filepath.Join(pair.dir, "bouncer-2"), b2, p2)
		url = failoverURL("bc", b1, b2) + "&default_query_exec_mode=exec"
	}
	// The connections that LISTEN name themselves: through PgBouncer they
	// are the notifyURL's (every process's), else the gateway's own.
	listenApp := d.app("gateway-1")
	if bouncer {
		listenApp = "listen." + d.tag
		d.env = append(d.env, config.EnvDatabaseNotifyURL+"="+direct+"&application_name="+listenApp)
	}
	d.url = url
	sinkFile := filepath.Join(t.TempDir(), "events.jsonl")
	tlsFiles := initPostgresPKI(t, append(slices.Clone(d.env), config.EnvDatabaseURL+"="+url))
	d.cfgFile = testenv.WriteFile(t, "better-compute.yaml", splitConfig+tlsFiles+
		fmt.Sprintf("sinks:\n  files:\n    - name: %s\n      path: %s\n", failoverSink, sinkFile))
	installWriteLog(t, pair.primary.url("bc"))

	st, err := backend.Open(ctx, direct+"&application_name=e2e-test", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d.st = st
	d.db = connectFailover(t, direct)

	apiProc := d.start("api", "api")
	gw := &splitProc{name: "gateway-1", p: d.start("gateway-1", "gateway")}
	d.gateways = []*splitProc{gw}
	for i := range 2 {
		name := fmt.Sprintf("worker-%d", i+1)
		d.workers = append(d.workers, &splitProc{name: name, p: d.start(name, workerRoles)})
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range append([]*splitProc{{name: "api", p: apiProc}, gw}, d.workers...) {
				t.Logf("%s's output (last 8 KiB):\n%s", p.name, tail(p.p.Output(), 8<<10))
			}
		}
	})
	apiBase := "http://" + apiProc.WaitLine(`msg="API listening" addr=(\S+)`, 60*time.Second)[1]
	d.api = apiBase + "/api"
	gw.url = gw.p.WaitLine(`msg="Gateway listening" .*public_url=(\S+)`, 60*time.Second)[1]
	for _, w := range d.workers {
		w.id = w.p.WaitLine(`msg="Worker roles running".* worker=(\S+)`, 60*time.Second)[1]
	}
	eventually(t, 20*time.Second, func() bool {
		gws, err := d.st.GatewayList(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range gws {
			if row.Address == gw.url {
				gw.id = row.ID
			}
		}
		return gw.id != ""
	}, func() string { return "the gateway has no row in gateways" })
	secret, _, err := iam.Create(ctx, d.st, iam.CreateParams{Role: store.RoleAdmin, Description: "e2e failover"})
	if err != nil {
		t.Fatal(err)
	}
	d.admin = &client.Client{BaseURL: d.api, Token: secret}

	fleet := d.joinFleet(ctx, failoverDaemons)
	var nodes []string
	for _, dm := range fleet.daemons {
		nodes = append(nodes, dm.NodeID())
	}
	d.waitShards(60*time.Second, d.workers[0].id, d.workers[1].id)
	d.waitListen(listenApp)
	stream := startRetryingCommands(d.admin, nodes, 50*time.Millisecond)
	eventually(t, 60*time.Second, func() bool { return stream.accepted() >= 100 },
		func() string { return fmt.Sprintf("only %d commands accepted before the failover", stream.accepted()) })
	t.Logf("deployment up on %s, %d daemons connected, %d commands accepted %v after start",
		map[bool]string{false: "a multi-host URL", true: "two PgBouncers on a multi-host URL"}[bouncer],
		fleet.connected(), stream.accepted(), time.Since(began).Round(time.Millisecond))

	// kill -9 of the primary, then the standby is promoted; /readyz is
	// watched all along.
	watch := watchReady(apiBase + "/readyz")
	acceptedBefore := stream.accepted()
	killed := time.Now()
	pair.killPrimary()
	eventually(t, 30*time.Second, func() bool { return watch.notReadySince(killed) },
		func() string { return "/readyz did not answer not ready after the primary's kill -9" })
	time.Sleep(time.Until(killed.Add(promoteAfter))) // the HA tool's detection time, or the operator's
	pair.promote()
	t.Logf("primary killed; standby promoted %v later", pair.promoted.Sub(killed).Round(time.Millisecond))
	readyAt := watch.waitReady(t, pair.promoted, 120*time.Second)
	acceptedAt := stream.waitAcceptedAfter(t, pair.promoted, 120*time.Second)
	d.db.Close(ctx)
	d.db = connectFailover(t, direct)
	d.waitListen(listenApp)
	listenAt := time.Now()
	reasons := watch.stop()
	t.Logf("failover: /readyz not ready from %v after the kill, ready again %v after the promotion; first command accepted %v after it; gateway LISTENing on the new primary within %v",
		watch.firstNotReady.Sub(killed).Round(time.Millisecond), readyAt.Sub(pair.promoted).Round(time.Millisecond),
		acceptedAt.Sub(pair.promoted).Round(time.Millisecond), listenAt.Sub(pair.promoted).Round(time.Millisecond))
	for _, r := range reasons {
		t.Logf("/readyz said meanwhile: %s", r)
	}
	if !slices.ContainsFunc(reasons, func(r string) bool { return strings.HasPrefix(r, "not ready: database unavailable: ") }) {
		t.Errorf("/readyz said %q while the database failed over, want not ready: database unavailable: and the reason", reasons)
	}

	// Steady load after the failover, then every check on the new
	// primary's record.
	eventually(t, 60*time.Second, func() bool { return stream.accepted() >= acceptedBefore+200 },
		func() string {
			return fmt.Sprintf("%d commands accepted since the failover, want 200", stream.accepted()-acceptedBefore)
		})
	res := stream.stop()
	t.Logf("commands.create: %d calls accepted (%d commands), %d retried with their idempotency key (%d retries in all), %d gave up",
		res.calls, len(res.ids), res.retriedCalls, res.retries, len(res.errs))
	for i, err := range res.errs {
		if i < 5 {
			t.Errorf("commands.create gave up after retries: %v", err)
		}
	}
	d.checkFailoverCommands(res.ids)
	d.checkFailoverFencing()
	d.checkSinkComplete(sinkFile)
	t.Logf("%s done in %v", t.Name(), time.Since(began).Round(time.Millisecond))
}

// connectFailover opens the test's own connection on url (multi-host).
func connectFailover(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	var conn *pgx.Conn
	var err error
	eventually(t, 30*time.Second, func() bool {
		conn, err = pgx.Connect(context.Background(), url+"&application_name=e2e-test")
		return err == nil
	}, func() string { return fmt.Sprintf("connect to %s: %v", url, err) })
	return conn
}

// waitListen waits until a session named app LISTENs on the wake channel
// (through PgBouncer the api's listener has the name too).
func (d *splitDeployment) waitListen(app string) {
	d.t.Helper()
	eventually(d.t, 60*time.Second, func() bool {
		var n int
		err := d.db.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND query IN ('LISTEN better_compute_wake', 'LISTEN "better_compute_wake"')`, app).Scan(&n)
		return err == nil && n >= 1
	}, func() string { return "no LISTEN better_compute_wake by " + app })
}

// readyWatch polls /readyz every 100 ms and records what it answers.
type readyWatch struct {
	mu            sync.Mutex
	firstNotReady time.Time
	lastReady     time.Time // the last 200 seen
	reasons       []string  // distinct not-ready bodies
	cancel        context.CancelFunc
	done          chan struct{}
}

func watchReady(url string) *readyWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &readyWatch{cancel: cancel, done: make(chan struct{})}
	hc := &http.Client{Timeout: 5 * time.Second}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			at := time.Now()
			code, body := 0, ""
			if resp, err := hc.Get(url); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				code, body = resp.StatusCode, strings.TrimSpace(string(b))
			} else {
				body = err.Error()
			}
			w.mu.Lock()
			if code == http.StatusOK {
				w.lastReady = at
			} else {
				if w.firstNotReady.IsZero() {
					w.firstNotReady = at
				}
				if !slices.Contains(w.reasons, body) && len(w.reasons) < 8 {
					w.reasons = append(w.reasons, body)
				}
			}
			w.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return w
}

// notReadySince reports whether /readyz answered not ready after at.
func (w *readyWatch) notReadySince(at time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.firstNotReady.IsZero() && !w.firstNotReady.Before(at)
}

// waitReady waits until /readyz answers 200 after at and returns when.
func (w *readyWatch) waitReady(t *testing.T, at time.Time, timeout time.Duration) time.Time {
	t.Helper()
	var ready time.Time
	eventually(t, timeout, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		ready = w.lastReady
		return ready.After(at)
	}, func() string { return fmt.Sprintf("/readyz not ready again %v after the promotion", timeout) })
	return ready
}

func (w *readyWatch) stop() []string {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.reasons)
}

// retryingStream creates commands through the API at a steady rate, each
// call for one or two nodes with an idempotency key of its own, and
// retries a call that fails with the same key (with back-off) until it is
// accepted or a minute has passed.
type retryingStream struct {
	mu           sync.Mutex
	ids          []string
	acceptedAt   []time.Time
	calls        int
	retriedCalls int
	retries      int
	errs         []error

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startRetryingCommands(c *client.Client, targets []string, interval time.Duration) *retryingStream {
	ctx, cancel := context.WithCancel(context.Background())
	s := &retryingStream{cancel: cancel}
	prefix := fmt.Sprintf("failover-%08x-", rand.Uint32())
	s.wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var nodes []string
			for range 1 + rand.IntN(2) {
				nodes = append(nodes, targets[rand.IntN(len(targets))])
			}
			nodes = slices.Compact(slices.Sorted(slices.Values(nodes)))
			key := fmt.Sprintf("%s%d", prefix, n)
			s.wg.Go(func() { s.create(ctx, c, key, nodes) })
		}
	})
	return s
}

func (s *retryingStream) create(ctx context.Context, c *client.Client, key string, nodes []string) {
	deadline := time.Now().Add(time.Minute)
	backoff := 100 * time.Millisecond
	for try := 0; ; try++ {
		resp := &apiv1.CreateCommandsResponse{}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := c.Call(cctx, "commands.create", &apiv1.CreateCommandsRequest{NodeIds: nodes, Kind: "exec", IdempotencyKey: key,
			Exec: &apiv1.ExecSpec{Argv: []string{"true"}}, Timeout: durationpb.New(failoverCommandTimeout)}, resp)
		cancel()
		s.mu.Lock()
		if err == nil {
			s.calls++
			if try > 0 {
				s.retriedCalls++
				s.retries += try
			}
			for _, cmd := range resp.GetCommands() {
				s.ids = append(s.ids, cmd.GetId())
			}
			s.acceptedAt = append(s.acceptedAt, time.Now())
			s.mu.Unlock()
			return
		}
		var apiErr *client.Error
		if errors.As(err, &apiErr) && (apiErr.Code == "INVALID_ARGUMENT" || apiErr.Code == "PERMISSION_DENIED" || apiErr.Code == "UNAUTHENTICATED") {
			s.errs = append(s.errs, fmt.Errorf("%s: %w", key, err))
			s.mu.Unlock()
			return
		}
		if time.Now().After(deadline) {
			s.errs = append(s.errs, fmt.Errorf("%s after %d tries: %w", key, try+1, err))
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		time.Sleep(backoff/2 + rand.N(backoff))
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (s *retryingStream) accepted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.acceptedAt)
}

// waitAcceptedAfter waits until a call is accepted after at.
func (s *retryingStream) waitAcceptedAfter(t *testing.T, at time.Time, timeout time.Duration) time.Time {
	t.Helper()
	var first time.Time
	eventually(t, timeout, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, a := range s.acceptedAt {
			if a.After(at) && (first.IsZero() || a.Before(first)) {
				first = a
			}
		}
		return !first.IsZero()
	}, func() string { return "no commands.create call accepted after the promotion" })
	return first
}

// streamResult is what a retryingStream did.
type streamResult struct {
	ids                          []string
	calls, retriedCalls, retries int
	errs                         []error
}

// stop stops the stream, lets the calls under way finish, and returns
// what it did.
func (s *retryingStream) stop() streamResult {
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return streamResult{ids: slices.Clone(s.ids), calls: s.calls, retriedCalls: s.retriedCalls, retries: s.retries, errs: slices.Clone(s.errs)}
}

// checkFailoverCommands waits until no command is left non-terminal and
// checks that every accepted command is in the table and every command
// there moved into a terminal state exactly once and never out of one,
// and that no idempotency key made two commands for one node.
func (d *splitDeployment) checkFailoverCommands(ids []string) {
	d.t.Helper()
	ctx := context.Background()
	states := d.terminalStates(failoverCommandTimeout + 30*time.Second)
	missing := 0
	for _, id := range ids {
		if _, ok := states[id]; !ok {
			if missing++; missing <= 10 {
				d.t.Errorf("command %s, accepted by the API, is not in commands on the new primary", id)
			}
		}
	}
	var dup int
	if err := d.db.QueryRow(ctx, `SELECT count(*) FROM (SELECT idempotency_key, node_id FROM commands
		WHERE idempotency_key IS NOT NULL GROUP BY 1, 2 HAVING count(*) > 1) x`).Scan(&dup); err != nil {
		d.t.Fatal(err)
	}
	if dup > 0 {
		d.t.Errorf("%d (idempotency key, node) pairs have more than one command: a retried create ran twice", dup)
	}
	into, outOf := map[string]int{}, map[string]int{}
	for _, lw := range d.writes(`tbl = 'commands'`) {
		wasTerminal := lw.OldVal != nil && store.IsTerminal(*lw.OldVal)
		isTerminal := lw.NewVal != nil && store.IsTerminal(*lw.NewVal)
		if isTerminal && !wasTerminal {
			into[lw.Key]++
		}
		if wasTerminal {
			outOf[lw.Key]++
		}
	}
	tally, bad := map[string]int{}, 0
	for id, state := range states {
		tally[state]++
		if into[id] != 1 || outOf[id] != 0 {
			if bad++; bad <= 10 {
				d.t.Errorf("command %s: state %s, %d transitions into a terminal state and %d out of one; want 1 and 0", id, state, into[id], outOf[id])
			}
		}
	}
	d.t.Logf("commands: %d accepted through the API, %d rows, by state %v; %d missing, %d not ended exactly once", len(ids), len(states), tally, missing, bad)
}

// checkFailoverFencing checks the write log across the failover: no
// lease's epoch went back, and every write of a worker process landed
// while the lease guarding it was held by that worker.
func (d *splitDeployment) checkFailoverFencing() {
	d.t.Helper()
	type change struct {
		at     time.Time
		holder string
		epoch  int64
	}
	history := map[string][]change{}
	raised := 0
	for _, lw := range d.writes(`tbl = 'leases'`) {
		c := change{at: lw.At}
		if lw.NewVal != nil {
			h, e, _ := strings.Cut(*lw.NewVal, "@")
			c.holder = h
			fmt.Sscan(e, &c.epoch)
		}
		if prev := history[lw.Key]; len(prev) > 0 && c.holder != "" {
			if last := prev[len(prev)-1]; c.epoch < last.epoch {
				d.t.Errorf("lease %s went from epoch %d back to %d", lw.Key, last.epoch, c.epoch)
			} else if c.epoch > last.epoch {
				raised++
			}
		}
		history[lw.Key] = append(history[lw.Key], c)
	}
	holderAt := func(lease string, at time.Time) (change, bool) {
		var last change
		found := false
		for _, c := range history[lease] {
			if c.at.After(at) {
				break
			}
			last, found = c, true
		}
		return last, found
	}
	checked := 0
	for _, w := range d.workers {
		for _, lw := range d.writes(`app = $1 AND tbl <> 'leases'`, d.app(w.name)) {
			lease := leaseGuarding(lw)
			if lease == "" {
				continue // a write no lease guards (such as the worker's own row)
			}
			checked++
			if c, ok := holderAt(lease, lw.At); !ok || c.holder != w.id {
				d.t.Errorf("%s wrote %s %s %s at %v while %s was held by %q: a write under a lost lease landed",
					w.name, lw.Op, lw.Table, lw.Key, lw.At, lease, c.holder)
			}
		}
	}
	d.t.Logf("fencing: %d fenced writes of the workers each landed under a lease they held; %d lease takeovers raised an epoch, none went back", checked, raised)
}

// checkSinkComplete waits until the file sink's cursor reaches the last
// outbox entry and checks that the file holds every entry's id up to it.
func (d *splitDeployment) checkSinkComplete(path string) {
	d.t.Helper()
	ctx := context.Background()
	var last, cursor int64
	eventually(d.t, 60*time.Second, func() bool {
		if err := d.db.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM outbox`).Scan(&last); err != nil {
			d.t.Fatal(err)
		}
		var err error
		cursor, err = d.st.OutboxCursor(ctx, failoverSink)
		return err == nil && cursor >= last && last > 0
	}, func() string { return fmt.Sprintf("sink %s at %d of the outbox's %d", failoverSink, cursor, last) })
	var want []string
	for after := int64(0); after < cursor; {
		page, err := d.st.OutboxList(ctx, after, 1000)
		if err != nil {
			d.t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, e := range page {
			if e.ID > cursor {
				break
			}
			var ev struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(events.FromOutbox(e.ID, e.Topic, e.Key, e.Payload, e.CreatedAt), &ev); err != nil {
				d.t.Fatal(err)
			}
			want = append(want, ev.ID)
		}
		after = page[len(page)-1].ID
	}
	f, err := os.Open(path)
	if err != nil {
		d.t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	lines := 0
	for sc.Scan() {
		var ev struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.ID == "" {
			d.t.Fatalf("sink file line %d without an id: %v: %s", lines+1, err, sc.Text())
		}
		seen[ev.ID]++
		lines++
	}
	if err := sc.Err(); err != nil {
		d.t.Fatal(err)
	}
	lost, dups := 0, 0
	for _, id := range want {
		if seen[id] == 0 {
			if lost++; lost <= 10 {
				d.t.Errorf("event %s is not in the sink's file", id)
			}
		}
	}
	for _, n := range seen {
		dups += n - 1
	}
	d.t.Logf("sink %s: %d outbox entries, %d lines in its file, %d delivered more than once (by id), %d lost", failoverSink, len(want), lines, dups, lost)
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
