package kmsg

import (
	"fmt"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// mlx5 error severities, as ParseMlx5 names them.
const (
	// Mlx5Fatal is a line saying the device's firmware or hardware failed:
	// the driver's health poller found a fatal error, the device entered
	// its error state or its health counter stopped ("health compromised").
	Mlx5Fatal = "fatal"
	// Mlx5Error is a health report or a firmware command that failed with
	// a syndrome.
	Mlx5Error = "error"
)

// Mlx5 is one error the mlx5_core driver (NVIDIA/Mellanox ConnectX, the
// InfiniBand and RoCE adapters of GPU systems) logged for a device, in the
// forms of drivers/net/ethernet/mellanox/mlx5/core (health.c, cmd.c), each
// prefixed by dev_err with the driver's name and the device's PCI address,
// for example
//
//	mlx5_core 0000:3b:00.0: poll_health:802:(pid 0): Fatal error 1 detected
//	mlx5_core 0000:3b:00.0: mlx5_health_check_fatal_sensors:... device's health compromised - reached miss count
//	mlx5_core 0000:3b:00.0: mlx5_enter_error_state:...: start
//	mlx5_core 0000:3b:00.0: print_health_info:...: Health issue observed, firmware internal error, severity(3) ERROR:
//	mlx5_core 0000:3b:00.0: print_health_info:...: synd 0x1: firmware internal error
//	mlx5_core 0000:3b:00.0: mlx5_cmd_out_err:...: CREATE_MKEY(0x200) op_mod(0x0) failed, status bad parameter(0x3), syndrome (0x1e6f63), err(-22)
//
// A line of the driver that says none of these (link up, firmware
// version, ...) is not an Mlx5.
type Mlx5 struct {
	// Address is the device's PCI address as the line writes it, lower
	// case with its function, for example "0000:3b:00.0": each port of a
	// dual-port adapter is a function (and an RDMA device) of its own.
	Address string
	// Severity is Mlx5Fatal or Mlx5Error.
	Severity string
	// Text is the line after the address.
	Text string
}

// mlx5 lines that report a fatal error (lower case), and those that report
// an error.
var (
	mlx5FatalWords = []string{"fatal error", "health compromised", "enter_error_state", "internal error state",
		"system error event triggered", "pci channel state is permanent failure"}
	mlx5ErrorWords = []string{"health issue observed", "health buffer", "syndrome", "synd 0x", "health recovery"}
)

// ParseMlx5 reads an mlx5_core error from a kernel log message (a Record's
// Message); ok is false when the message is not an mlx5_core line of a
// device with a PCI address ("DDDD:BB:DD.F") saying one of the errors
// above.
func ParseMlx5(msg string) (m Mlx5, ok bool) {
	rest, found := strings.CutPrefix(msg, "mlx5_core ")
	if !found {
		return Mlx5{}, false
	}
	addr, text, found := strings.Cut(rest, ": ")
	if !found {
		return Mlx5{}, false
	}
	dev, fn, found := strings.Cut(addr, ".")
	if !found || len(fn) != 1 || fn[0] < '0' || fn[0] > '7' {
		return Mlx5{}, false
	}
	d, b, s, pciOK := parsePCI(dev)
	if !pciOK {
		return Mlx5{}, false
	}
	low := strings.ToLower(text)
	switch {
	case containsAny(low, mlx5FatalWords):
		m.Severity = Mlx5Fatal
	case containsAny(low, mlx5ErrorWords):
		m.Severity = Mlx5Error
	default:
		return Mlx5{}, false
	}
	m.Address = fmt.Sprintf("%04x:%02x:%02x.%s", d, b, s, fn)
	m.Text = text
	return m, true
}

func containsAny(s string, words []string) bool {
	for _, w := range words {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// BootTime is now minus the time since boot on CLOCK_MONOTONIC, the clock
// the kernel stamps its log with (a Record's SinceBoot is measured from
// it); now when that clock cannot be read.
func BootTime(now time.Time) time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return now
	}
	return now.Add(-time.Duration(ts.Nano()))
}
