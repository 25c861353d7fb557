package gpufinding_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// every finding kind, one of each signal.
func every() []*sessionv1.GPUFinding {
	at := timestamppb.New(time.Date(2026, 3, 4, 5, 6, 7, 8, time.UTC))
	base := func(s any) *sessionv1.GPUFinding {
		f := &sessionv1.GPUFinding{GpuUuid: "GPU-1", BoardSerial: "1320", PciBusId: "00000000:07:00.0",
			ImmediateResolution: "RESET_GPU", InvestigatoryResolution: "IGNORE (sympathetic)", Resolution: "RESET_GPU",
			Health: sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED, ObservedAt: at,
			Evidence: &sessionv1.GPUFindingEvidence{Source: "scan", Counters: map[string]uint64{"n": 3}, Message: "m"}}
		switch s := s.(type) {
		case *sessionv1.XIDSignal:
			f.Signal = &sessionv1.GPUFinding_Xid{Xid: s}
		case *sessionv1.ECCSignal:
			f.Signal = &sessionv1.GPUFinding_Ecc{Ecc: s}
		case *sessionv1.RowRemapSignal:
			f.Signal = &sessionv1.GPUFinding_RowRemap{RowRemap: s}
		case *sessionv1.RecoveryActionSignal:
			f.Signal = &sessionv1.GPUFinding_RecoveryAction{RecoveryAction: s}
		case *sessionv1.ClocksSignal:
			f.Signal = &sessionv1.GPUFinding_Clocks{Clocks: s}
		case *sessionv1.NVLinkSignal:
			f.Signal = &sessionv1.GPUFinding_Nvlink{Nvlink: s}
		case *sessionv1.RetiredPagesSignal:
			f.Signal = &sessionv1.GPUFinding_RetiredPages{RetiredPages: s}
		case *sessionv1.GPULostSignal:
			f.Signal = &sessionv1.GPUFinding_GpuLost{GpuLost: s}
		case *sessionv1.PCIeSignal:
			f.Signal = &sessionv1.GPUFinding_Pcie{Pcie: s}
		case *sessionv1.GPUMissingSignal:
			f.Signal = &sessionv1.GPUFinding_GpuMissing{GpuMissing: s}
		case *sessionv1.FabricSignal:
			f.Signal = &sessionv1.GPUFinding_Fabric{Fabric: s}
		case *sessionv1.PersistenceModeSignal:
			f.Signal = &sessionv1.GPUFinding_Persistence{Persistence: s}
		case *sessionv1.DriftSignal:
			f.Signal = &sessionv1.GPUFinding_Drift{Drift: s}
		case *sessionv1.FabricManagerSignal:
			f.Signal = &sessionv1.GPUFinding_FabricManager{FabricManager: s}
		case *sessionv1.InfiniBandSignal:
			f.GpuUuid, f.BoardSerial = "", ""
			f.Signal = &sessionv1.GPUFinding_Infiniband{Infiniband: s}
		}
		return f
	}
	return []*sessionv1.GPUFinding{
		base(&sessionv1.XIDSignal{Code: 95, Mnemonic: "ROBUST_CHANNEL_UNCONTAINED_ERROR"}),
		base(&sessionv1.ECCSignal{Uncorrectable: true, Count: 2}),
		base(&sessionv1.ECCSignal{Count: 200}),
		base(&sessionv1.RowRemapSignal{Failure: true, UncorrectableRows: 9}),
		base(&sessionv1.RecoveryActionSignal{Action: "GPU_RESET"}),
		base(&sessionv1.ClocksSignal{EventReasons: 64, Reasons: []string{"hardware thermal slowdown"}}),
		base(&sessionv1.NVLinkSignal{Errors: 150, Window: durationpb.New(10 * time.Minute)}),
		base(&sessionv1.RetiredPagesSignal{Pending: true}),
		base(&sessionv1.GPULostSignal{NvmlError: "ERROR_GPU_IS_LOST"}),
		base(&sessionv1.PCIeSignal{Replays: 60, Window: durationpb.New(10 * time.Minute), LinkGeneration: 4,
			MaxLinkGeneration: 4, LinkWidth: 8, MaxLinkWidth: 16}),
		base(&sessionv1.PCIeSignal{AerSeverity: "fatal"}),
		base(&sessionv1.GPUMissingSignal{Expected: 8, Present: 7}),
		base(&sessionv1.FabricSignal{State: "IN_PROGRESS", Status: "SUCCESS", For: durationpb.New(6 * time.Minute)}),
		base(&sessionv1.PersistenceModeSignal{}),
		base(&sessionv1.DriftSignal{DriverVersion: "535.104.05", PoolDriverVersion: "550.54.15", PoolNodes: 3, MatchingNodes: 2}),
		base(&sessionv1.FabricManagerSignal{ActiveState: "failed", SubState: "failed", LoadState: "loaded",
			DownFor: durationpb.New(6 * time.Minute)}),
		base(&sessionv1.FabricManagerSignal{ActiveState: "active", SubState: "running", LoadState: "loaded", Restarts: 4,
			Window: durationpb.New(10 * time.Minute)}),
		base(&sessionv1.InfiniBandSignal{Device: "mlx5_0", Port: 1, Cause: "flap", State: "ACTIVE", PhysState: "LinkUp",
			Window: durationpb.New(5 * time.Minute), LinkDowned: 1}),
		base(nil),
	}
}

func TestRoundTripEveryKind(t *testing.T) {
	kinds := map[string]bool{}
	for _, f := range every() {
		if err := gpufinding.Check(f); err != nil {
			t.Fatalf("Check(%v) = %v", f, err)
		}
		b, err := gpufinding.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		kind := gpufinding.Kind(f)
		kinds[kind] = true
		got, err := gpufinding.Decode(kind, b)
		if err != nil || !proto.Equal(got, f) {
			t.Errorf("Decode(%s, %s) = %v, %v; want %v", kind, b, got, err, f)
		}
	}
	if len(kinds) != 17 {
		t.Errorf("kinds = %v, want 17 distinct", kinds)
	}
}

// TestDecodeOldShape: payloads gateways stored before the typed finding
// read as findings with the signal their kind names.
func TestDecodeOldShape(t *testing.T) {
	for _, c := range []struct {
		kind, payload string
		want          *sessionv1.GPUFinding
	}{
		{"gpu.xid", `{"gpuUuid":"GPU-1","xid":95,"xidMnemonic":"UNCONTAINED_ECC_ERROR","resolution":"RESET_GPU",` +
			`"attributes":{"source":"kmsg","pid":"7","process":"python"},"nodeTime":"2026-01-02T03:04:05Z"}`,
			&sessionv1.GPUFinding{GpuUuid: "GPU-1", ImmediateResolution: "RESET_GPU", Resolution: "RESET_GPU",
				Signal:     &sessionv1.GPUFinding_Xid{Xid: &sessionv1.XIDSignal{Code: 95, Mnemonic: "UNCONTAINED_ECC_ERROR"}},
				ObservedAt: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
				Evidence:   &sessionv1.GPUFindingEvidence{Source: "kmsg", Process: "python"}}},
		{"gpu.xid", `{"xid":31}`, &sessionv1.GPUFinding{Signal: &sessionv1.GPUFinding_Xid{Xid: &sessionv1.XIDSignal{Code: 31}}}},
		{"gpu.ecc.uncorrected", `{"gpuUuid":"GPU-2","resolution":"RESET_GPU"}`, &sessionv1.GPUFinding{GpuUuid: "GPU-2",
			ImmediateResolution: "RESET_GPU", Resolution: "RESET_GPU",
			Signal: &sessionv1.GPUFinding_Ecc{Ecc: &sessionv1.ECCSignal{Uncorrectable: true}}}},
		{"gpu.row-remap.failure", `{"resolution":"CONTACT_SUPPORT"}`, &sessionv1.GPUFinding{ImmediateResolution: "CONTACT_SUPPORT",
			Resolution: "CONTACT_SUPPORT", Signal: &sessionv1.GPUFinding_RowRemap{RowRemap: &sessionv1.RowRemapSignal{Failure: true}}}},
		{"gpu.lost", `{"resolution":"RESTART_BM"}`, &sessionv1.GPUFinding{ImmediateResolution: "RESTART_BM", Resolution: "RESTART_BM",
			Signal: &sessionv1.GPUFinding_GpuLost{GpuLost: &sessionv1.GPULostSignal{}}}},
		{"gpu.health", `{"resolution":"ESCALATE"}`, &sessionv1.GPUFinding{Resolution: "ESCALATE"}},
	} {
		got, err := gpufinding.Decode(c.kind, []byte(c.payload))
		if err != nil || !proto.Equal(got, c.want) {
			t.Errorf("Decode(%s, %s) = %v, %v; want %v", c.kind, c.payload, got, err, c.want)
		}
	}
}

func TestDecodeRefusesOtherInput(t *testing.T) {
	for _, p := range []string{`[1]`, `"x"`, `{"xid":"seventy"}`, `{` + strings.Repeat(" ", gpufinding.MaxPayloadSize) + `}`} {
		if f, err := gpufinding.Decode("gpu.xid", []byte(p)); !errors.Is(err, gpufinding.ErrBadFinding) {
			t.Errorf("Decode(%.40s) = %v, %v; want ErrBadFinding", p, f, err)
		}
	}
}

func TestCheckBounds(t *testing.T) {
	long := strings.Repeat("x", gpufinding.MaxTextLen+1)
	counters := map[string]uint64{}
	for i := range gpufinding.MaxCounters + 1 {
		counters[strings.Repeat("c", i+1)] = 1
	}
	for name, f := range map[string]*sessionv1.GPUFinding{
		"nil":            nil,
		"long uuid":      {GpuUuid: long},
		"control":        {Resolution: "RESET\nGPU"},
		"bad utf-8":      {BoardSerial: "\xff"},
		"long line":      {Evidence: &sessionv1.GPUFindingEvidence{LogLine: strings.Repeat("x", gpufinding.MaxLineLen+1)}},
		"counters":       {Evidence: &sessionv1.GPUFindingEvidence{Counters: counters}},
		"bad time":       {ObservedAt: &timestamppb.Timestamp{Nanos: -1}},
		"long cause":     {Signal: &sessionv1.GPUFinding_Clocks{Clocks: &sessionv1.ClocksSignal{Reasons: []string{long}}}},
		"long ib device": {Signal: &sessionv1.GPUFinding_Infiniband{Infiniband: &sessionv1.InfiniBandSignal{Device: long}}},
		"ib control": {Signal: &sessionv1.GPUFinding_Infiniband{Infiniband: &sessionv1.InfiniBandSignal{Device: "mlx5_0",
			PhysState: "Link\x00Up"}}},
		"ib window": {Signal: &sessionv1.GPUFinding_Infiniband{Infiniband: &sessionv1.InfiniBandSignal{
			Window: &durationpb.Duration{Seconds: 1, Nanos: -1}}}},
	} {
		if err := gpufinding.Check(f); !errors.Is(err, gpufinding.ErrBadFinding) {
			t.Errorf("%s: Check = %v, want ErrBadFinding", name, err)
		}
	}
}

// TestFromEvent: an Event's typed finding is taken as sent; without one
// (an older bcd) it is made of the flat fields.
func TestFromEvent(t *testing.T) {
	f := every()[3]
	if got := gpufinding.FromEvent(&sessionv1.Event{Kind: "gpu.xid", Xid: 79, GpuFinding: f}); got != f {
		t.Errorf("FromEvent with a finding = %v, want it unchanged", got)
	}
	got := gpufinding.FromEvent(&sessionv1.Event{Kind: "gpu.xid", Xid: 79, GpuUuid: "GPU-3", Resolution: "RESTART_BM",
		XidMnemonic: "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"})
	if gpufinding.SignalOf(got) != gpufinding.SignalXID || got.GetXid().GetCode() != 79 || got.GetGpuUuid() != "GPU-3" ||
		got.GetResolution() != "RESTART_BM" {
		t.Errorf("FromEvent without a finding = %v", got)
	}
}
