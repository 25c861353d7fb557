package plugin

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// startMargin is the BMC timeout of the tests' calls that may start the
// plugin, and the bound of their waits for a (re)start: a call's deadline
// covers the plugin's start (exec of the -race test binary, the handshake),
// which takes seconds when both cores of the machine are busy ("plugin
// unavailable: still starting: context deadline exceeded" with 1 s). It is
// above StartTimeout, which then bounds the start. Calls whose timeout is
// what the test is about keep their short ones, and run on a started plugin.
const startMargin = 30 * time.Second

// testConfig is a Config for tests: short timeouts and backoff, logs to
// sink.
func testConfig(dir string, sink *logSink) Config {
	return Config{
		Dir:            dir,
		StartTimeout:   20 * time.Second, // a -race test binary starts slowly on 2 cores
		CallGrace:      200 * time.Millisecond,
		HealthTimeout:  5 * time.Second, // answered in milliseconds when idle, seconds when busy
		HealthInterval: time.Hour,
		MinBackoff:     50 * time.Millisecond,
		MaxBackoff:     200 * time.Millisecond,
		Logger:         slog.New(sink),
	}
}

func newTestHost(t *testing.T, cfg Config) *Host {
	t.Helper()
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func power(addr string, timeout time.Duration) *pluginv1.PowerRequest {
	return &pluginv1.PowerRequest{
		Target: &pluginv1.BMCTarget{Address: addr, Username: "admin", Password: "pw-" + addr + "-secret",
			Timeout: durationpb.New(timeout)},
		Action: pluginv1.PowerAction_POWER_ACTION_STATUS,
	}
}

func TestPowerAndList(t *testing.T) {
	t.Parallel()
	sink := newLogSink(t)
	h := newTestHost(t, testConfig(pluginDir(t, "fake"), sink))

	if got := h.List(); len(got) != 1 || got[0].Name != "fake" || got[0].Running {
		t.Fatalf("List before any call = %+v, want fake, not running", got)
	}
	resp, err := h.Power(context.Background(), "fake", power("ok", startMargin))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetState() != pluginv1.PowerState_POWER_STATE_ON {
		t.Errorf("state = %v, want ON", resp.GetState())
	}
	if _, err := h.BootDevice(context.Background(), "fake", &pluginv1.BootDeviceRequest{Target: power("ok", startMargin).Target}); err != nil {
		t.Errorf("BootDevice: %v", err)
	}
	st := h.List()[0]
	if !st.Running || !st.Healthy || st.Version != "1.2.3" || st.PID == 0 || st.Starts != 1 {
		t.Errorf("List = %+v, want running, healthy, version 1.2.3, a pid, 1 start", st)
	}
	if name, ok := h.Find(CapabilityPower); !ok || name != "fake" {
		t.Errorf("Find(power) = %q, %v", name, ok)
	}
	if _, ok := h.Find("nope"); ok {
		t.Error("Find(nope) found a plugin")
	}
}

func TestNotFoundAndClosed(t *testing.T) {
	t.Parallel()
	h := newTestHost(t, testConfig(pluginDir(t), newLogSink(t)))
	_, err := h.Power(context.Background(), "ipmi", power("ok", startMargin))
	var pe *Error
	if !errors.Is(err, ErrNotFound) || !errors.As(err, &pe) || pe.Plugin != "ipmi" {
		t.Fatalf("Power on a missing plugin: %v, want ErrNotFound naming ipmi", err)
	}
	h.Close()
	if _, err := h.Power(context.Background(), "ipmi", power("ok", startMargin)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Power after Close: %v, want ErrClosed", err)
	}
}

func TestPluginInstalledLater(t *testing.T) {
	t.Parallel()
	dir := pluginDir(t)
	h := newTestHost(t, testConfig(dir, newLogSink(t)))
	exe, _ := os.Executable()
	if err := os.Symlink(exe, filepath.Join(dir, "bcx-fake")); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Power(context.Background(), "fake", power("ok", startMargin)); err != nil {
		t.Fatalf("Power on a plugin installed after New: %v", err)
	}
}

func TestUnsupported(t *testing.T) {
	t.Parallel()
	h := newTestHost(t, testConfig(pluginDir(t, "nocaps"), newLogSink(t)))
	_, err := h.Power(context.Background(), "nocaps", power("ok", startMargin))
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("Power on a plugin without the power capability: %v, want ErrUnsupported", err)
	}
}

func TestPluginErrors(t *testing.T) {
	t.Parallel()
	h := newTestHost(t, testConfig(pluginDir(t, "fake"), newLogSink(t)))
	_, err := h.Power(context.Background(), "fake", power("nope", startMargin))
	var pe *Error
	if !errors.Is(err, ErrInvalid) || !errors.As(err, &pe) || pe.Reason != ReasonInvalidRequest {
		t.Errorf("invalid request: %v, want ErrInvalid with reason INVALID_REQUEST", err)
	}
	_, err = h.Power(context.Background(), "fake", power("plain", time.Second))
	if !errors.Is(err, ErrBMC) || !strings.Contains(err.Error(), "plain failure") {
		t.Errorf("plain error: %v, want ErrBMC with the plugin's message", err)
	}
	_, err = h.Power(context.Background(), "fake", &pluginv1.PowerRequest{})
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("no target: %v, want ErrInvalid", err)
	}
}

// A password the plugin leaks into its error and its log reaches neither
// the caller nor bcd's log.
func TestRedaction(t *testing.T) {
	t.Parallel()
	sink := newLogSink(t)
	h := newTestHost(t, testConfig(pluginDir(t, "fake"), sink))
	req := power("leak", startMargin)
	secret := req.Target.Password
	_, err := h.Power(context.Background(), "fake", req)
	var pe *Error
	if !errors.Is(err, ErrBMC) || !errors.As(err, &pe) || pe.Reason != ReasonAuthFailed {
		t.Fatalf("leak: %v, want ErrBMC with reason AUTH_FAILED", err)
	}
	if strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), Redacted) {
		t.Errorf("error %q holds the password or no %s", err, Redacted)
	}
	sink.waitFor("Fake leaking "+Redacted, startMargin)
	if log := sink.buf.String(); strings.Contains(log, secret) {
		t.Errorf("log holds the password:\n%s", log)
	}
}

// A plugin that never answers cannot hold a call past its deadline; one
// that answers its health check is kept, one that does not is restarted.
func TestHungPlugin(t *testing.T) {
	t.Parallel()
	sink := newLogSink(t)
	h := newTestHost(t, testConfig(pluginDir(t, "fake"), sink))
	if _, err := h.Power(context.Background(), "fake", power("ok", startMargin)); err != nil {
		t.Fatal(err) // started outside the timing below
	}

	start := time.Now()
	_, err := h.Power(context.Background(), "fake", power("hang", 300*time.Millisecond))
	took := time.Since(start)
	t.Logf("hung call returned after %s: %v", took, err)
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("hung call: %v, want ErrTimeout", err)
	}
	if took > 3*time.Second {
		t.Errorf("hung call took %s, want about 300ms + 200ms grace", took)
	}
	sink.waitFor("Plugin still answers its health check", startMargin)
	if _, err := h.Power(context.Background(), "fake", power("ok", startMargin)); err != nil {
		t.Fatalf("call after a hung call: %v", err)
	}
	if s := h.List()[0]; s.Starts != 1 {
		t.Errorf("a plugin that still answers its health check was restarted: %+v", s)
	}

	_, err = h.Power(context.Background(), "fake", power("hang-health", 300*time.Millisecond))
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("hung call: %v, want ErrTimeout", err)
	}
	sink.waitFor("Plugin failed", startMargin)
	if _, err := h.Power(context.Background(), "fake", power("ok", startMargin)); err != nil {
		t.Fatalf("call after the hung plugin was killed: %v", err)
	}
	if s := h.List()[0]; s.Starts != 2 {
		t.Errorf("Starts = %d, want 2 (restarted after failing its health check)", s.Starts)
	}
}

// A plugin killed during a call fails that call at once; the next call
// runs on a restarted plugin.
func TestCrashMidCall(t *testing.T) {
	t.Parallel()
	sink := newLogSink(t)
	cfg := testConfig(pluginDir(t, "fake"), sink)
	h := newTestHost(t, cfg)
	if _, err := h.Power(context.Background(), "fake", power("ok", startMargin)); err != nil {
		t.Fatal(err)
	}
	pid := h.List()[0].PID

	errc := make(chan error, 1)
	var took time.Duration
	go func() {
		start := time.Now()
		_, err := h.Power(context.Background(), "fake", power("block", 30*time.Second))
		took = time.Since(start)
		errc <- err
	}()
	sink.waitFor("Fake call received", startMargin)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-errc:
	case <-time.After(startMargin):
		t.Fatalf("the call on a killed plugin did not return within %s", startMargin)
	}
	t.Logf("call on a killed plugin returned after %s: %v", took, err)
	if !errors.Is(err, ErrCrashed) {
		t.Fatalf("call on a killed plugin: %v, want ErrCrashed", err)
	}
	sink.waitFor("Plugin failed", startMargin) // the exit is counted and logged
	if _, err := h.Power(context.Background(), "fake", power("ok", startMargin)); err != nil {
		t.Fatalf("call after the crash: %v", err)
	}
	s := h.List()[0]
	if s.Starts != 2 || s.PID == pid || s.Failures != 1 {
		t.Errorf("after the crash: %+v, want 2 starts, a new pid, 1 failure", s)
	}
}

// Run restarts a plugin that dies between calls, without waiting for one.
func TestRunRestarts(t *testing.T) {
	t.Parallel()
	sink := newLogSink(t)
	h := newTestHost(t, testConfig(pluginDir(t, "fake"), sink))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	sink.waitFor("Plugin started", 20*time.Second)
	pid := h.List()[0].PID
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	sink.waitFor("Plugin started", 20*time.Second)
	if s := h.List()[0]; !s.Running || s.PID == pid || s.Starts != 2 {
		t.Errorf("after the kill: %+v, want running again under a new pid", s)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := syscall.Kill(h.List()[0].PID, 0); err == nil && h.List()[0].PID != 0 {
		t.Error("plugin still running after Run returned")
	}
}

// A plugin of another protocol version, or one that exits at start, is
// refused with a clear error and retried with growing backoff.
func TestStartFailures(t *testing.T) {
	t.Parallel()
	h := newTestHost(t, testConfig(pluginDir(t, "v2", "badexit"), newLogSink(t)))
	_, err := h.Power(context.Background(), "v2", power("ok", startMargin))
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "ncompatible") {
		t.Errorf("protocol v2 plugin: %v, want ErrUnavailable naming the incompatible version", err)
	}
	t.Logf("v2: %v", err)
	_, err = h.Power(context.Background(), "badexit", power("ok", startMargin))
	t.Logf("badexit: %v", err)
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("plugin exiting at start: %v, want ErrUnavailable", err)
	}
	for _, s := range h.List() {
		if s.Healthy || s.Running || s.Failures != 1 || s.Message == "" {
			t.Errorf("List: %+v, want unhealthy, not running, 1 failure, a message", s)
		}
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	for n, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 10: time.Minute} {
		got := backoff(time.Second, time.Minute, n)
		if got < want || got > want+want/5 {
			t.Errorf("backoff(%d) = %s, want %s plus up to 20%%", n, got, want)
		}
	}
}

func TestDiscover(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name string, mode os.FileMode) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	write("bcx-ipmi", 0o755)
	write("bcx-Bad", 0o755)
	write("bcx-noexec", 0o644)
	write("bcx-writable", 0o777)
	write("other", 0o755)
	if err := os.Mkdir(filepath.Join(dir, "bcx-dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	list, skips, err := discover(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].name != "ipmi" {
		t.Errorf("found %+v, want only ipmi", list)
	}
	if len(skips) != 4 {
		t.Errorf("skipped %+v, want bcx-Bad, bcx-noexec, bcx-writable, bcx-dir", skips)
	}
	if list, _, err := discover(filepath.Join(dir, "missing")); err != nil || len(list) != 0 {
		t.Errorf("missing dir: %v, %v; want no plugins, no error", list, err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, _, err := discover(dir); err == nil {
		t.Error("world-writable plugin directory accepted")
	}
}
