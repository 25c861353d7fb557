package sim_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/proto/gpudiag"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// faultRig is one FakeDaemon running against an in-process gateway.
type faultRig struct {
	t *testing.T
	g *sessiontest.Gateway
	d *sim.FakeDaemon
}

func newFaultRig(t *testing.T) (*faultRig, *sessiontest.Session) {
	t.Helper()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{HeartbeatInterval: 50 * time.Millisecond})
	tok := p.NewToken(t)
	g.AddToken(tok)
	d, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: "faulty", Session: fastSession()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	if err := d.Join(ctx, g.URL, tok); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	r := &faultRig{t: t, g: g, d: d}
	s := g.NextSession(t, wait)
	if inv := r.next(s, "the first inventory", func(m *sessionv1.NodeMessage) bool { return m.GetInventory() != nil }).GetInventory(); len(inv.GetGpus()) != 8 {
		t.Fatalf("first inventory: %v", inv)
	}
	return r, s
}

// next returns the next message of s that want accepts, skipping others.
func (r *faultRig) next(s *sessiontest.Session, what string, want func(*sessionv1.NodeMessage) bool) *sessionv1.NodeMessage {
	r.t.Helper()
	timeout := time.After(wait)
	for {
		select {
		case m := <-s.Messages():
			if want(m) {
				return m
			}
		case <-timeout:
			r.t.Fatalf("no %s within %v", what, wait)
			return nil
		}
	}
}

func isEvent(m *sessionv1.NodeMessage) bool     { return m.GetEvent() != nil }
func isInventory(m *sessionv1.NodeMessage) bool { return m.GetInventory() != nil }

func resultOf(id string) func(m *sessionv1.NodeMessage) bool {
	return func(m *sessionv1.NodeMessage) bool {
		return m.GetCommandUpdate().GetCommandId() == id && m.GetCommandUpdate().GetResult() != nil
	}
}

func command(id, kind string) *sessionv1.GatewayMessage {
	return &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: &sessionv1.Command{Id: id, Kind: kind}}}
}

func gpuReset(id, uuid string) *sessionv1.GatewayMessage {
	return &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: &sessionv1.Command{Id: id, Kind: sessionv1.KindGPUReset,
		Spec: &sessionv1.Command_GpuReset{GpuReset: &sessionv1.GPUResetSpec{GpuUuid: uuid}}}}}
}

// An XID is sent as bcd sends it, classified by NVIDIA's catalogue, and the
// GPU's health shows in the next inventory until a gpu.reset, which takes
// the configured time and then clears it.
func TestFaultXIDThenReset(t *testing.T) {
	t.Parallel()
	r, s := newFaultRig(t)
	d := r.d
	uuid3 := d.Inventory().GetGpus()[3].GetUuid()
	if err := d.RaiseXID(3, 95); err != nil {
		t.Fatal(err)
	}
	ev := r.next(s, "the XID 95 event", isEvent).GetEvent()
	if ev.GetKind() != "gpu.xid" || ev.GetXid() != 95 || ev.GetResolution() != "RESET_GPU" || ev.GetXidMnemonic() == "" ||
		ev.GetGpuUuid() != uuid3 || ev.GetSeverity() != sessionv1.Severity_SEVERITY_CRITICAL {
		t.Fatalf("XID 95 event = %v", ev)
	}
	inv := r.next(s, "the inventory after XID 95", isInventory).GetInventory()
	if h := inv.GetGpus()[3].GetHealth(); h.GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED ||
		h.GetResolution() != "RESET_GPU" || h.GetXid() != 95 || h.GetXidMnemonic() != ev.GetXidMnemonic() {
		t.Fatalf("GPU 3 health after XID 95 = %v", h)
	}
	if inv.GetDigest() == d.Inventory().GetDigest() || inv.GetGpus()[2].GetHealth().GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK {
		t.Fatalf("inventory after the XID: digest %s, GPU 2 %v", inv.GetDigest(), inv.GetGpus()[2].GetHealth())
	}
	if err := d.RaiseXID(1, 13); err != nil {
		t.Fatal(err)
	}
	if ev := r.next(s, "the XID 13 event", isEvent).GetEvent(); ev.GetResolution() != "RESTART_APP" || ev.GetSeverity() != sessionv1.Severity_SEVERITY_WARNING {
		t.Fatalf("XID 13 event = %v", ev)
	}
	if err := d.RaiseXID(8, 79); err == nil {
		t.Error("RaiseXID on GPU 8 of 8 succeeded")
	}

	const delay = 300 * time.Millisecond
	d.SetRecovery(sim.Recovery{ResetDelay: delay})
	start := time.Now()
	if err := s.Send(gpuReset("reset_1", uuid3)); err != nil {
		t.Fatal(err)
	}
	res := r.next(s, "the reset's result", resultOf("reset_1")).GetCommandUpdate().GetResult()
	if res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || time.Since(start) < delay {
		t.Fatalf("reset result %v after %v, want success after %v", res, time.Since(start), delay)
	}
	// The inventory reads healthy again (it was sent before the result).
	if st := d.Inventory().GetGpus()[3].GetHealth().GetState(); st != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK {
		t.Errorf("static inventory changed: %v", st)
	}
	if err := s.Send(command("inv", sessionv1.KindInventoryRefresh)); err != nil {
		t.Fatal(err)
	}
	inv = r.next(s, "the inventory after the reset", isInventory).GetInventory()
	if h := inv.GetGpus()[3].GetHealth(); h.GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK || h.GetResolution() != "" {
		t.Fatalf("GPU 3 after the reset = %v", h)
	}
	if st := d.FaultStats(); st.Resets != 1 || st.Down || st.Hung {
		t.Errorf("stats %+v", st)
	}
}

// A lost GPU cannot be reset; a reboot takes the daemon away for the
// configured time, it comes back with a new boot id and healthy GPUs, and
// the redelivered reboot is answered from the record, not repeated.
func TestFaultLostGPUThenReboot(t *testing.T) {
	t.Parallel()
	r, s := newFaultRig(t)
	d := r.d
	if err := d.LoseGPU(0); err != nil {
		t.Fatal(err)
	}
	if ev := r.next(s, "the XID 79 event", isEvent).GetEvent(); ev.GetXid() != 79 || ev.GetResolution() != "RESTART_BM" {
		t.Fatalf("lost GPU event = %v", ev)
	}
	inv := r.next(s, "the inventory with the lost GPU", isInventory).GetInventory()
	if h := inv.GetGpus()[0].GetHealth(); h.GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED || h.GetResolution() != "RESTART_BM" {
		t.Fatalf("lost GPU health = %v", h)
	}
	if err := s.Send(gpuReset("reset_lost", inv.GetGpus()[0].GetUuid())); err != nil {
		t.Fatal(err)
	}
	if res := r.next(s, "the reset's result", resultOf("reset_lost")).GetCommandUpdate().GetResult(); res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED {
		t.Fatalf("reset of a lost GPU = %v", res)
	}

	const delay = 300 * time.Millisecond
	d.SetRecovery(sim.Recovery{RebootDelay: delay})
	start := time.Now()
	if err := s.Send(command("reboot_1", sessionv1.KindReboot)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	case <-time.After(wait):
		t.Fatal("the session outlived the reboot")
	}
	s2 := r.g.NextSession(t, wait)
	if time.Since(start) < delay || s2.Hello.GetBootId() == s.Hello.GetBootId() || s2.Hello.GetBootId() == "" {
		t.Fatalf("back after %v with boot id %q (was %q)", time.Since(start), s2.Hello.GetBootId(), s.Hello.GetBootId())
	}
	inv = r.next(s2, "the inventory after the reboot", isInventory).GetInventory()
	if h := inv.GetGpus()[0].GetHealth(); h.GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK {
		t.Fatalf("GPU 0 after the reboot = %v", h)
	}
	if err := s2.Send(command("reboot_1", sessionv1.KindReboot)); err != nil { // the gateway redelivers
		t.Fatal(err)
	}
	if res := r.next(s2, "the redelivered reboot's result", resultOf("reboot_1")).GetCommandUpdate().GetResult(); res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("redelivered reboot = %v", res)
	}
	if st := d.FaultStats(); st.Reboots != 1 || st.Boots != 2 || st.Down {
		t.Errorf("stats %+v, want one reboot", st)
	}
}

// A reboot that hangs keeps the daemon away until its faults are cleared
// (the power cycle that ends the hang); it comes back with a new boot id.
func TestFaultRebootHangsThenPowerCycle(t *testing.T) {
	t.Parallel()
	r, s := newFaultRig(t)
	d := r.d
	d.SetRecovery(sim.Recovery{RebootHangs: true})
	if err := s.Send(command("reboot_h", sessionv1.KindReboot)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	case <-time.After(wait):
		t.Fatal("the session outlived the reboot")
	}
	select {
	case s2 := <-r.g.Sessions():
		t.Fatalf("a daemon whose reboot hangs came back: %v", s2.Hello)
	case <-time.After(300 * time.Millisecond):
	}
	d.ClearFaults()
	s2 := r.g.NextSession(t, wait)
	if b := s2.Hello.GetBootId(); b == s.Hello.GetBootId() || b == "" {
		t.Fatalf("back after the power cycle with boot id %q (was %q)", b, s.Hello.GetBootId())
	}
	if st := d.FaultStats(); st.Reboots != 1 || st.Boots != 2 || st.Down {
		t.Errorf("stats %+v, want one reboot and a new boot", st)
	}
}

// A hung daemon keeps its session but sends no heartbeats and answers no
// commands; a disconnected one stays away until its faults are cleared.
func TestFaultHangAndDisconnect(t *testing.T) {
	t.Parallel()
	r, s := newFaultRig(t)
	d := r.d
	s.NextHeartbeat(t, wait)
	d.Hang()
	// A heartbeat already on its way may still come; then none.
	drain := time.After(200 * time.Millisecond)
	for draining := true; draining; {
		select {
		case <-s.Heartbeats():
		case <-s.Messages():
		case <-drain:
			draining = false
		}
	}
	if err := s.Send(command("while_hung", sessionv1.KindInventoryRefresh)); err != nil {
		t.Fatal(err)
	}
	select {
	case hb := <-s.Heartbeats():
		t.Fatalf("a hung daemon sent a heartbeat: %v", hb)
	case m := <-s.Messages():
		if m.GetHeartbeat() != nil || m.GetCommandUpdate() != nil || m.GetInventory() != nil {
			t.Fatalf("a hung daemon sent %v", m)
		}
	case <-time.After(400 * time.Millisecond): // eight heartbeat intervals
	}
	select {
	case <-s.Done():
		t.Fatal("the hang ended the session")
	default:
	}
	d.ClearFaults()
	s.NextHeartbeat(t, wait)

	d.Disconnect(0)
	select {
	case <-s.Done():
	case <-time.After(wait):
		t.Fatal("Disconnect left the session open")
	}
	select {
	case s2 := <-r.g.Sessions():
		t.Fatalf("a disconnected daemon came back: %v", s2.Hello)
	case <-time.After(300 * time.Millisecond):
	}
	if !d.FaultStats().Down {
		t.Error("FaultStats.Down = false while disconnected")
	}
	d.ClearFaults()
	s3 := r.g.NextSession(t, wait)
	if s3.Hello.GetBootId() != s.Hello.GetBootId() {
		t.Errorf("a disconnect changed the boot id")
	}
}

func TestParseAndApplyFaults(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", "xid", "xid 1", "xid 1 2", "xid 1 x 79", "xid 1 2 -3", "ecc 0 a", "hang 0 extra",
		"disconnect 0 soon", "recovery 0 reset=x", "recovery 0 fast", "explode 0", "ib 0 1", "ib 0 x flap", "ib-clear 0"} {
		if _, err := sim.ParseFault(bad); !errors.Is(err, sim.ErrBadFault) {
			t.Errorf("ParseFault(%q) = %v, want ErrBadFault", bad, err)
		}
	}
	ft, err := sim.ParseFault("recovery all reset=30s reboot=2m reset-fails diag-fails")
	if err != nil || ft.Recovery != (sim.Recovery{ResetDelay: 30 * time.Second, RebootDelay: 2 * time.Minute, ResetFails: true,
		DiagFails: true}) {
		t.Fatalf("recovery = %+v, %v", ft, err)
	}
	p := sessiontest.NewPKI(t)
	f, err := sim.NewFleet(sim.FleetConfig{GatewayURL: "https://127.0.0.1:1", Token: p.NewToken(t), N: 3})
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.ApplyFaults(strings.NewReader("# a test\nxid 1 2 95\n\nhang sim-00002\necc all 5 7\n"))
	if err != nil || n != 3 {
		t.Fatalf("ApplyFaults = %d, %v", n, err)
	}
	ds := f.Daemons()
	if h := ds[1].CurrentInventory().GetGpus()[2].GetHealth(); h.GetXid() != 95 || h.GetResolution() != "RESET_GPU" {
		t.Errorf("daemon 1 GPU 2 = %v", h)
	}
	if !ds[2].FaultStats().Hung || ds[0].FaultStats().Hung {
		t.Error("hang applied to the wrong daemon")
	}
	for _, d := range ds {
		if g := d.CurrentInventory().GetGpus()[5]; g.GetEccVolatileUncorrected() != 7 || g.GetHealth().GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED {
			t.Errorf("%s GPU 5 = %v", d.Name(), g)
		}
	}
	if _, err := f.ApplyFaults(strings.NewReader("clear all\nxid 9 0 79\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("a fault for daemon 9 of 3: %v", err)
	}
	if h := ds[1].CurrentInventory().GetGpus()[2].GetHealth(); h.GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK || ds[2].FaultStats().Hung {
		t.Errorf("after clear: %v, hung %v", h, ds[2].FaultStats().Hung)
	}
	if _, err := f.Apply(sim.Fault{Op: "xid", Daemon: "0", GPU: 8, Code: 79}); !errors.Is(err, sim.ErrNoSuchGPU) {
		t.Errorf("xid on GPU 8: %v", err)
	}
	if _, err := f.ApplyFaults(strings.NewReader("ib 0 3 flap\n")); err != nil {
		t.Fatal(err)
	}
	if p := ds[0].CurrentInventory().GetIbPorts()[3]; p.GetHealth().GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED ||
		p.GetLinkDowned() != 1 {
		t.Errorf("daemon 0 InfiniBand port 3 after a flap = %v", p)
	}
	if _, err := f.ApplyFaults(strings.NewReader("ib-clear 0 3\n")); err != nil {
		t.Fatal(err)
	}
	if p := ds[0].CurrentInventory().GetIbPorts()[3]; p.GetHealth().GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK {
		t.Errorf("daemon 0 InfiniBand port 3 after ib-clear = %v", p)
	}
}

// TestFaultInfiniBandPort: a FakeDaemon's InfiniBand port fault is an
// ib.port event carrying its typed finding (no GPU), the port reads as the
// fault shows in the next inventory, and it reads up and ok once cleared.
func TestFaultInfiniBandPort(t *testing.T) {
	t.Parallel()
	r, s := newFaultRig(t)
	d := r.d
	if n := len(d.Inventory().GetIbPorts()); n != 8 {
		t.Fatalf("simulated InfiniBand ports: %d, want 8", n)
	}
	if err := d.RaiseIBPortFault(2, sim.IBFaultDown); err != nil {
		t.Fatal(err)
	}
	ev := r.next(s, "the ib.port event", isEvent).GetEvent()
	f := ev.GetGpuFinding()
	if ev.GetKind() != "ib.port" || f.GetGpuUuid() != "" || f.GetInfiniband().GetDevice() != "mlx5_2" ||
		f.GetInfiniband().GetPort() != 1 || f.GetInfiniband().GetCause() != "down" || f.GetInfiniband().GetState() != "DOWN" ||
		f.GetResolution() != "CHECK_MECHANICALS" || f.GetHealth() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED ||
		f.GetPciBusId() != d.Inventory().GetIbPorts()[2].GetPciBusId() {
		t.Fatalf("ib.port event = %v", ev)
	}
	inv := r.next(s, "the inventory after the fault", isInventory).GetInventory()
	if p := inv.GetIbPorts()[2]; p.GetState() != "DOWN" || p.GetHealth().GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED {
		t.Fatalf("port 2 after the fault: %v", p)
	}
	if inv.GetIbPorts()[1].GetHealth().GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK {
		t.Fatalf("port 1 after port 2's fault: %v", inv.GetIbPorts()[1])
	}
	if err := d.ClearIBPortFault(2); err != nil {
		t.Fatal(err)
	}
	inv = r.next(s, "the inventory after the clear", isInventory).GetInventory()
	if p := inv.GetIbPorts()[2]; p.GetState() != "ACTIVE" || p.GetHealth().GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK {
		t.Fatalf("port 2 after the clear: %v", p)
	}
	if err := d.RaiseIBPortFault(8, sim.IBFaultFlap); !errors.Is(err, sim.ErrNoSuchIBPort) {
		t.Errorf("RaiseIBPortFault on port 8 of 8 = %v, want ErrNoSuchIBPort", err)
	}
	if err := d.RaiseIBPortFault(0, "melted"); err == nil || !strings.Contains(err.Error(), "want down, errors, flap or mlx5") {
		t.Errorf("RaiseIBPortFault with an unknown cause = %v", err)
	}
}

// gpu.diag passes on a healthy daemon with the built-in check's detail, and
// fails naming every GPU once recovery says diag-fails.
func TestFaultDiag(t *testing.T) {
	t.Parallel()
	r, s := newFaultRig(t)
	diag := func(id string) *sessionv1.CommandResult {
		t.Helper()
		if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: &sessionv1.Command{Id: id,
			Kind: sessionv1.KindGPUDiag, Spec: &sessionv1.Command_GpuDiag{GpuDiag: &sessionv1.GPUDiagSpec{Level: 1}}}}}); err != nil {
			t.Fatal(err)
		}
		return r.next(s, "the diagnostic's result", resultOf(id)).GetCommandUpdate().GetResult()
	}
	var detail gpudiag.Result
	res := diag("diag_1")
	if err := json.Unmarshal(res.GetDetailJson(), &detail); err != nil || res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED ||
		detail.Tool != gpudiag.ToolNVML || detail.Tests != 24 || !detail.Passed() {
		t.Fatalf("healthy diag: %v (%+v, %v)", res, detail, err)
	}
	r.d.SetRecovery(sim.Recovery{DiagFails: true})
	res = diag("diag_2")
	detail = gpudiag.Result{}
	if err := json.Unmarshal(res.GetDetailJson(), &detail); err != nil || res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED ||
		len(detail.Failures) != 8 || !strings.Contains(res.GetError(), "ecc-uncorrected") {
		t.Fatalf("diag-fails: %v (%+v, %v)", res, detail, err)
	}
	if st := r.d.FaultStats(); st.Diags != 2 {
		t.Errorf("FaultStats.Diags = %d, want 2", st.Diags)
	}
}
