package gpu

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/inventory/gpu/kmsg"
	"github.com/better-compute/better-compute/bcd/inventory/gpu/xid"
)

// Log attribute keys used by this package.
const (
	attrStatus    = "status"
	attrIndex     = "gpu_index"
	attrUUID      = "gpu_uuid"
	attrXID       = "xid"
	attrGPUs      = "gpus"
	attrRetryIn   = "retry_in"
	attrEventType = "event_type"
)

// Config configures a [Collector]. The zero value is valid: it uses the
// system's NVML library.
type Config struct {
	// NVML is the NVML library. Defaults to nvml.New(), which loads
	// libnvidia-ml.so.1 at the first Init; tests pass a mock such as
	// go-nvml's mock/dgxa100.New().
	NVML nvml.Interface
	// Logger receives the collector's logs. Defaults to discarding them.
	Logger *slog.Logger
	// Now is the clock used to stamp events and age XIDs. Defaults to
	// time.Now.
	Now func() time.Time
	// EventWaitTimeout is how long one NVML event wait blocks in Watch, and
	// so the longest Watch takes to notice a cancelled context. Whole
	// milliseconds, from 1 ms to about 49 days. Defaults to 1 s.
	EventWaitTimeout time.Duration
	// EventRetryMax caps the backoff between failed event waits. Defaults
	// to 30 s.
	EventRetryMax time.Duration
	// CorrectedECCSpike is the rise in a GPU's volatile corrected ECC count
	// between two Collect calls at which the GPU is reported degraded.
	// Defaults to 100 errors.
	CorrectedECCSpike uint64
	// Catalog classifies XIDs. Defaults to NVIDIA's catalogue as bcd
	// embeds it (xid.Load).
	Catalog *xid.Catalog
	// XIDDedupWindow is how close in time two sightings of the same XID
	// code on the same GPU must be to count as one: NVML's event and the
	// kernel's log line of one error, or a burst of the same error, give
	// one Event. Defaults to 30 s.
	XIDDedupWindow time.Duration
	// NVLinkWindow is the window over which the NVLink error totals'
	// rise is judged. Defaults to 10 min.
	NVLinkWindow time.Duration
	// NVLinkErrorThreshold is the rise of a GPU's NVLink error totals
	// (CRC, replay and recovery errors over all links) within NVLinkWindow
	// at which the GPU is reported degraded. Our heuristic, not an NVIDIA
	// rule. Defaults to 100 errors.
	NVLinkErrorThreshold uint64
	// Thresholds are the limits the control plane may change later
	// (SetThresholds); zero fields keep DefaultThresholds.
	Thresholds Thresholds
	// BootTime is when the machine booted, to date kernel-log records
	// (stamped with the time since boot). Defaults to the clock minus
	// CLOCK_MONOTONIC, read when WatchKernelLog starts.
	BootTime func() time.Time
	// Runner runs systemctl to read the nvidia-fabricmanager unit, only
	// on a machine whose GPUs have an NVLink fabric. Defaults to os/exec
	// with a 5 s timeout per call; tests pass recorded outputs.
	Runner Runner
}

// Collector reads GPU inventory and health through NVML and watches for
// XID and ECC events. It is safe for concurrent use; Collect and Watch may
// run at the same time.
type Collector struct {
	nvml        nvml.Interface
	log         *slog.Logger
	now         func() time.Time
	waitTimeout time.Duration
	retryMax    time.Duration
	spike       uint64
	catalog     *xid.Catalog
	dedup       time.Duration
	nvWindow    time.Duration
	nvThreshold uint64
	bootTime    func() time.Time
	runner      Runner

	// unavailableLogged makes the "no NVML" info log appear once per
	// Collector, however often Collect and Watch are called.
	unavailableLogged atomic.Bool
	// fmUnreadLogged makes the "fabric manager unit not read" warning
	// appear once per Collector.
	fmUnreadLogged atomic.Bool

	mu     sync.Mutex
	th     Thresholds           // with defaults; SetThresholds
	states map[string]*gpuState // by GPU UUID
	byPCI  map[string]watched   // by kmsg.NVMLBusKey of the PCI bus id, from the last Collect
	byUUID map[string]watched   // by GPU UUID, from the last Collect
	fm     fabricManagerState   // the nvidia-fabricmanager unit
}

// New returns a Collector for cfg, with defaults filled in. It returns an
// error when a duration in cfg is out of range. It does not touch NVML.
func New(cfg Config) (*Collector, error) {
	if cfg.NVML == nil {
		cfg.NVML = nvml.New()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.EventWaitTimeout = cmp.Or(cfg.EventWaitTimeout, time.Second)
	cfg.EventRetryMax = cmp.Or(cfg.EventRetryMax, 30*time.Second)
	cfg.CorrectedECCSpike = cmp.Or(cfg.CorrectedECCSpike, 100)
	cfg.XIDDedupWindow = cmp.Or(cfg.XIDDedupWindow, 30*time.Second)
	cfg.NVLinkWindow = cmp.Or(cfg.NVLinkWindow, 10*time.Minute)
	cfg.NVLinkErrorThreshold = cmp.Or(cfg.NVLinkErrorThreshold, 100)
	if cfg.Catalog == nil {
		c, err := xid.Load()
		if err != nil {
			return nil, fmt.Errorf("gpu collector: %w", err)
		}
		cfg.Catalog = c
	}
	if cfg.Runner == nil {
		cfg.Runner = execRunner{timeout: 5 * time.Second}
	}
	if cfg.BootTime == nil {
		now := cfg.Now
		cfg.BootTime = func() time.Time { return kmsg.BootTime(now()) }
	}

	if cfg.EventWaitTimeout < time.Millisecond || cfg.EventWaitTimeout/time.Millisecond > math.MaxUint32 {
		return nil, fmt.Errorf("gpu collector: event wait timeout %v out of range [1ms, %dms]",
			cfg.EventWaitTimeout, uint32(math.MaxUint32))
	}
	if cfg.EventRetryMax < 0 {
		return nil, fmt.Errorf("gpu collector: negative event retry max %v", cfg.EventRetryMax)
	}
	if cfg.XIDDedupWindow < 0 || cfg.NVLinkWindow < 0 {
		return nil, fmt.Errorf("gpu collector: negative XID dedup window %v or NVLink window %v", cfg.XIDDedupWindow, cfg.NVLinkWindow)
	}
	return &Collector{
		nvml:        cfg.NVML,
		log:         cfg.Logger,
		now:         cfg.Now,
		waitTimeout: cfg.EventWaitTimeout,
		retryMax:    cfg.EventRetryMax,
		spike:       cfg.CorrectedECCSpike,
		catalog:     cfg.Catalog,
		dedup:       cfg.XIDDedupWindow,
		nvWindow:    cfg.NVLinkWindow,
		nvThreshold: cfg.NVLinkErrorThreshold,
		bootTime:    cfg.BootTime,
		runner:      cfg.Runner,
		th:          cfg.Thresholds.withDefaults(),
		states:      make(map[string]*gpuState),
		byPCI:       make(map[string]watched),
	}, nil
}

// Collect initialises NVML, reads every GPU and shuts NVML down again
// (NVML reference-counts Init, so a running Watch keeps its session).
//
// A host without NVIDIA driver (NVML's ERROR_LIBRARY_NOT_FOUND or
// ERROR_DRIVER_NOT_LOADED) is a normal state: Collect returns a Report with
// no GPUs, a Status saying why, and a nil error, and logs it once per
// Collector at info level. Per-GPU query failures never fail Collect; they
// leave fields empty and are listed in GPU.Errors (see [GPU]). Collect
// returns an error only when ctx is done, when Init fails for another
// reason, or when NVML cannot count the GPUs.
func (c *Collector) Collect(ctx context.Context) (Report, error) {
	if err := ctx.Err(); err != nil {
		return Report{}, fmt.Errorf("collect gpus: %w", err)
	}
	ret := c.nvml.Init()
	if status, ok := unavailable(ret); ok {
		c.noteUnavailable(ctx, status)
		return Report{Status: status}, nil
	}
	if ret != nvml.SUCCESS {
		return Report{}, fmt.Errorf("collect gpus: init nvml: %w", ret)
	}
	defer c.shutdown(ctx)

	n, ret := c.nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return Report{}, fmt.Errorf("collect gpus: count devices: %w", ret)
	}
	if n == 0 {
		return Report{Status: "NVML found no NVIDIA GPUs", NVML: true}, nil
	}

	var sys reader
	var driver, cuda string
	if v, ret := c.nvml.SystemGetDriverVersion(); sys.ok("driver version", ret) {
		driver = v
	}
	if v, ret := c.nvml.SystemGetCudaDriverVersion(); sys.ok("cuda driver version", ret) && v > 0 {
		cuda = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	}

	rep := Report{GPUs: make([]GPU, 0, n), NVML: true}
	byPCI := make(map[string]watched, n)
	byUUID := make(map[string]watched, n)
	// fm is the fabric manager's finding, judged once per Collect at the
	// first GPU with an NVLink fabric, and a cause of each such GPU's
	// health; it is sent once, as a node's finding naming no GPU, from the
	// first such GPU (the others hold it without its signal).
	var fm *finding
	fmRead := false
	for i := range n {
		if err := ctx.Err(); err != nil {
			return Report{}, fmt.Errorf("collect gpus: %w", err)
		}
		r := reader{errs: slices.Clone(sys.errs)}
		g := GPU{Index: i, DriverVersion: driver, CUDADriverVersion: cuda}
		var pre []finding
		dev, ret := c.nvml.DeviceGetHandleByIndex(i)
		if r.ok("device handle", ret) {
			readDevice(dev, &g, &r)
		} else if !r.lost {
			pre = append(pre, finding{health: HealthFailed, resolution: xid.RestartBM, reason: "NVML cannot open the GPU: " + ret.Error(),
				key: EventKindGPULost, signal: &Event{Kind: EventKindGPULost, LostError: ret.Error()}})
		}
		if r.lost {
			pre = append(pre, finding{health: HealthFailed, resolution: xid.RestartBM, reason: "GPU is lost: NVML returned ERROR_GPU_IS_LOST",
				key: EventKindGPULost, signal: &Event{Kind: EventKindGPULost, LostError: "ERROR_GPU_IS_LOST"}})
		}
		id := watched{index: i, uuid: g.UUID, serial: g.Serial, pci: g.PCIBusID}
		if key := kmsg.NVMLBusKey(g.PCIBusID); key != "" {
			byPCI[key] = id
		}
		if g.UUID != "" {
			byUUID[g.UUID] = id
		}
		g.Errors = r.errs
		if g.Fabric != nil && !fmRead {
			fmRead = true
			rep.FabricManager, fm = c.fabricManager(ctx)
		}
		if g.Fabric != nil && fm != nil {
			pre = append(pre, *fm)
			fm.signal = nil
		}

		c.mu.Lock()
		var st *gpuState
		if g.UUID != "" {
			st = c.stateLocked(g.UUID)
		}
		assess(&g, pre, st, assessParams{now: c.now(), correctedSpike: c.spike, nvlinkWindow: c.nvWindow, nvlinkThreshold: c.nvThreshold,
			th: c.th})
		c.mu.Unlock()

		for j := range g.NewFindings {
			if ev := &g.NewFindings[j]; ev.Kind == EventKindFabricManager {
				ev.GPUUUID, ev.Serial, ev.PCIBusID = "", "", ""
				ev.Message = strings.TrimPrefix(ev.Message, fmt.Sprintf("GPU %d (%s): ", g.Index, g.UUID))
			}
		}
		if g.Health != HealthOK {
			c.log.DebugContext(ctx, "GPU unhealthy", attrIndex, i, attrUUID, g.UUID, attrStatus, g.Health)
		}
		rep.GPUs = append(rep.GPUs, g)
	}
	c.mu.Lock()
	c.byPCI, c.byUUID = byPCI, byUUID
	c.mu.Unlock()
	return rep, nil
}

// readDevice fills g from dev; failures go to r.
func readDevice(dev nvml.Device, g *GPU, r *reader) {
	if v, ret := dev.GetName(); r.ok("name", ret) {
		g.Name = v
	}
	if v, ret := dev.GetUUID(); r.ok("uuid", ret) {
		g.UUID = v
	}
	if v, ret := dev.GetSerial(); r.ok("serial", ret) {
		g.Serial = v
	}
	if v, ret := dev.GetPciInfo(); r.ok("pci info", ret) {
		g.PCIBusID = cString(v.BusId[:])
	}
	if v, ret := dev.GetMemoryInfo(); r.ok("memory info", ret) {
		g.MemoryTotalBytes, g.MemoryUsedBytes = v.Total, v.Used
	}
	// GetTemperature is deprecated in the NVML 13 headers, but its successor
	// (GetTemperatureV) returns a concrete handler that cannot be mocked
	// through nvml.Device, and every shipping driver still exports it.
	if v, ret := dev.GetTemperature(nvml.TEMPERATURE_GPU); r.ok("temperature", ret) { //nolint:staticcheck // see above
		g.TemperatureC = v
	}
	if v, ret := dev.GetPowerUsage(); r.ok("power usage", ret) {
		g.PowerDrawMilliwatts = v
	}
	if v, ret := dev.GetEnforcedPowerLimit(); r.ok("power limit", ret) {
		g.PowerLimitMilliwatts = v
	}
	if v, ret := dev.GetClockInfo(nvml.CLOCK_SM); r.ok("sm clock", ret) {
		g.SMClockMHz = v
	}
	if v, ret := dev.GetClockInfo(nvml.CLOCK_MEM); r.ok("memory clock", ret) {
		g.MemoryClockMHz = v
	}
	g.ECC = readECC(dev, r)
	g.RetiredPages = readRetiredPages(dev, r)
	if corr, unc, pending, failure, ret := dev.GetRemappedRows(); r.ok("remapped rows", ret) {
		g.RemappedRows = &RemappedRows{Corrected: corr, Uncorrected: unc, Pending: pending, Failure: failure}
	}
	g.MIG = readMIG(dev, r)
	g.PCIe = readPCIe(dev, r)
	g.Fabric = readFabric(dev, r)
	if v, ret := dev.GetPersistenceMode(); r.ok("persistence mode", ret) {
		on := v == nvml.FEATURE_ENABLED
		g.PersistenceMode = &on
	}
	if v, ret := dev.GetCurrentClocksEventReasons(); r.ok("clocks event reasons", ret) {
		g.ClocksEventReasons = &v
	}
	readFields(dev, g, r)
}

// Fields read with one nvmlDeviceGetFieldValues call.
var fieldIDs = []uint32{nvml.FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, nvml.FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
	nvml.FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, nvml.FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}

// readFields reads the NVLink error totals and the driver's recovery
// action. A field the GPU or driver does not know is left out quietly.
func readFields(dev nvml.Device, g *GPU, r *reader) {
	vals := make([]nvml.FieldValue, len(fieldIDs))
	for i, id := range fieldIDs {
		vals[i].FieldId = id
	}
	if !r.ok("field values", dev.GetFieldValues(vals)) {
		return
	}
	var nl NVLinkErrors
	var haveNL bool
	for _, v := range vals {
		if nvml.Return(v.NvmlReturn) != nvml.SUCCESS {
			continue
		}
		n := fieldUint(v)
		switch v.FieldId {
		case nvml.FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL:
			nl.CRCFlit, haveNL = n, true
		case nvml.FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL:
			nl.CRCData, haveNL = n, true
		case nvml.FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL:
			nl.Replay, haveNL = n, true
		case nvml.FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL:
			nl.Recovery, haveNL = n, true
		case nvml.FI_DEV_GET_GPU_RECOVERY_ACTION:
			g.RecoveryAction = recoveryActionName(nvml.DeviceGpuRecoveryAction(n))
		}
	}
	if haveNL {
		g.NVLinkErrors = &nl
	}
}

// fieldUint reads a field value as an unsigned number (NVML stores it in a
// union whose type ValueType names; little-endian on every platform NVML
// ships for).
func fieldUint(v nvml.FieldValue) uint64 {
	b := v.Value
	switch nvml.ValueType(v.ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_INT, nvml.VALUE_TYPE_SIGNED_INT:
		return uint64(binary.LittleEndian.Uint32(b[:4]))
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.LittleEndian.Uint16(b[:2]))
	case nvml.VALUE_TYPE_DOUBLE:
		return uint64(math.Float64frombits(binary.LittleEndian.Uint64(b[:])))
	default:
		return binary.LittleEndian.Uint64(b[:])
	}
}

// fabricStates names NVML's GPU fabric states.
var fabricStates = map[uint8]string{nvml.GPU_FABRIC_STATE_NOT_STARTED: "NOT_STARTED",
	nvml.GPU_FABRIC_STATE_IN_PROGRESS: "IN_PROGRESS", nvml.GPU_FABRIC_STATE_COMPLETED: "COMPLETED"}

// readFabric reads the GPU's NVLink fabric registration; nil on a GPU
// without a fabric (NVML's state NOT_SUPPORTED, or the query not
// supported).
func readFabric(dev nvml.Device, r *reader) *Fabric {
	fi, ret := dev.GetGpuFabricInfo()
	if !r.ok("gpu fabric info", ret) {
		return nil
	}
	st, ok := fabricStates[fi.State]
	if !ok {
		return nil
	}
	return &Fabric{State: st, Status: nvml.Return(fi.Status).String()}
}

// readPCIe reads the PCIe replay counter and the link's generation and
// width; nil when NVML reports none of them.
func readPCIe(dev nvml.Device, r *reader) *PCIe {
	var p PCIe
	var any bool
	read := func(query string, get func() (int, nvml.Return), to *int) {
		if v, ret := get(); r.ok(query, ret) {
			*to, any = max(v, 0), true
		}
	}
	var replays int
	read("pcie replay counter", dev.GetPcieReplayCounter, &replays)
	p.Replays = uint64(replays)
	read("pcie link generation", dev.GetCurrPcieLinkGeneration, &p.LinkGeneration)
	read("pcie max link generation", dev.GetMaxPcieLinkGeneration, &p.MaxLinkGeneration)
	read("pcie link width", dev.GetCurrPcieLinkWidth, &p.LinkWidth)
	read("pcie max link width", dev.GetMaxPcieLinkWidth, &p.MaxLinkWidth)
	if !any {
		return nil
	}
	return &p
}

func readECC(dev nvml.Device, r *reader) *ECC {
	var e ECC
	counter := func(query string, typ nvml.MemoryErrorType, ctr nvml.EccCounterType) *uint64 {
		v, ret := dev.GetTotalEccErrors(typ, ctr)
		if !r.ok(query, ret) {
			return nil
		}
		return &v
	}
	e.VolatileCorrected = counter("ecc volatile corrected", nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)
	e.VolatileUncorrected = counter("ecc volatile uncorrected", nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	e.AggregateCorrected = counter("ecc aggregate corrected", nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.AGGREGATE_ECC)
	e.AggregateUncorrected = counter("ecc aggregate uncorrected", nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC)
	if e == (ECC{}) {
		return nil
	}
	return &e
}

func readRetiredPages(dev nvml.Device, r *reader) *RetiredPages {
	var rp RetiredPages
	if pages, ret := dev.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS); r.ok("retired pages sbe", ret) {
		n := len(pages)
		rp.MultipleSingleBitECC = &n
	}
	if pages, ret := dev.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR); r.ok("retired pages dbe", ret) {
		n := len(pages)
		rp.DoubleBitECC = &n
	}
	if st, ret := dev.GetRetiredPagesPendingStatus(); r.ok("retired pages pending", ret) {
		p := st == nvml.FEATURE_ENABLED
		rp.Pending = &p
	}
	if rp == (RetiredPages{}) {
		return nil
	}
	return &rp
}

func readMIG(dev nvml.Device, r *reader) *MIG {
	cur, pending, ret := dev.GetMigMode()
	if !r.ok("mig mode", ret) {
		return nil
	}
	m := &MIG{Enabled: cur == nvml.DEVICE_MIG_ENABLE, PendingEnabled: pending == nvml.DEVICE_MIG_ENABLE}
	if !m.Enabled {
		return m
	}
	n, ret := dev.GetMaxMigDeviceCount()
	if !r.ok("mig device count", ret) {
		return m
	}
	for i := range n {
		md, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // an empty slot
		}
		if !r.ok("mig device handle", ret) {
			continue
		}
		d := MIGDevice{Index: i}
		q := fmt.Sprintf("mig device %d ", i)
		if v, ret := md.GetUUID(); r.ok(q+"uuid", ret) {
			d.UUID = v
		}
		if v, ret := md.GetName(); r.ok(q+"name", ret) {
			d.Name = v
		}
		if v, ret := md.GetGpuInstanceId(); r.ok(q+"gpu instance id", ret) {
			d.GPUInstanceID = v
		}
		if v, ret := md.GetComputeInstanceId(); r.ok(q+"compute instance id", ret) {
			d.ComputeInstanceID = v
		}
		if v, ret := md.GetMemoryInfo(); r.ok(q+"memory info", ret) {
			d.MemoryTotalBytes = v.Total
		}
		m.Devices = append(m.Devices, d)
	}
	return m
}

// reader sorts NVML return codes: success, "not supported" (silently
// empty), a lost GPU (remembered once), and other failures (listed).
type reader struct {
	errs []string
	lost bool
}

// ok reports whether ret is SUCCESS and records anything else.
func (r *reader) ok(query string, ret nvml.Return) bool {
	switch ret {
	case nvml.SUCCESS:
		return true
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
	case nvml.ERROR_GPU_IS_LOST:
		r.lost = true
	default:
		r.errs = append(r.errs, query+": "+ret.Error())
	}
	return false
}

// unavailable reports whether ret from Init means "no NVIDIA driver here",
// and the Status line for it.
func unavailable(ret nvml.Return) (string, bool) {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "NVML library not found: no NVIDIA driver installed", true
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "NVIDIA kernel driver not loaded", true
	default:
		return "", false
	}
}

func (c *Collector) noteUnavailable(ctx context.Context, status string) {
	if c.unavailableLogged.CompareAndSwap(false, true) {
		c.log.InfoContext(ctx, "No GPU inventory", attrStatus, status)
	}
}

func (c *Collector) shutdown(ctx context.Context) {
	if ret := c.nvml.Shutdown(); ret != nvml.SUCCESS {
		c.log.WarnContext(ctx, "Shut down NVML", logkey.Err, error(ret))
	}
}

// fabricManager reads the nvidia-fabricmanager unit and judges it
// (fabricManagerState.judge). A read that fails judges the last reading
// again while it is younger than Thresholds.FabricManagerWindow (one
// failed systemctl call neither ends an episode nor sends its finding
// again); past that, or with no reading yet (no systemd, no systemctl), it
// is warned of once and judges nothing.
func (c *Collector) fabricManager(ctx context.Context) (*FabricManager, *finding) {
	fm, err := c.readFabricManager(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if err != nil {
		if c.fm.last != nil && now.Sub(c.fm.lastAt) < c.th.FabricManagerWindow {
			return c.fm.last, c.fm.judge(c.fm.last, now, c.th)
		}
		if c.fmUnreadLogged.CompareAndSwap(false, true) {
			c.log.WarnContext(ctx, "Fabric manager unit not read; its health is not judged", logkey.Err, err)
		}
		return nil, nil
	}
	c.fm.last, c.fm.lastAt = fm, now
	return fm, c.fm.judge(fm, now, c.th)
}

// stateLocked returns the remembered state for uuid, creating it. c.mu
// must be held.
func (c *Collector) stateLocked(uuid string) *gpuState {
	st, ok := c.states[uuid]
	if !ok {
		st = newState()
		c.states[uuid] = st
	}
	return st
}

// cString converts a NUL-terminated C char array to a string.
func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
