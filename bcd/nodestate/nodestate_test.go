package nodestate_test

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/nodestate"
)

var t0 = time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC)

// sample is a disconnected state written by this process at t0.
func sample() *nodestate.State {
	notAfter := t0.Add(20 * time.Hour)
	return &nodestate.State{
		PID: os.Getpid(), UpdatedAt: t0, Since: t0.Add(-5 * time.Minute),
		Gateway: "https://gw-1.example.com:8443", LastError: "connect: connection refused", LastErrorAt: t0,
		CertNotAfter: notAfter, CertRenewAfter: notAfter.Add(-8 * time.Hour),
		ReattestGraceSeconds: int64(nodestate.DefaultReattestGrace / time.Second), ReattestGraceFrom: nodestate.GraceFromDefault,
		ReattestDeadline: notAfter.Add(nodestate.DefaultReattestGrace),
	}
}

func TestWriteRead(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := nodestate.Read(dir); !errors.Is(err, nodestate.ErrNoState) {
		t.Fatalf("Read of an empty directory = %v, want ErrNoState", err)
	}
	s := sample()
	if err := nodestate.Write(dir, s); err != nil {
		t.Fatal(err)
	}
	s.Connected, s.SessionID = true, "sess-2"
	if err := nodestate.Write(dir, s); err != nil { // replaces the first
		t.Fatal(err)
	}
	got, err := nodestate.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if *got != *s || got.Version != nodestate.Version || got.Grace() != 7*24*time.Hour {
		t.Errorf("Read = %+v, want %+v", got, s)
	}
	fi, err := os.Stat(nodestate.Path(dir))
	if err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("state file: %v %v, want mode 0644", fi, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %v, want only %s (no temporary file left)", entries, nodestate.File)
	}

	raw, _ := os.ReadFile(nodestate.Path(dir))
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"version", "pid", "updated_at", "connected", "since", "gateway", "session_id", "last_error",
		"last_error_at", "cert_not_after", "cert_renew_after", "reattest_grace_seconds", "reattest_grace_from", "reattest_deadline"} {
		if _, ok := m[k]; !ok {
			t.Errorf("state file lacks %q: %s", k, raw)
		}
	}

	if err := os.WriteFile(nodestate.Path(dir), []byte(`{"version": 99}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := nodestate.Read(dir); err == nil || !strings.Contains(err.Error(), "layout version 99") {
		t.Errorf("Read of version 99 = %v", err)
	}
}

func TestLine(t *testing.T) {
	t.Parallel()
	s := sample()
	if got, want := s.Line(), "disconnected since 2025-06-01T09:55:00Z: connect: connection refused; certificate valid until 2025-06-02T06:00:00Z"; got != want {
		t.Errorf("Line = %q, want %q", got, want)
	}
	s.LastError = ""
	if got := s.Line(); !strings.Contains(got, ": not connected yet;") {
		t.Errorf("Line without error = %q", got)
	}
	s.Connected = true
	if got, want := s.Line(), "connected to https://gw-1.example.com:8443 since 2025-06-01T09:55:00Z"; got != want {
		t.Errorf("Line = %q, want %q", got, want)
	}
	if got := nodestate.OneLine(errors.New("a\n  b\tc")); got != "a b c" {
		t.Errorf("OneLine = %q", got)
	}
}

func TestInspect(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Hour)
	for _, tc := range []struct {
		name     string
		pid      int
		lock     bool // hold the data directory lock
		lockFile bool
		want     string // in NotRunning; "" for running
	}{
		{name: "running", pid: os.Getpid(), lock: true, lockFile: true},
		{name: "lock free", pid: os.Getpid(), lockFile: true, want: "no bcd node holds the data directory lock (bcd.lock)"},
		{name: "no lock file", pid: os.Getpid(), want: "no bcd.lock"},
		{name: "process gone", pid: math.MaxInt32, lock: true, lockFile: true, want: "process 2147483647 that wrote it is gone"},
		{name: "no process", pid: 0, want: "names no process"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			s := sample()
			s.PID = tc.pid
			if err := nodestate.Write(dir, s); err != nil {
				t.Fatal(err)
			}
			if tc.lockFile {
				if err := os.WriteFile(filepath.Join(dir, identity.LockFile), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.lock {
				release, err := identity.NewStore(dir).Lock()
				if err != nil {
					t.Fatal(err)
				}
				defer release()
			}
			r, err := nodestate.Inspect(dir, now)
			if err != nil {
				t.Fatal(err)
			}
			if r.Running != (tc.want == "") || !strings.Contains(r.NotRunning, tc.want) || (tc.want == "") != (r.NotRunning == "") {
				t.Errorf("Running %v, NotRunning %q; want %q", r.Running, r.NotRunning, tc.want)
			}
			if r.Healthy() {
				t.Error("a disconnected node is healthy")
			}
		})
	}
	if _, err := nodestate.Inspect(t.TempDir(), now); !errors.Is(err, nodestate.ErrNoState) {
		t.Errorf("Inspect of an empty directory = %v", err)
	}
}

func TestReportFigures(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := nodestate.Write(dir, sample()); err != nil {
		t.Fatal(err)
	}
	r, err := nodestate.Inspect(dir, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if r.CertLeftSeconds != 19*3600 || r.ReattestLeftSeconds != (19+7*24)*3600 {
		t.Errorf("left: cert %d s, reattest %d s", r.CertLeftSeconds, r.ReattestLeftSeconds)
	}
	if got, want := r.CertificateSummary(), "2025-06-02T06:00:00Z (19h0m left)"; got != want {
		t.Errorf("CertificateSummary = %q, want %q", got, want)
	}
	if got := r.ReattestSummary(); !strings.HasPrefix(got, "7d19h left (until 2025-06-09T06:00:00Z; grace 7d0h, the default, assumed") {
		t.Errorf("ReattestSummary = %q", got)
	}
	r.GatewayNow = t0.Add(22 * time.Hour)
	if got := r.CertificateSummary(); got != "2025-06-02T06:00:00Z (expired 2h0m ago)" {
		t.Errorf("expired CertificateSummary = %q", got)
	}
	r.ReattestGraceFrom, r.ReattestGraceSeconds = nodestate.GraceFromGateway, 0
	if got := r.ReattestSummary(); !strings.HasPrefix(got, "off") {
		t.Errorf("ReattestSummary without grace = %q", got)
	}

	// A machine 48 h ahead whose bcd node measured it: the certificate is
	// judged by the gateway's time, and has 19 h left, not "expired".
	ahead := sample()
	ahead.ClockSkewSeconds = 48 * 3600
	if err := nodestate.Write(dir, ahead); err != nil {
		t.Fatal(err)
	}
	r, err = nodestate.Inspect(dir, t0.Add(49*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.CertificateSummary(), "2025-06-02T06:00:00Z (19h0m left)"; got != want || r.CertLeftSeconds != 19*3600 {
		t.Errorf("48 h ahead: CertificateSummary = %q (%d s), want %q", got, r.CertLeftSeconds, want)
	}
	if got := r.ClockSummary(); !strings.HasPrefix(got, "172800 s ahead of the gateway's") {
		t.Errorf("48 h ahead: ClockSummary = %q", got)
	}

	// The JSON form is one object: the state's fields and the report's.
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"connected", "since", "gateway", "cert_not_after", "now", "running", "not_running", "cert_left_seconds", "reattest_left_seconds"} {
		if _, ok := m[k]; !ok {
			t.Errorf("report JSON lacks %q: %s", k, raw)
		}
	}
}

func TestHuman(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0: "0s", 12 * time.Second: "12s", 4*time.Minute + 5*time.Second: "4m5s", 23*time.Hour + 59*time.Minute: "23h59m",
		7*24*time.Hour + 23*time.Hour + 30*time.Minute: "7d23h", 1500 * time.Millisecond: "2s",
	} {
		if got := nodestate.Human(d); got != want {
			t.Errorf("Human(%v) = %q, want %q", d, got, want)
		}
	}
}
