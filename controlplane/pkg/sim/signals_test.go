package sim_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/gateway"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/reconcilers/drift"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// storeRig is a real gateway on a real SQLite store with n FakeDaemons of
// one pool holding real sessions over TLS.
type storeRig struct {
	t       *testing.T
	ctx     context.Context
	st      store.Store
	pool    *store.Pool
	daemons []*sim.FakeDaemon
}

func newStoreRig(t *testing.T, n int) *storeRig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st := sqlitetest.Open(t)
	bundle, err := pki.Init(pki.InitOptions{TrustDomain: "sim.test"})
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := bootstrap.WriteGatewayCert(bundle, t.TempDir(), []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "default"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile,
		DispatchInterval: 50 * time.Millisecond, HeartbeatInterval: time.Second, FlushInterval: 20 * time.Millisecond}, st, bundle, log)
	if err != nil {
		t.Fatal(err)
	}
	gwDone := make(chan struct{})
	go func() { defer close(gwDone); _ = gw.Run(ctx) }()
	<-gw.Ready()
	token, _, err := api.CreateJoinToken(ctx, st, bundle.GatewayPin(), pool.ID, time.Hour, n, "sim", "")
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := sim.NewFleet(sim.FleetConfig{GatewayURL: gw.PublicURL(), Token: token, N: n,
		Session: session.Config{StartJitter: -1, BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fleet.Join(ctx); err != nil {
		t.Fatal(err)
	}
	fleetDone := make(chan struct{})
	go func() { defer close(fleetDone); _ = fleet.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-fleetDone; <-gwDone })
	wctx, wcancel := context.WithTimeout(ctx, wait)
	defer wcancel()
	if err := fleet.WaitFor(wctx, func(s sim.FleetStats) bool { return s.Connected == n }); err != nil {
		t.Fatal(err)
	}
	r := &storeRig{t: t, ctx: ctx, st: st, pool: pool, daemons: fleet.Daemons()}
	for _, d := range r.daemons {
		r.until(d.Name()+"'s inventory stored", func() bool { return len(r.gpus(d)) == 8 })
	}
	return r
}

// until polls cond (the gateway writes on its flush interval) until it
// holds, or fails the test.
func (r *storeRig) until(what string, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("not %s within %v", what, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gpus returns d's GPUs as the store's copy of its inventory lists them.
func (r *storeRig) gpus(d *sim.FakeDaemon) []*sessionv1.GPU {
	r.t.Helper()
	n, err := r.st.NodeGet(r.ctx, d.NodeID())
	if err != nil {
		r.t.Fatal(err)
	}
	inv := &sessionv1.Inventory{}
	if len(n.Inventory) > 0 {
		if err := protojson.Unmarshal(n.Inventory, inv); err != nil {
			r.t.Fatal(err)
		}
	}
	return inv.GetGpus()
}

// findings returns d's stored findings of kind, newest first.
func (r *storeRig) findings(d *sim.FakeDaemon, kind string) []*sessionv1.GPUFinding {
	r.t.Helper()
	es, err := r.st.EventList(r.ctx, &store.EventListParams{NodeID: d.NodeID(), Limit: store.MaxListLimit})
	if err != nil {
		r.t.Fatal(err)
	}
	var out []*sessionv1.GPUFinding
	for _, e := range es {
		if e.Kind != kind {
			continue
		}
		f, err := gpufinding.Decode(e.Kind, e.Payload)
		if err != nil {
			r.t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

// health is GPU i's health state in the store's copy of d's inventory.
func (r *storeRig) health(d *sim.FakeDaemon, i int) sessionv1.GPUHealthState {
	gs := r.gpus(d)
	if i >= len(gs) {
		return sessionv1.GPUHealthState_GPU_HEALTH_STATE_UNSPECIFIED
	}
	return gs[i].GetHealth().GetState()
}

// TestSimulatorPlaysEverySignal (issue 43): each signal a FakeDaemon raises
// — PCIe replays, a narrowed link and an AER error, an NVLink fabric state
// short of completed, persistence mode off, the fabric manager's service
// down, a GPU gone from the bus, and another driver version than the
// pool's — reaches a real gateway's store as the finding bcd (or, for a
// missing GPU and drift, the control plane) makes of it, with its signal,
// resolution and health; the GPU's health shows in the stored inventory,
// and setting the reading back ends it.
func TestSimulatorPlaysEverySignal(t *testing.T) {
	t.Parallel()
	r := newStoreRig(t, 3)
	d := r.daemons[0]
	const (
		degraded = sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED
		failed   = sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED
		ok       = sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK
	)
	gpu := func(i int) string { return d.Inventory().GetGpus()[i].GetUuid() }
	// The signals are spread over the daemons: the gateway takes about one
	// write a second of a session past a burst of 20.

	// PCIe: replays, width, AER.
	must(t, d.RaisePCIe(1, sim.PCIeFault{Replays: 150}))
	must(t, d.RaisePCIe(2, sim.PCIeFault{Width: 8}))
	must(t, d.RaisePCIe(3, sim.PCIeFault{AER: "fatal"}))
	r.until("three gpu.pcie findings stored", func() bool { return len(r.findings(d, gpufinding.KindPCIe)) == 3 })
	for _, f := range r.findings(d, gpufinding.KindPCIe) {
		p := f.GetPcie()
		var good bool
		switch f.GetGpuUuid() {
		case gpu(1):
			good = p.GetReplays() == 150 && p.GetWindow().AsDuration() > 0 && f.GetResolution() == "CHECK_MECHANICALS" && f.GetHealth() == degraded
		case gpu(2):
			good = p.GetLinkWidth() == 8 && p.GetMaxLinkWidth() == 16 && f.GetResolution() == "CHECK_MECHANICALS"
		case gpu(3):
			good = p.GetAerSeverity() == "fatal" && f.GetResolution() == "RESTART_BM" && f.GetHealth() == failed
		}
		if !good || f.GetEvidence().GetMessage() == "" || f.GetObservedAt() == nil {
			t.Errorf("PCIe finding = %v", f)
		}
	}
	r.until("GPU 3 failed in the inventory", func() bool { return r.health(d, 3) == failed && r.health(d, 2) == degraded })
	for _, i := range []int{1, 2, 3} {
		must(t, d.ClearPCIe(i))
	}
	r.until("the PCIe faults ended", func() bool { return r.health(d, 1) == ok && r.health(d, 2) == ok && r.health(d, 3) == ok })

	// The NVLink fabric state.
	d = r.daemons[1]
	must(t, d.SetFabricState(4, "IN_PROGRESS"))
	r.until("a gpu.fabric finding", func() bool { return len(r.findings(d, gpufinding.KindFabric)) == 1 })
	if f := r.findings(d, gpufinding.KindFabric)[0]; f.GetGpuUuid() != gpu(4) || f.GetFabric().GetState() != "IN_PROGRESS" ||
		f.GetResolution() != "ESCALATE" || f.GetHealth() != degraded {
		t.Errorf("fabric finding = %v", f)
	}
	r.until("GPU 4 degraded", func() bool { return r.health(d, 4) == degraded })
	must(t, d.SetFabricState(4, "COMPLETED"))
	r.until("GPU 4 ok", func() bool { return r.health(d, 4) == ok })

	// Persistence mode.
	must(t, d.SetPersistenceMode(5, false))
	r.until("a gpu.persistence finding", func() bool { return len(r.findings(d, gpufinding.KindPersistence)) == 1 })
	if f := r.findings(d, gpufinding.KindPersistence)[0]; f.GetGpuUuid() != gpu(5) || f.GetPersistence() == nil ||
		f.GetResolution() != "IGNORE" || f.GetHealth() != degraded {
		t.Errorf("persistence finding = %v", f)
	}
	r.until("GPU 5 degraded", func() bool { return r.health(d, 5) == degraded })
	must(t, d.SetPersistenceMode(5, true))
	r.until("GPU 5 ok", func() bool { return r.health(d, 5) == ok })

	// The fabric manager's service: one node finding, every GPU degraded.
	d.SetFabricManager("failed")
	r.until("a gpu.fabric-manager finding", func() bool { return len(r.findings(d, gpufinding.KindFabricManager)) == 1 })
	if f := r.findings(d, gpufinding.KindFabricManager)[0]; f.GetGpuUuid() != "" || f.GetFabricManager().GetActiveState() != "failed" ||
		f.GetResolution() != "ESCALATE" || f.GetHealth() != degraded {
		t.Errorf("fabric manager finding = %v", f)
	}
	r.until("every GPU degraded", func() bool { return r.health(d, 0) == degraded && r.health(d, 7) == degraded })
	d.SetFabricManager("active")
	r.until("every GPU ok", func() bool { return r.health(d, 0) == ok && r.health(d, 7) == ok })

	// A GPU gone from the bus: the gateway's gpu.missing, naming it.
	d = r.daemons[2]
	must(t, d.RemoveGPU(6))
	r.until("a gpu.missing finding", func() bool { return len(r.findings(d, gpufinding.KindGPUMissing)) == 1 })
	if f := r.findings(d, gpufinding.KindGPUMissing)[0]; f.GetGpuUuid() != gpu(6) || f.GetGpuMissing().GetExpected() != 8 ||
		f.GetGpuMissing().GetPresent() != 7 || f.GetResolution() != "RESTART_BM" || f.GetHealth() != failed {
		t.Errorf("missing finding = %v", f)
	}
	must(t, d.RestoreGPU(6))
	r.until("8 GPUs listed again", func() bool { return len(r.gpus(d)) == 8 })

	// Another driver: the control plane's drift round finds it on d alone.
	d.SetVersions("535.104.05", "")
	r.until("the new driver stored", func() bool { return r.gpus(d)[0].GetDriverVersion() == "535.104.05" })
	ls, got, err := r.st.LeaseAcquire(r.ctx, &store.LeaseAcquireParams{Name: drift.LeaseName, Holder: "t", TTL: time.Minute})
	if err != nil || !got {
		t.Fatal(got, err)
	}
	fence := store.Fence{Lease: ls.Name, Holder: "t", Epoch: ls.Epoch}
	job := drift.NewJob(r.st, nil, slog.New(slog.DiscardHandler))
	drifting, err := job.Round(r.ctx, fence, time.Now())
	if err != nil || !slices.Equal(drifting[r.pool.ID], []string{d.NodeID()}) {
		t.Fatalf("drifting = %v, %v; want %s", drifting, err, d.NodeID())
	}
	if fs := r.findings(d, gpufinding.KindDrift); len(fs) != 1 || fs[0].GetDrift().GetDriverVersion() != "535.104.05" ||
		fs[0].GetDrift().GetPoolDriverVersion() != "550.54.15" || fs[0].GetResolution() != drift.Resolution {
		t.Errorf("drift findings = %v", fs)
	}
	for _, o := range r.daemons[:2] {
		if fs := r.findings(o, gpufinding.KindDrift); len(fs) != 0 {
			t.Errorf("%s drifts: %v", o.Name(), fs)
		}
	}
	d.ClearFaults()
	r.until("the simulated driver stored", func() bool { return r.gpus(d)[0].GetDriverVersion() == "550.54.15" })
	if drifting, err := job.Round(r.ctx, fence, time.Now()); err != nil || len(drifting) != 0 {
		t.Errorf("after ClearFaults: drifting %v, %v", drifting, err)
	}
}

// TestParseSignalFaults: the fault lines of the new signals parse and
// apply, and bad ones are refused.
func TestParseSignalFaults(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"pcie 0 1", "pcie 0 1 width=16", "pcie 0 1 aer=bad", "pcie 0 1 replays=0", "pcie 0 1 speed=3",
		"persistence 0 1 maybe", "fabric-manager 0", "fabric-manager 0 bogus", "versions 0", "remove-gpu 0"} {
		if _, err := sim.ParseFault(bad); err == nil {
			t.Errorf("ParseFault(%q): want an error", bad)
		}
	}
	f, err := sim.NewFleet(sim.FleetConfig{GatewayURL: "https://127.0.0.1:1", Token: sessiontest.NewPKI(t).NewToken(t), N: 2})
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.ApplyFaults(strings.NewReader("pcie 0 1 width=4\nfabric 0 2 NOT_STARTED\npersistence 1 3 off\n" +
		"fabric-manager 1 failed\nremove-gpu 0 7\nversions 1 535.104.05 12.2\n"))
	if err != nil || n != 6 {
		t.Fatalf("ApplyFaults = %d, %v", n, err)
	}
	ds := f.Daemons()
	inv0, inv1 := ds[0].CurrentInventory(), ds[1].CurrentInventory()
	for _, c := range []struct {
		what string
		ok   bool
	}{
		{"daemon 0 GPU 1 degraded", inv0.GetGpus()[1].GetHealth().GetState() == sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED},
		{"daemon 0 GPU 2 degraded", inv0.GetGpus()[2].GetHealth().GetResolution() == "ESCALATE"},
		{"daemon 0 lists 7 GPUs", len(inv0.GetGpus()) == 7 && len(inv0.GetGpusSeen()) == 8},
		{"daemon 1 GPU 3 persistence", fmt.Sprint(inv1.GetGpus()[3].GetHealth().GetReasons()) ==
			"[nvidia-fabricmanager.service not running: failed persistence mode off]" ||
			fmt.Sprint(inv1.GetGpus()[3].GetHealth().GetReasons()) == "[persistence mode off nvidia-fabricmanager.service not running: failed]"},
		{"daemon 1 versions", inv1.GetGpus()[0].GetDriverVersion() == "535.104.05" && inv1.GetGpus()[0].GetCudaDriverVersion() == "12.2"},
	} {
		if !c.ok {
			t.Errorf("%s: daemon 0 %v\ndaemon 1 %v", c.what, inv0.GetGpus(), inv1.GetGpus())
		}
	}
	if _, err := f.ApplyFaults(strings.NewReader("pcie 0 1 ok\nfabric 0 2 COMPLETED\nrestore-gpu 0 7\n")); err != nil {
		t.Fatal(err)
	}
	if inv := ds[0].CurrentInventory(); len(inv.GetGpus()) != 8 || inv.GetGpus()[1].GetHealth().GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK ||
		inv.GetGpus()[2].GetHealth().GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK {
		t.Errorf("after ok, COMPLETED, restore-gpu: %v", inv.GetGpus())
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
