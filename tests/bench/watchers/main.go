// Command watchers measures the event stream, GET {basePath}/events/watch,
// with many watchers on one api process: the api runs in a child process
// (this program re-run with -child), on PostgreSQL, so that its CPU is
// read from /proc alone; the parent opens the watchers over loopback HTTP
// and writes events two ways: straight into the outbox (as a gateway or a
// worker in another process does: the api's feed is woken by the NOTIFY
// of the writing transaction, which it LISTENs for as serve wires it, and
// its poll is the fallback) and through the api's own tokens.create (each
// writes token.created; the api reads the outbox at once after its own
// writes).
//
//	go run ./tests/bench/watchers -watchers 100 -rate 200 -seconds 10
//	go run ./tests/bench/watchers -poll-only   # the fallback alone: no LISTEN
//
// It prints, for each way, the api process's CPU (cores) with the watchers
// idle and while events flow, and the lag from the write to the watcher's
// receipt: the p50 and p99 over every receipt, and the slowest watcher's
// p99 and max.
package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/wake"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

func main() {
	watchers := flag.Int("watchers", 100, "SSE watchers")
	rate := flag.Int("rate", 200, "events written per second")
	seconds := flag.Int("seconds", 10, "seconds of writing, per way")
	db := flag.String("db", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL server URL (a fresh schema is made and dropped)")
	child := flag.String("child", "", "internal: run the api on this database URL")
	pollOnly := flag.Bool("poll-only", false, "the api does not LISTEN for other processes' outbox writes: its feed finds them at its poll (500 ms)")
	flag.Parse()
	var err error
	if *child != "" {
		err = runChild(*child, *pollOnly)
	} else {
		err = run(*db, *watchers, *rate, *seconds, *pollOnly)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// runChild serves the api on 127.0.0.1 and prints "READY <addr>". Unless
// pollOnly, it LISTENs on postgres.OutboxChannel and wakes the api's event
// feed with it, as serve does (controlplane/serve).
func runChild(url string, pollOnly bool) error {
	ctx := context.Background()
	st, err := postgres.Open(ctx, url)
	if err != nil {
		return err
	}
	defer st.Close()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	errc := make(chan error, 2)
	var wakeups <-chan struct{}
	if !pollOnly {
		outbox := wake.NewBus(nil)
		var unsubscribe func()
		wakeups, unsubscribe = outbox.Subscribe()
		defer unsubscribe()
		go func() {
			errc <- wake.ListenChannels(ctx, url, map[string]*wake.Bus{postgres.OutboxChannel: outbox}, log)
		}()
	}
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Secret: strings.Repeat("b", 32), EventWakeups: wakeups}, st, log)
	go func() { errc <- srv.Run(ctx) }()
	select {
	case <-srv.Ready():
	case err := <-errc:
		return err
	}
	fmt.Printf("READY %s\n", srv.Addr())
	return <-errc
}

// cpuSeconds is the user and system CPU time of pid.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100, nil // USER_HZ is 100 on Linux
}

// receipt is one event a watcher got: its subject and when.
type receipt struct {
	subject string
	at      time.Time
}

// receipts are one watcher's receipts. Lags are worked out after a run:
// an event written through the API can reach a watcher before the call
// that wrote it returns its id.
type receipts struct {
	mu  sync.Mutex
	got []receipt
}

func run(db string, n, rate, seconds int, pollOnly bool) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	schema := "bench_" + strings.ToLower(rand.Text()[:10])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return err
	}
	defer conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	url := db + cmp.Or(map[bool]string{true: "&"}[strings.Contains(db, "?")], "?") + "search_path=" + schema
	st, err := postgres.Open(ctx, url)
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		return err
	}
	admin, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleAdmin, Description: "bench"})
	if err != nil {
		return err
	}
	viewer, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleViewer, Description: "bench watchers"})
	if err != nil {
		return err
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, self, "-child", url, "-poll-only="+strconv.FormatBool(pollOnly))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(out)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "READY ") {
		return fmt.Errorf("the api child did not start: %q", sc.Text())
	}
	base := "http://" + strings.TrimPrefix(sc.Text(), "READY ") + "/api"
	pid := cmd.Process.Pid

	// sent records when each subject's event was written.
	var sentMu sync.Mutex
	sent := map[string]time.Time{}
	all := make([]*receipts, n)
	var opened sync.WaitGroup
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: 0}}
	for i := range n {
		all[i] = &receipts{}
		opened.Add(1)
		go func(r *receipts) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/events/watch", nil)
			req.Header.Set("Authorization", "Bearer "+viewer)
			res, err := hc.Do(req)
			if err != nil || res.StatusCode != 200 {
				fmt.Fprintln(os.Stderr, "bench: watch:", err, res)
				opened.Done()
				return
			}
			defer res.Body.Close()
			s := bufio.NewScanner(res.Body)
			s.Buffer(make([]byte, 64<<10), 1<<20)
			first := true
			for s.Scan() {
				line := s.Text()
				if first && line == "" {
					first = false
					opened.Done()
				}
				data, ok := strings.CutPrefix(line, "data: ")
				if !ok {
					continue
				}
				now := time.Now()
				var env events.Envelope
				if json.Unmarshal([]byte(data), &env) != nil {
					continue
				}
				r.mu.Lock()
				r.got = append(r.got, receipt{env.Subject, now})
				r.mu.Unlock()
			}
		}(all[i])
	}
	opened.Wait()
	fmt.Printf("%d watchers on one api process (PostgreSQL, loopback HTTP), %d events/s for %d s each way\n", n, rate, seconds)
	outboxWay := "written straight into the outbox (another process; its NOTIFY wakes the api's feed)"
	if pollOnly {
		outboxWay = "written straight into the outbox (another process; -poll-only: the api's poll finds it)"
	}

	measure := func(d time.Duration, fn func(context.Context)) float64 {
		c0, _ := cpuSeconds(pid)
		start := time.Now()
		wctx, stop := context.WithTimeout(ctx, d)
		fn(wctx)
		stop()
		c1, _ := cpuSeconds(pid)
		return (c1 - c0) / time.Since(start).Seconds()
	}
	idle := measure(10*time.Second, func(ctx context.Context) { <-ctx.Done() })
	fmt.Printf("idle (heartbeats only): %.3f cores\n", idle)

	ac := &client.Client{BaseURL: base, Token: admin}
	for _, way := range []struct {
		name  string
		write func(ctx context.Context, i int) error
	}{
		{outboxWay, func(ctx context.Context, i int) error {
			subject := fmt.Sprintf("bench-%d", i)
			env, err := events.New("com.better-compute.bench.tick", subject, map[string]int{"i": i}, time.Now())
			if err != nil {
				return err
			}
			b, _ := env.Marshal()
			sentMu.Lock()
			sent[subject] = time.Now()
			sentMu.Unlock()
			_, err = st.OutboxInsert(ctx, env.Type, subject, b)
			return err
		}},
		{"written by the api's own tokens.create (read at once after the write)", func(ctx context.Context, i int) error {
			start := time.Now()
			resp, err := ac.TokensCreate(ctx, &apiv1.CreateAPITokenRequest{Role: "viewer", Description: "bench"})
			if err != nil {
				return err
			}
			sentMu.Lock()
			sent[resp.GetApiToken().GetId()] = start
			sentMu.Unlock()
			return nil
		}},
	} {
		for _, r := range all {
			r.mu.Lock()
			r.got = r.got[:0]
			r.mu.Unlock()
		}
		sentMu.Lock()
		clear(sent)
		sentMu.Unlock()
		written := 0
		busy := measure(time.Duration(seconds)*time.Second, func(ctx context.Context) {
			tick := time.NewTicker(time.Second / time.Duration(rate))
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					if err := way.write(ctx, written); err != nil {
						if ctx.Err() == nil {
							fmt.Fprintln(os.Stderr, "bench: write:", err)
						}
						return // the window ended during this write: not counted
					}
					written++
				}
			}
		})
		time.Sleep(2 * time.Second) // the last receipts
		var every []time.Duration
		var worstP99, worstMax time.Duration
		least := written * 10
		sentMu.Lock()
		for _, r := range all {
			r.mu.Lock()
			var l []time.Duration
			for _, g := range r.got {
				if at, ok := sent[g.subject]; ok {
					l = append(l, g.at.Sub(at))
				}
			}
			r.mu.Unlock()
			slices.Sort(l)
			least = min(least, len(l))
			every = append(every, l...)
			if len(l) > 0 {
				worstP99 = max(worstP99, l[len(l)*99/100])
				worstMax = max(worstMax, l[len(l)-1])
			}
		}
		sentMu.Unlock()
		slices.Sort(every)
		if len(every) == 0 {
			return fmt.Errorf("%s: no receipts", way.name)
		}
		fmt.Printf("%s:\n  %d events; the watcher with the fewest got %d\n  api CPU %.3f cores\n"+
			"  lag p50 %v, p99 %v; slowest watcher p99 %v, max %v\n", way.name, written, least, busy,
			every[len(every)/2].Round(time.Millisecond/10), every[len(every)*99/100].Round(time.Millisecond/10),
			worstP99.Round(time.Millisecond/10), worstMax.Round(time.Millisecond/10))
	}
	return nil
}
