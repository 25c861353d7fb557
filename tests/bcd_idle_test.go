package tests

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	"github.com/better-compute/better-compute/tests/testenv"
)

var idleFor = flag.Duration("bcd.idle", time.Minute, "how long BenchmarkBcdNodeIdle measures an idle bcd node")

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture bcd is built for.
const clockTicks = 100

// BenchmarkBcdNodeIdle starts a real `bcd node` (joined through a test
// gateway in this process, 10 s heartbeats, no NVIDIA driver on this
// machine) and, once its first inventory has arrived, samples its resident
// memory (VmRSS) every second and its CPU time (utime + stime) for
// -bcd.idle (default 60 s):
//
//	go test -run '^$' -bench BcdNodeIdle -benchtime 1x ./tests/
//
// It prints; it asserts nothing. docs/performance.md records the figures.
// BCD_BENCH_BIN=PATH measures that bcd binary instead of the one built from
// this tree (for example one built with release flags or build tags).
func BenchmarkBcdNodeIdle(b *testing.B) {
	bcd := os.Getenv("BCD_BENCH_BIN")
	if bcd == "" {
		bcd = testenv.Binary(b, "bcd")
	}
	p := sessiontest.NewPKI(b)
	g := sessiontest.NewGateway(b, p, sessiontest.GatewayOptions{HeartbeatInterval: 10 * time.Second})
	tok := p.NewToken(b)
	g.AddToken(tok)
	data := filepath.Join(b.TempDir(), "data")
	if code, out, errOut := testenv.Run(b, []string{"BCD_JOIN_TOKEN=" + tok}, "", bcd, "join", "--gateway", g.URL, "--data-dir", data); code != 0 {
		b.Fatalf("bcd join: exit %d: %s %s", code, out, errOut)
	}

	for range b.N {
		node := testenv.Start(b, nil, bcd, "node", "--data-dir", data, "--log-level", "warn")
		s := g.NextSession(b, 30*time.Second)
		deadline := time.After(30 * time.Second)
		for got := false; !got; {
			select {
			case m := <-s.Messages():
				got = m.GetInventory() != nil
			case <-deadline:
				b.Fatal("no inventory")
			}
		}
		pid := node.Pid()
		cpu0 := cpuTicks(b, pid)
		start := time.Now()
		var maxRSS, sumRSS, n uint64
		tick := time.NewTicker(time.Second)
		heartbeats := 0
		for time.Since(start) < *idleFor {
			select {
			case <-tick.C:
				rss := statusKB(b, pid, "VmRSS")
				maxRSS = max(maxRSS, rss)
				sumRSS += rss
				n++
			case <-s.Heartbeats():
				heartbeats++
			}
		}
		tick.Stop()
		elapsed := time.Since(start)
		cpu := float64(cpuTicks(b, pid)-cpu0) / clockTicks
		endRSS := statusKB(b, pid, "VmRSS")
		anon, file := statusKB(b, pid, "RssAnon"), statusKB(b, pid, "RssFile")
		hwm := statusKB(b, pid, "VmHWM")
		node.Stop(syscallTERM, 10*time.Second)

		cpuPct := 100 * cpu / elapsed.Seconds()
		b.ReportMetric(float64(maxRSS)/1024, "rss-max-MiB")
		b.ReportMetric(float64(sumRSS)/float64(n)/1024, "rss-mean-MiB")
		b.ReportMetric(float64(hwm)/1024, "rss-peak-MiB")
		b.ReportMetric(cpuPct, "cpu-%-of-core")
		b.Logf("idle bcd node over %v: RSS mean %.1f MiB, max %.1f MiB, at end %.1f MiB (anonymous %.1f, file-backed %.1f), "+
			"peak since start (VmHWM) %.1f MiB; CPU %.2f s = %.3f%% of one core; %d heartbeats",
			elapsed.Round(time.Second), float64(sumRSS)/float64(n)/1024, float64(maxRSS)/1024, float64(endRSS)/1024,
			float64(anon)/1024, float64(file)/1024, float64(hwm)/1024, cpu, cpuPct, heartbeats)
	}
}

// statusKB reads a "Key: N kB" line of /proc/<pid>/status.
func statusKB(tb testing.TB, pid int, key string) uint64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				v, err := strconv.ParseUint(f[0], 10, 64)
				if err == nil {
					return v
				}
			}
		}
	}
	tb.Fatalf("no %s in /proc/%d/status", key, pid)
	return 0
}

// cpuTicks returns utime + stime of pid, in clock ticks.
func cpuTicks(tb testing.TB, pid int) uint64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: state is field 3, utime 14, stime 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		tb.Fatalf("short /proc/%d/stat: %q", pid, s)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		tb.Fatalf("/proc/%d/stat: %q", pid, s)
	}
	return ut + st
}
