// Package gpu reads NVIDIA GPU inventory and health through NVML
// (github.com/NVIDIA/go-nvml) and watches for XID and ECC error events.
//
// The NVML library is injected as an nvml.Interface: production passes
// nvml.New() (or leaves [Config].NVML nil), tests pass a go-nvml mock such as
// mock/dgxa100.New(). The package needs cgo because go-nvml does.
//
// # Collecting
//
// [Collector.Collect] returns a [Report]: one [GPU] per NVML index with
// name, UUID, serial, PCI bus id, memory (bytes), driver and CUDA driver
// version, temperature (°C), power draw and limit (mW), ECC counters,
// retired pages or remapped rows, MIG mode and devices, SM and memory
// clocks (MHz), and a [Health]. A query that NVML answers with
// ERROR_NOT_SUPPORTED leaves its field empty; other per-GPU failures are
// listed in GPU.Errors and never fail the collection.
//
// A host without an NVIDIA driver is normal: when nvmlInit returns
// ERROR_LIBRARY_NOT_FOUND or ERROR_DRIVER_NOT_LOADED, Collect returns no
// GPUs, a Report.Status saying why, and no error, and the Collector logs it
// once at info level.
//
// # Health
//
// Each GPU is [HealthOK], [HealthDegraded] or [HealthFailed]; the worst
// finding wins and every finding is listed in GPU.HealthReasons. Each
// finding also carries a resolution, and GPU.Resolution is the strongest
// of them (IGNORE < RESTART_APP < RESET_GPU < RESTART_VM < RESTART_BM < a
// word that needs a person, such as CONTACT_SUPPORT < ESCALATE); GPU.XID
// and GPU.XIDMnemonic name the most recent XID among the findings.
//
// XIDs, from NVML events ([Collector.Watch]) and the kernel log
// ([Collector.WatchKernelLog]), are classified by NVIDIA's XID catalogue,
// carried as data in package xid (source: NVIDIA's XID catalogue,
// https://docs.nvidia.com/deploy/xid-errors/). The resolution is NVIDIA's
// immediate resolution, or ESCALATE where the catalogue leaves it blank or
// names a WORKFLOW_* (the conservative default: quarantine and escalate to
// a person), and IGNORE for XID 154, which NVIDIA calls "Informational only
// regarding another Xid": the driver's recovery action it announces is read
// at the scan every XID starts and acts as its own finding. The health an
// XID implies follows from its resolution:
//
//	resolution                                     health while it holds
//	IGNORE                                         ok (event, severity info)
//	RESTART_APP                                    ok (event, severity warning)
//	RESET_GPU, RESTART_VM, RESTART_BM, ESCALATE    failed
//	any other word (CONTACT_SUPPORT, CHECK_*, ...) degraded
//
// An XID that changes health holds until the GPU is reset
// ([Collector.ResetDone], which bcd's gpu.reset calls when nvidia-smi
// succeeds) or the machine reboots (the kernel log starts again and bcd
// remembers nothing of the boot before): no state sticks forever.
//
// Readings, judged anew at every Collect, so that a finding ends when its
// cause does:
//
//	finding                                                health    resolution
//	NVML answers ERROR_GPU_IS_LOST, or no handle           failed    RESTART_BM
//	volatile uncorrected ECC count > 0                     failed    RESET_GPU
//	double-bit ECC event seen by Watch (until a reset)     failed    RESET_GPU
//	row remapping failure (out of spare rows)              failed    CONTACT_SUPPORT
//	row remapping pending (GPU reset required)             degraded  RESET_GPU
//	retired pages pending (reset or reboot required)       degraded  RESET_GPU
//	driver recovery action GPU_RESET, DRAIN_AND_RESET,
//	BUS_RESET                                              failed    RESET_GPU
//	driver recovery action NODE_REBOOT, SYSTEM_REBOOT      failed    RESTART_BM
//	driver recovery action DRAIN_P2P, RECOVER_IMEX_DOMAIN  degraded  ESCALATE
//	clocks held down by hardware slowdown, thermal
//	slowdown (hardware or software) or a power brake       degraded  CHECK_MECHANICALS
//	NVLink error totals rose by Config.NVLinkErrorThreshold
//	within Config.NVLinkWindow                             degraded  ESCALATE
//	volatile corrected ECC count rose by at least
//	Config.CorrectedECCSpike since the previous Collect    degraded  IGNORE
//	persistence mode off (unless
//	Thresholds.IgnorePersistenceMode)                      degraded  IGNORE
//	nvidia-fabricmanager down past Thresholds.FabricGrace
//	or flapping (GPUs on a fabric only; held for the
//	stabilisation window Thresholds.FabricManagerWindow)  degraded  ESCALATE
//
// Row remapping (Ampere and later) and page retirement (earlier GPUs) follow
// NVIDIA's "GPU Memory Error Management" guide
// (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/). The driver's
// recovery action is NVML's field FI_DEV_GET_GPU_RECOVERY_ACTION (drivers
// that do not know it leave it out). The corrected-ECC spike and NVLink
// thresholds are our heuristics, not NVIDIA rules; the NVLink counters are
// aggregate totals that never go down, so health looks at their rise within
// the window (a fall means the driver reloaded: the window starts again).
//
// # Events
//
// [Collector.Watch] registers an NVML event set for XID critical errors and
// double- and single-bit ECC errors (each where the GPU supports it) and
// waits on it with a timeout ([Config].EventWaitTimeout), so cancelling its
// context stops it within one timeout. Each XID or double-bit ECC event
// updates the GPU's health and is passed once to the caller's callback as
// an [Event]. [Collector.WatchKernelLog] reads the kernel's NVRM Xid lines
// (package kmsg) the same way, look-back included; an XID seen by both, or
// repeated, within Config.XIDDedupWindow on the same GPU is one Event.
//
// Collect initialises NVML and shuts it down on every call. NVML counts
// these references, so while Watch runs (for the life of the daemon) the
// driver stays initialised and Collect is cheap; without it, each Collect
// pays a full nvmlInit, which takes seconds on GPUs without persistence
// mode.
package gpu
