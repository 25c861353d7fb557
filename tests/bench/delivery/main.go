// Command delivery measures commit-to-delivery latency of events to a
// webhook sink while 1,000 FakeDaemons generate them: a real gateway and
// the sinks role (workers.Run with one configured webhook, as serve runs
// it) in this process, on PostgreSQL, and N FakeDaemons holding sessions
// on that gateway, each sending a GPU XID event at a steady rate overall
// (every daemon one event per N/rate seconds, phases spread evenly). The
// gateway writes each event with its gpu.health-changed outbox row in one
// transaction; the dispatcher delivers it to a webhook on loopback in this
// process that checks each request's signature and records, per event,
// the time from its CloudEvents `time` attribute (taken in the
// transaction that wrote it) to its arrival, and from the daemon's send.
//
//	go run ./tests/bench/delivery -n 1000 -rate 200 -seconds 30
//
// It prints the event rate and the p50, p99 and max of both latencies.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/gateway"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/reconcilers/sinks"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/workers"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

func main() {
	n := flag.Int("n", 1000, "FakeDaemons")
	rate := flag.Int("rate", 200, "events per second over the whole fleet (at most 1 per daemon per second: the gateway's per-session write rate)")
	seconds := flag.Int("seconds", 30, "seconds of events")
	db := flag.String("db", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL server URL (a fresh schema is made and dropped)")
	pool := flag.Int("pool", 0, "the store's most connections (pool_max_conns), which the gateway and the sink share; 0: pgx's default, max(4, CPUs)")
	flag.Parse()
	if *rate < 1 || *rate > *n || *seconds < 1 {
		fmt.Fprintln(os.Stderr, "bench: want 1 <= -rate <= -n and -seconds >= 1")
		os.Exit(2)
	}
	if err := run(*n, *rate, *seconds, *db, *pool); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// openStore opens a fresh schema on db; the returned function drops it.
func openStore(ctx context.Context, db string, pool int) (store.Store, func(), error) {
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	schema := "bench_" + strings.ToLower(rand.Text()[:10])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, nil, err
	}
	url := db + cmp.Or(map[bool]string{true: "&"}[strings.Contains(db, "?")], "?") + "search_path=" + schema
	if pool > 0 {
		url += fmt.Sprintf("&pool_max_conns=%d", pool)
	}
	st, err := postgres.Open(ctx, url)
	return st, func() {
		if st != nil {
			st.Close()
		}
		conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		conn.Close(context.Background())
	}, err
}

// arrivals records the webhook's receipts of the benchmark's events.
type arrivals struct {
	mu sync.Mutex
	// sent is when each event's daemon sent it, by its message.
	sent map[string]time.Time
	// commit and send are the latencies from the envelope's time and from
	// the daemon's send to the receipt, of events sent while recording.
	commit, send []time.Duration
	// other counts the other events delivered (joins, readiness).
	other    atomic.Int64
	received atomic.Int64
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func run(n, rate, seconds int, db string, maxConns int) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, cleanup, err := openStore(ctx, db, maxConns)
	if err != nil {
		return err
	}
	defer cleanup()
	if _, err := st.Migrate(ctx); err != nil {
		return err
	}
	bundle, err := pki.Init(pki.InitOptions{TrustDomain: "bench.local"})
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bench-delivery-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	certFile, keyFile, err := bootstrap.WriteGatewayCert(bundle, dir, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, 0)
	if err != nil {
		return err
	}
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "bench", Region: "default"})
	if err != nil {
		return err
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "bench", SiteID: site.ID})
	if err != nil {
		return err
	}

	// The webhook: checks the signature, records each event's latencies.
	secret := "bench-webhook-signing-secret"
	arr := &arrivals{sent: map[string]time.Time{}}
	var bad atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		now := time.Now()
		ts, _ := strconv.ParseInt(r.Header.Get(sinks.HeaderTimestamp), 10, 64)
		var evs []*events.Envelope
		if err != nil || !sinks.Verify([]byte(secret), ts, body, r.Header.Get(sinks.HeaderSignature)) || json.Unmarshal(body, &evs) != nil {
			bad.Add(1)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		arr.received.Add(int64(len(evs)))
		arr.mu.Lock()
		defer arr.mu.Unlock()
		for _, e := range evs {
			var d events.GPUHealthData
			if e.Type != events.GPUHealthChanged || json.Unmarshal(e.Data, &d) != nil {
				arr.other.Add(1)
				continue
			}
			if at, ok := arr.sent[d.Message]; ok {
				arr.commit = append(arr.commit, now.Sub(e.Time))
				arr.send = append(arr.send, now.Sub(at))
				delete(arr.sent, d.Message)
			}
		}
	}))
	defer hook.Close()

	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, MaxStreams: n + 100,
		HandshakeRate: 2000, HandshakeBurst: 200, MaxConnectingPerSource: 256, MaxQueuedPerSource: 4096,
		JoinRate: 1e6, JoinBurst: 100000}, st, bundle, log)
	if err != nil {
		return err
	}
	gwDone := make(chan error, 1)
	go func() { gwDone <- gw.Run(ctx) }()
	<-gw.Ready()
	// The sinks role as serve runs it: one dispatcher for the configured
	// webhook, taking every event, with its default poll and batch.
	cfg := &config.Config{RolesList: []string{"sinks"},
		Sinks: config.Sinks{Webhooks: []config.WebhookSink{{Name: "bench", URL: hook.URL, Secret: secret}}}}
	workersDone := make(chan error, 1)
	go func() { workersDone <- workers.Run(ctx, cfg, st, workers.Options{}, log) }()

	token, _, err := api.CreateJoinToken(ctx, st, bundle.GatewayPin(), pool.ID, time.Hour, n, "bench", "")
	if err != nil {
		return err
	}
	fleet, err := sim.NewFleet(sim.FleetConfig{GatewayURL: gw.PublicURL(), Token: token, N: n, NoInventory: true,
		Session: session.Config{StartJitter: -1}})
	if err != nil {
		return err
	}
	joinStart := time.Now()
	if err := fleet.Join(ctx); err != nil {
		return err
	}
	fmt.Printf("joined %d FakeDaemons in %v\n", n, time.Since(joinStart).Round(time.Millisecond))
	fleetDone := make(chan error, 1)
	go func() { fleetDone <- fleet.Run(ctx) }()
	// Stop the fleet and the roles before the store closes.
	defer func() { cancel(); <-fleetDone; <-workersDone; <-gwDone }()
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	if err := fleet.WaitFor(wctx, func(s sim.FleetStats) bool { return s.Connected >= n }); err != nil {
		return fmt.Errorf("waiting for sessions: %w", err)
	}
	// The joins' events (node.joined, join-token.used, node.ready, ...)
	// reach the sink before the clock starts.
	settle := time.Now()
	for last := int64(-1); ; {
		time.Sleep(2 * time.Second)
		got := arr.other.Load()
		if got == last && got >= int64(2*n) {
			break
		}
		if time.Since(settle) > 2*time.Minute {
			return fmt.Errorf("the joins' events never all arrived (%d so far)", got)
		}
		last = got
	}
	fmt.Printf("store %s, %d sessions on one gateway, %d join events delivered; load average %s\n",
		st.Dialect(), gw.Sessions(), arr.other.Load(), loadavg())

	// Every daemon sends an XID every n/rate seconds, its phase i/rate.
	period := time.Duration(float64(time.Second) * float64(n) / float64(rate))
	var sentN, failed atomic.Int64
	start := time.Now()
	end := start.Add(time.Duration(seconds) * time.Second)
	// The sink's backlog (outbox entries past its cursor), sampled every
	// 250 ms until the sends end.
	var peak atomic.Int64
	sampling := make(chan struct{})
	go func() {
		defer close(sampling)
		for time.Now().Before(end) {
			time.Sleep(250 * time.Millisecond)
			top, err1 := st.OutboxMaxID(ctx)
			cur, err2 := st.OutboxCursor(ctx, "bench")
			if err1 == nil && err2 == nil && top-cur > peak.Load() {
				peak.Store(top - cur)
			}
		}
	}()
	var wg sync.WaitGroup
	for i, d := range fleet.Daemons() {
		gpu := d.Inventory().GetGpus()[i%len(d.Inventory().GetGpus())].GetUuid()
		wg.Go(func() {
			next := start.Add(time.Duration(i) * time.Second / time.Duration(rate))
			for seq := 0; ; seq++ {
				time.Sleep(time.Until(next))
				if time.Now().After(end) {
					return
				}
				msg := fmt.Sprintf("bench %d.%d", i, seq)
				arr.mu.Lock()
				arr.sent[msg] = time.Now()
				arr.mu.Unlock()
				err := d.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Event{Event: &sessionv1.Event{
					Kind: "gpu.xid", Time: timestamppb.Now(), Severity: sessionv1.Severity_SEVERITY_CRITICAL,
					GpuUuid: gpu, Xid: 79, Message: msg}}})
				if err != nil {
					failed.Add(1)
					arr.mu.Lock()
					delete(arr.sent, msg)
					arr.mu.Unlock()
				} else {
					sentN.Add(1)
				}
				next = next.Add(period)
			}
		})
	}
	wg.Wait()
	<-sampling
	took := time.Duration(seconds) * time.Second // the sends after end are not made
	loadEnd := loadavg()
	// The last events' delivery: until every sent event arrived, or 10 s.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		arr.mu.Lock()
		left := len(arr.sent)
		arr.mu.Unlock()
		if left == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	arr.mu.Lock()
	commit, send, missing := slices.Clone(arr.commit), slices.Clone(arr.send), len(arr.sent)
	arr.mu.Unlock()
	slices.Sort(commit)
	slices.Sort(send)
	if len(commit) == 0 {
		return fmt.Errorf("no events delivered (%d sent, %d refused posts)", sentN.Load(), bad.Load())
	}
	pct := func(l []time.Duration, p int) time.Duration {
		return l[min(len(l)-1, len(l)*p/100)].Round(time.Millisecond / 10)
	}
	fmt.Printf("%d FakeDaemons, %d XID events sent in %v = %.0f events/s (%d sends failed), load average at the end %s\n",
		n, sentN.Load(), took.Round(time.Millisecond), float64(sentN.Load())/took.Seconds(), failed.Load(), loadEnd)
	fmt.Printf("delivered %d of them to the webhook (%d not within 10 s of the last send; %d refused posts); the sink's backlog peaked at %d entries\n",
		len(commit), missing, bad.Load(), peak.Load())
	fmt.Printf("commit (event time) -> webhook: p50 %v, p99 %v, max %v\n", pct(commit, 50), pct(commit, 99), commit[len(commit)-1].Round(time.Millisecond/10))
	fmt.Printf("daemon send -> webhook:         p50 %v, p99 %v, max %v\n", pct(send, 50), pct(send, 99), send[len(send)-1].Round(time.Millisecond/10))
	return nil
}
