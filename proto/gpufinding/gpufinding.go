// Package gpufinding owns the stored form of a GPU finding
// (sessionv1.GPUFinding): the node event kinds each signal is sent under,
// the protojson a gateway writes into a "gpu.*" event's payload (Marshal),
// the one reader of that payload (Decode, which also reads the JSON shape
// gateways wrote before the typed message, docs/gpu-findings.md), the
// finding of a session Event (FromEvent, for a bcd that predates the typed
// message) and the bounds a node's finding must keep (Check).
//
// bcd builds findings, the gateway checks and stores them, the store reads
// them back for the gpu.health-changed event and the remediation inbox, and
// the remediation reconciler matches on their signal (SignalOf) and
// resolution: nothing else parses them.
package gpufinding

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// The node event kinds (sessionv1.Event.kind) a finding is sent under, one
// per signal (Kind).
const (
	KindXID            = "gpu.xid"             // XIDSignal
	KindECCUncorrected = "gpu.ecc.uncorrected" // ECCSignal, uncorrectable
	KindECCCorrected   = "gpu.ecc.corrected"   // ECCSignal, a spike of corrected errors
	KindRowRemap       = "gpu.row-remap"       // RowRemapSignal
	KindRecoveryAction = "gpu.recovery-action" // RecoveryActionSignal
	KindClocks         = "gpu.clocks"          // ClocksSignal
	KindNVLink         = "gpu.nvlink"          // NVLinkSignal
	KindRetiredPages   = "gpu.retired-pages"   // RetiredPagesSignal
	KindGPULost        = "gpu.lost"            // GPULostSignal
	KindPCIe           = "gpu.pcie"            // PCIeSignal
	KindGPUMissing     = "gpu.missing"         // GPUMissingSignal
	KindFabric         = "gpu.fabric"          // FabricSignal
	KindPersistence    = "gpu.persistence"     // PersistenceModeSignal
	KindDrift          = "gpu.drift"           // DriftSignal (the control plane's, of a node)
	KindFabricManager  = "gpu.fabric-manager"  // FabricManagerSignal
	KindInfiniBand     = "ib.port"             // InfiniBandSignal: a port or RDMA device, not a GPU
	// KindHealth is a finding without a signal this version knows.
	KindHealth = "gpu.health"
)

// Signal names a finding's signal, the oneof variant that is set.
type Signal int

// The signals. SignalNone is a finding without one (a signal added after
// this version, or a legacy row whose kind names none).
const (
	SignalNone Signal = iota
	SignalXID
	SignalECC
	SignalRowRemap
	SignalRecoveryAction
	SignalClocks
	SignalNVLink
	SignalRetiredPages
	SignalGPULost
	SignalPCIe
	SignalGPUMissing
	SignalFabric
	SignalPersistence
	SignalDrift
	SignalFabricManager
	SignalInfiniBand
)

var signalNames = [...]string{"none", "xid", "ecc", "row-remap", "recovery-action", "clocks", "nvlink", "retired-pages", "gpu-lost", "pcie", "gpu-missing", "fabric",
	"persistence", "drift", "fabric-manager", "infiniband"}

// String names s, for example "row-remap".
func (s Signal) String() string {
	if s >= 0 && int(s) < len(signalNames) {
		return signalNames[s]
	}
	return fmt.Sprintf("Signal(%d)", int(s))
}

// SignalOf returns which signal f carries; SignalNone for nil.
func SignalOf(f *sessionv1.GPUFinding) Signal {
	switch f.GetSignal().(type) {
	case *sessionv1.GPUFinding_Xid:
		return SignalXID
	case *sessionv1.GPUFinding_Ecc:
		return SignalECC
	case *sessionv1.GPUFinding_RowRemap:
		return SignalRowRemap
	case *sessionv1.GPUFinding_RecoveryAction:
		return SignalRecoveryAction
	case *sessionv1.GPUFinding_Clocks:
		return SignalClocks
	case *sessionv1.GPUFinding_Nvlink:
		return SignalNVLink
	case *sessionv1.GPUFinding_RetiredPages:
		return SignalRetiredPages
	case *sessionv1.GPUFinding_GpuLost:
		return SignalGPULost
	case *sessionv1.GPUFinding_Pcie:
		return SignalPCIe
	case *sessionv1.GPUFinding_GpuMissing:
		return SignalGPUMissing
	case *sessionv1.GPUFinding_Fabric:
		return SignalFabric
	case *sessionv1.GPUFinding_Persistence:
		return SignalPersistence
	case *sessionv1.GPUFinding_Drift:
		return SignalDrift
	case *sessionv1.GPUFinding_FabricManager:
		return SignalFabricManager
	case *sessionv1.GPUFinding_Infiniband:
		return SignalInfiniBand
	}
	return SignalNone
}

// Kind returns the event kind f is sent and stored under (the Kind*
// constants): KindHealth for a finding without a known signal.
func Kind(f *sessionv1.GPUFinding) string {
	switch SignalOf(f) {
	case SignalXID:
		return KindXID
	case SignalECC:
		if f.GetEcc().GetUncorrectable() {
			return KindECCUncorrected
		}
		return KindECCCorrected
	case SignalRowRemap:
		return KindRowRemap
	case SignalRecoveryAction:
		return KindRecoveryAction
	case SignalClocks:
		return KindClocks
	case SignalNVLink:
		return KindNVLink
	case SignalRetiredPages:
		return KindRetiredPages
	case SignalGPULost:
		return KindGPULost
	case SignalPCIe:
		return KindPCIe
	case SignalGPUMissing:
		return KindGPUMissing
	case SignalFabric:
		return KindFabric
	case SignalPersistence:
		return KindPersistence
	case SignalDrift:
		return KindDrift
	case SignalFabricManager:
		return KindFabricManager
	case SignalInfiniBand:
		return KindInfiniBand
	}
	return KindHealth
}

// Bounds a node's finding must keep (Check), in bytes or entries.
const (
	MaxTextLen     = 256  // every string but the log line and the message
	MaxLineLen     = 2048 // Evidence.log_line and Evidence.message
	MaxCounters    = 32   // Evidence.counters entries
	MaxReasons     = 16   // ClocksSignal.reasons entries
	MaxPayloadSize = 16 << 10
)

// ErrBadFinding is wrapped by every Check and Decode error.
var ErrBadFinding = errors.New("bad GPU finding")

// Check reports whether f keeps the bounds above: every string valid UTF-8
// without control characters and at most MaxTextLen bytes (MaxLineLen for
// the log line and message), at most MaxCounters counters and MaxReasons
// clock reasons, a valid observed_at when set. Errors wrap ErrBadFinding.
func Check(f *sessionv1.GPUFinding) error {
	if f == nil {
		return fmt.Errorf("%w: none", ErrBadFinding)
	}
	ev := f.GetEvidence()
	texts := []struct {
		name string
		s    string
		max  int
	}{
		{"gpuUuid", f.GetGpuUuid(), MaxTextLen}, {"boardSerial", f.GetBoardSerial(), MaxTextLen},
		{"pciBusId", f.GetPciBusId(), MaxTextLen}, {"immediateResolution", f.GetImmediateResolution(), MaxTextLen},
		{"investigatoryResolution", f.GetInvestigatoryResolution(), MaxTextLen},
		{"resolution", f.GetResolution(), MaxTextLen}, {"xid.mnemonic", f.GetXid().GetMnemonic(), MaxTextLen},
		{"recoveryAction.action", f.GetRecoveryAction().GetAction(), MaxTextLen},
		{"gpuLost.nvmlError", f.GetGpuLost().GetNvmlError(), MaxTextLen},
		{"pcie.aerSeverity", f.GetPcie().GetAerSeverity(), MaxTextLen},
		{"fabric.state", f.GetFabric().GetState(), MaxTextLen}, {"fabric.status", f.GetFabric().GetStatus(), MaxTextLen},
		{"drift.driverVersion", f.GetDrift().GetDriverVersion(), MaxTextLen},
		{"drift.poolDriverVersion", f.GetDrift().GetPoolDriverVersion(), MaxTextLen},
		{"drift.cudaVersion", f.GetDrift().GetCudaVersion(), MaxTextLen},
		{"drift.poolCudaVersion", f.GetDrift().GetPoolCudaVersion(), MaxTextLen},
		{"fabricManager.activeState", f.GetFabricManager().GetActiveState(), MaxTextLen},
		{"fabricManager.subState", f.GetFabricManager().GetSubState(), MaxTextLen},
		{"fabricManager.loadState", f.GetFabricManager().GetLoadState(), MaxTextLen},
		{"infiniband.device", f.GetInfiniband().GetDevice(), MaxTextLen}, {"infiniband.cause", f.GetInfiniband().GetCause(), MaxTextLen},
		{"infiniband.state", f.GetInfiniband().GetState(), MaxTextLen},
		{"infiniband.physState", f.GetInfiniband().GetPhysState(), MaxTextLen},
		{"evidence.source", ev.GetSource(), MaxTextLen}, {"evidence.process", ev.GetProcess(), MaxTextLen},
		{"evidence.logLine", ev.GetLogLine(), MaxLineLen}, {"evidence.message", ev.GetMessage(), MaxLineLen},
	}
	for _, t := range texts {
		if !text(t.s, t.max) {
			return fmt.Errorf("%w: %s: want at most %d bytes of UTF-8 without control characters", ErrBadFinding, t.name, t.max)
		}
	}
	if n := len(ev.GetCounters()); n > MaxCounters {
		return fmt.Errorf("%w: evidence.counters: %d entries, want at most %d", ErrBadFinding, n, MaxCounters)
	}
	for k := range ev.GetCounters() {
		if k == "" || !text(k, MaxTextLen) {
			return fmt.Errorf("%w: evidence.counters: bad name %q", ErrBadFinding, k)
		}
	}
	rs := f.GetClocks().GetReasons()
	if len(rs) > MaxReasons {
		return fmt.Errorf("%w: clocks.reasons: %d entries, want at most %d", ErrBadFinding, len(rs), MaxReasons)
	}
	for _, r := range rs {
		if !text(r, MaxTextLen) {
			return fmt.Errorf("%w: clocks.reasons: bad reason %q", ErrBadFinding, r)
		}
	}
	if ts := f.GetObservedAt(); ts != nil && ts.CheckValid() != nil {
		return fmt.Errorf("%w: observedAt: %v", ErrBadFinding, ts.CheckValid())
	}
	if w := f.GetNvlink().GetWindow(); w != nil && w.CheckValid() != nil {
		return fmt.Errorf("%w: nvlink.window: %v", ErrBadFinding, w.CheckValid())
	}
	if w := f.GetFabric().GetFor(); w != nil && w.CheckValid() != nil {
		return fmt.Errorf("%w: fabric.for: %v", ErrBadFinding, w.CheckValid())
	}
	if w := f.GetPcie().GetWindow(); w != nil && w.CheckValid() != nil {
		return fmt.Errorf("%w: pcie.window: %v", ErrBadFinding, w.CheckValid())
	}
	if w := f.GetFabricManager().GetWindow(); w != nil && w.CheckValid() != nil {
		return fmt.Errorf("%w: fabricManager.window: %v", ErrBadFinding, w.CheckValid())
	}
	if w := f.GetFabricManager().GetDownFor(); w != nil && w.CheckValid() != nil {
		return fmt.Errorf("%w: fabricManager.downFor: %v", ErrBadFinding, w.CheckValid())
	}
	if w := f.GetInfiniband().GetWindow(); w != nil && w.CheckValid() != nil {
		return fmt.Errorf("%w: infiniband.window: %v", ErrBadFinding, w.CheckValid())
	}
	return nil
}

func text(s string, max int) bool {
	return len(s) <= max && utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0
}

// Marshal returns f's stored form: protojson with the proto field names in
// lowerCamelCase ("gpuUuid", "xid": {"code": 79}, ...) and unset fields
// left out.
func Marshal(f *sessionv1.GPUFinding) ([]byte, error) {
	b, err := protojson.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("marshal GPU finding: %w", err)
	}
	return b, nil
}

// Decode reads the finding a "gpu.*" event of kind stored in payload: the
// typed message's protojson (Marshal), or the JSON gateways wrote before it
// ({"gpuUuid", "xid": 79, "xidMnemonic", "resolution", "attributes",
// "nodeTime"}, see Legacy). A payload over MaxPayloadSize, or one that is
// neither shape, is an error wrapping ErrBadFinding.
func Decode(kind string, payload []byte) (*sessionv1.GPUFinding, error) {
	if len(payload) > MaxPayloadSize {
		return nil, fmt.Errorf("%w: payload of %d bytes, want at most %d", ErrBadFinding, len(payload), MaxPayloadSize)
	}
	f := &sessionv1.GPUFinding{}
	err := protojson.Unmarshal(payload, f)
	// A typed finding names its signal when its kind does; an old payload
	// of only gpuUuid and resolution also reads as protojson, and its kind
	// names the signal.
	if err == nil && (SignalOf(f) != SignalNone || SignalOf((&Legacy{Kind: kind}).Finding()) == SignalNone) {
		return f, nil
	}
	var l Legacy
	if lerr := json.Unmarshal(payload, &l); lerr != nil {
		if err == nil {
			return f, nil
		}
		return nil, fmt.Errorf("%w: neither the typed finding (%v) nor the old payload (%v)", ErrBadFinding, err, lerr)
	}
	l.Kind = kind
	return l.Finding(), nil
}

// Legacy is a GPU event as gateways stored it before the typed finding (the
// events table's payload, the remediation inbox's columns) and as a bcd
// before it sends it (sessionv1.Event's flat fields).
type Legacy struct {
	Kind        string            `json:"-"`
	GPUUUID     string            `json:"gpuUuid"`
	XID         uint32            `json:"xid"`
	XIDMnemonic string            `json:"xidMnemonic"`
	Resolution  string            `json:"resolution"`
	Attributes  map[string]string `json:"attributes"`
	NodeTime    *time.Time        `json:"nodeTime"`
	Message     string            `json:"-"`
}

// Finding is l as a typed finding. Its signal comes from the kind, the one
// thing the old shape says of it: "gpu.xid" an XID (l.XID), "gpu.ecc*" an
// uncorrectable ECC error, a kind naming "row-remap" a row-remapping
// failure, "gpu.lost" a lost GPU; any other kind has no signal. This is the
// one place a kind's text is read. The resolution is both the
// immediate one and the one called for (the old shape kept one).
func (l *Legacy) Finding() *sessionv1.GPUFinding {
	f := &sessionv1.GPUFinding{GpuUuid: l.GPUUUID, ImmediateResolution: l.Resolution, Resolution: l.Resolution}
	switch {
	case l.Kind == KindXID:
		f.Signal = &sessionv1.GPUFinding_Xid{Xid: &sessionv1.XIDSignal{Code: l.XID, Mnemonic: l.XIDMnemonic}}
	case strings.HasPrefix(l.Kind, "gpu.ecc"):
		f.Signal = &sessionv1.GPUFinding_Ecc{Ecc: &sessionv1.ECCSignal{Uncorrectable: true}}
	case strings.Contains(l.Kind, "row-remap"):
		f.Signal = &sessionv1.GPUFinding_RowRemap{RowRemap: &sessionv1.RowRemapSignal{Failure: true}}
	case l.Kind == KindGPULost:
		f.Signal = &sessionv1.GPUFinding_GpuLost{GpuLost: &sessionv1.GPULostSignal{}}
	}
	if l.NodeTime != nil {
		f.ObservedAt = timestamppb.New(*l.NodeTime)
	}
	if l.Message != "" || len(l.Attributes) > 0 {
		f.Evidence = &sessionv1.GPUFindingEvidence{Source: l.Attributes["source"], Process: l.Attributes["process"],
			Message: l.Message}
	}
	return f
}

// FromEvent returns the finding of a node's "gpu.*" event: its gpu_finding
// as sent, or, from a bcd that predates it, one made of the flat fields
// (Legacy.Finding). It never returns nil.
func FromEvent(e *sessionv1.Event) *sessionv1.GPUFinding {
	if f := e.GetGpuFinding(); f != nil {
		return f
	}
	l := Legacy{Kind: e.GetKind(), GPUUUID: e.GetGpuUuid(), XID: e.GetXid(), XIDMnemonic: e.GetXidMnemonic(),
		Resolution: e.GetResolution(), Attributes: e.GetAttributes(), Message: e.GetMessage()}
	if ts := e.GetTime(); ts != nil && ts.CheckValid() == nil {
		t := ts.AsTime().UTC()
		l.NodeTime = &t
	}
	return l.Finding()
}
