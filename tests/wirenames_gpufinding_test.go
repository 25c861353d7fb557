package tests

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestWireNamesGPUFindingEveryKind (issue 31): a real bcd (the nvmlmock
// build) reports one finding of every kind — an XID and an uncorrectable
// ECC event from NVML's event API, and from its scans an uncorrectable and
// a corrected-ECC count, a failed and a pending row remapping, a recovery
// action, throttled clocks, a narrowed PCIe link, an NVLink fabric not
// registered past its grace, an NVLink error rise, pages waiting to be
// retired, a lost GPU, persistence mode off, the fabric manager's service
// flapping (a node's finding, naming no GPU) and an InfiniBand port's flap
// (ib.port, from a sysfs fixture: no GPU) — and each reads back as the same typed
// session.v1 GPUFinding from the events table, from its gpu.health-changed
// event and, when it names a resolution, from the remediation inbox.
// Remediation is off, so the inbox keeps what the store wrote.
func TestWireNamesGPUFindingEveryKind(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{top: "remediation:\n  disabled: true\ngpuHealth:\n  fabricGrace: 1s\n"})
	tokenFile, _ := d.joinToken(1, time.Hour)
	m := newMachine(t, "gpu-findings")
	node := m.mustJoin(d.gatewayURL, tokenFile)
	tm := m.tm()
	tm.BCD = testenv.BinaryTags(t, "bcd", "nvmlmock")
	fx := &ibFixture{t: t, root: t.TempDir()}
	fx.port("mlx5_0", 1, "0000:3b:00.0")
	bin, args := tm.Argv("node", "--data-dir", m.dataDir, "--plugin-dir", t.TempDir(),
		"--bmc-file", filepath.Join(t.TempDir(), "none.yaml"), "--inventory-interval", "300ms", "--sysfs-root", fx.root)
	np := testenv.Start(t, nil, bin, args...)
	np.WaitLine(`NVML is go-nvml's mock DGX A100`, 60*time.Second)
	np.WaitLine(sessionEstablished.String(), 60*time.Second)
	nodeOf := func() *store.Node {
		n, err := d.st.NodeGet(t.Context(), node)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	eventually(t, 60*time.Second, func() bool {
		inv := inventory(nodeOf().Inventory)
		return nodeOf().State == store.NodeReady && len(inv.GetGpus()) == 8 && len(inv.GetIbPorts()) == 1
	}, func() string { return "node not ready with its 8 GPUs and 1 InfiniBand port: " + nodeOf().State })
	gpus := inventory(nodeOf().Inventory).GetGpus()

	// Every kind, each on a GPU of its own or told apart by kind and
	// source: "<gpu index> <kind> <evidence source>".
	lines := "0 79\n1 ecc-event\n1 lost\n2 ecc-uncorrected 3\n2 retired-pages-pending\n3 ecc-corrected 500\n" +
		"4 row-remap-failure\n5 row-remap-pending\n5 recovery 1\n6 clocks 64\n6 pcie-width 8\n3 fabric 1\n4 persistence off\n" +
		"fabric-manager restart 3\n7 nvlink 500\n"
	want := []string{"-1 ib.port scan", "0 gpu.xid nvml", "1 gpu.ecc.uncorrected nvml", "1 gpu.lost scan", "2 gpu.ecc.uncorrected scan",
		"2 gpu.retired-pages scan", "3 gpu.ecc.corrected scan", "3 gpu.fabric scan", "4 gpu.row-remap scan", "5 gpu.recovery-action scan",
		"5 gpu.row-remap scan", "6 gpu.clocks scan", "6 gpu.pcie scan", "7 gpu.nvlink scan", "4 gpu.persistence scan"}
	want = append(want, "-1 gpu.fabric-manager scan") // the fabric manager's service flapping: a node's finding
	slices.Sort(want)
	if err := os.WriteFile(filepath.Join(m.dataDir, "nvmlmock-xids"), []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	np.Signal(syscall.SIGUSR1)
	np.WaitLine(`msg="Mock reading set" .*gpu_index=7 reading="nvlink 500"`, 30*time.Second)
	fx.set("mlx5_0", 1, "counters/link_downed", "1")

	index := map[string]int{}
	for i, g := range gpus {
		index[g.GetUuid()] = i
	}
	label := func(e *store.Event, f *sessionv1.GPUFinding) string {
		i, ok := index[f.GetGpuUuid()]
		if !ok {
			i = -1
		}
		return fmt.Sprintf("%d %s %s", i, e.Kind, f.GetEvidence().GetSource())
	}
	// The events table: one event per finding, its payload the finding.
	stored := map[string]*sessionv1.GPUFinding{}
	var byID = map[int64]*sessionv1.GPUFinding{}
	eventually(t, 60*time.Second, func() bool {
		evs, err := d.st.EventList(t.Context(), &store.EventListParams{NodeID: node, Limit: store.MaxListLimit})
		if err != nil {
			t.Fatal(err)
		}
		clear(stored)
		for _, e := range evs {
			f, err := gpufinding.Decode(e.Kind, e.Payload)
			if err != nil {
				t.Fatalf("event %d %s: payload %s: %v", e.ID, e.Kind, e.Payload, err)
			}
			if l := label(e, f); stored[l] == nil {
				stored[l], byID[e.ID] = f, f
			}
		}
		return len(stored) >= len(want)
	}, func() string {
		return fmt.Sprintf("stored findings %v, want %v", slices.Sorted(maps.Keys(stored)), want)
	})
	if got := slices.Sorted(maps.Keys(stored)); !slices.Equal(got, want) {
		t.Errorf("stored findings\n%q, want\n%q", got, want)
	}

	// Each is the typed finding bcd made: its GPU's identity, its signal,
	// NVIDIA's resolution, the health it implies, its evidence and time.
	signals := map[gpufinding.Signal]bool{}
	for l, f := range stored {
		signals[gpufinding.SignalOf(f)] = true
		if gpufinding.SignalOf(f) == gpufinding.SignalFabricManager {
			if f.GetGpuUuid() != "" || f.GetPciBusId() != "" || f.GetObservedAt() == nil || f.GetEvidence().GetMessage() == "" {
				t.Errorf("%s: want a node's finding (no GPU) with its time and message: %v", l, f)
			}
			continue
		}
		if gpufinding.Kind(f) != strings.Fields(l)[1] {
			t.Errorf("%s: stored under kind %s, its signal's is %s", l, strings.Fields(l)[1], gpufinding.Kind(f))
		}
		if gpufinding.SignalOf(f) == gpufinding.SignalInfiniBand {
			// A port, not a GPU: its device's PCI address, no GPU or serial.
			if f.GetPciBusId() != "0000:3b:00.0" || f.GetGpuUuid() != "" || f.GetBoardSerial() != "" {
				t.Errorf("%s: PCI %q GPU %q serial %q, want the device's address and no GPU", l, f.GetPciBusId(), f.GetGpuUuid(),
					f.GetBoardSerial())
			}
		} else if g := gpus[index[f.GetGpuUuid()]]; f.GetPciBusId() != g.GetPciBusId() || f.GetPciBusId() == "" || f.GetBoardSerial() != gputest.Serial(g.GetUuid()) {
			t.Errorf("%s: PCI %q serial %q, want the GPU's %q %q", l, f.GetPciBusId(), f.GetBoardSerial(), g.GetPciBusId(),
				gputest.Serial(g.GetUuid()))
		}
		if f.GetObservedAt() == nil || f.GetHealth() == sessionv1.GPUHealthState_GPU_HEALTH_STATE_UNSPECIFIED ||
			f.GetResolution() == "" || f.GetImmediateResolution() == "" || f.GetEvidence().GetMessage() == "" {
			t.Errorf("%s: finding lacks its time, health, resolution or message: %v", l, f)
		}
	}
	checks := map[string]func(*sessionv1.GPUFinding) bool{
		"0 gpu.xid nvml": func(f *sessionv1.GPUFinding) bool {
			return f.GetXid().GetCode() == 79 && f.GetXid().GetMnemonic() == "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" &&
				f.GetImmediateResolution() == "RESTART_BM" && f.GetInvestigatoryResolution() == "CONTACT_SUPPORT" &&
				f.GetResolution() == "RESTART_BM" && f.GetHealth() == sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED
		},
		"1 gpu.ecc.uncorrected nvml": func(f *sessionv1.GPUFinding) bool {
			return f.GetEcc().GetUncorrectable() && f.GetResolution() == "RESET_GPU"
		},
		"1 gpu.lost scan": func(f *sessionv1.GPUFinding) bool { return f.GetGpuLost().GetNvmlError() == "ERROR_GPU_IS_LOST" },
		"2 gpu.ecc.uncorrected scan": func(f *sessionv1.GPUFinding) bool {
			return f.GetEcc().GetUncorrectable() && f.GetEcc().GetCount() == 3 && f.GetEvidence().GetCounters()["eccVolatileUncorrected"] == 3
		},
		"2 gpu.retired-pages scan": func(f *sessionv1.GPUFinding) bool { return f.GetRetiredPages().GetPending() },
		"3 gpu.ecc.corrected scan": func(f *sessionv1.GPUFinding) bool {
			return !f.GetEcc().GetUncorrectable() && f.GetEcc().GetCount() == 500
		},
		"4 gpu.row-remap scan": func(f *sessionv1.GPUFinding) bool {
			return f.GetRowRemap().GetFailure() && f.GetRowRemap().GetUncorrectableRows() == 9 && f.GetResolution() == "CONTACT_SUPPORT"
		},
		"5 gpu.row-remap scan": func(f *sessionv1.GPUFinding) bool {
			return f.GetRowRemap().GetPending() && !f.GetRowRemap().GetFailure()
		},
		"5 gpu.recovery-action scan": func(f *sessionv1.GPUFinding) bool { return f.GetRecoveryAction().GetAction() == "GPU_RESET" },
		"6 gpu.clocks scan": func(f *sessionv1.GPUFinding) bool {
			return f.GetClocks().GetEventReasons() == 64 && slices.Equal(f.GetClocks().GetReasons(), []string{"hardware thermal slowdown"})
		},
		"3 gpu.fabric scan": func(f *sessionv1.GPUFinding) bool {
			return f.GetFabric().GetState() == "NOT_STARTED" && f.GetResolution() == "ESCALATE"
		},
		"6 gpu.pcie scan": func(f *sessionv1.GPUFinding) bool {
			return f.GetPcie().GetLinkWidth() == 8 && f.GetPcie().GetMaxLinkWidth() == 16 && f.GetResolution() == "CHECK_MECHANICALS"
		},
		"7 gpu.nvlink scan": func(f *sessionv1.GPUFinding) bool {
			return f.GetNvlink().GetErrors() == 500 && f.GetNvlink().GetWindow().AsDuration() > 0
		},
		"4 gpu.persistence scan": func(f *sessionv1.GPUFinding) bool {
			return f.GetPersistence() != nil && f.GetResolution() == "IGNORE"
		},
		"-1 gpu.fabric-manager scan": func(f *sessionv1.GPUFinding) bool {
			return f.GetFabricManager().GetRestarts() == 3 && f.GetFabricManager().GetActiveState() == "active" &&
				f.GetResolution() == "ESCALATE"
		},
		"-1 ib.port scan": func(f *sessionv1.GPUFinding) bool {
			s := f.GetInfiniband()
			return s.GetDevice() == "mlx5_0" && s.GetPort() == 1 && s.GetCause() == "flap" && s.GetLinkDowned() == 1 &&
				f.GetResolution() == "CHECK_MECHANICALS"
		},
	}
	for l, ok := range checks {
		if f := stored[l]; f != nil && !ok(f) {
			t.Errorf("%s: signal or resolution not as raised: %v", l, f)
		}
	}
	for _, s := range []gpufinding.Signal{gpufinding.SignalXID, gpufinding.SignalECC, gpufinding.SignalRowRemap,
		gpufinding.SignalRecoveryAction, gpufinding.SignalClocks, gpufinding.SignalNVLink, gpufinding.SignalRetiredPages,
		gpufinding.SignalGPULost, gpufinding.SignalPCIe, gpufinding.SignalFabric, gpufinding.SignalPersistence,
		gpufinding.SignalFabricManager, gpufinding.SignalInfiniBand} {
		if !signals[s] {
			t.Errorf("no finding with signal %s", s)
		}
	}

	// The gpu.health-changed events carry the same message.
	es, err := d.st.OutboxQuery(t.Context(), &store.OutboxQueryParams{TopicPrefix: events.GPUHealthChanged, Ascending: true,
		Limit: store.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	evented := map[string]*sessionv1.GPUFinding{}
	for _, e := range es {
		env, err := events.Parse(e.Payload)
		if err != nil {
			t.Fatal(err)
		}
		var data events.GPUHealthData
		if err := json.Unmarshal(env.Data, &data); err != nil {
			t.Fatal(err)
		}
		if data.NodeID != node {
			continue
		}
		f, err := data.GPUFinding()
		if err != nil {
			t.Fatalf("gpu.health-changed %s: finding %s: %v", data.Kind, data.Finding, err)
		}
		l := label(&store.Event{Kind: data.Kind}, f)
		if evented[l] == nil {
			evented[l] = f
		}
	}
	for l, f := range stored {
		if !proto.Equal(evented[l], f) {
			t.Errorf("%s: gpu.health-changed finding\n%v, stored\n%v", l, evented[l], f)
		}
	}

	// The remediation inbox holds each finding with a resolution, read back
	// from its event.
	fs, err := d.st.RemediationFindingsTake(t.Context(), store.ShardOf(node), store.MaxListLimit)
	if err != nil {
		t.Fatal(err)
	}
	inbox := 0
	for _, f := range fs {
		if f.NodeID != node {
			continue
		}
		inbox++
		if want := byID[f.EventID]; want != nil && !proto.Equal(f.GPUFinding, want) {
			t.Errorf("inbox finding of event %d (%s)\n%v, stored\n%v", f.EventID, f.Kind, f.GPUFinding, want)
		}
	}
	if inbox < len(want) {
		t.Errorf("the remediation inbox holds %d of the node's findings, want at least %d", inbox, len(want))
	}
	t.Logf("%d finding kinds, %d signals, read back alike from the events table, gpu.health-changed and the inbox (%d rows)",
		len(stored), len(signals), inbox)
}
