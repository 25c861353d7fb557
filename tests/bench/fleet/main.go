// Command fleet runs N simulated daemons (controlplane/pkg/sim FakeDaemons,
// bcd's own protocol client over real TLS) against a real gateway, in a
// process of their own, for the session benchmarks (tests/bench/sessions):
//
//	go run ./tests/bench/fleet --gateway https://localhost:8443 --token-file F --n 10000
//
// It joins the daemons (a failed join is retried, with a "join-error"
// line; the token needs room for the joins the failures used), prints one
// "joined" line, runs them, and prints a
// "stats" line every second until SIGINT or SIGTERM (or, with
// --stop-on-eof, the end of standard input):
//
//	joined n=10000 seconds=19.8 rate=505.1 failures=0
//	stats t_ms=1764000000000 joined=10000 connected=10000 connects=10000 reconnects=0 disconnects=0 stopped=0 rss_kib=912345
//
// t_ms is the Unix time in milliseconds; connects, reconnects and
// disconnects are running totals (sim.FleetStats). With --renew-for it
// renews the daemons' certificates instead of running their sessions, for
// tests/bench/sessions -renewals (renew.go).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
)

// maxJoinRetries bounds how often Fleet.Join is called again after a
// failure.
const maxJoinRetries = 20

func main() {
	gateway := flag.String("gateway", "", "gateway URL to join through, https://host:port (required)")
	tokenFile := flag.String("token-file", "", "file holding a join token that admits at least --n joins, more when joins fail (required)")
	n := flag.Int("n", 1000, "number of simulated daemons")
	concurrency := flag.Int("join-concurrency", sim.DefaultJoinConcurrency, "joins at once")
	prefix := flag.String("prefix", "bench", "hostname prefix of the daemons")
	noInventory := flag.Bool("no-inventory", false, "do not send the simulated inventory after the first Welcome")
	verbose := flag.Bool("v", false, "log the daemons' warnings on stderr")
	stopOnEOF := flag.Bool("stop-on-eof", false, "stop at the end of standard input (so as never to outlive the program that started it)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the joins to this file")
	var renew renewOptions
	flag.StringVar(&renew.afterFile, "renew-after-file", "", "after the joins, write each daemon's time of issue, renew_after and NotAfter to this file (renew.go)")
	flag.DurationVar(&renew.d, "renew-for", 0, "instead of running the sessions, renew the daemons' certificates for this long and print a \"renewed\" line (renew.go)")
	flag.IntVar(&renew.concurrency, "renew-concurrency", 64, "with --renew-for: renewals at once")
	flag.Parse()
	if *gateway == "" || *tokenFile == "" || *n < 1 {
		fmt.Fprintln(os.Stderr, "fleet: --gateway, --token-file and --n ≥ 1 are required")
		os.Exit(2)
	}
	if err := run(*gateway, *tokenFile, *n, *concurrency, *prefix, *noInventory, *verbose, *stopOnEOF, *cpuProfile, renew); err != nil {
		fmt.Fprintf(os.Stderr, "fleet: %v\n", err)
		os.Exit(1)
	}
}

func run(gateway, tokenFile string, n, concurrency int, prefix string, noInventory, verbose, stopOnEOF bool, cpuProfile string, renew renewOptions) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if stopOnEOF {
		go func() {
			_, _ = bufio.NewReader(os.Stdin).ReadString(0)
			stop()
		}()
	}
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		return err
	}
	log := slog.New(slog.DiscardHandler)
	if verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	f, err := sim.NewFleet(sim.FleetConfig{
		GatewayURL: gateway, Token: strings.TrimSpace(string(tok)), N: n, JoinConcurrency: concurrency,
		NamePrefix: prefix, NoInventory: noInventory, Logger: log,
		Session: session.Config{Logger: log},
	})
	if err != nil {
		return err
	}
	// A failed join (the gateway answering INTERNAL under load, say) is
	// reported and retried, as an installer would; Fleet.Join stops at the
	// first failure and a second call joins the rest.
	if cpuProfile != "" {
		fh, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(fh); err != nil {
			return err
		}
		defer fh.Close()
	}
	start := time.Now()
	failures := 0
	for {
		err := f.Join(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil || failures == maxJoinRetries {
			return err
		}
		failures++
		fmt.Printf("join-error joined=%d err=%q\n", f.Stats().Joined, err.Error())
	}
	secs := time.Since(start).Seconds()
	if cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	fmt.Printf("joined n=%d seconds=%.2f rate=%.1f failures=%d\n", n, secs, float64(n)/secs, failures)
	if renew.afterFile != "" {
		if err := writeRenewAfter(renew.afterFile, f.Daemons()); err != nil {
			return err
		}
		fmt.Printf("renew-after-written file=%s\n", renew.afterFile)
	}
	if renew.d > 0 {
		if err := renewFor(ctx, f.Daemons(), renew); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	}

	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			s := f.Stats()
			fmt.Printf("stats t_ms=%d joined=%d connected=%d connects=%d reconnects=%d disconnects=%d stopped=%d rss_kib=%d\n",
				time.Now().UnixMilli(), s.Joined, s.Connected, s.Connects, s.Reconnects, s.Disconnects, s.Stopped, rssKiB())
		case err := <-done:
			return err
		}
	}
}

// rssKiB is this process's resident set size, 0 when unknown.
func rssKiB() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kib int64
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kib)
			return kib
		}
	}
	return 0
}
