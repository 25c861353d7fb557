package sim_test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
)

var benchSessions = flag.Int("sim.sessions", 1000, "sessions BenchmarkFleetClientMemory holds")

// helperEnv makes the test binary act as a test gateway process.
const helperEnv = "BC_SIM_TEST_GATEWAY"

// TestHelperGateway is not a test: run with helperEnv set, it serves a
// sessiontest gateway, prints its URL and a join token on stdout, and
// stops when stdin closes. BenchmarkFleetClientMemory runs it as a separate
// process so that only the daemons' memory is measured.
func TestHelperGateway(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("helper process only")
	}
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{HeartbeatInterval: 10 * time.Second})
	tok := p.NewToken(t)
	g.AddToken(tok)
	fmt.Printf("%s %s\n", g.URL, tok)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
}

// BenchmarkFleetClientMemory holds -sim.sessions sessions (default 1,000)
// from one Fleet against a gateway in another process and reports the Go
// heap and goroutines per session on the daemons' side:
//
//	go test -run '^$' -bench FleetClientMemory -benchtime 1x ./controlplane/pkg/sim -sim.sessions 10000
//
// With SIM_HEAP_PROFILE=FILE set it also writes a heap profile to FILE and
// a goroutine profile to FILE.goroutines while all sessions are held.
func BenchmarkFleetClientMemory(b *testing.B) {
	n := *benchSessions
	cmd := exec.Command(os.Args[0], "-test.run", "^TestHelperGateway$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatalf("helper gateway: %v", err)
	}
	url, tok, _ := strings.Cut(strings.TrimSpace(line), " ")

	for range b.N {
		f, err := sim.NewFleet(sim.FleetConfig{
			GatewayURL: url, Token: tok, N: n, NoInventory: true,
			Session: session.Config{StartJitter: time.Second, HandshakeTimeout: time.Minute},
		})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		start := time.Now()
		if err := f.Join(ctx); err != nil {
			b.Fatal(err)
		}
		joinRate := float64(n) / time.Since(start).Seconds()
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		g0 := runtime.NumGoroutine()

		runCtx, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- f.Run(runCtx) }()
		if err := f.WaitFor(ctx, func(s sim.FleetStats) bool { return s.Connected == n }); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		g1 := runtime.NumGoroutine()
		if path := os.Getenv("SIM_HEAP_PROFILE"); path != "" {
			if fh, err := os.Create(path); err == nil {
				_ = pprof.WriteHeapProfile(fh)
				fh.Close()
			}
			if fh, err := os.Create(path + ".goroutines"); err == nil {
				_ = pprof.Lookup("goroutine").WriteTo(fh, 1)
				fh.Close()
			}
		}
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/float64(n), "heap-B/session")
		b.ReportMetric(float64(after.StackInuse-before.StackInuse)/float64(n), "stack-B/session")
		b.ReportMetric(float64(g1-g0)/float64(n), "goroutines/session")
		b.ReportMetric(joinRate, "joins/s")
		stop()
		<-done
		cancel()
	}
}
