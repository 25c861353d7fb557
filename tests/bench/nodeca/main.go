// Command nodeca benchmarks a node-CA rotation (issue 34; docs/pki.md,
// "Rotating the node CA"): it starts a real `better-compute serve` (every
// role; the embedded default, or PostgreSQL in a fresh schema with -db)
// whose node certificates live -cert-ttl, joins N FakeDaemons
// (controlplane/pkg/sim, bcd's own session client over real TLS, in this
// process) and holds their sessions, then runs `pki rotate node-ca start`
// and nothing else: the gateway sends every session the new bundle, the
// daemons acknowledge it, the rotation reconciler activates the rotation
// at its threshold, every daemon moves to the new CA at its next renewal,
// and the reconciler retires the old CA. It polls `status -o json` every
// -poll and prints:
//
//   - acks per second: N over the time from start to the last daemon's
//     acknowledgement (each daemon notes when it stored the bundle, just
//     before it sends BundleAck), with p50 and p99 of that time, and when
//     status first counted every ack;
//   - the time from start to activated and to retired (the rotation's own
//     timestamps in status);
//   - how many daemons end on a certificate from the new CA, their
//     reconnects during the rotation (0: no session was closed), and
//     serve's CPU from start to retired.
//
// Nothing is asserted; it is a program, not part of the test suite:
//
//	go run ./tests/bench/nodeca -n 10000
//	go run ./tests/bench/nodeca -n 2000 -db 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// It runs from the repository root (it builds better-compute there) and
// raises its file descriptor limit to the hard one.
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
)

// benchSecret is the deployment secret of a PostgreSQL run.
const benchSecret = "bench-nodeca-secret-0123456789abcdef"

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat.
const clockTicks = 100

func main() {
	n := flag.Int("n", 10000, "FakeDaemons")
	db := flag.String("db", "", "a PostgreSQL server URL to run serve on, in a fresh schema (default: the embedded store)")
	certTTL := flag.Duration("cert-ttl", 3*time.Minute, "host.gateway.nodeCertTTL: every daemon moves to the new CA within about 5/6 of it after activation")
	threshold := flag.Float64("threshold", 0, "start --threshold (0: the default, 0.99)")
	poll := flag.Duration("poll", time.Second, "how often status is read")
	timeout := flag.Duration("timeout", 20*time.Minute, "give up when the rotation has not retired this long after start")
	work := flag.String("work", "", "working directory for the binary, data and logs (default: a new temporary one, removed unless -keep)")
	keep := flag.Bool("keep", false, "keep the working directory")
	bcBin := flag.String("better-compute", "", "better-compute binary to run (default: build ./controlplane/cmd/better-compute)")
	flag.Parse()
	if *n < 1 {
		fatalf("-n %d: want at least 1", *n)
	}
	raiseFileLimit()
	dir := *work
	if dir == "" {
		d, err := os.MkdirTemp("", "bc-bench-nodeca-")
		if err != nil {
			fatalf("%v", err)
		}
		dir = d
		if !*keep {
			defer os.RemoveAll(dir)
		}
	}
	b := &bench{dir: dir, n: *n, db: *db, certTTL: *certTTL, threshold: *threshold, poll: *poll, timeout: *timeout}
	b.bc = *bcBin
	if b.bc == "" {
		b.bc = filepath.Join(dir, "bin", "better-compute")
		cmd := exec.Command("go", "build", "-o", b.bc, "./controlplane/cmd/better-compute")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fatalf("build better-compute (run from the repository root): %v", err)
		}
	}
	if err := b.run(context.Background()); err != nil {
		fatalf("%v", err)
	}
	if *keep || *work != "" {
		fmt.Printf("\nlogs in %s\n", dir)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nodeca: "+format+"\n", args...)
	os.Exit(1)
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// bench is one run's settings.
type bench struct {
	dir, bc, db   string
	n             int
	certTTL       time.Duration
	threshold     float64
	poll, timeout time.Duration
	env           []string
	cfg           string
	store         string
	serve         *exec.Cmd
	serveLog      string
}

// rotationView is `pki rotate node-ca start|status -o json`.
type rotationView struct {
	Rotation struct {
		ID          string    `json:"id"`
		Phase       string    `json:"phase"`
		NewCAID     string    `json:"newCaId"`
		Threshold   float64   `json:"threshold"`
		StartedAt   time.Time `json:"startedAt"`
		ActivatedAt time.Time `json:"activatedAt"`
		RetiredAt   time.Time `json:"retiredAt"`
		LiveNodes   int       `json:"liveNodes"`
		AckedNodes  int       `json:"ackedNodes"`
		OffNewCA    int       `json:"nodesOffNewCa"`
		Waiting     string    `json:"waiting"`
	} `json:"rotation"`
}

func (b *bench) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b.store = "sqlite"
	b.env = append(os.Environ(), "BETTER_COMPUTE_DATA_DIR="+filepath.Join(b.dir, "data"))
	tlsFiles := ""
	if b.db != "" {
		b.store = "postgres"
		u, drop, err := pgSchema(ctx, b.db)
		if err != nil {
			return err
		}
		defer drop()
		b.env = append(b.env, "BETTER_COMPUTE_DATABASE_URL="+u, "BETTER_COMPUTE_SECRET="+benchSecret)
		if tlsFiles, err = b.initPostgresPKI(); err != nil {
			return err
		}
	}
	apiPort, gwPort := freePort(), freePort()
	b.cfg = filepath.Join(b.dir, "better-compute.yaml")
	// Every daemon comes from 127.0.0.1: the per-source bounds are the
	// gateway's bounds in all.
	cfgText := fmt.Sprintf("host:\n  listen: 127.0.0.1:%d\n  gateway:\n    listen: 127.0.0.1:%d\n    maxStreams: %d\n    nodeCertTTL: %s\n"+
		"    limits: {pendingPerSource: 256, queuedPerSource: %d, joinsPerSecond: 1000, joinBurst: 1000, handshakeTimeout: 20s}\n%s",
		apiPort, gwPort, max(2*b.n, 5000), b.certTTL, max(2*b.n, 4096), tlsFiles)
	if err := os.WriteFile(b.cfg, []byte(cfgText), 0o644); err != nil {
		return err
	}
	logf("n=%d: starting serve (%s, nodeCertTTL %v) in %s", b.n, b.store, b.certTTL, b.dir)
	if err := b.startServe(); err != nil {
		return err
	}
	defer func() { _ = syscall.Kill(-b.serve.Process.Pid, syscall.SIGKILL); _ = b.serve.Wait() }()
	if b.db != "" {
		// The embedded store starts with a default pool; PostgreSQL
		// starts empty.
		if _, err := b.cli("sites", "create", "--name", "bench", "--region", "default"); err != nil {
			return err
		}
		if _, err := b.cli("pools", "create", "--name", "default", "--site", "bench"); err != nil {
			return err
		}
	}
	tokenFile := filepath.Join(b.dir, "join-token")
	if _, err := b.cli("join-tokens", "create", "--pool", "default", "--max-uses", strconv.Itoa(2*b.n), "--ttl", "2h", "--out", tokenFile); err != nil {
		return err
	}
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		return err
	}

	fleet, err := sim.NewFleet(sim.FleetConfig{GatewayURL: fmt.Sprintf("https://localhost:%d", gwPort), Token: strings.TrimSpace(string(token)),
		N: b.n, NoInventory: true, Session: session.Config{StartJitter: 5 * time.Second}})
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := fleet.Join(ctx); err != nil {
		return err
	}
	logf("n=%d: joined in %v; connecting", b.n, time.Since(t0).Round(time.Millisecond))
	go func() { _ = fleet.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Minute)
	err = fleet.WaitFor(wctx, func(s sim.FleetStats) bool { return s.Connected >= b.n })
	wcancel()
	if err != nil {
		return fmt.Errorf("waiting for sessions: %w", err)
	}
	logf("n=%d: %d sessions up %v after the first join", b.n, b.n, time.Since(t0).Round(time.Millisecond))
	before := fleet.Stats()

	// The rotation: start, then only status.
	cpu0 := cpuTicks(b.serve.Process.Pid)
	started := time.Now()
	var v rotationView
	if err := b.cliJSON(&v, "pki", "rotate", "node-ca", "start", "--threshold", strconv.FormatFloat(b.threshold, 'g', -1, 64), "--reason", "bench"); err != nil {
		return err
	}
	newCA := v.Rotation.NewCAID
	logf("n=%d: rotation %s started, new CA %s", b.n, v.Rotation.ID, newCA)
	var allCounted time.Duration
	last := ""
	for v.Rotation.Phase != "retired" {
		if time.Since(started) > b.timeout {
			return fmt.Errorf("not retired %v after start: %+v", b.timeout, v.Rotation)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(b.poll):
		}
		asked := time.Now()
		// A fresh value each time: -o json leaves out zero counts, and
		// decoding into the last answer would keep its numbers.
		v = rotationView{}
		if err := b.cliJSON(&v, "pki", "rotate", "node-ca", "status"); err != nil {
			return err
		}
		if took := time.Since(asked); took > 2*time.Second {
			logf("n=%d: status took %v", b.n, took.Round(time.Millisecond))
		}
		r := v.Rotation
		if allCounted == 0 && r.LiveNodes > 0 && r.AckedNodes >= r.LiveNodes {
			allCounted = time.Since(started)
		}
		if line := fmt.Sprintf("%s acked %d/%d off-new-ca %d", r.Phase, r.AckedNodes, r.LiveNodes, r.OffNewCA); line != last {
			logf("n=%d: %v: %s", b.n, time.Since(started).Round(time.Second), line)
			last = line
		}
	}
	cpu := float64(cpuTicks(b.serve.Process.Pid)-cpu0) / clockTicks
	after := fleet.Stats()
	r := v.Rotation

	// The daemons' own record: when each stored the bundle (and acked),
	// and which CA issued the certificate each ends on.
	var acks []time.Duration
	onNew := 0
	for _, d := range fleet.Daemons() {
		if rec := d.Bundle(); rec.Kept > 0 {
			acks = append(acks, rec.First.Sub(started))
			if leaf := d.Identity().Chain[0]; issuedBy(leaf, rec.Roots, newCA) {
				onNew++
			}
		}
	}
	slices.Sort(acks)
	if len(acks) == 0 {
		return errors.New("no daemon stored the bundle")
	}
	q := func(p float64) time.Duration { return acks[min(len(acks)-1, int(p*float64(len(acks)-1)+0.5))] }
	lastAck := acks[len(acks)-1]
	total := r.RetiredAt.Sub(r.StartedAt)

	fmt.Printf("\nnode-CA rotation, %d FakeDaemons, %s, nodeCertTTL %v, threshold %g\n", b.n, b.store, b.certTTL, r.Threshold)
	fmt.Printf("  acks/s                      %.0f (%d daemons acked within %v of start; p50 %v, p99 %v)\n",
		float64(len(acks))/lastAck.Seconds(), len(acks), lastAck.Round(time.Millisecond), q(0.50).Round(time.Millisecond), q(0.99).Round(time.Millisecond))
	fmt.Printf("  status counted every ack    %v after start (polled every %v)\n", allCounted.Round(time.Millisecond), b.poll)
	fmt.Printf("  start -> activated          %v (the reconciler, every 5 s)\n", r.ActivatedAt.Sub(r.StartedAt).Round(time.Millisecond))
	fmt.Printf("  start -> retired            %v (activated -> retired %v: every node renewed onto the new CA)\n",
		total.Round(time.Millisecond), r.RetiredAt.Sub(r.ActivatedAt).Round(time.Millisecond))
	fmt.Printf("  renewals onto the new CA    %d of %d daemons end on it (%.0f/s from activated to retired)\n",
		onNew, b.n, float64(onNew)/r.RetiredAt.Sub(r.ActivatedAt).Seconds())
	fmt.Printf("  sessions                    %d reconnects, %d disconnects during the rotation\n",
		after.Reconnects-before.Reconnects, after.Disconnects-before.Disconnects)
	fmt.Printf("  serve CPU                   %.1f s from start to retired (%.0f%% of one core)\n", cpu, 100*cpu/time.Since(started).Seconds())
	return nil
}

// issuedBy reports whether leaf was signed by the root with id caID.
func issuedBy(leaf *x509.Certificate, roots []*x509.Certificate, caID string) bool {
	for _, r := range roots {
		if pki.NodeCAID(r) == caID {
			return leaf.CheckSignatureFrom(r) == nil
		}
	}
	return false
}

// startServe starts serve with every role and waits for its gateway.
func (b *bench) startServe() error {
	b.serveLog = filepath.Join(b.dir, "serve.log")
	f, err := os.Create(b.serveLog)
	if err != nil {
		return err
	}
	cmd := exec.Command(b.bc, "serve", "--config", b.cfg)
	cmd.Env = b.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	cmd.Stdout = f
	if err := cmd.Start(); err != nil {
		return err
	}
	b.serve = cmd
	ready, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		defer f.Close()
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		seen := false
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(f, line)
			if !seen && strings.Contains(line, `msg="Gateway listening"`) {
				seen = true
				close(ready)
			}
		}
	}()
	select {
	case <-ready:
		logf("serve pid %d", cmd.Process.Pid)
		return nil
	case <-ended:
		return fmt.Errorf("serve exited; see %s", b.serveLog)
	case <-time.After(time.Minute):
		return fmt.Errorf("serve not listening within a minute; see %s", b.serveLog)
	}
}

// cli runs better-compute's CLI against the deployment (its API, as the
// admin of the data dir) and returns its standard output.
func (b *bench) cli(args ...string) ([]byte, error) {
	cmd := exec.Command(b.bc, append([]string{"--config", b.cfg}, args...)...)
	cmd.Env = b.env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("better-compute %s: %w\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return out, nil
}

// cliJSON runs cli with -o json and decodes its output into v.
func (b *bench) cliJSON(v any, args ...string) error {
	out, err := b.cli(append(args, "-o", "json")...)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("better-compute %s -o json: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// initPostgresPKI migrates the database, makes its PKI and a gateway
// certificate, and returns the gateway's tlsFiles lines.
func (b *bench) initPostgresPKI() (string, error) {
	for _, args := range [][]string{
		{"migrate"},
		{"pki", "init", "--trust-domain", "bench.local", "-o", "json"},
		{"pki", "issue-gateway", "--dns", "localhost", "--ip", "127.0.0.1", "--out-dir", b.dir},
	} {
		cmd := exec.Command(b.bc, args...)
		cmd.Env = b.env
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("better-compute %s: %w\n%s%s", strings.Join(args, " "), err, out, stderr.String())
		}
		if args[0] == "pki" && args[1] == "init" {
			// The first admin token, shown once: the CLI calls below
			// use it.
			var res struct {
				AdminToken string `json:"adminToken"`
			}
			if err := json.Unmarshal(out, &res); err != nil || res.AdminToken == "" {
				return "", fmt.Errorf("pki init -o json gave no admin token (%v): %s", err, out)
			}
			b.env = append(b.env, "BETTER_COMPUTE_TOKEN="+res.AdminToken)
		}
	}
	return fmt.Sprintf("    tlsFiles:\n      cert: %s\n      key: %s\n",
		filepath.Join(b.dir, "gateway.crt"), filepath.Join(b.dir, "gateway.key")), nil
}

// pgSchema makes a fresh schema on server and returns a URL that uses it
// and a function that drops it.
func pgSchema(ctx context.Context, server string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		return "", nil, fmt.Errorf("-db %s: %w", server, err)
	}
	defer conn.Close(ctx)
	schema := "bench_" + strings.ToLower(rand.Text()[:10])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return "", nil, fmt.Errorf("create schema: %w", err)
	}
	u, err := url.Parse(server)
	if err != nil {
		return "", nil, fmt.Errorf("-db %s: %w", server, err)
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
	}, nil
}

// raiseFileLimit sets the soft RLIMIT_NOFILE to the hard one.
func raiseFileLimit() {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return
	}
	l.Cur = l.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		logf("cannot raise the file descriptor limit: %v", err)
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

// cpuTicks is pid's utime+stime in clock ticks.
func cpuTicks(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st
}
