package agent_test

import (
	"context"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/agent"
	"github.com/better-compute/better-compute/bcd/cmduser"
	"github.com/better-compute/better-compute/bcd/inventory"
	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
	"github.com/better-compute/better-compute/bcd/journal"
	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

const wait = 10 * time.Second

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// noNVML returns a GPU collector on a mock NVML whose library is missing,
// as on a host without NVIDIA driver.
func noNVML(t *testing.T) *gpu.Collector {
	t.Helper()
	s := gputest.NewDGXA100()
	s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	return newCollector(t, s)
}

func newCollector(t *testing.T, n nvml.Interface) *gpu.Collector {
	t.Helper()
	c, err := gpu.New(gpu.Config{NVML: n, Logger: testLogger(t), EventWaitTimeout: 20 * time.Millisecond,
		Runner: gputest.NewFabricManager()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// running is an agent started by start.
type running struct {
	gw   *sessiontest.Gateway
	stop context.CancelFunc
	done chan error
}

// start runs an agent configured by cfg (its Session identity, trust and
// timeouts filled in here) against a fresh test gateway, and stops it when
// the test ends.
func start(t *testing.T, cfg agent.Config) *running {
	t.Helper()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	key := sessiontest.NewKey(t)
	now := time.Now()
	cert := p.NodeCertificate(t, key, "node-1", now.Add(-time.Minute), now.Add(time.Hour))
	s := &cfg.Session
	s.Gateways = []string{g.URL}
	s.Trust = session.Trust{Pin: p.Pin()}
	s.Key = key
	s.Chain = []*x509.Certificate{cert}
	s.StartJitter = -1
	s.BackoffBase = 10 * time.Millisecond
	s.BackoffMax = 50 * time.Millisecond
	s.Logger = testLogger(t)
	if cfg.GPU == nil {
		cfg.GPU = noNVML(t)
	}
	if cfg.CommandUser == nil && !cfg.Unprivileged && os.Geteuid() == 0 {
		cfg.CommandUser, cfg.CommandHome = commandUser(t)
	}
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{gw: g, stop: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() { r.shutdown(t) })
	return r
}

// commandUser returns nobody as the command user, with a HOME it can
// reach (switching to it needs root).
func commandUser(t *testing.T) (*cmduser.User, string) {
	t.Helper()
	u, err := cmduser.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	return &u, filepath.Join(openDir(t), cmduser.HomeDir)
}

// openDir returns a fresh folder every user can write, removed when the
// test ends.
func openDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "bc-agent-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

// shutdown stops the agent and checks that Run returned nil.
func (r *running) shutdown(t *testing.T) {
	t.Helper()
	r.stop()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		r.done <- nil // later calls return at once
	case <-time.After(wait):
		t.Fatal("Run did not return after cancellation")
	}
}

// next returns the next message of s for which match is true, skipping
// the others.
func next(t *testing.T, s *sessiontest.Session, what string, match func(*sessionv1.NodeMessage) bool) *sessionv1.NodeMessage {
	t.Helper()
	deadline := time.After(wait)
	for {
		select {
		case m := <-s.Messages():
			if match(m) {
				return m
			}
		case <-deadline:
			t.Fatalf("no %s within %v", what, wait)
			return nil
		}
	}
}

func isInventory(m *sessionv1.NodeMessage) bool { return m.GetInventory() != nil }

func isResult(id string) func(*sessionv1.NodeMessage) bool {
	return func(m *sessionv1.NodeMessage) bool {
		u := m.GetCommandUpdate()
		return u.GetCommandId() == id && u.GetResult() != nil
	}
}

func TestInventoryAfterEveryWelcomeAndDigestOnHeartbeats(t *testing.T) {
	t.Parallel()
	r := start(t, agent.Config{})
	s := r.gw.NextSession(t, wait)

	caps := s.Hello.GetCapabilities()
	for _, c := range []string{sessionv1.CapabilityExec, sessionv1.CapabilityCancel, sessionv1.CapabilityInventory, sessionv1.CapabilityResume} {
		if !slices.Contains(caps, c) {
			t.Errorf("Hello capabilities %q lack %q", caps, c)
		}
	}
	if slices.Contains(caps, sessionv1.CapabilityGPUNVML) {
		t.Errorf("Hello offers %s without NVML: %q", sessionv1.CapabilityGPUNVML, caps)
	}
	digest := s.Hello.GetInventoryDigest()
	if len(digest) != 64 {
		t.Fatalf("Hello inventory digest %q", digest)
	}
	if s.Hello.GetBootId() == "" {
		t.Error("Hello without boot id")
	}

	inv := next(t, s, "inventory", isInventory).GetInventory()
	if inv.GetDigest() != digest || inv.GetHost().GetCpu().GetThreads() == 0 || inv.GetHost().GetMemory().GetTotalBytes() == 0 {
		t.Errorf("inventory digest %q (Hello %q), host %v", inv.GetDigest(), digest, inv.GetHost())
	}
	if len(inv.GetGpus()) != 0 || !strings.Contains(inv.GetGpuStatus(), "NVML library not found") {
		t.Errorf("inventory without NVML: %d GPUs, status %q", len(inv.GetGpus()), inv.GetGpuStatus())
	}
	for range 3 {
		hb := s.NextHeartbeat(t, wait)
		if hb.GetInventoryDigest() != digest || hb.GetUptimeSeconds() == 0 || hb.GetMemoryAvailableBytes() == 0 {
			t.Errorf("heartbeat %v, want digest %s and readings", hb, digest)
		}
	}

	// A new session gets the full inventory again.
	s.End(status.New(codes.Unavailable, "gateway restarting"))
	s2 := r.gw.NextSession(t, wait)
	if inv := next(t, s2, "inventory on the second session", isInventory).GetInventory(); inv.GetDigest() != digest {
		t.Errorf("second session inventory digest %q, want %q", inv.GetDigest(), digest)
	}
}

// fakeScanner returns a fixed host that a test changes, and counts scans.
type fakeScanner struct {
	mu    sync.Mutex
	host  inventory.Host
	scans chan struct{}
}

func (f *fakeScanner) Scan(ctx context.Context) (*inventory.Host, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	h := f.host
	h.Disks = slices.Clone(h.Disks)
	f.mu.Unlock()
	select {
	case f.scans <- struct{}{}:
	default:
	}
	return &h, nil
}

func (f *fakeScanner) addDisk(d inventory.Disk) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.host.Disks = append(f.host.Disks, d)
}

func TestChangedDigestResendsInventory(t *testing.T) {
	t.Parallel()
	sc := &fakeScanner{host: inventory.Host{Hostname: "n1", Memory: inventory.Memory{TotalBytes: 1 << 30}}, scans: make(chan struct{}, 1)}
	r := start(t, agent.Config{Scanner: sc, RescanInterval: 10 * time.Millisecond})
	s := r.gw.NextSession(t, wait)
	first := next(t, s, "inventory", isInventory).GetInventory().GetDigest()

	// Periodic scans of an unchanged host send nothing.
	for range 5 {
		select {
		case <-sc.scans:
		case <-time.After(wait):
			t.Fatal("no periodic scan")
		}
	}
	for len(s.Messages()) > 0 {
		if m := <-s.Messages(); m.GetInventory() != nil {
			t.Fatal("inventory re-sent although nothing changed")
		}
	}

	sc.addDisk(inventory.Disk{Name: "nvme1n1", SizeBytes: 1 << 40})
	inv := next(t, s, "changed inventory", isInventory).GetInventory()
	if inv.GetDigest() == first || len(inv.GetHost().GetDisks()) != 1 {
		t.Fatalf("after a disk was added: digest %q (was %q), disks %v", inv.GetDigest(), first, inv.GetHost().GetDisks())
	}
	hb := next(t, s, "heartbeat with the new digest", func(m *sessionv1.NodeMessage) bool {
		return m.GetHeartbeat().GetInventoryDigest() == inv.GetDigest()
	})
	if hb == nil {
		t.Fatal("no heartbeat")
	}
}

func TestInventoryRefreshCommand(t *testing.T) {
	t.Parallel()
	sc := &fakeScanner{host: inventory.Host{Hostname: "n1"}, scans: make(chan struct{}, 1)}
	r := start(t, agent.Config{Scanner: sc})
	s := r.gw.NextSession(t, wait)
	digest := next(t, s, "inventory", isInventory).GetInventory().GetDigest()

	if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: &sessionv1.Command{
		Id: "cmd_refresh", Kind: "inventory.refresh"}}}); err != nil {
		t.Fatal(err)
	}
	// Sent although unchanged, and before the command's result.
	var gotInventory bool
	res := next(t, s, "refresh result", func(m *sessionv1.NodeMessage) bool {
		if inv := m.GetInventory(); inv != nil {
			gotInventory = inv.GetDigest() == digest
		}
		return isResult("cmd_refresh")(m)
	}).GetCommandUpdate().GetResult()
	if res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Errorf("inventory.refresh result %v", res)
	}
	if !gotInventory {
		t.Error("inventory.refresh sent no inventory before its result")
	}
}

func TestXIDBecomesEventAndInventory(t *testing.T) {
	t.Parallel()
	nv := gputest.NewDGXA100()
	set := gputest.NewEventSet()
	registered := gputest.WireEvents(nv, set)
	r := start(t, agent.Config{GPU: newCollector(t, nv)})
	s := r.gw.NextSession(t, wait)
	if caps := s.Hello.GetCapabilities(); !slices.Contains(caps, sessionv1.CapabilityGPUNVML) {
		t.Errorf("Hello capabilities %q lack %s with NVML", caps, sessionv1.CapabilityGPUNVML)
	}
	inv := next(t, s, "inventory", isInventory).GetInventory()
	if n := len(inv.GetGpus()); n != 8 || inv.GetGpus()[3].GetUuid() != gputest.UUID(3) {
		t.Fatalf("inventory has %d GPUs: %v", n, inv.GetGpus())
	}
	for range nv.Devices {
		select {
		case <-registered: // Watch is waiting for events
		case <-time.After(wait):
			t.Fatal("GPUs not registered for events")
		}
	}

	set.C <- gputest.XID(nv.Devices[3], 79)
	ev := next(t, s, "event", func(m *sessionv1.NodeMessage) bool { return m.GetEvent() != nil }).GetEvent()
	if ev.GetKind() != gpu.EventKindXID || ev.GetXid() != 79 || ev.GetGpuUuid() != gputest.UUID(3) ||
		ev.GetSeverity() != sessionv1.Severity_SEVERITY_CRITICAL || !strings.Contains(ev.GetMessage(), "XID 79") || ev.GetTime() == nil ||
		ev.GetXidMnemonic() != "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" || ev.GetResolution() != "RESTART_BM" ||
		ev.GetAttributes()["source"] != gpu.SourceNVML {
		t.Errorf("event %v", ev)
	}
	after := next(t, s, "inventory after the XID", isInventory).GetInventory()
	if after.GetDigest() == inv.GetDigest() {
		t.Error("digest unchanged after GPU 3 failed")
	}
	for i, g := range after.GetGpus() {
		want := sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK
		if i == 3 {
			want = sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED
		}
		if g.GetHealth().GetState() != want {
			t.Errorf("GPU %d health %v, want %v", i, g.GetHealth(), want)
		}
	}
	if h := after.GetGpus()[3].GetHealth(); h.GetXid() != 79 || h.GetResolution() != "RESTART_BM" || h.GetXidMnemonic() != ev.GetXidMnemonic() {
		t.Errorf("GPU 3 health %v, want XID 79, RESTART_BM", h)
	}
	if caps := s.Hello.GetCapabilities(); !slices.Contains(caps, sessionv1.CapabilityGPUReset) || !slices.Contains(caps, sessionv1.CapabilityReboot) {
		t.Errorf("Hello capabilities %q lack gpu.reset and reboot", caps)
	}
}

// kernelLog hands out fixed kernel-log records, then waits.
type kernelLog []string

func (k kernelLog) FollowKernelLog(ctx context.Context, fn func(string)) error {
	for _, r := range k {
		fn(r)
	}
	<-ctx.Done()
	return nil
}

// An XID in the kernel log (here from before bcd started: the look-back)
// reaches the gateway as an event of the right GPU, and its health.
func TestKernelLogXIDBecomesEvent(t *testing.T) {
	t.Parallel()
	nv := gputest.NewDGXA100()
	log := kernelLog{"3,900,42000000,-;NVRM: Xid (PCI:0000:02:00): 119, pid=4242, name=trainer, Timeout after 6s of waiting for RPC response from GPU2 GSP!"}
	r := start(t, agent.Config{GPU: newCollector(t, nv), KernelLog: log})
	s := r.gw.NextSession(t, wait)
	ev := next(t, s, "kernel-log event", func(m *sessionv1.NodeMessage) bool { return m.GetEvent() != nil }).GetEvent()
	if ev.GetXid() != 119 || ev.GetGpuUuid() != gputest.UUID(2) || ev.GetResolution() != "RESET_GPU" ||
		ev.GetAttributes()["source"] != gpu.SourceKernelLog || ev.GetAttributes()["pid"] != "4242" || ev.GetAttributes()["process"] != "trainer" {
		t.Fatalf("event %v", ev)
	}
	inv := next(t, s, "inventory with GPU 2 failed", func(m *sessionv1.NodeMessage) bool {
		return m.GetInventory().GetGpus() != nil && m.GetInventory().GetGpus()[2].GetHealth().GetState() == sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED
	}).GetInventory()
	if h := inv.GetGpus()[2].GetHealth(); h.GetResolution() != "RESET_GPU" || h.GetXid() != 119 {
		t.Errorf("GPU 2 health %v", h)
	}
}

func TestEventKeptUntilNextSession(t *testing.T) {
	t.Parallel()
	nv := gputest.NewDGXA100()
	set := gputest.NewEventSet()
	registered := gputest.WireEvents(nv, set)
	disconnected := make(chan struct{}, 8)
	cfg := agent.Config{GPU: newCollector(t, nv)}
	cfg.Session.OnEvent = func(ev session.Event) {
		if ev.Kind == session.EventDisconnected {
			disconnected <- struct{}{}
		}
	}
	r := start(t, cfg)
	s := r.gw.NextSession(t, wait)
	for range nv.Devices {
		<-registered
	}
	// Refuse the next connection, so that the node has no session for a
	// while.
	r.gw.RefuseNext(codes.Unavailable, 300*time.Millisecond)
	s.End(status.New(codes.Unavailable, "bye"))
	<-disconnected
	set.C <- gputest.XID(nv.Devices[5], 48)

	s2 := r.gw.NextSession(t, wait)
	ev := next(t, s2, "kept event", func(m *sessionv1.NodeMessage) bool { return m.GetEvent() != nil }).GetEvent()
	if ev.GetXid() != 48 || ev.GetGpuUuid() != gputest.UUID(5) {
		t.Errorf("event %v, want XID 48 on GPU 5", ev)
	}
}

func TestCommandsAndRootWithoutHelper(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "helper.sock") // nobody listens
	r := start(t, agent.Config{Unprivileged: true, HelperSocket: sock})
	s := r.gw.NextSession(t, wait)

	send := func(c *sessionv1.Command) {
		t.Helper()
		if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: c}}); err != nil {
			t.Fatal(err)
		}
	}
	exec := func(id string, asRoot bool, argv ...string) *sessionv1.Command {
		return &sessionv1.Command{Id: id, Kind: "exec", Spec: &sessionv1.Command_Exec{Exec: &sessionv1.ExecSpec{Argv: argv, AsRoot: asRoot}}}
	}

	send(exec("cmd_root", true, "id", "-u"))
	res := next(t, s, "root result", isResult("cmd_root")).GetCommandUpdate().GetResult()
	if res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.GetError(), "root helper is not running") {
		t.Errorf("root exec without a helper: %v", res)
	}
	// An unprivileged bcd runs no command itself: the helper starts them
	// as the command user.
	send(exec("cmd_plain", false, "id", "-u"))
	res = next(t, s, "plain result", isResult("cmd_plain")).GetCommandUpdate().GetResult()
	if res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.GetError(), "root helper is not running") {
		t.Errorf("plain exec of an unprivileged bcd without a helper: %v", res)
	}
}

// TestCommandCancelled: a running command is in the heartbeat, and a Cancel
// ends it.
func TestCommandCancelled(t *testing.T) {
	t.Parallel()
	r := start(t, agent.Config{})
	s := r.gw.NextSession(t, wait)
	send := func(c *sessionv1.Command) {
		t.Helper()
		if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: c}}); err != nil {
			t.Fatal(err)
		}
	}
	send(&sessionv1.Command{Id: "cmd_sleep", Kind: "exec", Spec: &sessionv1.Command_Exec{Exec: &sessionv1.ExecSpec{Argv: []string{"sleep", "600"}}}})
	next(t, s, "heartbeat naming the running command", func(m *sessionv1.NodeMessage) bool {
		return slices.Contains(m.GetHeartbeat().GetRunningCommandIds(), "cmd_sleep")
	})
	if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Cancel{Cancel: &sessionv1.Cancel{CommandId: "cmd_sleep"}}}); err != nil {
		t.Fatal(err)
	}
	res := next(t, s, "cancelled result", isResult("cmd_sleep")).GetCommandUpdate().GetResult()
	if res.GetState() != sessionv1.CommandState_COMMAND_STATE_CANCELLED {
		t.Errorf("cancelled sleep: %v", res)
	}
}

// TestStopLeavesNothingRunning stops an agent with a command running: Run
// returns, the command ends, and no goroutine of the agent is left.
func TestStopLeavesNothingRunning(t *testing.T) {
	r := start(t, agent.Config{})
	s := r.gw.NextSession(t, wait)
	if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: &sessionv1.Command{
		Id: "cmd_long", Kind: "exec", Spec: &sessionv1.Command_Exec{Exec: &sessionv1.ExecSpec{Argv: []string{"sleep", "600"}}}}}}); err != nil {
		t.Fatal(err)
	}
	next(t, s, "running", func(m *sessionv1.NodeMessage) bool { return m.GetCommandUpdate().GetRunning() != nil })
	start := time.Now()
	r.shutdown(t)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("stopping took %v", d)
	}
	r.gw.Close()
	goleak.VerifyNone(t, goleak.IgnoreTopFunction("testing.(*T).Run"), goleak.IgnoreAnyFunction("testing.tRunner.func1"),
		goleak.IgnoreAnyFunction("testing.(*T).Parallel"), goleak.IgnoreAnyFunction("testing.runTests"))
}

// A result that finished without a session goes into the next Hello, and
// again into the one after when the gateway refused the first.
func TestResultsSurviveARefusedReconnect(t *testing.T) {
	t.Parallel()
	r := start(t, agent.Config{})
	s := r.gw.NextSession(t, wait)
	if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: &sessionv1.Command{
		Id: "cmd_offline", Kind: "exec", Spec: &sessionv1.Command_Exec{Exec: &sessionv1.ExecSpec{Argv: []string{"sleep", "0.2"}}}}}}); err != nil {
		t.Fatal(err)
	}
	next(t, s, "running", func(m *sessionv1.NodeMessage) bool { return m.GetCommandUpdate().GetRunning() != nil })
	// The first reconnect is refused before the command ends, the second
	// after it ended (its Hello carries the result): each with a hint of
	// 1 s, so the command ends between them.
	r.gw.RefuseNext(codes.Unavailable, time.Second)
	r.gw.RefuseNext(codes.Unavailable, time.Second)
	s.End(status.New(codes.Unavailable, "bye"))

	s2 := r.gw.NextSession(t, wait)
	i := slices.IndexFunc(s2.Hello.GetPendingResults(), func(res *sessionv1.CommandResult) bool { return res.GetCommandId() == "cmd_offline" })
	if i < 0 || s2.Hello.GetPendingResults()[i].GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("Hello pending results %v, want cmd_offline succeeded", s2.Hello.GetPendingResults())
	}
	// Once a Welcome answered, they are not sent again.
	s2.End(status.New(codes.Unavailable, "bye again"))
	if s3 := r.gw.NextSession(t, wait); len(s3.Hello.GetPendingResults()) != 0 {
		t.Errorf("results sent again after a Welcome: %v", s3.Hello.GetPendingResults())
	}
}

// A deliberate restart (bcd stopped, then started over the same data
// directory) ends the running command, reports it as stopped by bcd, and
// the restarted agent answers its redelivery without running it again.
func TestRestartKeepsCommandsInTheJournal(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	runs := filepath.Join(openDir(t), "runs") // the command user writes it
	cmd := &sessionv1.Command{Id: "cmd_restart", Kind: "exec", Spec: &sessionv1.Command_Exec{Exec: &sessionv1.ExecSpec{
		Argv: []string{"sh", "-c", "echo run >> " + runs + "; echo started; exec sleep 600"}}}}
	deliver := func(s *sessiontest.Session) {
		t.Helper()
		if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: cmd}}); err != nil {
			t.Fatal(err)
		}
	}
	r := start(t, agent.Config{StateDir: dir})
	s := r.gw.NextSession(t, wait)
	deliver(s)
	// Its output says the run was recorded in runs.
	next(t, s, "output", func(m *sessionv1.NodeMessage) bool {
		return strings.Contains(string(m.GetCommandUpdate().GetOutput().GetData()), "started")
	})
	r.shutdown(t)

	r2 := start(t, agent.Config{StateDir: dir})
	s2 := r2.gw.NextSession(t, wait)
	deliver(s2)
	res := next(t, s2, "result of the redelivery", isResult("cmd_restart")).GetCommandUpdate().GetResult()
	if res.GetState() != sessionv1.CommandState_COMMAND_STATE_CANCELLED || !strings.Contains(res.GetError(), "bcd stopped") {
		t.Fatalf("redelivered after a restart: %v", res)
	}
	if b, err := os.ReadFile(runs); err != nil || string(b) != "run\n" {
		t.Fatalf("runs = %q, %v: want exactly one run", b, err)
	}
}

// A GPU reset the journal records for this boot (bcd restarted after it)
// keeps the kernel log's look-back from bringing back the XID it cleared.
func TestJournalledResetHidesOlderKernelLogXID(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	j, err := journal.Open(journal.Config{Path: filepath.Join(dir, journal.File)})
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Accept(journal.Record{ID: "reset_1", Kind: sessionv1.KindGPUReset, BootID: "boot-test", AcceptedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := j.Finished("reset_1", &sessionv1.CommandResult{CommandId: "reset_1", State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED,
		FinishedAt: timestamppb.Now(), DetailJson: []byte(`{"gpuUuid":"` + gputest.UUID(2) + `"}`)}); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	log := kernelLog{
		"3,10,1000000,-;NVRM: Xid (PCI:0000:02:00): 119, GSP timeout", // before the reset
		"3,11,1000001,-;NVRM: Xid (PCI:0000:01:00): 62, PMU halt",     // another GPU, never reset
	}
	cfg := agent.Config{GPU: newCollector(t, gputest.NewDGXA100()), KernelLog: log, StateDir: dir}
	cfg.Session.BootID = "boot-test"
	r := start(t, cfg)
	s := r.gw.NextSession(t, wait)
	ev := next(t, s, "kernel-log event", func(m *sessionv1.NodeMessage) bool { return m.GetEvent() != nil }).GetEvent()
	if ev.GetXid() != 62 || ev.GetGpuUuid() != gputest.UUID(1) {
		t.Fatalf("first event %v, want XID 62 on GPU 1 (XID 119 on GPU 2 was reset away)", ev)
	}
}
