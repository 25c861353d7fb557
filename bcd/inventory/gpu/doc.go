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
// finding wins and every finding is listed in GPU.HealthReasons.
//
// XID errors, as reported by [Collector.Watch]. Source: NVIDIA's XID
// catalogue, https://docs.nvidia.com/deploy/xid-errors/ (descriptions and
// recommended actions); the failed/degraded split is ours, following the
// catalogue's "reset GPU / RMA" versus "application error" actions.
//
//	XID  description                                            health
//	 79  GPU has fallen off the bus                             failed
//	 48  double-bit ECC error                                   failed
//	 63  ECC page retirement or row remapping recording event   failed
//	 64  ECC page retirement or row remapper recording failure  failed
//	 74  NVLink error                                           failed
//	 92  high single-bit ECC error rate                         failed
//	 94  contained ECC error                                    failed
//	 95  uncontained ECC error                                  failed
//	 13  graphics engine exception                              degraded
//	 31  GPU memory page fault                                  degraded
//	 43  GPU stopped processing                                 degraded
//	any other XID                                               unchanged (event severity info)
//
// Failed XIDs hold for the life of the Collector (in practice until bcd
// restarts, normally with the reboot or reset that clears them); degraded
// XIDs expire [Config].DegradedXIDWindow after they were last seen.
//
// Counters and states read by Collect:
//
//	finding                                                         health
//	NVML answers ERROR_GPU_IS_LOST, or the handle cannot be opened  failed
//	volatile uncorrected ECC count > 0 (since driver load)          failed
//	double-bit ECC event seen by Watch                              failed
//	row remapping failure (out of spare rows)                       failed
//	row remapping pending (GPU reset required)                      degraded
//	retired pages pending (reset or reboot required)                degraded
//	volatile corrected ECC count rose by at least
//	Config.CorrectedECCSpike since the previous Collect             degraded
//
// Row remapping (Ampere and later) and page retirement (earlier GPUs) follow
// NVIDIA's "GPU Memory Error Management" guide
// (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/). The corrected
// ECC spike threshold is our heuristic, not an NVIDIA rule.
//
// # Events
//
// [Collector.Watch] registers an NVML event set for XID critical errors and
// double- and single-bit ECC errors (each where the GPU supports it) and
// waits on it with a timeout ([Config].EventWaitTimeout), so cancelling its
// context stops it within one timeout. Each XID or double-bit ECC event
// updates the GPU's health and is passed once to the caller's callback as
// an [Event].
//
// Collect initialises NVML and shuts it down on every call. NVML counts
// these references, so while Watch runs (for the life of the daemon) the
// driver stays initialised and Collect is cheap; without it, each Collect
// pays a full nvmlInit, which takes seconds on GPUs without persistence
// mode.
package gpu
