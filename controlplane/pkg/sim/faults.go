package sim

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/xid"
	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/proto/gpudiag"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Fault injection (DESIGN.md, "The simulator"; issue 19): a FakeDaemon can
// be told to raise an XID on a GPU, report ECC errors or a lost GPU, stop
// answering (hang: session open, no heartbeats, commands unanswered) or
// drop off the network for a while, and how long a gpu.reset or a reboot
// takes to bring it back. Each XID is classified by the same catalogue bcd
// uses (package bcd/inventory/gpu/xid): the Event carries NVIDIA's mnemonic
// and resolution, and the next inventory shows the GPU's health, as bcd's
// would. A successful gpu.reset clears that GPU's faults after
// Recovery.ResetDelay; a reboot drops the session for Recovery.RebootDelay
// and comes back with a new boot id and every fault cleared; the redelivered
// command is answered from the daemon's record, as bcd answers it from its
// journal.

// Recovery is how a FakeDaemon recovers from remediation commands.
type Recovery struct {
	// ResetDelay is how long a gpu.reset takes before it succeeds and the
	// GPU reads healthy. Defaults to 0 (at once).
	ResetDelay time.Duration
	// ResetFails makes gpu.reset fail (nvidia-smi cannot reset the GPU, as
	// on an NVSwitch system or with a GPU off the bus): the fault stays.
	ResetFails bool
	// RebootDelay is how long a reboot keeps the daemon away before it
	// reconnects with a new boot id. Defaults to DefaultRestartDelay.
	RebootDelay time.Duration
	// RebootHangs makes a reboot never come back (the machine hangs on the
	// way): the daemon stays away until ClearFaults, and comes back then,
	// as after a BMC power cycle, with a new boot id.
	RebootHangs bool
	// DiagFails makes gpu.diag fail, as DCGM's memory test would on a GPU
	// whose repair did not hold: the node is escalated, not returned.
	DiagFails bool
}

// FaultStats counts what a FakeDaemon did about its faults.
type FaultStats struct {
	// Resets counts gpu.reset commands run (redeliveries not counted),
	// Reboots reboot commands, Drains drain commands, Diags gpu.diag
	// commands.
	Resets, Reboots, Drains, Diags int
	// Hung reports the daemon stops answering now; Down that it is away
	// (disconnected or rebooting).
	Hung, Down bool
	// Boots counts the boots the daemon went through (1 at start).
	Boots int
}

// gpuCause is one injected cause of a GPU's health.
type gpuCause struct {
	reason         string
	resolution     string
	xid            uint32
	mnemonic       string
	at             time.Time
	uncorrectedECC uint64
	// key names a reading's cause (signals.go: "pcie", "fabric",
	// "persistence", "fabric-manager"), which a later reading replaces or
	// ends; "" for an XID or ECC error, which only a reset or reboot ends.
	key string
	// health, when set, is the health the cause implies; otherwise it
	// follows the resolution (xid.ImpactOf).
	health sessionv1.GPUHealthState
}

// faultState is a FakeDaemon's injected faults.
type faultState struct {
	mu      sync.Mutex
	causes  map[int][]gpuCause // by GPU index
	ib      map[int]string     // an InfiniBand port's fault cause, by port index (RaiseIBPortFault)
	version int                // rises with every change of causes
	inv     *sessionv1.Inventory
	invVer  int
	sentVer int // the version last sent (-1: none yet)
	sent    bool

	recovery Recovery
	stats    FaultStats
	bootID   string
	// booting is set while a reboot that hangs keeps the daemon away: it
	// comes back with a new boot id when ClearFaults ends it.
	booting bool

	// hung is closed while the daemon answers; a new, open channel while
	// it hangs.
	hung chan struct{}
	// up is closed while the daemon may hold a session; an open channel
	// while it is away.
	up chan struct{}
	// endSession ends the current session (a disconnect or reboot).
	endSession context.CancelFunc
	// downTimer brings the daemon back after a timed outage.
	downTimer *time.Timer
	catalog   *xid.Catalog

	// removed are the GPUs (by index) that fell off the bus: the inventory
	// does not list them (RemoveGPU).
	removed map[int]bool
	// boards are the GPUs (by index) whose board was swapped for another
	// (SwapGPU): the inventory lists that board's UUID and serial there.
	boards map[int]board
	// driver and cuda replace every GPU's versions in the inventory when
	// set (SetVersions).
	driver, cuda string
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// init fills the zero state; f.mu must be held.
func (f *faultState) initLocked() {
	if f.hung == nil {
		f.hung, f.up = closedChan(), closedChan()
		f.causes = map[int][]gpuCause{}
		f.stats.Boots = 1
		f.sentVer = -1
	}
}

func (d *FakeDaemon) faults() *faultState {
	d.flt.mu.Lock()
	d.flt.initLocked()
	d.flt.mu.Unlock()
	return &d.flt
}

// catalog returns the XID catalogue, loaded on first use.
func (f *faultState) catalogLocked() (*xid.Catalog, error) {
	if f.catalog == nil {
		c, err := xid.Load()
		if err != nil {
			return nil, err
		}
		f.catalog = c
	}
	return f.catalog, nil
}

// ErrNoSuchGPU reports a GPU index the simulated machine does not have.
var ErrNoSuchGPU = errors.New("no such simulated GPU")

func (d *FakeDaemon) gpuAt(i int) (*sessionv1.GPU, error) {
	if i < 0 || i >= len(d.inv.GetGpus()) {
		return nil, fmt.Errorf("fake daemon %s: GPU %d: %w (it has %d)", d.cfg.Name, i, ErrNoSuchGPU, len(d.inv.GetGpus()))
	}
	f := d.faults()
	f.mu.Lock()
	b, ok := f.boards[i]
	f.mu.Unlock()
	if !ok {
		return d.inv.GetGpus()[i], nil
	}
	g := proto.Clone(d.inv.GetGpus()[i]).(*sessionv1.GPU)
	g.Uuid, g.Serial = b.uuid, b.serial
	return g, nil
}

// gpuIndexLocked is the index of the GPU with UUID uuid (a swapped board's
// included), -1 when none. f.mu must be held.
func (d *FakeDaemon) gpuIndexLocked(uuid string) int {
	for i, b := range d.flt.boards {
		if b.uuid == uuid {
			return i
		}
	}
	return slices.IndexFunc(d.inv.GetGpus(), func(g *sessionv1.GPU) bool {
		_, swapped := d.flt.boards[int(g.GetIndex())]
		return !swapped && g.GetUuid() == uuid
	})
}

// RaiseXID makes GPU i (0-based) report XID code, as the driver would: the
// daemon sends a "gpu.xid" Event with NVIDIA's mnemonic and resolution from
// the catalogue, and, for an XID that affects health (xid.ImpactOf), the
// GPU reads degraded or failed in the inventory it sends next (at once
// when connected) until a gpu.reset or reboot clears it. Errors:
// ErrNoSuchGPU.
func (d *FakeDaemon) RaiseXID(i int, code uint32) error {
	g, err := d.gpuAt(i)
	if err != nil {
		return err
	}
	f := d.faults()
	f.mu.Lock()
	cat, err := f.catalogLocked()
	if err != nil {
		f.mu.Unlock()
		return fmt.Errorf("fake daemon %s: %w", d.cfg.Name, err)
	}
	e := cat.Classify(code)
	now := time.Now()
	if xid.ImpactOf(e.Resolution) != xid.ImpactNone {
		f.addLocked(i, gpuCause{reason: fmt.Sprintf("XID %d %s: %s", code, e.Mnemonic, e.Resolution), resolution: e.Resolution,
			xid: code, mnemonic: e.Mnemonic, at: now})
	}
	f.mu.Unlock()
	msg := fmt.Sprintf("XID %d on GPU %d (%s): XID %d %s: %s", code, i, g.GetUuid(), code, e.Mnemonic, e.Resolution)
	ev := &sessionv1.Event{Kind: gpufinding.KindXID, Time: timestamppb.New(now), Severity: xidSeverity(e.Resolution), GpuUuid: g.GetUuid(),
		Xid: code, XidMnemonic: e.Mnemonic, Resolution: e.Resolution, Message: msg,
		Attributes: map[string]string{"source": "sim"},
		GpuFinding: simFinding(g, &sessionv1.GPUFinding{
			Signal:              &sessionv1.GPUFinding_Xid{Xid: &sessionv1.XIDSignal{Code: code, Mnemonic: e.Mnemonic}},
			ImmediateResolution: e.Immediate, InvestigatoryResolution: e.Investigatory, Resolution: e.Resolution,
			Health: xidHealthState(e.Resolution), ObservedAt: timestamppb.New(now)}, msg)}
	d.report(ev)
	return nil
}

// RaiseECC makes GPU i report count uncorrectable ECC errors (a double-bit
// ECC event): a "gpu.ecc.uncorrected" Event, and the GPU failed with
// resolution RESET_GPU until a reset or reboot. Errors: ErrNoSuchGPU.
func (d *FakeDaemon) RaiseECC(i int, count uint64) error {
	g, err := d.gpuAt(i)
	if err != nil {
		return err
	}
	count = max(count, 1)
	f := d.faults()
	f.mu.Lock()
	f.addLocked(i, gpuCause{reason: fmt.Sprintf("uncorrectable ECC errors: %d since driver load or reset", count),
		resolution: xid.ResetGPU, at: time.Now(), uncorrectedECC: count})
	f.mu.Unlock()
	now := timestamppb.Now()
	msg := fmt.Sprintf("uncorrectable ECC error on GPU %d (%s)", i, g.GetUuid())
	d.report(&sessionv1.Event{Kind: gpufinding.KindECCUncorrected, Time: now, Severity: sessionv1.Severity_SEVERITY_CRITICAL,
		GpuUuid: g.GetUuid(), Resolution: xid.ResetGPU, Message: msg, Attributes: map[string]string{"source": "sim"},
		GpuFinding: simFinding(g, &sessionv1.GPUFinding{
			Signal:              &sessionv1.GPUFinding_Ecc{Ecc: &sessionv1.ECCSignal{Uncorrectable: true, Count: count}},
			ImmediateResolution: xid.ResetGPU, Resolution: xid.ResetGPU, Health: sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED,
			ObservedAt: now}, msg)})
	return nil
}

// simFinding completes f with g's identity and the simulator's evidence.
func simFinding(g *sessionv1.GPU, f *sessionv1.GPUFinding, msg string) *sessionv1.GPUFinding {
	f.GpuUuid, f.BoardSerial, f.PciBusId = g.GetUuid(), g.GetSerial(), g.GetPciBusId()
	f.Evidence = &sessionv1.GPUFindingEvidence{Source: "sim", Message: msg}
	return f
}

// xidHealthState is the health an XID of resolution r implies (xid.ImpactOf).
func xidHealthState(r string) sessionv1.GPUHealthState {
	switch xid.ImpactOf(r) {
	case xid.ImpactFailed:
		return sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED
	case xid.ImpactDegraded:
		return sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED
	}
	return sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK
}

// LoseGPU makes GPU i fall off the bus: NVML answers ERROR_GPU_IS_LOST
// (the GPU reads failed, resolution RESTART_BM) and the driver logs XID 79,
// which the daemon reports. Only a reboot clears it (a gpu.reset of a lost
// GPU fails). Errors: ErrNoSuchGPU.
func (d *FakeDaemon) LoseGPU(i int) error {
	if _, err := d.gpuAt(i); err != nil {
		return err
	}
	f := d.faults()
	f.mu.Lock()
	f.addLocked(i, gpuCause{reason: "GPU is lost: NVML returned ERROR_GPU_IS_LOST", resolution: xid.RestartBM, at: time.Now()})
	f.mu.Unlock()
	return d.RaiseXID(i, 79)
}

// lost reports whether GPU i is lost. f.mu must be held.
func (f *faultState) lostLocked(i int) bool {
	return slices.ContainsFunc(f.causes[i], func(c gpuCause) bool { return c.resolution == xid.RestartBM && c.xid == 0 })
}

func (f *faultState) addLocked(i int, c gpuCause) {
	f.causes[i] = append(f.causes[i], c)
	f.version++
}

// Hang makes the daemon stop answering: its session stays open, but it
// sends no heartbeats and answers no commands, until ClearFaults.
func (d *FakeDaemon) Hang() {
	f := d.faults()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.stats.Hung {
		f.stats.Hung = true
		f.hung = make(chan struct{})
	}
}

// Disconnect drops the daemon's session and keeps it away for dur (0:
// until ClearFaults), as a machine that lost its network or power does.
func (d *FakeDaemon) Disconnect(dur time.Duration) {
	f := d.faults()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.takeDownLocked(dur, false)
}

// takeDownLocked ends the session and keeps the daemon away for dur (0:
// until ClearFaults); reboot also gives it a new boot id and clears its
// GPUs' faults when it comes back. f.mu must be held.
func (f *faultState) takeDownLocked(dur time.Duration, reboot bool) {
	if !f.stats.Down {
		f.stats.Down = true
		f.up = make(chan struct{})
	}
	if f.endSession != nil {
		f.endSession()
	}
	if f.downTimer != nil {
		f.downTimer.Stop()
		f.downTimer = nil
	}
	if reboot && dur == 0 {
		f.booting = true
	}
	if dur > 0 {
		f.downTimer = time.AfterFunc(dur, func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			if reboot || f.booting {
				f.booting = false
				f.rebootedLocked()
			}
			f.bringUpLocked()
		})
	}
}

// rebootedLocked is the machine's new boot: a new boot id, no GPU faults,
// no hang. f.mu must be held.
func (f *faultState) rebootedLocked() {
	var b [16]byte
	_, _ = rand.Read(b[:])
	f.bootID = uuid(b[:])
	f.stats.Boots++
	if len(f.causes) > 0 || len(f.removed) > 0 {
		f.causes, f.removed = map[int][]gpuCause{}, nil
		f.version++
	}
	if f.stats.Hung {
		f.stats.Hung = false
		close(f.hung)
	}
}

func (f *faultState) bringUpLocked() {
	if f.stats.Down {
		f.stats.Down = false
		close(f.up)
	}
}

// ClearFaults ends every injected fault: the GPUs read healthy (the next
// inventory says so), a hung daemon answers again and one kept away
// reconnects: after a reboot that hung, with a new boot id, as the power
// cycle that ends such a hang brings it back. The Recovery settings stay.
func (d *FakeDaemon) ClearFaults() {
	f := d.faults()
	f.mu.Lock()
	if len(f.causes) > 0 || len(f.removed) > 0 || f.driver != "" || f.cuda != "" {
		f.causes, f.removed, f.driver, f.cuda = map[int][]gpuCause{}, nil, "", ""
		f.version++
	}
	if len(f.ib) > 0 {
		f.ib = nil
		f.version++
	}
	if f.stats.Hung {
		f.stats.Hung = false
		close(f.hung)
	}
	if f.downTimer != nil {
		f.downTimer.Stop()
		f.downTimer = nil
	}
	if f.booting {
		f.booting = false
		f.rebootedLocked()
	}
	f.bringUpLocked()
	f.mu.Unlock()
	d.sendInventoryIfDue()
}

// SetRecovery sets how the daemon recovers from gpu.reset and reboot.
func (d *FakeDaemon) SetRecovery(r Recovery) {
	f := d.faults()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recovery = r
}

// FaultStats returns the daemon's fault counters.
func (d *FakeDaemon) FaultStats() FaultStats {
	f := d.faults()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

// xidSeverity grades an XID event as bcd does.
func xidSeverity(r string) sessionv1.Severity {
	switch {
	case r == xid.Ignore:
		return sessionv1.Severity_SEVERITY_INFO
	case xid.ImpactOf(r) == xid.ImpactFailed:
		return sessionv1.Severity_SEVERITY_CRITICAL
	}
	return sessionv1.Severity_SEVERITY_WARNING
}

// report sends ev and the inventory when it changed; without a session
// both wait (the event is dropped, as bcd drops past MaxPendingEvents; the
// inventory goes after the next Welcome).
func (d *FakeDaemon) report(ev *sessionv1.Event) {
	if err := d.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Event{Event: ev}}); err != nil {
		d.log.Debug("Simulated GPU event not sent", "kind", ev.GetKind(), logkey.Err, err)
	}
	d.sendInventoryIfDue()
}

// CurrentInventory is the simulated inventory with the GPUs' injected
// health, its digest over it.
func (d *FakeDaemon) CurrentInventory() *sessionv1.Inventory {
	f := d.faults()
	f.mu.Lock()
	defer f.mu.Unlock()
	return d.inventoryLocked()
}

func (d *FakeDaemon) inventoryLocked() *sessionv1.Inventory {
	f := &d.flt
	if f.version == 0 {
		return d.inv
	}
	if f.inv != nil && f.invVer == f.version {
		return f.inv
	}
	inv := proto.Clone(d.inv).(*sessionv1.Inventory)
	inv.Digest = ""
	for i, causes := range f.causes {
		if len(causes) == 0 {
			continue
		}
		g := inv.GetGpus()[i]
		h := &sessionv1.GPUHealth{State: sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK}
		var latest time.Time
		for _, c := range causes {
			state := sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED
			if xid.ImpactOf(c.resolution) == xid.ImpactFailed {
				state = sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED
			}
			if c.health != sessionv1.GPUHealthState_GPU_HEALTH_STATE_UNSPECIFIED {
				state = c.health
			}
			h.State = max(h.State, state)
			h.Reasons = append(h.Reasons, c.reason)
			if xid.Rank(c.resolution) > xid.Rank(h.Resolution) {
				h.Resolution = c.resolution
			}
			if c.xid != 0 && !c.at.Before(latest) {
				latest, h.Xid, h.XidMnemonic = c.at, c.xid, c.mnemonic
			}
			g.EccVolatileUncorrected += c.uncorrectedECC
			g.EccAggregateUncorrected += c.uncorrectedECC
		}
		g.Health = h
	}
	for i, b := range f.boards {
		g := inv.GetGpus()[i]
		g.Uuid, g.Serial = b.uuid, b.serial
	}
	for _, g := range inv.GetGpus() {
		g.DriverVersion = cmp.Or(f.driver, g.GetDriverVersion())
		g.CudaDriverVersion = cmp.Or(f.cuda, g.GetCudaDriverVersion())
	}
	if len(f.removed) > 0 {
		inv.Gpus = slices.DeleteFunc(inv.Gpus, func(g *sessionv1.GPU) bool { return f.removed[int(g.GetIndex())] })
		for i, g := range inv.Gpus {
			g.Index = uint32(i) // NVML enumerates the others from 0
		}
	}
	for i, cause := range f.ib {
		ibPortFault(inv.GetIbPorts()[i], cause)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(inv)
	if err != nil {
		panic(fmt.Sprintf("sim: marshal inventory: %v", err)) // only plain fields: cannot fail
	}
	sum := sha256.Sum256(b)
	inv.Digest = hex.EncodeToString(sum[:])
	f.inv, f.invVer = inv, f.version
	return inv
}

// inventoryDigest is the digest of the current inventory (Hello,
// heartbeats).
func (d *FakeDaemon) inventoryDigest() string { return d.CurrentInventory().GetDigest() }

// sendInventoryIfDue sends the current inventory when this session has not
// had it yet, or it changed since it was sent.
func (d *FakeDaemon) sendInventoryIfDue() {
	if d.cfg.NoInventory {
		return
	}
	f := d.faults()
	f.mu.Lock()
	inv, ver := d.inventoryLocked(), f.version
	due := ver != f.sentVer
	f.mu.Unlock()
	if !due {
		return
	}
	if err := d.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Inventory{Inventory: inv}}); err != nil {
		return
	}
	f.mu.Lock()
	if f.sentVer < ver {
		f.sentVer = ver
	}
	f.mu.Unlock()
}

// currentBootID is the boot id the daemon reports: a new one after each
// simulated reboot.
func (d *FakeDaemon) currentBootID() string {
	f := d.faults()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bootID != "" {
		return f.bootID
	}
	return d.bootID
}

// heartbeatIn is the session's Heartbeat hook: while the daemon hangs it
// blocks, so that no heartbeat goes out, until the hang ends or ctx (the
// session's) does.
func (d *FakeDaemon) heartbeatIn(ctx context.Context) func(*sessionv1.Heartbeat) {
	return func(hb *sessionv1.Heartbeat) {
		f := d.faults()
		f.mu.Lock()
		hung := f.hung
		f.mu.Unlock()
		select {
		case <-hung:
		case <-ctx.Done():
		}
		d.heartbeat(hb)
		hb.InventoryDigest = d.inventoryDigest()
	}
}

// hung reports whether the daemon hangs now (its commands go unanswered).
func (d *FakeDaemon) hung() bool { return d.FaultStats().Hung }

// runClients holds sessions on cfg until ctx ends: one, as session.Client.Run
// does, and after a simulated outage (Disconnect, a reboot) another once the
// outage is over, as a machine that comes back does. It returns what the
// last session's Run returned when that session ended on its own.
func (d *FakeDaemon) runClients(ctx context.Context, cfg session.Config) error {
	f := d.faults()
	for {
		f.mu.Lock()
		up := f.up
		f.mu.Unlock()
		select {
		case <-up:
		case <-ctx.Done():
			return nil
		}
		cfg.BootID = d.currentBootID()
		c, err := session.New(cfg)
		if err != nil {
			return fmt.Errorf("fake daemon %s: %w", d.cfg.Name, err)
		}
		sctx, cancel := context.WithCancel(ctx)
		f.mu.Lock()
		f.endSession = cancel
		down := f.stats.Down
		f.mu.Unlock()
		if down {
			cancel() // taken down between the wait and here
		}
		d.mu.Lock()
		d.cur = c
		d.mu.Unlock()
		err = c.Run(sctx)
		cancel()
		d.mu.Lock()
		d.cur = nil
		d.mu.Unlock()
		f.mu.Lock()
		f.endSession = nil
		taken := f.stats.Down
		f.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		if !taken {
			return err
		}
	}
}

// recoveryResult is the result of gpu.reset, reboot and drain on the
// simulated machine (the daemon's record of the command: redeliveries are
// answered with it).
func (d *FakeDaemon) recoveryResult(cmd *sessionv1.Command) *sessionv1.CommandResult {
	res := &sessionv1.CommandResult{CommandId: cmd.GetId(), State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED, FinishedAt: timestamppb.Now()}
	fail := func(msg string) *sessionv1.CommandResult {
		res.State, res.ExitCode, res.Error = sessionv1.CommandState_COMMAND_STATE_FAILED, -1, msg
		return res
	}
	f := d.faults()
	f.mu.Lock()
	defer f.mu.Unlock()
	switch cmd.GetKind() {
	case sessionv1.KindGPUReset:
		f.stats.Resets++
		uuid := cmd.GetGpuReset().GetGpuUuid()
		i := d.gpuIndexLocked(uuid)
		switch {
		case i < 0:
			return fail(fmt.Sprintf("gpu.reset: processes of %s: no such GPU on this node", uuid))
		case f.recovery.ResetFails || f.lostLocked(i):
			res.ExitCode = 3
			return fail("gpu.reset: nvidia-smi -r exited with status 3 (see the output)")
		}
		res.DetailJson, _ = json.Marshal(map[string]any{"gpuUuid": uuid, "killedPids": []int{}})
	case sessionv1.KindReboot:
		f.stats.Reboots++
		res.DetailJson, _ = json.Marshal(map[string]string{"boot_id_before": cmp.Or(f.bootID, d.bootID)})
	case sessionv1.KindDrain:
		f.stats.Drains++
		res.DetailJson = []byte(`{"waitedFor":[]}`)
	case sessionv1.KindGPUDiag:
		// The built-in NVML check, as bcd runs it where there is no dcgmi.
		f.stats.Diags++
		gpus := d.inv.GetGpus()
		r := gpudiag.Result{Tool: gpudiag.ToolNVML, Tests: 3 * len(gpus)}
		for i, g := range gpus {
			if f.recovery.DiagFails || f.lostLocked(i) {
				r.Add(gpudiag.Failure{Test: "ecc-uncorrected", GPU: g.GetUuid(), Message: "uncorrectable ECC errors since the GPU was reset"})
			}
		}
		res.DetailJson, _ = json.Marshal(r)
		if !r.Passed() {
			return fail("gpu.diag: the NVML check " + r.Summary())
		}
	}
	return res
}

// recovers carries out a gpu.reset or reboot the daemon accepted with
// result res, and reports whether it did (the caller sends nothing more):
// a reset answers after Recovery.ResetDelay and then clears the GPU's
// faults; a reboot drops the session for Recovery.RebootDelay and comes
// back with a new boot id, the gateway's redelivery answered from the
// record.
func (d *FakeDaemon) recovers(cmd *sessionv1.Command, res *sessionv1.CommandResult, send func(*sessionv1.CommandUpdate) error) bool {
	kind := cmd.GetKind()
	if kind != sessionv1.KindGPUReset && kind != sessionv1.KindReboot || res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
		return false
	}
	for i, u := range []*sessionv1.CommandUpdate{
		{Update: &sessionv1.CommandUpdate_Accepted{Accepted: &sessionv1.Accepted{AcceptedAt: timestamppb.Now()}}},
		{Update: &sessionv1.CommandUpdate_Running{Running: &sessionv1.Running{StartedAt: timestamppb.Now()}}},
	} {
		u.CommandId, u.UpdateSeq = cmd.GetId(), uint64(i+1)
		_ = send(u)
	}
	f := d.faults()
	f.mu.Lock()
	defer f.mu.Unlock()
	if kind == sessionv1.KindReboot {
		delay := f.recovery.RebootDelay
		if delay <= 0 {
			delay = DefaultRestartDelay
		}
		if f.recovery.RebootHangs {
			delay = 0
		}
		f.takeDownLocked(delay, true)
		return true
	}
	uuid := cmd.GetGpuReset().GetGpuUuid()
	i := d.gpuIndexLocked(uuid)
	time.AfterFunc(f.recovery.ResetDelay, func() {
		f.mu.Lock()
		if len(f.causes[i]) > 0 {
			delete(f.causes, i)
			f.version++
		}
		f.mu.Unlock()
		d.sendInventoryIfDue()
		res.FinishedAt = timestamppb.Now()
		_ = send(&sessionv1.CommandUpdate{CommandId: cmd.GetId(), UpdateSeq: 3, Update: &sessionv1.CommandUpdate_Result{Result: res}})
	})
	return true
}
