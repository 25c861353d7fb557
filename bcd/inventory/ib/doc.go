// Package ib reads the InfiniBand and RoCE ports of a host from sysfs and
// judges their health (issue 43; docs/gpu-health.md, "InfiniBand").
//
// # Reading
//
// [Read] lists /sys/class/infiniband/<device>/ports/<n>/ under a sysfs root
// (an fs.FS; bcd's is `bcd node --sysfs-root`, default /sys, so tests point
// it at a fixture tree): the logical `state` ("4: ACTIVE"), the physical
// `phys_state` ("5: LinkUp"), `rate` ("400 Gb/sec (4X NDR)"), `link_layer`
// ("InfiniBand" or "Ethernet" for RoCE), the counters
// `counters/{link_downed,link_error_recovery,symbol_error,port_rcv_errors,excessive_buffer_overrun_errors}`
// and the device's PCI address (PCI_SLOT_NAME in `device/uevent`). A host
// without /sys/class/infiniband has no ports, which is not an error. What
// is read is bounded: at most [MaxPorts] ports over all devices, at most
// [MaxFileSize] bytes of each file. A file that cannot be read or parsed
// leaves its field empty ([ParsePort] says why).
//
// # Health
//
// A [Monitor] keeps each port's history between scans, on an injected
// clock, and judges at every [Monitor.Collect] (the thresholds are the
// control plane's gpuHealth.ib*, [Thresholds]):
//
//	finding                                                      health    resolution         ends
//	down: a port that was up (ACTIVE and LinkUp) since bcd
//	started is down for Thresholds.DownGrace                     degraded  CHECK_MECHANICALS  at the first scan that reads it up
//	errors: symbol_error + link_error_recovery + port_rcv_errors
//	+ excessive_buffer_overrun_errors rose by ErrorThreshold
//	within ErrorWindow                                           degraded  CHECK_MECHANICALS  once the window passes without such a rise
//	flap: the link went down and came back (link_downed rose,
//	or a down port is up again within DownGrace): one finding
//	per episode                                                  degraded  CHECK_MECHANICALS  FlapWindow after the episode's last flap
//	mlx5: an mlx5_core fatal error line for the port's device    failed    ESCALATE           LogHold after the last such line
//	mlx5: an mlx5_core health or syndrome line                   degraded  ESCALATE           the same
//
// A port down when bcd starts, and never up since, is shown but not
// judged: bcd cannot tell an unused port from a broken one (a dual-port
// adapter with one cable). A scan that cannot read a port's states judges
// no flap or drop and keeps the port's history as it was. The counters only grow (some saturate: 8-bit
// link_downed, 16-bit symbol_error); a fall means the driver reloaded or
// someone cleared them, and the window starts again.
//
// Each finding is reported once when it appears ([Port.NewFindings]) and
// again only after it has ended; a flap episode that ends and a new flap
// later is a new finding. An mlx5 line is reported at once when read
// ([Monitor.KernelRecord]).
package ib
