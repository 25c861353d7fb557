package plugin

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// The test binary doubles as the plugins the tests run: linked into a
// plugin directory as bcx-<name>, it serves the fake named by its argv[0]
// instead of running tests.
func TestMain(m *testing.M) {
	switch filepath.Base(os.Args[0]) {
	case "bcx-fake":
		serveFake([]string{CapabilityPower, CapabilityBoot, CapabilityBMCInfo})
		return
	case "bcx-nocaps":
		serveFake(nil)
		return
	case "bcx-v2":
		// A plugin of a future protocol version only.
		goplugin.Serve(&goplugin.ServeConfig{
			HandshakeConfig:  goplugin.HandshakeConfig{ProtocolVersion: 2, MagicCookieKey: Handshake.MagicCookieKey, MagicCookieValue: Handshake.MagicCookieValue},
			VersionedPlugins: map[int]goplugin.PluginSet{2: {pluginSetKey: &grpcPlugin{impl: &fake{}}}},
			GRPCServer:       goplugin.DefaultGRPCServer,
		})
		return
	case "bcx-badexit":
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func serveFake(caps []string) {
	log := slog.New(NewLogHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	Serve(&fake{log: log, caps: caps}, log)
}

// fake is a plugin whose behaviour the BMC address chooses:
//
//	"ok"          answers POWER_STATE_ON
//	"block"       logs "Fake call received", then waits for the call's end
//	"hang"        logs "Fake call received", then never answers, ignoring the context
//	"hang-health" like hang, and Health stops answering too
//	"leak"        logs the password and returns an error holding it
//	"plain"       returns an error without the plugin ErrorInfo
type fake struct {
	pluginv1.UnimplementedPluginServiceServer
	log        *slog.Logger
	caps       []string
	hangHealth atomic.Bool
}

func (f *fake) Info(context.Context, *pluginv1.InfoRequest) (*pluginv1.InfoResponse, error) {
	name := strings.TrimPrefix(filepath.Base(os.Args[0]), ExecPrefix)
	return &pluginv1.InfoResponse{Name: name, Version: "1.2.3", Capabilities: f.caps}, nil
}

func (f *fake) Health(ctx context.Context, _ *pluginv1.HealthRequest) (*pluginv1.HealthResponse, error) {
	if f.hangHealth.Load() {
		select {}
	}
	return &pluginv1.HealthResponse{Healthy: true, Message: "fake ok"}, nil
}

func (f *fake) Power(ctx context.Context, req *pluginv1.PowerRequest) (*pluginv1.PowerResponse, error) {
	t := req.GetTarget()
	switch t.GetAddress() {
	case "ok":
		return &pluginv1.PowerResponse{State: pluginv1.PowerState_POWER_STATE_ON, RawState: "on"}, nil
	case "block":
		f.log.Info("Fake call received")
		<-ctx.Done()
		return nil, StatusError(ReasonTimeout, "bmc block: "+ctx.Err().Error())
	case "hang-health":
		f.hangHealth.Store(true)
		fallthrough
	case "hang":
		f.log.Info("Fake call received")
		select {}
	case "leak":
		f.log.Warn("Fake leaking "+t.GetPassword(), "password", t.GetPassword())
		return nil, StatusError(ReasonAuthFailed, "bmc leak: wrong password "+t.GetPassword())
	case "plain":
		return nil, status.Error(codes.Internal, "plain failure")
	}
	return nil, StatusError(ReasonInvalidRequest, "unknown fake address "+t.GetAddress())
}

func (f *fake) BootDevice(context.Context, *pluginv1.BootDeviceRequest) (*pluginv1.BootDeviceResponse, error) {
	return &pluginv1.BootDeviceResponse{Provider: pluginv1.Provider_PROVIDER_IPMITOOL}, nil
}

// pluginDir makes a plugin directory holding the test binary linked as each
// bcx-<name>.
func pluginDir(t *testing.T, names ...string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, n := range names {
		if err := os.Symlink(exe, filepath.Join(dir, ExecPrefix+n)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// logSink collects a host's log records and signals messages tests wait
// for.
type logSink struct {
	t      *testing.T
	h      slog.Handler
	buf    *lockedBuffer
	waitCh chan string
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newLogSink(t *testing.T) *logSink {
	buf := &lockedBuffer{}
	return &logSink{
		t:      t,
		h:      slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}),
		buf:    buf,
		waitCh: make(chan string, 100),
	}
}

func (s *logSink) Enabled(context.Context, slog.Level) bool { return true }

func (s *logSink) Handle(ctx context.Context, r slog.Record) error {
	select {
	case s.waitCh <- r.Message:
	default:
	}
	return s.h.Handle(ctx, r)
}

func (s *logSink) WithAttrs(as []slog.Attr) slog.Handler {
	c := *s
	c.h = s.h.WithAttrs(as)
	return &c
}

func (s *logSink) WithGroup(name string) slog.Handler {
	c := *s
	c.h = s.h.WithGroup(name)
	return &c
}

// waitFor waits for a record with message msg.
func (s *logSink) waitFor(msg string, d time.Duration) {
	s.t.Helper()
	deadline := time.After(d)
	for {
		select {
		case m := <-s.waitCh:
			if m == msg {
				return
			}
		case <-deadline:
			s.t.Fatalf("no log record %q within %s; log:\n%s", msg, d, s.buf.String())
		}
	}
}
