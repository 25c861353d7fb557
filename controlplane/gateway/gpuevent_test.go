package gateway

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// A node's XID event carries NVIDIA's mnemonic and the resolution into the
// stored event and into gpu.health-changed's data, where the control plane
// acts on the resolution (docs/gpu-health.md).
func TestGPUEventCarriesMnemonicAndResolution(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(nil)
		n := e.join(g, "gpu-xid", "")
		s := e.connect(g, n)
		before, err := e.st.OutboxMaxID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Event{Event: &sessionv1.Event{
			Kind: "gpu.xid", Xid: 79, Severity: sessionv1.Severity_SEVERITY_CRITICAL, GpuUuid: "GPU-79",
			Message: "XID 79 on GPU 3", XidMnemonic: "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", Resolution: "RESTART_BM",
			Attributes: map[string]string{"source": "kmsg"},
		}}}); err != nil {
			t.Fatal(err)
		}
		var data events.GPUHealthData
		e.eventually(t, 30*time.Second, "the gpu.health-changed event", func() bool {
			entries, _ := e.st.OutboxList(ctx, before, store.MaxListLimit)
			for _, en := range entries {
				var env struct {
					Type string          `json:"type"`
					Data json.RawMessage `json:"data"`
				}
				if json.Unmarshal(en.Payload, &env) == nil && env.Type == events.GPUHealthChanged {
					return json.Unmarshal(env.Data, &data) == nil
				}
			}
			return false
		})
		if data.XID != 79 || data.XIDMnemonic != "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" || data.Resolution != "RESTART_BM" ||
			data.GPUUUID != "GPU-79" || data.NodeID != n.id {
			t.Errorf("gpu.health-changed data = %+v", data)
		}
		evs, err := e.st.EventList(ctx, &store.EventListParams{NodeID: n.id})
		if err != nil || len(evs) != 1 {
			t.Fatalf("events = %v, %v", evs, err)
		}
		// A bcd without the typed finding: the gateway makes it of the
		// flat fields and stores it as the typed finding's protojson.
		f, err := gpufinding.Decode(evs[0].Kind, evs[0].Payload)
		if err != nil || f.GetXid().GetMnemonic() != "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" || f.GetXid().GetCode() != 79 ||
			f.GetResolution() != "RESTART_BM" || f.GetGpuUuid() != "GPU-79" || f.GetEvidence().GetSource() != "kmsg" {
			t.Errorf("stored payload = %s (%v, %v)", evs[0].Payload, f, err)
		}
		if got, err := data.GPUFinding(); err != nil || !proto.Equal(got, f) {
			t.Errorf("gpu.health-changed finding = %v (%v), want the stored one %v", got, err, f)
		}
	})
}

// A node's typed finding is stored unchanged; one outside
// gpufinding.Check's bounds is dropped, and the events after it still
// count.
func TestGPUEventStoresTypedFindingUnchanged(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(nil)
		n := e.join(g, "gpu-typed", "")
		s := e.connect(g, n)
		bad := &sessionv1.GPUFinding{GpuUuid: "GPU-\n1", Resolution: "RESET_GPU",
			Signal: &sessionv1.GPUFinding_Ecc{Ecc: &sessionv1.ECCSignal{Uncorrectable: true}}}
		good := &sessionv1.GPUFinding{GpuUuid: "GPU-2", BoardSerial: "1320", PciBusId: "00000000:07:00.0", Resolution: "CONTACT_SUPPORT",
			ImmediateResolution: "CONTACT_SUPPORT", Health: sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED,
			Signal:   &sessionv1.GPUFinding_RowRemap{RowRemap: &sessionv1.RowRemapSignal{Failure: true, UncorrectableRows: 9}},
			Evidence: &sessionv1.GPUFindingEvidence{Source: "scan", Counters: map[string]uint64{"remappedRowsUncorrectable": 9}}}
		for _, f := range []*sessionv1.GPUFinding{bad, good} {
			if err := s.stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Event{Event: &sessionv1.Event{
				Kind: gpufinding.Kind(f), Severity: sessionv1.Severity_SEVERITY_CRITICAL, GpuFinding: f}}}); err != nil {
				t.Fatal(err)
			}
		}
		var evs []*store.Event
		e.eventually(t, 30*time.Second, "the typed finding's event", func() bool {
			evs, _ = e.st.EventList(ctx, &store.EventListParams{NodeID: n.id})
			return len(evs) > 0
		})
		if len(evs) != 1 || evs[0].Kind != gpufinding.KindRowRemap {
			t.Fatalf("events = %v, want the row remapping's only", evs)
		}
		if f, err := gpufinding.Decode(evs[0].Kind, evs[0].Payload); err != nil || !proto.Equal(f, good) {
			t.Errorf("stored finding = %v (%v), want %v", f, err, good)
		}
	})
}
