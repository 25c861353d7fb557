// Command workers measures the worker roles' two costs that grow with a
// deployment: how long the 256 shard leases take to settle on their
// rendezvous owners when a worker joins, leaves or dies, and how fast one
// full pass of the node liveness reconciler goes over N nodes.
//
//	go run ./tests/bench/workers -trials 5 -nodes 10000
//	go run ./tests/bench/workers -shards=false -nodes 10000 -db sqlite
//
// Shards (PostgreSQL only: split roles need it): W in-process shard.Managers
// with the production timings (15 s TTL, 5 s rounds), each with its own
// worker id over one store. A join starts one more; a graceful leave cancels
// one (it releases its shards and leaves workers); a kill -9 cuts one off
// the store first, so it releases nothing and its leases expire. Settled
// means every shard:<n> lease is held, unexpired by the database's clock, by
// shard.Owner(n, live workers), polled every 50 ms. Each join, kill and leave
// comes at a random phase of the managers' 5 s rounds.
//
// Liveness: N nodes (store.NodeUpsert, ready, a session each on one of N /
// 5,000 gateways), every heartbeat written as the gateways write them (one
// SessionHeartbeatBatch per gateway, timed), the 256
// shard leases held by the benchmark, then one liveness.Reconciler pass
// over every shard, three times: every node fresh (no change), every node
// stale (N marked unreachable), every node heartbeating again (N marked
// ready), with one and with three goroutines (three workers' shares).
//
// Sweep (-finished, PostgreSQL): one CommandSweep (what the CommandSweeper
// runs every second) with M finished commands in the table (expired a day
// ago, as the retention window keeps them; vacuumed and analysed, as
// autovacuum leaves the table), best of five; -open-index adds the partial
// index the expiry query can use first.
//
// Enqueue (-enqueue, PostgreSQL): G goroutines create one-node commands
// (store.CommandEnqueue, one outbox entry each) while a reader reads the
// outbox as a sink's dispatcher does, for G in 1, 8 and 16.
//
// Nothing is asserted; it prints.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/reconcilers/liveness"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
)

// nodeSessionTx is what making a bench node with its session writes.
type nodeSessionTx interface {
	NodeUpsert(ctx context.Context, p *store.NodeUpsertParams) (*store.Node, error)
	SessionOpen(ctx context.Context, p *store.SessionOpenParams) (session, previous *store.Session, err error)
	NodeSetState(ctx context.Context, id, state string) error
}

func main() {
	db := flag.String("db", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL server URL (a fresh schema is made and dropped); \"sqlite\" for the embedded store (liveness only)")
	shards := flag.Bool("shards", true, "measure shard settling (PostgreSQL only)")
	workers := flag.Int("workers", 3, "workers running before each join")
	trials := flag.Int("trials", 5, "joins, kills and leaves measured")
	nodes := flag.Int("nodes", 10000, "nodes for the liveness pass; 0 skips it")
	finished := flag.String("finished", "", "comma list of finished-command counts to time CommandSweep at (PostgreSQL), such as 0,1000000,3000000")
	openIndex := flag.Bool("open-index", false, "with -finished: first add a partial index on the deadline of commands not yet terminal")
	enqueue := flag.Bool("enqueue", false, "time concurrent one-node command enqueues with an outbox reader (PostgreSQL)")
	flag.Parse()
	if err := run(*db, *shards, *workers, *trials, *nodes); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if err := runStore(*db, *finished, *openIndex, *enqueue); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(db string, shards bool, workers, trials, nodes int) error {
	ctx := context.Background()
	if shards && db != "sqlite" {
		st, cleanup, err := openStore(ctx, db)
		if err != nil {
			return err
		}
		err = benchShards(ctx, st, workers, trials)
		cleanup()
		if err != nil {
			return err
		}
	}
	if nodes > 0 {
		st, cleanup, err := openStore(ctx, db)
		if err != nil {
			return err
		}
		defer cleanup()
		return benchLiveness(ctx, st, nodes)
	}
	return nil
}

// runStore runs the sweep and enqueue measurements asked for.
func runStore(db, finished string, openIndex, enqueue bool) error {
	ctx := context.Background()
	if finished != "" && db != "sqlite" {
		var sizes []int
		for f := range strings.SplitSeq(finished, ",") {
			var n int
			if _, err := fmt.Sscan(f, &n); err != nil {
				return fmt.Errorf("-finished: %w", err)
			}
			sizes = append(sizes, n)
		}
		st, url, cleanup, err := openStoreURL(ctx, db)
		if err != nil {
			return err
		}
		if openIndex {
			err = createOpenIndex(ctx, url)
		}
		if err == nil {
			err = benchSweep(ctx, st, url, sizes)
		}
		cleanup()
		if err != nil {
			return err
		}
	}
	if enqueue && db != "sqlite" {
		st, cleanup, err := openStore(ctx, db)
		if err != nil {
			return err
		}
		defer cleanup()
		return benchEnqueue(ctx, st)
	}
	return nil
}

// openStore opens a migrated store: a fresh PostgreSQL schema, or a fresh
// SQLite file.
func openStore(ctx context.Context, db string) (store.Store, func(), error) {
	st, _, cleanup, err := openStoreURL(ctx, db)
	return st, cleanup, err
}

// openStoreURL is openStore that also returns the PostgreSQL URL of the
// fresh schema ("" for SQLite).
func openStoreURL(ctx context.Context, db string) (store.Store, string, func(), error) {
	if db == "sqlite" {
		dir, err := os.MkdirTemp("", "bench-workers-")
		if err != nil {
			return nil, "", nil, err
		}
		st, err := sqlite.Open(ctx, filepath.Join(dir, "state.db"))
		if err != nil {
			return nil, "", nil, err
		}
		_, err = st.Migrate(ctx)
		return st, "", func() { st.Close(); os.RemoveAll(dir) }, err
	}
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		return nil, "", nil, err
	}
	schema := "bench_" + strings.ToLower(rand.Text()[:10])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, "", nil, err
	}
	sep := "?"
	if strings.Contains(db, "?") {
		sep = "&"
	}
	cleanup := func() {
		conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		conn.Close(context.Background())
	}
	url := db + sep + "search_path=" + schema
	st, err := postgres.Open(ctx, url)
	if err != nil {
		cleanup()
		return nil, "", nil, err
	}
	if _, err := st.Migrate(ctx); err != nil {
		st.Close()
		cleanup()
		return nil, "", nil, err
	}
	return st, url, func() { st.Close(); cleanup() }, nil
}

// errKilled is what a killed worker's store calls return.
var errKilled = errors.New("worker killed")

// killable is a worker's view of the store that can be cut off at once, as
// kill -9 cuts a process off: after kill, every call the shard manager
// makes fails, so it renews, releases and deletes nothing.
type killable struct {
	store.Store
	dead atomic.Bool
}

func (k *killable) WorkerHeartbeat(ctx context.Context, p *store.WorkerHeartbeatParams) (*store.Worker, error) {
	if k.dead.Load() {
		return nil, errKilled
	}
	return k.Store.WorkerHeartbeat(ctx, p)
}

func (k *killable) WorkerList(ctx context.Context, liveWithin time.Duration, now *time.Time) ([]*store.Worker, error) {
	if k.dead.Load() {
		return nil, errKilled
	}
	return k.Store.WorkerList(ctx, liveWithin, now)
}

func (k *killable) WorkerDelete(ctx context.Context, id string) error {
	if k.dead.Load() {
		return errKilled
	}
	return k.Store.WorkerDelete(ctx, id)
}

func (k *killable) LeaseAcquire(ctx context.Context, p *store.LeaseAcquireParams) (*store.Lease, bool, error) {
	if k.dead.Load() {
		return nil, false, errKilled
	}
	return k.Store.LeaseAcquire(ctx, p)
}

func (k *killable) LeaseRenew(ctx context.Context, p *store.LeaseRenewParams) (*store.Lease, bool, error) {
	if k.dead.Load() {
		return nil, false, errKilled
	}
	return k.Store.LeaseRenew(ctx, p)
}

func (k *killable) LeaseRelease(ctx context.Context, name, holder string, epoch int64) error {
	if k.dead.Load() {
		return errKilled
	}
	return k.Store.LeaseRelease(ctx, name, holder, epoch)
}

func (k *killable) LeaseList(ctx context.Context, prefix string) ([]*store.Lease, error) {
	if k.dead.Load() {
		return nil, errKilled
	}
	return k.Store.LeaseList(ctx, prefix)
}

// worker is one in-process shard manager.
type worker struct {
	id     string
	st     *killable
	cancel context.CancelFunc
	done   chan struct{}
}

var quiet = slog.New(slog.DiscardHandler)

func startWorker(st store.Store, n int) (*worker, error) {
	w := &worker{id: fmt.Sprintf("bench-worker-%02d", n), st: &killable{Store: st}, done: make(chan struct{})}
	m, err := shard.New(shard.Config{WorkerID: w.id, Roles: []string{"controllers"}}, w.st, quiet)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go func() { defer close(w.done); m.Run(ctx) }()
	return w, nil
}

// kill cuts w off the store, then stops it: it releases nothing.
func (w *worker) kill() {
	w.st.dead.Store(true)
	w.cancel()
	<-w.done
}

// leave stops w gracefully: it releases its shards and leaves workers.
func (w *worker) leave() {
	w.cancel()
	<-w.done
}

// settled reports whether every shard is held, unexpired by the database's
// clock, by its rendezvous owner among live.
func settled(ctx context.Context, st store.Store, live []*worker) (bool, error) {
	ids := make([]string, len(live))
	for i, w := range live {
		ids[i] = w.id
	}
	now, err := st.Now(ctx)
	if err != nil {
		return false, err
	}
	leases, err := st.LeaseList(ctx, "shard:")
	if err != nil {
		return false, err
	}
	holder := map[string]*store.Lease{}
	for _, l := range leases {
		holder[l.Name] = l
	}
	for n := range store.Shards {
		l := holder[shard.LeaseName(n)]
		if l == nil || l.Holder != shard.Owner(n, ids) || !l.ExpiresAt.After(now) {
			return false, nil
		}
	}
	return true, nil
}

// waitSettled polls settled every 50 ms and returns the time since start.
func waitSettled(ctx context.Context, st store.Store, live []*worker, start time.Time) (time.Duration, error) {
	deadline := start.Add(2 * time.Minute)
	for {
		ok, err := settled(ctx, st, live)
		if err != nil {
			return 0, err
		}
		if ok {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("shards not settled on %d workers within 2 min", len(live))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func benchShards(ctx context.Context, st store.Store, workers, trials int) error {
	fmt.Printf("shards: %d workers, shard.Manager defaults (TTL 15 s, rounds every 5 s), %s\n", workers, st.Dialect())
	next := 0
	var live []*worker
	defer func() {
		for _, w := range live {
			w.leave()
		}
	}()
	start := time.Now()
	for range workers {
		w, err := startWorker(st, next)
		if err != nil {
			return err
		}
		next++
		live = append(live, w)
	}
	took, err := waitSettled(ctx, st, live, start)
	if err != nil {
		return err
	}
	fmt.Printf("  cold start of %d workers at once: settled in %v\n", workers, took.Round(time.Millisecond))
	var joins, kills, leaves []time.Duration
	for i := range trials {
		// A worker joins, at a random phase of the others' rounds (each
		// process's rounds start when it does).
		time.Sleep(mrand.N(5 * time.Second))
		start := time.Now()
		w, err := startWorker(st, next)
		if err != nil {
			return err
		}
		next++
		live = append(live, w)
		took, err := waitSettled(ctx, st, live, start)
		if err != nil {
			return err
		}
		joins = append(joins, took)
		// One is killed (the oldest, so the newcomer keeps its shards), at
		// a random phase of its rounds.
		time.Sleep(mrand.N(5 * time.Second))
		victim := live[0]
		live = live[1:]
		start = time.Now()
		victim.kill()
		took, err = waitSettled(ctx, st, live, start)
		if err != nil {
			return err
		}
		kills = append(kills, took)
		fmt.Printf("  trial %d: join settled in %v, kill -9 settled in %v\n", i+1, joins[i].Round(time.Millisecond), took.Round(time.Millisecond))
	}
	for i := range trials {
		w, err := startWorker(st, next)
		if err != nil {
			return err
		}
		next++
		live = append(live, w)
		if _, err := waitSettled(ctx, st, live, time.Now()); err != nil {
			return err
		}
		time.Sleep(mrand.N(5 * time.Second))
		leaver := live[len(live)-1]
		live = live[:len(live)-1]
		start := time.Now()
		leaver.leave()
		took, err := waitSettled(ctx, st, live, start)
		if err != nil {
			return err
		}
		leaves = append(leaves, took)
		fmt.Printf("  trial %d: graceful leave settled in %v\n", i+1, took.Round(time.Millisecond))
	}
	fmt.Printf("  join %d → %d workers: %s\n", workers, workers+1, spread(joins))
	fmt.Printf("  kill -9 %d → %d workers: %s\n", workers+1, workers, spread(kills))
	fmt.Printf("  graceful leave %d → %d workers: %s\n", workers+1, workers, spread(leaves))
	return nil
}

// spread formats min, median and max.
func spread(d []time.Duration) string {
	s := slices.Clone(d)
	slices.Sort(s)
	return fmt.Sprintf("min %v, median %v, max %v (%d trials)", s[0].Round(10*time.Millisecond),
		s[len(s)/2].Round(10*time.Millisecond), s[len(s)-1].Round(10*time.Millisecond), len(s))
}

func benchLiveness(ctx context.Context, st store.Store, n int) error {
	fmt.Printf("liveness: %d nodes, %s\n", n, st.Dialect())
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "bench", Region: "default"})
	if err != nil {
		return err
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "bench", SiteID: site.ID})
	if err != nil {
		return err
	}
	// Sessions are spread over gateways of 5,000 (the default maxStreams).
	const perGateway = 5000
	gatewayOf := func(i int) string { return fmt.Sprintf("gw_bench%03d", i/perGateway) }
	sessions := make([]string, n)
	start := time.Now()
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := g; i < n; i += 4 {
				id := fmt.Sprintf("node_bench%06d", i)
				err := store.InTx(ctx, st, func(tx nodeSessionTx) error {
					if _, err := tx.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID,
						Hostname: fmt.Sprintf("n%06d", i), MachineID: id}); err != nil {
						return err
					}
					s, _, err := tx.SessionOpen(ctx, &store.SessionOpenParams{NodeID: id, SessionID: "sess_" + id, GatewayID: gatewayOf(i)})
					if err != nil {
						return err
					}
					sessions[i] = s.SessionID
					return tx.NodeSetState(ctx, id, store.NodeReady)
				})
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	fmt.Printf("  inserted %d nodes with sessions in %v\n", n, time.Since(start).Round(time.Millisecond))
	// heartbeat writes every node's heartbeat as the gateways do: one
	// SessionHeartbeatBatch per gateway for all of its sessions.
	heartbeat := func(at *time.Time) error {
		for i := 0; i < n; i += perGateway {
			if _, err := st.SessionHeartbeatBatch(ctx, gatewayOf(i), sessions[i:min(i+perGateway, n)], at); err != nil {
				return err
			}
		}
		return nil
	}
	for range 3 {
		start := time.Now()
		if err := heartbeat(nil); err != nil {
			return err
		}
		took := time.Since(start)
		fmt.Printf("  heartbeat writes: %d heartbeats on %d gateway(s), one batch per gateway, in %v (%.0f heartbeats/s)\n",
			n, (n+perGateway-1)/perGateway, took.Round(time.Millisecond), float64(n)/took.Seconds())
	}
	fences := make([]store.Fence, store.Shards)
	all := make([]int, store.Shards)
	for s := range store.Shards {
		all[s] = s
		l, ok, err := st.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: shard.LeaseName(s), Holder: "bench", TTL: time.Hour})
		if err != nil || !ok {
			return fmt.Errorf("acquire %s: %v", shard.LeaseName(s), err)
		}
		fences[s] = store.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch}
	}
	changes := atomic.Int64{}
	r := liveness.New(liveness.Config{OnChange: func(string, string) { changes.Add(1) }}, st, quiet)
	pass := func(workers int) (time.Duration, int64, error) {
		changes.Store(0)
		start := time.Now()
		// A round as shard.RunReconcilers runs it: one read for every
		// shard, then each shard's pass.
		due, err := r.Due(ctx, start, all)
		if err != nil {
			return 0, 0, err
		}
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Go(func() {
				for i := w; i < len(due); i += workers {
					s := due[i]
					if err := r.Reconcile(ctx, s, fences[s]); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		return time.Since(start), changes.Load(), <-errs
	}
	past := time.Now().Add(-time.Hour)
	for _, workers := range []int{1, 3} {
		for _, step := range []struct {
			name   string
			before func() error
		}{
			{"every node fresh", func() error { return heartbeat(nil) }},
			{"every node stale", func() error { return heartbeat(&past) }},
			{"every node back", func() error { return heartbeat(nil) }},
		} {
			if err := step.before(); err != nil {
				return err
			}
			took, changed, err := pass(workers)
			if err != nil {
				return err
			}
			fmt.Printf("  one pass over 256 shards, %d goroutine(s), %s: %v, %d transitions, %.0f nodes/s\n",
				workers, step.name, took.Round(time.Millisecond), changed, float64(n)/took.Seconds())
		}
	}
	return nil
}

// openIndexDDL is the partial index the sweep's expiry query can use: its
// predicate is the query's.
const openIndexDDL = `CREATE INDEX IF NOT EXISTS commands_open_deadline_idx ON commands (deadline_at)
	WHERE state NOT IN ('succeeded', 'failed', 'cancelled', 'expired', 'lost')`

func createOpenIndex(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, openIndexDDL)
	fmt.Println("sweep: with", strings.Join(strings.Fields(openIndexDDL), " "))
	return err
}

func benchSweep(ctx context.Context, st store.Store, url string, sizes []int) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	fmt.Printf("sweep: CommandSweep with finished commands in the table, %s\n", st.Dialect())
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "bench", Region: "default"})
	if err != nil {
		return err
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "bench", SiteID: site.ID})
	if err != nil {
		return err
	}
	var ids []string
	for i := range 1000 {
		n, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: fmt.Sprintf("node_sweep%04d", i), PoolID: pool.ID,
			Hostname: fmt.Sprintf("s%04d", i), MachineID: fmt.Sprintf("s%04d", i)})
		if err != nil {
			return err
		}
		ids = append(ids, n.ID)
	}
	have := 0
	for _, total := range sizes {
		// Finished commands, a day old, as the retention window keeps
		// them: enqueued 1,000 to a statement with a deadline long past,
		// then ended expired by sweeps.
		day := time.Now().Add(-24 * time.Hour)
		for have < total {
			batch := min(1000, total-have)
			if _, err := st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: ids[:batch], Kind: "exec",
				SessionSpec: []byte(`{}`), Timeout: time.Minute, Now: &day}); err != nil {
				return err
			}
			have += batch
			if have%100000 == 0 || have == total {
				if _, err := st.CommandSweep(ctx, &store.CommandSweepParams{LostAfter: 30 * time.Second}); err != nil {
					return err
				}
			}
		}
		// As autovacuum leaves the table in a steady state.
		if _, err := conn.Exec(ctx, `VACUUM ANALYZE commands`); err != nil {
			return err
		}
		best := time.Hour
		for range 5 {
			start := time.Now()
			if _, err := st.CommandSweep(ctx, &store.CommandSweepParams{LostAfter: 30 * time.Second}); err != nil {
				return err
			}
			best = min(best, time.Since(start))
		}
		fmt.Printf("  %d finished commands: one CommandSweep %v (best of 5)\n", total, best.Round(10*time.Microsecond))
	}
	return nil
}

func benchEnqueue(ctx context.Context, st store.Store) error {
	fmt.Printf("enqueue: one-node CommandEnqueue from G goroutines, one outbox reader, %s\n", st.Dialect())
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "bench", Region: "default"})
	if err != nil {
		return err
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "bench", SiteID: site.ID})
	if err != nil {
		return err
	}
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_enqueue", PoolID: pool.ID, Hostname: "e", MachineID: "e"}); err != nil {
		return err
	}
	for _, g := range []int{1, 8, 16} {
		const total = 3000
		stop := make(chan struct{})
		var reads atomic.Int64
		var reader sync.WaitGroup
		reader.Go(func() {
			var cursor int64
			for {
				select {
				case <-stop:
					return
				default:
				}
				es, err := st.OutboxList(ctx, cursor, 100)
				if err != nil {
					return
				}
				reads.Add(1)
				if len(es) > 0 {
					cursor = es[len(es)-1].ID
				} else {
					time.Sleep(time.Millisecond)
				}
			}
		})
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, g)
		for w := range g {
			wg.Go(func() {
				for i := w; i < total; i += g {
					if _, err := st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_enqueue"}, Kind: "exec",
						SessionSpec: []byte(`{}`), Timeout: time.Minute}); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		took := time.Since(start)
		close(stop)
		reader.Wait()
		close(errs)
		if err := <-errs; err != nil {
			return err
		}
		fmt.Printf("  %2d goroutines: %.0f enqueues/s (%d outbox reads meanwhile)\n", g, total/took.Seconds(), reads.Load())
	}
	return nil
}
