package gpu

import (
	"time"

	"github.com/better-compute/better-compute/proto/gpufinding"
)

// Report is the result of one [Collector.Collect]: every GPU NVML enumerates,
// in NVML index order.
type Report struct {
	// GPUs lists the GPUs by NVML index. Empty when Status says why.
	GPUs []GPU `json:"gpus,omitempty"`
	// Status explains an empty GPUs list in one lower-case line, for
	// example "nvml library not found (no NVIDIA driver installed)". It is
	// empty whenever at least one GPU was found.
	Status string `json:"status,omitempty"`
	// NVML reports that the NVML library loaded and the driver answered
	// (nvmlInit succeeded), whether or not it found GPUs; false when Status
	// says there is no driver.
	NVML bool `json:"nvml"`
	// FabricManager is the nvidia-fabricmanager unit's state, read only
	// when a GPU has an NVLink fabric (GPU.Fabric, NVSwitch systems); nil
	// otherwise or when systemd could not be asked.
	FabricManager *FabricManager `json:"fabric_manager,omitempty"`
}

// FabricManager is the nvidia-fabricmanager systemd unit as `systemctl
// show` reports it (docs/gpu-health.md, "Fabric manager").
type FabricManager struct {
	// ActiveState is systemd's ActiveState: "active", "reloading",
	// "inactive", "failed", "activating" or "deactivating".
	ActiveState string `json:"active_state"`
	// SubState is the unit type's own state, for example "running",
	// "dead", "failed", "auto-restart".
	SubState string `json:"sub_state,omitempty"`
	// LoadState is "loaded", or "not-found" when the unit is not installed.
	LoadState string `json:"load_state,omitempty"`
	// Restarts is systemd's NRestarts: automatic restarts since the unit
	// was last started by hand (systemd 235 and later; 0 before).
	Restarts uint64 `json:"restarts"`
	// ActiveEnterMonotonic is ActiveEnterTimestampMonotonic: when the unit
	// last became active, in microseconds since boot; 0 when never.
	ActiveEnterMonotonic uint64 `json:"active_enter_monotonic,omitempty"`
}

// Up reports whether the unit is running: ActiveState "active" or
// "reloading".
func (f *FabricManager) Up() bool {
	return f.ActiveState == "active" || f.ActiveState == "reloading"
}

// GPU is the inventory and health of one physical GPU.
//
// A field whose NVML query returned ERROR_NOT_SUPPORTED (or
// ERROR_FUNCTION_NOT_FOUND on an older driver) is left at its zero value: an
// empty string, 0, or a nil pointer where 0 is itself a valid reading. Queries
// that failed for any other reason are listed in Errors.
type GPU struct {
	// Index is the NVML device index (0-based, the order nvidia-smi uses).
	Index int `json:"index"`
	// Name is the product name, for example "NVIDIA A100-SXM4-40GB".
	Name string `json:"name,omitempty"`
	// UUID is the GPU's NVML UUID ("GPU-" followed by a UUID); it is the
	// stable identity of the board across reboots and index changes.
	UUID string `json:"uuid,omitempty"`
	// Serial is the board serial number printed on the board.
	Serial string `json:"serial,omitempty"`
	// PCIBusID is the PCI address in NVML's form,
	// domain:bus:device.function, for example "00000000:07:00.0".
	PCIBusID string `json:"pci_bus_id,omitempty"`
	// MemoryTotalBytes is the frame-buffer size in bytes.
	MemoryTotalBytes uint64 `json:"memory_total_bytes,omitempty"`
	// MemoryUsedBytes is the frame-buffer memory in use, in bytes. Volatile.
	MemoryUsedBytes uint64 `json:"memory_used_bytes,omitempty"`
	// DriverVersion is the kernel driver version, for example "550.54.15".
	DriverVersion string `json:"driver_version,omitempty"`
	// CUDADriverVersion is the newest CUDA version the driver supports, as
	// "major.minor", for example "12.4".
	CUDADriverVersion string `json:"cuda_driver_version,omitempty"`
	// TemperatureC is the GPU core temperature in degrees Celsius. Volatile.
	TemperatureC uint32 `json:"temperature_c,omitempty"`
	// PowerDrawMilliwatts is the current board power draw in milliwatts.
	// Volatile.
	PowerDrawMilliwatts uint32 `json:"power_draw_mw,omitempty"`
	// PowerLimitMilliwatts is the enforced power limit in milliwatts.
	PowerLimitMilliwatts uint32 `json:"power_limit_mw,omitempty"`
	// ECC holds the ECC error counters; nil when the GPU reports none.
	ECC *ECC `json:"ecc,omitempty"`
	// RetiredPages is dynamic page retirement (pre-Ampere GPUs); nil when
	// not supported.
	RetiredPages *RetiredPages `json:"retired_pages,omitempty"`
	// RemappedRows is row remapping (Ampere and later); nil when not
	// supported.
	RemappedRows *RemappedRows `json:"remapped_rows,omitempty"`
	// MIG is the Multi-Instance GPU state; nil when the GPU has no MIG.
	MIG *MIG `json:"mig,omitempty"`
	// SMClockMHz is the current streaming-multiprocessor clock in MHz.
	// Volatile.
	SMClockMHz uint32 `json:"sm_clock_mhz,omitempty"`
	// MemoryClockMHz is the current memory clock in MHz. Volatile.
	MemoryClockMHz uint32 `json:"memory_clock_mhz,omitempty"`
	// NVLinkErrors are the GPU's NVLink error totals over all its links;
	// nil when the GPU has no NVLink or does not report them.
	NVLinkErrors *NVLinkErrors `json:"nvlink_errors,omitempty"`
	// ClocksEventReasons is NVML's bit mask of why the clocks are held
	// down now (nvmlClocksEventReason*: 8 hardware slowdown, 32 software
	// thermal, 64 hardware thermal, 128 power brake, ...); nil when not
	// reported.
	ClocksEventReasons *uint64 `json:"clocks_event_reasons,omitempty"`
	// PCIe is the GPU's PCIe link: its replay counter, generation and
	// width; nil when NVML reports none of them.
	PCIe *PCIe `json:"pcie,omitempty"`
	// Fabric is the GPU's NVLink fabric registration (NVSwitch systems,
	// nvmlDeviceGetGpuFabricInfo); nil where the GPU has no fabric.
	Fabric *Fabric `json:"fabric,omitempty"`
	// PersistenceMode is whether the driver's persistence mode is on
	// (nvmlDeviceGetPersistenceMode); nil when NVML does not report it.
	PersistenceMode *bool `json:"persistence_mode,omitempty"`
	// RecoveryAction is the recovery the driver asks for (NVML field
	// FI_DEV_GET_GPU_RECOVERY_ACTION, newer drivers only), named as NVML's
	// header does without its prefix: "GPU_RESET", "NODE_REBOOT",
	// "DRAIN_P2P", "DRAIN_AND_RESET", "RECOVER_IMEX_DOMAIN", "BUS_RESET",
	// "SYSTEM_REBOOT"; empty for none or when the driver does not say.
	RecoveryAction string `json:"recovery_action,omitempty"`
	// Health is the GPU's overall health; see the package documentation
	// for the rules.
	Health Health `json:"health"`
	// HealthReasons explains a Health other than HealthOK, one line per
	// finding, for example
	// "XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS: RESTART_BM".
	HealthReasons []string `json:"health_reasons,omitempty"`
	// Resolution is the strongest resolution any finding calls for, in
	// NVIDIA's words ("RESET_GPU", "RESTART_BM", ...) or "ESCALATE"
	// (package xid); empty when Health is HealthOK.
	Resolution string `json:"resolution,omitempty"`
	// XID is the most recent XID among the findings, 0 when none, and
	// XIDMnemonic its name in NVIDIA's catalogue.
	XID         uint32 `json:"xid,omitempty"`
	XIDMnemonic string `json:"xid_mnemonic,omitempty"`
	// Errors lists NVML queries that failed for a reason other than
	// "not supported", as "query: NVML error", for example
	// "serial: ERROR_NO_PERMISSION". The affected fields are left empty.
	Errors []string `json:"errors,omitempty"`
	// NewFindings are the health findings of this Collect's readings
	// (row remapping, recovery action, clocks, NVLink, ECC counts, retired
	// pages, a lost GPU, PCIe, the fabric, persistence mode) that the
	// previous Collect of this GPU did not have, as Events of SourceScan,
	// for bcd to send once. The fabric manager's unit is the node's: its
	// Event is among the first fabric GPU's, with no GPU named. XIDs and
	// ECC events are Watch's and never here. Empty without a UUID.
	NewFindings []Event `json:"-"`
}

// ECC holds a GPU's ECC error counts. Volatile counts are since the last
// driver load; aggregate counts are over the board's lifetime. A nil
// counter was not reported by the GPU.
type ECC struct {
	// VolatileCorrected is the count of corrected (single-bit) errors since
	// the driver was loaded.
	VolatileCorrected *uint64 `json:"volatile_corrected,omitempty"`
	// VolatileUncorrected is the count of uncorrected (double-bit) errors
	// since the driver was loaded.
	VolatileUncorrected *uint64 `json:"volatile_uncorrected,omitempty"`
	// AggregateCorrected is the lifetime count of corrected errors.
	AggregateCorrected *uint64 `json:"aggregate_corrected,omitempty"`
	// AggregateUncorrected is the lifetime count of uncorrected errors.
	AggregateUncorrected *uint64 `json:"aggregate_uncorrected,omitempty"`
}

// RetiredPages is a GPU's dynamic page retirement state (Kepler to Turing;
// Ampere and later remap rows instead, see [RemappedRows]).
type RetiredPages struct {
	// MultipleSingleBitECC is the number of pages retired because of
	// repeated single-bit ECC errors; nil when not reported.
	MultipleSingleBitECC *int `json:"multiple_single_bit_ecc,omitempty"`
	// DoubleBitECC is the number of pages retired because of a double-bit
	// ECC error; nil when not reported.
	DoubleBitECC *int `json:"double_bit_ecc,omitempty"`
	// Pending reports pages waiting to be retired at the next driver
	// reload or reboot; nil when not reported.
	Pending *bool `json:"pending,omitempty"`
}

// RemappedRows is a GPU's row-remapping state (Ampere and later).
type RemappedRows struct {
	// Corrected is the number of rows remapped because of correctable
	// errors.
	Corrected int `json:"corrected"`
	// Uncorrected is the number of rows remapped because of uncorrectable
	// errors.
	Uncorrected int `json:"uncorrected"`
	// Pending reports a remapping that takes effect at the next GPU reset.
	Pending bool `json:"pending"`
	// Failure reports that a remapping failed: the bank ran out of spare
	// rows and the GPU should be replaced.
	Failure bool `json:"failure"`
}

// NVLinkErrors are a GPU's NVLink error counters, summed over its links
// since the driver loaded (NVML's FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL
// fields). They only grow; health looks at how much they rose within
// Config.NVLinkWindow.
type NVLinkErrors struct {
	CRCFlit  uint64 `json:"crc_flit"`
	CRCData  uint64 `json:"crc_data"`
	Replay   uint64 `json:"replay"`
	Recovery uint64 `json:"recovery"`
}

// PCIe is a GPU's PCIe link as NVML reads it. A field NVML does not report
// is 0.
type PCIe struct {
	// Replays is NVML's PCIe replay counter (nvmlDeviceGetPcieReplayCounter):
	// link-level retransmissions since the driver loaded. It only grows;
	// health looks at its rise within Thresholds.PCIeReplayWindow.
	Replays uint64 `json:"replays"`
	// LinkGeneration and MaxLinkGeneration are the link's current PCIe
	// generation and the highest the GPU and its slot allow
	// (nvmlDeviceGetCurrPcieLinkGeneration, nvmlDeviceGetMaxPcieLinkGeneration).
	LinkGeneration    int `json:"link_generation,omitempty"`
	MaxLinkGeneration int `json:"max_link_generation,omitempty"`
	// LinkWidth and MaxLinkWidth are the link's current and highest width
	// in lanes (nvmlDeviceGetCurrPcieLinkWidth, nvmlDeviceGetMaxPcieLinkWidth).
	LinkWidth    int `json:"link_width,omitempty"`
	MaxLinkWidth int `json:"max_link_width,omitempty"`
}

// Fabric is a GPU's NVLink fabric state as NVML reports it
// (nvmlGpuFabricInfo_t): nvidia-fabricmanager registers each GPU of an
// NVSwitch system with the fabric; until it is done the GPU cannot talk
// to the others over NVLink.
type Fabric struct {
	// State is NVML's fabric state without its prefix: "NOT_STARTED",
	// "IN_PROGRESS" or "COMPLETED".
	State string `json:"state"`
	// Status is the registration's result (an NVML return name, for
	// example "SUCCESS"); meaningful once State is "COMPLETED".
	Status string `json:"status,omitempty"`
}

// MIG is a GPU's Multi-Instance GPU mode and the MIG devices carved from it.
type MIG struct {
	// Enabled reports whether MIG mode is currently on.
	Enabled bool `json:"enabled"`
	// PendingEnabled is the mode after the next GPU reset.
	PendingEnabled bool `json:"pending_enabled"`
	// Devices lists the MIG devices (GPU instance plus compute instance),
	// by MIG index. Empty when MIG is off or no instances exist.
	Devices []MIGDevice `json:"devices,omitempty"`
}

// MIGDevice is one MIG device of a GPU.
type MIGDevice struct {
	// Index is the MIG device index within its parent GPU.
	Index int `json:"index"`
	// UUID is the MIG device UUID ("MIG-..."), what CUDA_VISIBLE_DEVICES
	// takes.
	UUID string `json:"uuid,omitempty"`
	// Name is the profile name, for example
	// "NVIDIA A100-SXM4-40GB MIG 1g.5gb".
	Name string `json:"name,omitempty"`
	// GPUInstanceID is the GPU instance ID within the parent GPU.
	GPUInstanceID int `json:"gpu_instance_id"`
	// ComputeInstanceID is the compute instance ID within the GPU instance.
	ComputeInstanceID int `json:"compute_instance_id"`
	// MemoryTotalBytes is the memory assigned to this MIG device, in bytes.
	MemoryTotalBytes uint64 `json:"memory_total_bytes,omitempty"`
}

// Health is a GPU's overall health: [HealthOK], [HealthDegraded] or
// [HealthFailed].
type Health string

// The health values, in increasing order of severity.
const (
	// HealthOK means no finding: the GPU can take work.
	HealthOK Health = "ok"
	// HealthDegraded means the GPU works but needs attention (a reset, or a
	// look at the workload that raised an XID).
	HealthDegraded Health = "degraded"
	// HealthFailed means the GPU must not take work until it is reset or
	// replaced.
	HealthFailed Health = "failed"
)

func (h Health) rank() int {
	switch h {
	case HealthFailed:
		return 2
	case HealthDegraded:
		return 1
	default:
		return 0
	}
}

// Severity grades an [Event].
type Severity string

// The event severities.
const (
	// SeverityInfo is an event that does not change health (an XID NVIDIA
	// says to ignore).
	SeverityInfo Severity = "info"
	// SeverityWarning is an event that makes the GPU [HealthDegraded].
	SeverityWarning Severity = "warning"
	// SeverityCritical is an event that makes the GPU [HealthFailed].
	SeverityCritical Severity = "critical"
)

func severityOf(h Health) Severity {
	switch h {
	case HealthFailed:
		return SeverityCritical
	case HealthDegraded:
		return SeverityWarning
	default:
		return SeverityInfo
	}
}

// Event kinds (the wire names proto/gpufinding declares) reported by
// [Collector.Watch] and WatchKernelLog (an XID, a
// double-bit ECC event) and by [Collector.Collect] in GPU.NewFindings (a
// reading that became a health finding).
const (
	// EventKindXID is an XID error reported by the driver; Event.XID holds
	// its number.
	EventKindXID = gpufinding.KindXID
	// EventKindECCUncorrected is a double-bit (uncorrectable) ECC error
	// event, or (from Collect) a non-zero volatile uncorrected count in
	// Event.ECCCount; Event.XID is 0.
	EventKindECCUncorrected = gpufinding.KindECCUncorrected
	// EventKindECCCorrected is a rise of the corrected ECC count by
	// Config.CorrectedSpike or more since the previous Collect
	// (Event.ECCCount).
	EventKindECCCorrected = gpufinding.KindECCCorrected
	// EventKindRowRemap is a failed or pending row remapping
	// (Event.RemappedRows).
	EventKindRowRemap = gpufinding.KindRowRemap
	// EventKindRecoveryAction is a recovery action the driver asks for
	// (Event.RecoveryAction).
	EventKindRecoveryAction = gpufinding.KindRecoveryAction
	// EventKindClocks is a clock slowdown (Event.ClocksEventReasons,
	// Event.ClockReasons).
	EventKindClocks = gpufinding.KindClocks
	// EventKindNVLink is a rise of the NVLink error totals past
	// Config.NVLinkErrorThreshold within Config.NVLinkWindow
	// (Event.NVLinkErrors, Event.NVLinkWindow).
	EventKindNVLink = gpufinding.KindNVLink
	// EventKindRetiredPages is pages waiting to be retired.
	EventKindRetiredPages = gpufinding.KindRetiredPages
	// EventKindGPULost is a GPU NVML cannot open or reports lost
	// (Event.LostError).
	EventKindGPULost = gpufinding.KindGPULost
	// EventKindPCIe is a PCIe link finding: the replay counter rose past
	// Thresholds.PCIeReplayThreshold within Thresholds.PCIeReplayWindow
	// (Event.PCIeReplays, Event.PCIeWindow), a link below its maximum width
	// or generation (Event.PCIeLink), or an AER error in the kernel log
	// (Event.AERSeverity, Event.LogLine).
	EventKindPCIe = gpufinding.KindPCIe
	// EventKindFabric is a GPU whose NVLink fabric registration is not
	// complete past Thresholds.FabricGrace, or completed with an error
	// (Event.Fabric, Event.FabricFor).
	EventKindFabric = gpufinding.KindFabric
	// EventKindPersistence is a GPU whose persistence mode is off.
	EventKindPersistence = gpufinding.KindPersistence
	// EventKindFabricManager is the nvidia-fabricmanager unit down past
	// Thresholds.FabricGrace, or restarted Thresholds.FabricManagerFlapRestarts
	// times within Thresholds.FabricManagerWindow (Event.FabricManager,
	// Event.FabricManagerRestarts, Event.FabricManagerDownFor).
	EventKindFabricManager = gpufinding.KindFabricManager
)

// Event is one GPU error event seen by [Collector.Watch].
type Event struct {
	// Kind is [EventKindXID] or [EventKindECCUncorrected].
	Kind string `json:"kind"`
	// GPUUUID is the UUID of the GPU that raised the event; empty when NVML
	// did not say which GPU.
	GPUUUID string `json:"gpu_uuid,omitempty"`
	// XID is the XID number for [EventKindXID] events, 0 otherwise.
	XID uint64 `json:"xid,omitempty"`
	// XIDMnemonic is NVIDIA's name of XID from the catalogue (package xid);
	// empty for other kinds and for a code the catalogue does not list.
	XIDMnemonic string `json:"xid_mnemonic,omitempty"`
	// Resolution is what the event calls for: for an XID the catalogue's
	// resolution (package xid: NVIDIA's immediate resolution, or ESCALATE),
	// for an uncorrectable ECC event "RESET_GPU".
	Resolution string `json:"resolution,omitempty"`
	// Immediate and Investigatory are NVIDIA's immediate and investigatory
	// resolutions of an XID from the catalogue, as written (package xid:
	// Entry.Immediate, Entry.Investigatory); for another kind Immediate is
	// the resolution the health rules name and Investigatory is empty.
	Immediate     string `json:"immediate,omitempty"`
	Investigatory string `json:"investigatory,omitempty"`
	// Health is the health the event implies for its GPU while it holds.
	Health Health `json:"health,omitempty"`
	// Serial and PCIBusID identify the GPU beside its UUID, from the
	// latest Collect (Serial empty where NVML gives none); for a
	// kernel-log line of an unknown GPU PCIBusID is the line's address.
	Serial   string `json:"serial,omitempty"`
	PCIBusID string `json:"pci_bus_id,omitempty"`
	// LogLine is the kernel-log line of a [SourceKernelLog] event, as
	// logged; empty otherwise.
	LogLine string `json:"log_line,omitempty"`
	// ECCCount, RemappedRows, RecoveryAction, ClocksEventReasons,
	// ClockReasons, NVLinkErrors, NVLinkWindow and LostError are the
	// signal of a Collect finding, each for its kind above; zero
	// otherwise.
	ECCCount           uint64        `json:"ecc_count,omitempty"`
	RemappedRows       *RemappedRows `json:"remapped_rows,omitempty"`
	RecoveryAction     string        `json:"recovery_action,omitempty"`
	ClocksEventReasons uint64        `json:"clocks_event_reasons,omitempty"`
	ClockReasons       []string      `json:"clock_reasons,omitempty"`
	NVLinkErrors       uint64        `json:"nvlink_errors,omitempty"`
	NVLinkWindow       time.Duration `json:"nvlink_window,omitempty"`
	LostError          string        `json:"lost_error,omitempty"`
	// PCIeReplays, PCIeWindow, PCIeLink and AERSeverity are the signal of
	// an [EventKindPCIe] finding; zero otherwise.
	PCIeReplays uint64        `json:"pcie_replays,omitempty"`
	PCIeWindow  time.Duration `json:"pcie_window,omitempty"`
	PCIeLink    *PCIe         `json:"pcie_link,omitempty"`
	AERSeverity string        `json:"aer_severity,omitempty"`
	// Fabric and FabricFor are the signal of an [EventKindFabric] finding.
	Fabric    *Fabric       `json:"fabric_state,omitempty"`
	FabricFor time.Duration `json:"fabric_for,omitempty"`
	// FabricManager, FabricManagerRestarts (within FabricManagerWindow)
	// and FabricManagerDownFor are the signal of an
	// [EventKindFabricManager] finding.
	FabricManager         *FabricManager `json:"fabric_manager,omitempty"`
	FabricManagerRestarts uint64         `json:"fabric_manager_restarts,omitempty"`
	FabricManagerWindow   time.Duration  `json:"fabric_manager_window,omitempty"`
	FabricManagerDownFor  time.Duration  `json:"fabric_manager_down_for,omitempty"`
	// Counters are the readings behind a Collect finding, by name (for
	// example "remappedRowsUncorrectable"); nil otherwise.
	Counters map[string]uint64 `json:"counters,omitempty"`
	// Source is where bcd saw it: [SourceNVML] or [SourceKernelLog].
	Source string `json:"source,omitempty"`
	// PID and Process are the process the driver blamed, from a kernel-log
	// line that names one; 0 and "" otherwise.
	PID     int    `json:"pid,omitempty"`
	Process string `json:"process,omitempty"`
	// Severity grades the event; it matches the health the event implies.
	Severity Severity `json:"severity"`
	// Message is a one-line description, for example
	// "XID 79 on GPU 3 (GPU-5e0d...): GPU has fallen off the bus".
	Message string `json:"message"`
	// Time is when bcd received the event (from the injected clock), or
	// for a kernel-log line when the kernel logged it.
	Time time.Time `json:"time"`
}

// Where an [Event] was seen.
const (
	// SourceNVML is NVML's event API (Collector.Watch).
	SourceNVML = "nvml"
	// SourceKernelLog is an NVRM Xid line of the kernel log
	// (Collector.WatchKernelLog).
	SourceKernelLog = "kmsg"
	// SourceScan is a reading of the GPU's counters (Collector.Collect).
	SourceScan = "scan"
)
