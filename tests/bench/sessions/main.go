// Command sessions benchmarks one gateway holding many sessions: it starts
// a real `better-compute serve` (the embedded default, all roles) and, in a
// separate process, a fleet of N simulated daemons (tests/bench/fleet), and
// prints, for each N:
//
//   - joins per second (the fleet joins 32 at a time through the gateway);
//   - the sessions held, and the serve process's resident set (VmRSS) and
//     Go heap per session: RSS from /proc/<pid>/status before the fleet and
//     with every session up, live heap and goroutine stacks from the
//     runtime's GC trace (GODEBUG=gctrace=1, whole MB) after the idle window;
//   - serve's CPU over an idle window of heartbeats (utime+stime from
//     /proc/<pid>/stat), as a share of one core;
//   - after kill -9 of serve and a restart on the same port and data dir:
//     the time until every daemon holds a session again (the fleet's
//     count), and the peak per-second reconnect rate against the mean (the
//     restarted gateway's "Session opened" lines, by second since the kill).
//
// Nothing is asserted; it is a program, not part of the test suite:
//
//	go run ./tests/bench/sessions -n 1000,10000
//	go run ./tests/bench/sessions -n 1000 -outage 10s   # the gateway down 10 s: back after its return, per 100 ms
//
// With -renewals it measures certificate renewal instead (renewals.go).
//
// It runs from the repository root (it builds both binaries there) and
// needs a file descriptor limit above N (it raises its soft limit to the
// hard one; the children inherit it).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

func main() {
	sizes := flag.String("n", "1000,10000", "comma-separated fleet sizes, one run each")
	idle := flag.Duration("idle", 60*time.Second, "window over which serve's CPU at idle heartbeats is measured")
	settle := flag.Duration("settle", 20*time.Second, "wait after every session is up before measuring")
	restart := flag.Bool("restart", true, "kill -9 and restart serve, and measure the reconnection")
	outage := flag.Duration("outage", 0, "with -restart: how long serve stays down between the kill and the restart (the gateway's outage)")
	work := flag.String("work", "", "working directory for binaries, data and logs (default: a new temporary one, removed unless --keep)")
	keep := flag.Bool("keep", false, "keep the working directory")
	noInventory := flag.Bool("no-inventory", false, "daemons send no inventory")
	handshakes := flag.Float64("handshakes-per-second", 0, "host.gateway.limits.handshakesPerSecond: new connections serve admits a second (0: its default)")
	fleetProfile := flag.String("fleet-cpuprofile", "", "have the fleet write a CPU profile of its joins to this file")
	joinConcurrency := flag.Int("join-concurrency", 0, "joins the fleet runs at once (0: the fleet's default)")
	joinProfile := flag.String("join-cpuprofile", "", "write a CPU profile of serve's first 20 s of joins to this file (N appended when -n names several sizes)")
	restartProfile := flag.String("restart-cpuprofile", "", "write a CPU profile of the restarted serve's first 30 s to this file (N appended when -n names several sizes)")
	serveProfile := flag.String("serve-cpuprofile", "", "write a CPU profile of serve over the idle window to this file (N appended when -n names several sizes; serve's /debug/pprof, host.metrics.pprof)")
	bcBin := flag.String("better-compute", "", "better-compute binary to run (default: build ./controlplane/cmd/better-compute)")
	renewals := flag.Bool("renewals", false, "measure certificate renewals instead (renewals.go): the spread of the join certificates' renew_after, and renewals per second")
	var renew renewFlags
	flag.DurationVar(&renew.d, "renew-for", 30*time.Second, "with -renewals: how long to renew for")
	flag.IntVar(&renew.concurrency, "renew-concurrency", 64, "with -renewals: renewals at once")
	flag.DurationVar(&renew.certTTL, "cert-ttl", 0, "with -renewals: host.gateway.nodeCertTTL (0: serve's default, 24h)")
	flag.StringVar(&renew.db, "db", "", "with -renewals: a PostgreSQL server URL to run serve on, in a fresh schema (default: the embedded store)")
	var serveEnv []string
	flag.Func("serve-env", "extra KEY=VALUE for serve's environment, such as GOMEMLIMIT=450MiB (repeatable)", func(s string) error {
		if !strings.Contains(s, "=") {
			return fmt.Errorf("want KEY=VALUE")
		}
		serveEnv = append(serveEnv, s)
		return nil
	})
	flag.Parse()

	var ns []int
	for s := range strings.SplitSeq(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fatalf("-n %q: want positive integers", *sizes)
		}
		ns = append(ns, n)
	}
	raiseFileLimit()
	dir := *work
	if dir == "" {
		d, err := os.MkdirTemp("", "bc-bench-sessions-")
		if err != nil {
			fatalf("%v", err)
		}
		dir = d
		if !*keep {
			defer os.RemoveAll(dir)
		}
	}
	b := &bench{handshakes: *handshakes, dir: dir, idle: *idle, settle: *settle, restart: *restart, outage: *outage, noInventory: *noInventory, serveEnv: serveEnv, fleetProfile: *fleetProfile, serveProfile: *serveProfile, restartProfile: *restartProfile, joinProfile: *joinProfile, joinConcurrency: *joinConcurrency, sizes: len(ns)}
	b.build(*bcBin)
	if *renewals {
		runRenewals(b, ns, renew)
		return
	}
	var results []*result
	for _, n := range ns {
		r := b.run(n)
		results = append(results, r)
		r.print(os.Stdout)
	}
	fmt.Println()
	summary(os.Stdout, results, *idle)
	if *keep || *work != "" {
		fmt.Printf("\nlogs in %s\n", dir)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "sessions: "+format+"\n", args...)
	os.Exit(1)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// raiseFileLimit sets the soft RLIMIT_NOFILE to the hard one, for this
// process and its children.
func raiseFileLimit() {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		logf("cannot raise the file descriptor limit: %v", err)
	}
	logf("file descriptor limit %d", l.Cur)
}

type bench struct {
	handshakes   float64
	dir          string
	bc, fleet    string // binaries
	idle, settle time.Duration
	restart      bool
	outage       time.Duration // serve down between the kill and the restart
	noInventory  bool
	serveEnv     []string
	fleetProfile string
	serveProfile string
	// restartProfile and joinProfile name the CPU profiles of the
	// restarted serve and of serve during joins.
	restartProfile, joinProfile string
	joinConcurrency             int
	sizes                       int // how many fleet sizes run
}

// build builds better-compute (unless bc names a binary) and the fleet into
// the working directory.
func (b *bench) build(bc string) {
	b.bc = filepath.Join(b.dir, "bin", "better-compute")
	b.fleet = filepath.Join(b.dir, "bin", "fleet")
	pkgs := map[string]string{b.bc: "./controlplane/cmd/better-compute", b.fleet: "./tests/bench/fleet"}
	if bc != "" {
		b.bc = bc
		pkgs = map[string]string{b.fleet: "./tests/bench/fleet"}
	}
	for out, pkg := range pkgs {
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fatalf("build %s (run from the repository root): %v", pkg, err)
		}
	}
}

// result is what one run measured.
type result struct {
	n               int
	joinRate        float64
	joinFailures    int
	upAfter         time.Duration // from the fleet's start to every session up
	held            int
	rss0, rss1      int64 // serve's VmRSS in KiB before the fleet and with every session up
	heap0           gcLine
	heap1           gcLine
	cpuShare        float64 // serve's CPU over the idle window, share of one core
	fleetRSS        int64
	restarted       bool
	serveUp         time.Duration    // kill to the new serve listening
	back            time.Duration    // kill to every daemon back
	peak, mean      float64          // reconnects per second
	perSecond       []int64          // sessions the restarted gateway opened, by second since the kill
	outage          time.Duration    // serve down between the kill and the restart (-outage)
	per100ms        []int64          // sessions the restarted gateway opened, by 100 ms since its restart
	backAfterReturn [4]time.Duration // 50, 90, 99 % and all of them open, after the restart
	fleetPerSecond  []int64          // Welcomes the fleet counted, by stats line since the kill
	rssRestart      int64
	mem0, mem1      memStats // serve's runtime memory before the fleet and after the idle window
	// notOpened and notOpenedRestart are Connects serve could not record
	// in time, in the first connect and after the restart.
	notOpened, notOpenedRestart int
}

func (b *bench) run(n int) *result {
	r := &result{n: n}
	dir := filepath.Join(b.dir, fmt.Sprintf("n%d", n))
	dataDir := filepath.Join(dir, "data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fatalf("%v", err)
	}
	apiPort, gwPort := freePort(), freePort()
	cfg := filepath.Join(dir, "better-compute.yaml")
	// Every daemon comes from 127.0.0.1: the per-source bounds (joins a
	// second, connections in setup and queued) are made the gateway's
	// bounds in all, as a fleet of N machines would meet them.
	cfgText := fmt.Sprintf("host:\n  listen: 127.0.0.1:%d\n  metrics:\n    bearerToken: %s\n    pprof: true\n  gateway:\n    listen: 127.0.0.1:%d\n    maxStreams: %d\n"+
		"    limits: {pendingPerSource: 256, queuedPerSource: %d, joinsPerSecond: 1000, joinBurst: 1000, handshakesPerSecond: %g}\n",
		apiPort, metricsToken, gwPort, max(2*n, 5000), max(2*n, 4096), b.handshakes)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", apiPort)
	if err := os.WriteFile(cfg, []byte(cfgText), 0o644); err != nil {
		fatalf("%v", err)
	}
	env := append(os.Environ(), "BETTER_COMPUTE_DATA_DIR="+dataDir, "GODEBUG=gctrace=1")
	env = append(env, b.serveEnv...)

	logf("n=%d: starting serve (embedded default, %s) in %s, pid printed below", n, strings.Join(append([]string{"GODEBUG=gctrace=1"}, b.serveEnv...), " "), dir)
	serve := b.startServe(filepath.Join(dir, "serve-1.log"), env, cfg)
	defer func() { serve.kill() }()
	time.Sleep(5 * time.Second)
	r.rss0 = vmRSS(serve.pid())
	r.heap0 = serve.lastGC()
	r.mem0 = scrapeMemStats(metricsURL)

	tokenFile := filepath.Join(dir, "join-token")
	b.createJoinToken(env, cfg, 2*n, tokenFile)

	args := []string{"--gateway", fmt.Sprintf("https://localhost:%d", gwPort), "--token-file", tokenFile,
		"--n", strconv.Itoa(n), "--stop-on-eof"}
	if b.noInventory {
		args = append(args, "--no-inventory")
	}
	if b.joinConcurrency > 0 {
		args = append(args, "--join-concurrency", strconv.Itoa(b.joinConcurrency))
	}
	if b.fleetProfile != "" {
		args = append(args, "--cpuprofile", b.fleetProfile)
	}
	logf("n=%d: starting the fleet", n)
	fl := startFleet(filepath.Join(dir, "fleet.log"), b.fleet, args...)
	defer fl.stop()
	joinProfiled := b.profile(apiPort, b.joinProfile, n, 20*time.Second)
	defer func() { <-joinProfiled }()
	start := time.Now()
	r.joinRate, r.joinFailures = fl.waitJoined(10 * time.Minute)
	logf("n=%d: joined at %.0f joins/s, %d failed joins retried", n, r.joinRate, r.joinFailures)
	fl.waitStats(10*time.Minute, func(s stats) bool { return s.connected == n })
	r.upAfter = time.Since(start)
	logf("n=%d: %d sessions up %v after the fleet started; settling %v", n, n, r.upAfter.Round(time.Millisecond), b.settle)
	time.Sleep(b.settle)

	logf("n=%d: measuring CPU over %v of idle heartbeats", n, b.idle)
	gcs := serve.gcCount()
	if b.serveProfile != "" {
		<-joinProfiled // one CPU profile at a time
	}
	profiled := b.profile(apiPort, b.serveProfile, n, b.idle)
	c0, t0 := cpuTicks(serve.pid()), time.Now()
	time.Sleep(b.idle)
	c1, t1 := cpuTicks(serve.pid()), time.Now()
	<-profiled
	r.cpuShare = float64(c1-c0) / clockTicks / t1.Sub(t0).Seconds()
	r.rss1 = vmRSS(serve.pid())
	r.mem1 = scrapeMemStats(metricsURL)
	r.notOpened = serve.countNotOpened()
	// The live heap after a GC that ran with every session up (the runtime
	// forces one at least every 2 minutes).
	r.heap1 = serve.waitGC(gcs, 3*time.Minute)
	last := fl.last()
	r.held, r.fleetRSS = last.connected, last.rssKiB
	logf("n=%d: serve RSS %d KiB (%d before), heap %d MB, CPU %.1f%% of a core", n, r.rss1, r.rss0, r.heap1.live, 100*r.cpuShare)

	if b.restart {
		r.restarted = true
		atKill := fl.last()
		logf("n=%d: kill -9 serve and restart", n)
		killed := time.Now()
		serve.kill()
		if b.outage > 0 {
			logf("n=%d: serve down for %v", n, b.outage)
			time.Sleep(b.outage)
		}
		restarted := time.Now()
		serve = b.startServe(filepath.Join(dir, "serve-2.log"), env, cfg)
		r.serveUp = time.Since(killed)
		restartProfiled := b.profile(apiPort, b.restartProfile, n, 30*time.Second)
		defer func() { <-restartProfiled }()
		end := fl.waitStats(10*time.Minute, func(s stats) bool {
			return s.connected == n && s.connects-atKill.connects >= int64(n)
		})
		r.back = time.UnixMilli(end.tms).Sub(killed)
		r.fleetPerSecond = connectsPerLine(fl.since(killed), atKill.connects)
		opened := serve.sessionsOpened()
		r.perSecond, r.peak, r.mean = reconnectRates(opened, killed)
		r.outage, r.per100ms, r.backAfterReturn = b.outage, per100ms(opened, restarted), backAfter(opened, restarted)
		r.notOpenedRestart = serve.countNotOpened()
		logf("n=%d: all back %v after the kill; peak %.0f/s, mean %.0f/s", n, r.back.Round(time.Millisecond), r.peak, r.mean)
		time.Sleep(10 * time.Second)
		r.rssRestart = vmRSS(serve.pid())
	}
	return r
}

// per100ms buckets the sessions a restarted gateway opened by the 100 ms
// since it was started again.
func per100ms(opened []time.Time, restarted time.Time) []int64 {
	var out []int64
	for _, t := range opened {
		i := int(t.Sub(restarted) / (100 * time.Millisecond))
		if i < 0 {
			continue
		}
		for len(out) <= i {
			out = append(out, 0)
		}
		out[i]++
	}
	return out
}

// backAfter returns how long after restarted 50, 90 and 99 % and all of the
// sessions the restarted gateway opened were open.
func backAfter(opened []time.Time, restarted time.Time) [4]time.Duration {
	var ds []time.Duration
	for _, t := range opened {
		ds = append(ds, max(0, t.Sub(restarted)))
	}
	slices.Sort(ds)
	var out [4]time.Duration
	if len(ds) == 0 {
		return out
	}
	for i, q := range []float64{0.50, 0.90, 0.99, 1} {
		out[i] = ds[min(len(ds)-1, int(q*float64(len(ds)-1)+0.5))]
	}
	return out
}

// reconnectRates buckets the sessions a restarted gateway opened by the
// second since the kill, and returns the buckets, the peak and the mean
// from the first non-empty second to the last.
func reconnectRates(opened []time.Time, killed time.Time) (perSecond []int64, peak, mean float64) {
	for _, t := range opened {
		i := int(t.Sub(killed) / time.Second)
		if i < 0 {
			continue
		}
		for len(perSecond) <= i {
			perSecond = append(perSecond, 0)
		}
		perSecond[i]++
	}
	first := slices.IndexFunc(perSecond, func(v int64) bool { return v > 0 })
	if first < 0 {
		return perSecond, 0, 0
	}
	var total int64
	for _, v := range perSecond[first:] {
		total += v
		peak = max(peak, float64(v))
	}
	return perSecond, peak, float64(total) / float64(len(perSecond)-first)
}

func (r *result) print(w io.Writer) {
	mib := func(kib int64) float64 { return float64(kib) / 1024 }
	fmt.Fprintf(w, "\nn=%d\n", r.n)
	fmt.Fprintf(w, "  joins/s                 %.0f (%d failed joins retried)\n", r.joinRate, r.joinFailures)
	fmt.Fprintf(w, "  all sessions up after   %v (joins included)\n", r.upAfter.Round(time.Millisecond))
	fmt.Fprintf(w, "  sessions held           %d\n", r.held)
	fmt.Fprintf(w, "  Connects not recorded   %d (serve's \"Session not opened\"; the daemons retried)\n", r.notOpened)
	fmt.Fprintf(w, "  serve RSS               %.1f MiB -> %.1f MiB: %.1f KiB per session\n",
		mib(r.rss0), mib(r.rss1), float64(r.rss1-r.rss0)/float64(r.n))
	fmt.Fprintf(w, "  serve Go heap (live)    %d MB -> %d MB: %.1f KiB per session (gctrace, whole MB)\n",
		r.heap0.live, r.heap1.live, float64(r.heap1.live-r.heap0.live)*1e6/1024/float64(r.n))
	fmt.Fprintf(w, "  serve goroutine stacks  %d MB -> %d MB: %.1f KiB per session used (gctrace)\n",
		r.heap0.stacks, r.heap1.stacks, float64(r.heap1.stacks-r.heap0.stacks)*1e6/1024/float64(r.n))
	perSession := func(f func(m memStats) float64) float64 { return (f(r.mem1) - f(r.mem0)) / 1024 / float64(r.n) }
	fmt.Fprintf(w, "  serve runtime, per session (from /metrics after the idle window):\n")
	fmt.Fprintf(w, "    heap spans in use     %.1f KiB (go_memstats_heap_inuse_bytes)\n", perSession(func(m memStats) float64 { return m.heapInuse }))
	fmt.Fprintf(w, "    goroutine stacks      %.1f KiB (go_memstats_stack_inuse_bytes: stack memory held, not only used)\n", perSession(func(m memStats) float64 { return m.stackInuse }))
	fmt.Fprintf(w, "    next GC goal          %.1f KiB (go_memstats_next_gc_bytes)\n", perSession(func(m memStats) float64 { return m.nextGC }))
	fmt.Fprintf(w, "    goroutines            %.2f (go_goroutines)\n", (r.mem1.goroutines-r.mem0.goroutines)/float64(r.n))
	fmt.Fprintf(w, "  serve CPU, idle         %.1f%% of one core\n", 100*r.cpuShare)
	fmt.Fprintf(w, "  fleet process RSS       %.1f MiB\n", mib(r.fleetRSS))
	if r.restarted {
		fmt.Fprintf(w, "  restart: serve up after %v; all %d back after %v (from kill -9)\n",
			r.serveUp.Round(time.Millisecond), r.n, r.back.Round(time.Millisecond))
		fmt.Fprintf(w, "  reconnects/s (gateway)  peak %.0f, mean %.0f (peak/mean %.2f)\n", r.peak, r.mean, r.peak/max(r.mean, 1))
		fmt.Fprintf(w, "  Connects not recorded   %d after the restart\n", r.notOpenedRestart)
		fmt.Fprintf(w, "  per second (gateway)    %v\n", r.perSecond)
		fmt.Fprintf(w, "  per second (fleet)      %v\n", r.fleetPerSecond)
		fmt.Fprintf(w, "  outage                  %v (serve down between the kill and the restart)\n", r.outage)
		fmt.Fprintf(w, "  back after its return   50%% %v, 90%% %v, 99%% %v, all %v\n", r.backAfterReturn[0].Round(time.Millisecond),
			r.backAfterReturn[1].Round(time.Millisecond), r.backAfterReturn[2].Round(time.Millisecond), r.backAfterReturn[3].Round(time.Millisecond))
		fmt.Fprintf(w, "  per 100 ms (gateway)    %v\n", r.per100ms)
		fmt.Fprintf(w, "  serve RSS after restart %.1f MiB\n", mib(r.rssRestart))
	}
}

func summary(w io.Writer, rs []*result, idle time.Duration) {
	fmt.Fprintf(w, "| sessions | joins/s | RSS/session | live heap/session | stacks held/session | CPU idle (%v) | back after restart | peak/mean reconnects |\n", idle)
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rs {
		back, burst := "-", "-"
		if r.restarted {
			back = r.back.Round(100 * time.Millisecond).String()
			burst = fmt.Sprintf("%.0f / %.0f per s (%.1f×)", r.peak, r.mean, r.peak/max(r.mean, 1))
		}
		fmt.Fprintf(w, "| %d | %.0f | %.1f KiB | %.1f KiB | %.1f KiB | %.1f%% | %s | %s |\n", r.held, r.joinRate,
			float64(r.rss1-r.rss0)/float64(r.n),
			float64(r.heap1.live-r.heap0.live)*1e6/1024/float64(r.n),
			(r.mem1.stackInuse-r.mem0.stackInuse)/1024/float64(r.n),
			100*r.cpuShare, back, burst)
	}
}

func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fatalf("%v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// profile starts taking a CPU profile of serve (API on apiPort) over d, for
// the file a flag named (N appended when several fleet sizes run), and
// returns a channel closed once it is written; closed at once when name is
// empty.
func (b *bench) profile(apiPort int, name string, n int, d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	if name == "" {
		close(done)
		return done
	}
	if b.sizes > 1 {
		name += "." + strconv.Itoa(n)
	}
	go func() {
		defer close(done)
		fetchProfile(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", apiPort, max(int(d.Seconds()), 1)), name)
	}()
	return done
}

// metricsToken is the bearer token the benchmark gives serve's /metrics.
const metricsToken = "bench-sessions-metrics-token"

// memStats are the Go runtime's figures serve's /metrics exports, in bytes.
type memStats struct {
	heapInuse, stackInuse, nextGC, goroutines float64
}

// getServe GETs url from serve's API with the metrics token and returns the
// response, whose body the caller closes; what is not a 200 ends the run.
func getServe(url string) *http.Response {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		fatalf("%v", err)
	}
	req.Header.Set("Authorization", "Bearer "+metricsToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		fatalf("GET %s: %s", url, resp.Status)
	}
	return resp
}

// fetchProfile saves the pprof profile at url to file.
func fetchProfile(url, file string) {
	resp := getServe(url)
	defer resp.Body.Close()
	fh, err := os.Create(file)
	if err != nil {
		fatalf("%v", err)
	}
	if _, err := io.Copy(fh, resp.Body); err != nil {
		fatalf("profile %s: %v", url, err)
	}
	if err := fh.Close(); err != nil {
		fatalf("%v", err)
	}
	logf("serve CPU profile in %s", file)
}

// scrapeMemStats reads serve's Go runtime figures from its /metrics.
func scrapeMemStats(url string) memStats {
	resp := getServe(url)
	defer resp.Body.Close()
	var m memStats
	fields := map[string]*float64{
		"go_memstats_heap_inuse_bytes":  &m.heapInuse,
		"go_memstats_stack_inuse_bytes": &m.stackInuse,
		"go_memstats_next_gc_bytes":     &m.nextGC,
		"go_goroutines":                 &m.goroutines,
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if p := fields[name]; ok && p != nil {
			*p, _ = strconv.ParseFloat(value, 64)
		}
	}
	return m
}

// vmRSS is pid's resident set size in KiB.
func vmRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		fatalf("%v", err)
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kib, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kib
		}
	}
	return 0
}

// cpuTicks is pid's utime+stime in clock ticks.
func cpuTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		fatalf("%v", err)
	}
	// Fields after the command name (which may hold spaces) start at
	// field 3, state; utime and stime are fields 14 and 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st
}

// gcLine is one GODEBUG=gctrace=1 line's sizes, in MB.
type gcLine struct {
	live, stacks int64
}

var gcTrace = regexp.MustCompile(`^gc \d+ @.* \d+->\d+->(\d+) MB, \d+ MB goal, (\d+) MB stacks`)

// proc is a child process whose output goes to a log file and through a
// line handler.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	in   io.WriteCloser

	mu    sync.Mutex
	cond  *sync.Cond
	gcs   []gcLine
	ready bool
	stats []stats
	rate  float64
	// joinFailures counts the fleet's failed joins (retried).
	joinFailures int
	// opened are the times of serve's "Session opened" lines.
	opened []time.Time
	// notOpened counts serve's "Session not opened" lines: Connects that
	// could not record their session in time (the daemon retries).
	notOpened int
}

// logTime is the time of a serve log line (slog's text handler).
var logTime = regexp.MustCompile(`^time=(\S+) `)

func (p *proc) countNotOpened() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.notOpened
}

func (p *proc) sessionsOpened() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.opened)
}

// connectsPerLine is the fleet's new Welcomes per stats line (about one a
// second) after base.
func connectsPerLine(ss []stats, base int64) []int64 {
	var out []int64
	for _, s := range ss {
		out = append(out, s.connects-base)
		base = s.connects
	}
	return out
}

func start(logPath string, env []string, handle func(p *proc, line string), name string, args ...string) *proc {
	f, err := os.Create(logPath)
	if err != nil {
		fatalf("%v", err)
	}
	cmd := exec.Command(name, args...)
	cmd.Env = env
	// Its own process group, for kill -9 of all of it; killed too when
	// this program dies, so that no serve outlives a benchmark.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, _ := cmd.StdoutPipe()
	errOut, _ := cmd.StderrPipe()
	in, _ := cmd.StdinPipe()
	p := &proc{cmd: cmd, done: make(chan struct{}), in: in}
	p.cond = sync.NewCond(&p.mu)
	if err := cmd.Start(); err != nil {
		fatalf("start %s: %v", name, err)
	}
	var wg sync.WaitGroup
	var fmu sync.Mutex
	for _, r := range []io.Reader{out, errOut} {
		wg.Go(func() {
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				line := sc.Text()
				fmu.Lock()
				fmt.Fprintln(f, line)
				fmu.Unlock()
				p.mu.Lock()
				handle(p, line)
				p.cond.Broadcast()
				p.mu.Unlock()
			}
		})
	}
	go func() {
		wg.Wait()
		_ = cmd.Wait()
		f.Close()
		p.mu.Lock()
		close(p.done)
		p.cond.Broadcast()
		p.mu.Unlock()
	}()
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitFor waits, holding p.mu, until cond holds; it fails the run when the
// process exits first or timeout passes.
func (p *proc) waitFor(what string, timeout time.Duration, cond func() bool) {
	deadline := time.Now().Add(timeout)
	t := time.AfterFunc(timeout, func() { p.mu.Lock(); p.cond.Broadcast(); p.mu.Unlock() })
	defer t.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for !cond() {
		if p.exited() {
			fatalf("%s exited before %s (see its log)", filepath.Base(p.cmd.Path), what)
		}
		if time.Now().After(deadline) {
			fatalf("no %s within %v", what, timeout)
		}
		p.cond.Wait()
	}
}

// kill sends SIGKILL to the process group and waits for it.
func (p *proc) kill() {
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	<-p.done
}

func (b *bench) startServe(logPath string, env []string, cfg string) *proc {
	p := start(logPath, env, func(p *proc, line string) {
		if m := gcTrace.FindStringSubmatch(line); m != nil {
			live, _ := strconv.ParseInt(m[1], 10, 64)
			stacks, _ := strconv.ParseInt(m[2], 10, 64)
			p.gcs = append(p.gcs, gcLine{live: live, stacks: stacks})
		}
		if strings.Contains(line, `msg="Gateway listening"`) {
			p.ready = true
		}
		if strings.Contains(line, `msg="Session not opened"`) {
			p.notOpened++
		}
		if strings.Contains(line, `msg="Session opened"`) {
			if m := logTime.FindStringSubmatch(line); m != nil {
				if t, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
					p.opened = append(p.opened, t)
				}
			}
		}
	}, b.bc, "serve", "--config", cfg)
	p.waitFor("gateway listening", time.Minute, func() bool { return p.ready })
	logf("serve pid %d", p.pid())
	return p
}

func (p *proc) gcCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.gcs)
}

func (p *proc) lastGC() gcLine {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.gcs) == 0 {
		return gcLine{}
	}
	return p.gcs[len(p.gcs)-1]
}

// waitGC waits for a GC after the first n and returns the latest.
func (p *proc) waitGC(n int, timeout time.Duration) gcLine {
	p.waitFor("GC trace line", timeout, func() bool { return len(p.gcs) > n })
	return p.lastGC()
}

// stats is one of the fleet's stats lines.
type stats struct {
	tms                            int64
	connected                      int
	connects, reconnects, disconns int64
	rssKiB                         int64
}

var (
	statsLine  = regexp.MustCompile(`^stats t_ms=(\d+) joined=\d+ connected=(\d+) connects=(\d+) reconnects=(\d+) disconnects=(\d+) stopped=\d+ rss_kib=(\d+)`)
	joinedLine = regexp.MustCompile(`^joined n=\d+ seconds=[\d.]+ rate=([\d.]+) failures=(\d+)`)
)

func startFleet(logPath, bin string, args ...string) *proc {
	return start(logPath, os.Environ(), func(p *proc, line string) {
		if m := joinedLine.FindStringSubmatch(line); m != nil {
			p.rate, _ = strconv.ParseFloat(m[1], 64)
			p.joinFailures, _ = strconv.Atoi(m[2])
		}
		if strings.HasPrefix(line, "join-error ") {
			logf("fleet: %s", line)
		}
		if m := statsLine.FindStringSubmatch(line); m != nil {
			var s stats
			s.tms, _ = strconv.ParseInt(m[1], 10, 64)
			s.connected, _ = strconv.Atoi(m[2])
			s.connects, _ = strconv.ParseInt(m[3], 10, 64)
			s.reconnects, _ = strconv.ParseInt(m[4], 10, 64)
			s.disconns, _ = strconv.ParseInt(m[5], 10, 64)
			s.rssKiB, _ = strconv.ParseInt(m[6], 10, 64)
			p.stats = append(p.stats, s)
		}
	}, bin, args...)
}

func (p *proc) waitJoined(timeout time.Duration) (rate float64, failures int) {
	p.waitFor("joined line", timeout, func() bool { return p.rate > 0 })
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rate, p.joinFailures
}

// waitStats waits for a stats line for which cond holds and returns it.
func (p *proc) waitStats(timeout time.Duration, cond func(stats) bool) stats {
	var hit stats
	p.waitFor("fleet stats", timeout, func() bool {
		if len(p.stats) > 0 && cond(p.stats[len(p.stats)-1]) {
			hit = p.stats[len(p.stats)-1]
			return true
		}
		return false
	})
	return hit
}

func (p *proc) last() stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.stats) == 0 {
		return stats{}
	}
	return p.stats[len(p.stats)-1]
}

// since returns the stats lines taken after t.
func (p *proc) since(t time.Time) []stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []stats
	for _, s := range p.stats {
		if s.tms >= t.UnixMilli() {
			out = append(out, s)
		}
	}
	return out
}

// stop ends the fleet: end of its standard input, then SIGKILL after 10 s.
func (p *proc) stop() {
	_ = p.in.Close()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.kill()
	}
}
