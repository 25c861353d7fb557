package main

// The -renewals mode: certificate renewal against one real serve.
//
//	go run ./tests/bench/sessions -renewals -n 10000 -renew-for 30s
//	go run ./tests/bench/sessions -renewals -n 10000 -renew-for 30s -db postgres://postgres@127.0.0.1:5432/test?sslmode=disable
//
// For each N it starts serve (the embedded store, or PostgreSQL in a fresh
// schema with -db) with host.gateway.nodeCertTTL -cert-ttl, and the fleet
// (tests/bench/fleet), which joins N FakeDaemons through the gateway as
// fast as it admits them (real Joins: real certificates with the
// renew_after the control plane sets) and then, instead of holding
// sessions, renews their certificates round robin, -renew-concurrency at
// a time, for -renew-for, each renewal on a connection of its own as bcd
// makes it (tests/bench/fleet/renew.go). It prints:
//
//   - the spread of the join certificates' renew_after: where in its
//     certificate's life each falls, the span from the first to the last
//     against the life, the busiest wall-clock second's and minute's share
//     of all N, and the same busiest second had renew_after no jitter
//     (two thirds of the life after issue);
//   - the renewals per second that ended within the window, their latency,
//     and serve's CPU over the window (utime+stime from /proc) per renewal.

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// renewFlags are the -renewals mode's flags.
type renewFlags struct {
	d           time.Duration // renewal window
	concurrency int           // renewals at once
	certTTL     time.Duration // host.gateway.nodeCertTTL; 0: serve's default
	db          string        // PostgreSQL server URL; "": the embedded store
}

// benchSecret is the deployment secret serve gets on PostgreSQL.
const benchSecret = "bench-sessions-secret-0123456789abcdef"

// renewResult is what one -renewals run measured.
type renewResult struct {
	n            int
	store        string
	certTTL      time.Duration
	concurrency  int
	joinRate     float64
	joinFailures int
	spread       spread
	renewed      renewedLine
	serveCPU     float64 // serve's CPU over the renewal window, share of one core
	fleetCPU     float64 // the fleet's, likewise
	loadAvg      string  // /proc/loadavg's first three fields after the window
}

// renewedLine is the fleet's "renewed" line.
type renewedLine struct {
	seconds, rate, p50, p99 float64
	ok, failed              int
}

var (
	renewStartLine = regexp.MustCompile(`^renew-start t_ms=(\d+)`)
	renewedRe      = regexp.MustCompile(`^renewed seconds=([\d.]+) ok=(\d+) failed=(\d+) rate=([\d.]+) p50_ms=([\d.]+) p99_ms=([\d.]+)`)
)

// runRenewals runs the -renewals mode for each fleet size and prints each
// run and a summary table.
func runRenewals(b *bench, ns []int, f renewFlags) {
	fmt.Printf("tree %s\n", treeState())
	var rs []*renewResult
	for _, n := range ns {
		r := b.renewals(n, f)
		r.print(os.Stdout)
		rs = append(rs, r)
	}
	fmt.Println()
	fmt.Println("| store | nodes | nodeCertTTL | joins/s | busiest second | busiest minute | span / life | busiest second, no jitter | renewals/s (at once) | serve CPU per renewal |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, r := range rs {
		s := r.spread
		fmt.Printf("| %s | %d | %v | %.0f | %.3f%% | %.2f%% | %.3f | %.1f%% | %.0f (%d) | %.2f ms |\n",
			r.store, r.n, r.certTTL, r.joinRate, 100*s.second.share, 100*s.minute.share, s.spanOfLife,
			100*s.noJitterSecond.share, r.renewed.rate, r.concurrency, r.cpuPerRenewal())
	}
}

func (b *bench) renewals(n int, f renewFlags) *renewResult {
	r := &renewResult{n: n, store: "sqlite", certTTL: f.certTTL, concurrency: f.concurrency}
	if r.certTTL == 0 {
		r.certTTL = 24 * time.Hour
	}
	dir := filepath.Join(b.dir, fmt.Sprintf("renewals-n%d", n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fatalf("%v", err)
	}
	env := append(os.Environ(), "BETTER_COMPUTE_DATA_DIR="+filepath.Join(dir, "data"))
	tlsFiles := ""
	if f.db != "" {
		r.store = "postgres"
		u, drop := pgSchema(f.db)
		defer drop()
		env = append(env, "BETTER_COMPUTE_DATABASE_URL="+u, "BETTER_COMPUTE_SECRET="+benchSecret)
		tlsFiles = b.initPostgresPKI(env, dir)
	}
	apiPort, gwPort := freePort(), freePort()
	cfg := filepath.Join(dir, "better-compute.yaml")
	cfgText := fmt.Sprintf("host:\n  listen: 127.0.0.1:%d\n  gateway:\n    listen: 127.0.0.1:%d\n    maxStreams: %d\n    nodeCertTTL: %s\n%s",
		apiPort, gwPort, max(2*n, 5000), r.certTTL, tlsFiles)
	if err := os.WriteFile(cfg, []byte(cfgText), 0o644); err != nil {
		fatalf("%v", err)
	}
	logf("n=%d: starting serve (%s, nodeCertTTL %v) in %s", n, r.store, r.certTTL, dir)
	serve := b.startServe(filepath.Join(dir, "serve.log"), env, cfg)
	defer serve.kill()
	tokenFile := filepath.Join(dir, "join-token")
	if f.db != "" {
		// The embedded store starts with a default pool; PostgreSQL
		// starts empty (as tests/deployment_test.go sets it up).
		b.cli(env, cfg, "sites", "create", "--name", "bench", "--region", "default")
		b.cli(env, cfg, "pools", "create", "--name", "default", "--site", "bench")
	}
	b.createJoinToken(env, cfg, 2*n, tokenFile)

	afterFile := filepath.Join(dir, "renew-after")
	var (
		renewStarted, renewDone bool
		cpu0, cpu1              int64 // serve's
		fcpu0, fcpu1            int64 // the fleet's
		t0, t1                  time.Time
	)
	fl := start(filepath.Join(dir, "fleet.log"), os.Environ(), func(p *proc, line string) {
		switch {
		case joinedLine.MatchString(line):
			m := joinedLine.FindStringSubmatch(line)
			p.rate, _ = strconv.ParseFloat(m[1], 64)
			p.joinFailures, _ = strconv.Atoi(m[2])
		case strings.HasPrefix(line, "join-error "), strings.HasPrefix(line, "renew-error "):
			logf("fleet: %s", line)
		case renewStartLine.MatchString(line):
			renewStarted, cpu0, fcpu0, t0 = true, cpuTicks(serve.pid()), cpuTicks(p.pid()), time.Now()
		case renewedRe.MatchString(line):
			cpu1, fcpu1, t1 = cpuTicks(serve.pid()), cpuTicks(p.pid()), time.Now()
			m := renewedRe.FindStringSubmatch(line)
			num := func(i int) float64 { v, _ := strconv.ParseFloat(m[i], 64); return v }
			r.renewed = renewedLine{seconds: num(1), ok: int(num(2)), failed: int(num(3)), rate: num(4), p50: num(5), p99: num(6)}
			renewDone = true
		}
	}, b.fleet, "--gateway", fmt.Sprintf("https://localhost:%d", gwPort), "--token-file", tokenFile,
		"--n", strconv.Itoa(n), "--stop-on-eof", "--no-inventory", "--renew-after-file", afterFile,
		"--renew-for", f.d.String(), "--renew-concurrency", strconv.Itoa(f.concurrency))
	defer fl.stop()
	logf("n=%d: joining", n)
	r.joinRate, r.joinFailures = fl.waitJoined(10 * time.Minute)
	logf("n=%d: joined at %.0f joins/s; renewing for %v, %d at once", n, r.joinRate, f.d, f.concurrency)
	fl.waitFor("renew-start line", time.Minute, func() bool { return renewStarted })
	r.spread = readSpread(afterFile)
	fl.waitFor("renewed line", f.d+2*time.Minute, func() bool { return renewDone })
	r.serveCPU = float64(cpu1-cpu0) / clockTicks / t1.Sub(t0).Seconds()
	r.fleetCPU = float64(fcpu1-fcpu0) / clockTicks / t1.Sub(t0).Seconds()
	r.loadAvg = loadAvg()
	logf("n=%d: %.0f renewals/s, serve at %.0f%% of a core", n, r.renewed.rate, 100*r.serveCPU)
	return r
}

// cpuPerRenewal is serve's CPU time per renewal over the window, in ms.
func (r *renewResult) cpuPerRenewal() float64 {
	if r.renewed.rate == 0 {
		return 0
	}
	return 1000 * r.serveCPU / r.renewed.rate
}

func (r *renewResult) print(w io.Writer) {
	s := r.spread
	fmt.Fprintf(w, "\nn=%d store=%s nodeCertTTL=%v\n", r.n, r.store, r.certTTL)
	fmt.Fprintf(w, "  joins/s                   %.0f (%d failed joins retried); issued over %v\n", r.joinRate, r.joinFailures, s.issuedOver)
	fmt.Fprintf(w, "  renew_after of the %d join certificates:\n", s.n)
	fmt.Fprintf(w, "    position in the life    %.4f to %.4f of issue -> NotAfter\n", s.minPos, s.maxPos)
	fmt.Fprintf(w, "    span, first to last     %v = %.4f of the life\n", s.span, s.spanOfLife)
	fmt.Fprintf(w, "    busiest second          %d = %.3f%% of all (mean over the span %.2f a second)\n", s.second.count, 100*s.second.share, float64(s.n)/max(s.span.Seconds(), 1))
	fmt.Fprintf(w, "    busiest minute          %d = %.2f%% of all\n", s.minute.count, 100*s.minute.share)
	fmt.Fprintf(w, "    by tenth of the span    %v\n", s.tenths)
	fmt.Fprintf(w, "    without the jitter      busiest second %d = %.1f%%, span %v (two thirds of the life after issue)\n",
		s.noJitterSecond.count, 100*s.noJitterSecond.share, s.noJitterSpan)
	fmt.Fprintf(w, "  renewals, %d at once for %.0f s, each on a connection of its own (no sessions held):\n", r.concurrency, r.renewed.seconds)
	fmt.Fprintf(w, "    renewals/s              %.1f (%d ok, %d failed)\n", r.renewed.rate, r.renewed.ok, r.renewed.failed)
	fmt.Fprintf(w, "    latency                 p50 %.1f ms, p99 %.1f ms\n", r.renewed.p50, r.renewed.p99)
	fmt.Fprintf(w, "    serve CPU               %.1f%% of one core: %.2f ms a renewal\n", 100*r.serveCPU, r.cpuPerRenewal())
	fmt.Fprintf(w, "    fleet CPU               %.1f%% of one core (load average %s)\n", 100*r.fleetCPU, r.loadAvg)
}

// peak is the fullest bucket of a histogram.
type peak struct {
	count int
	share float64 // of all
}

// spread summarises the join certificates' renew_after.
type spread struct {
	n              int
	issuedOver     time.Duration // first to last time of issue
	minPos, maxPos float64       // (renew_after - issue) / life
	span           time.Duration // first to last renew_after
	spanOfLife     float64
	second, minute peak // by wall-clock second and minute
	tenths         []int
	noJitterSecond peak
	noJitterSpan   time.Duration
}

// readSpread reads the fleet's renew-after file (tests/bench/fleet
// writeRenewAfter) and summarises it.
func readSpread(file string) spread {
	fh, err := os.Open(file)
	if err != nil {
		fatalf("%v", err)
	}
	defer fh.Close()
	var issued, after []time.Time
	var life time.Duration
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		var i, a, na int64
		if _, err := fmt.Sscanf(sc.Text(), "%d %d %d", &i, &a, &na); err != nil {
			fatalf("%s: %q: %v", file, sc.Text(), err)
		}
		issued = append(issued, time.Unix(0, i))
		after = append(after, time.Unix(0, a))
		life = time.Duration(na - i) // the same for every certificate
	}
	if len(after) == 0 {
		fatalf("%s: empty", file)
	}
	s := spread{n: len(after), minPos: 1}
	noJitter := make([]time.Time, len(after))
	for k := range after {
		pos := float64(after[k].Sub(issued[k])) / float64(life)
		s.minPos, s.maxPos = min(s.minPos, pos), max(s.maxPos, pos)
		noJitter[k] = issued[k].Add(life * 2 / 3)
	}
	s.issuedOver = slices.MaxFunc(issued, time.Time.Compare).Sub(slices.MinFunc(issued, time.Time.Compare))
	slices.SortFunc(after, time.Time.Compare)
	first, last := after[0], after[len(after)-1]
	s.span = last.Sub(first).Round(time.Second)
	s.spanOfLife = float64(s.span) / float64(life)
	s.second = busiest(after, time.Second)
	s.minute = busiest(after, time.Minute)
	s.noJitterSecond = busiest(noJitter, time.Second)
	slices.SortFunc(noJitter, time.Time.Compare)
	s.noJitterSpan = noJitter[len(noJitter)-1].Sub(noJitter[0])
	s.tenths = make([]int, 10)
	for _, t := range after {
		s.tenths[min(int(10*float64(t.Sub(first))/float64(max(s.span, 1))), 9)]++
	}
	return s
}

// busiest is the fullest bucket of ts by wall-clock intervals of d.
func busiest(ts []time.Time, d time.Duration) peak {
	counts := map[int64]int{}
	var p peak
	for _, t := range ts {
		k := t.UnixNano() / int64(d)
		counts[k]++
		p.count = max(p.count, counts[k])
	}
	p.share = float64(p.count) / float64(len(ts))
	return p
}

// createJoinToken makes a join token for uses joins in the default pool,
// written to file, with serve's CLI.
func (b *bench) createJoinToken(env []string, cfg string, uses int, file string) {
	b.cli(env, cfg, "join-tokens", "create", "--pool", "default", "--max-uses", strconv.Itoa(uses), "--ttl", "2h", "--out", file)
}

// cli runs serve's CLI with configuration cfg; a failure ends the run.
func (b *bench) cli(env []string, cfg string, args ...string) {
	cmd := exec.Command(b.bc, append([]string{"--config", cfg}, args...)...)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		fatalf("better-compute %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// initPostgresPKI migrates the database env names, makes its PKI and a
// gateway certificate in dir, and returns the gateway's tlsFiles lines of
// the configuration (as tests/serve_test.go does).
func (b *bench) initPostgresPKI(env []string, dir string) string {
	for _, args := range [][]string{
		{"migrate"},
		{"pki", "init", "--trust-domain", "bench.local"},
		{"pki", "issue-gateway", "--dns", "localhost", "--ip", "127.0.0.1", "--out-dir", dir},
	} {
		cmd := exec.Command(b.bc, args...)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			fatalf("better-compute %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return fmt.Sprintf("    tlsFiles:\n      cert: %s\n      key: %s\n", filepath.Join(dir, "gateway.crt"), filepath.Join(dir, "gateway.key"))
}

// pgSchema makes a fresh schema on the PostgreSQL server at server and
// returns a URL whose connections use it, and a func that drops it.
func pgSchema(server string) (string, func()) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		fatalf("-db %s: %v", server, err)
	}
	defer conn.Close(ctx)
	schema := "bench_" + strings.ToLower(rand.Text()[:10])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		fatalf("create schema: %v", err)
	}
	u, err := url.Parse(server)
	if err != nil {
		fatalf("-db %s: %v", server, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, server)
		if err != nil {
			logf("drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			logf("drop schema %s: %v", schema, err)
		}
	}
}

// loadAvg is the machine's load average over 1, 5 and 15 minutes.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// treeState names the commit the benchmark runs on and whether the working
// tree differs from it (git rev-parse, git status: read only).
func treeState() string {
	rev, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (no git)"
	}
	st, _ := exec.Command("git", "status", "--porcelain", "--untracked-files=normal").Output()
	changed := 0
	for l := range strings.SplitSeq(strings.TrimSpace(string(st)), "\n") {
		if l != "" {
			changed++
		}
	}
	if changed == 0 {
		return strings.TrimSpace(string(rev)) + ", clean"
	}
	return fmt.Sprintf("%s plus %d changed or new paths in the working tree", strings.TrimSpace(string(rev)), changed)
}
