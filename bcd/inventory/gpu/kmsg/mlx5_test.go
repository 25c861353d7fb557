package kmsg_test

import (
	"strings"
	"testing"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/kmsg"
)

// mlx5Lines are mlx5_core errors as drivers/net/ethernet/mellanox/mlx5/core
// writes them (health.c's poller and print_health_info, cmd.c's failed
// commands), across kernels 5.x and 6.x.
var mlx5Lines = []struct {
	record, address, severity string
}{
	{"3,901,7123456,-;mlx5_core 0000:3b:00.0: poll_health:802:(pid 0): Fatal error 1 detected", "0000:3b:00.0", kmsg.Mlx5Fatal},
	{"3,902,7123457,-;mlx5_core 0000:3b:00.1: mlx5_health_check_fatal_sensors:770:(pid 0): device's health compromised - reached miss count",
		"0000:3b:00.1", kmsg.Mlx5Fatal},
	{"3,903,7123458,-;mlx5_core 0000:B7:00.0: mlx5_enter_error_state:250:(pid 1234): start", "0000:b7:00.0", kmsg.Mlx5Fatal},
	{"3,904,7123459,-;mlx5_core 0000:86:00.0: print_health_info:437:(pid 0): Health issue observed, firmware internal error, severity(3) ERROR:",
		"0000:86:00.0", kmsg.Mlx5Error},
	{"3,905,7123460,-;mlx5_core 0000:86:00.0: print_health_info:424:(pid 0): synd 0x1: firmware internal error", "0000:86:00.0", kmsg.Mlx5Error},
	{"3,906,7123461,-;mlx5_core 0000:0c:00.0: mlx5_cmd_out_err:838:(pid 3120): CREATE_MKEY(0x200) op_mod(0x0) failed, status bad parameter(0x3), syndrome (0x1e6f63), err(-22)",
		"0000:0c:00.0", kmsg.Mlx5Error},
}

func TestInfiniBandMlx5Lines(t *testing.T) {
	for _, l := range mlx5Lines {
		r, err := kmsg.ParseRecord(l.record)
		if err != nil {
			t.Fatal(err)
		}
		m, ok := kmsg.ParseMlx5(r.Message)
		if !ok || m.Address != l.address || m.Severity != l.severity || m.Text == "" {
			t.Errorf("ParseMlx5(%q) = %+v, %v; want %s %s", r.Message, m, ok, l.address, l.severity)
		}
		if !kmsg.IsHealthRecord(l.record) {
			t.Errorf("IsHealthRecord(%q) = false: the helper would not pass it on", l.record)
		}
	}
	for _, msg := range []string{
		"mlx5_core 0000:3b:00.0: mlx5e_update_carrier:2345:(pid 77): Link up",
		"mlx5_core 0000:3b:00.0: firmware version: 28.39.1002",
		"mlx5_core 0000:3b:00: Fatal error 1 detected",     // no function
		"mlx5_core 0000:3b:00.9: Fatal error 1 detected",   // no such function
		"mlx5_core zzzz:3b:00.0: Fatal error 1 detected",   // not an address
		"mlx5_ib 0000:3b:00.0: Fatal error 1 detected",     // another driver
		"nvidia 0000:3b:00.0: syndrome (0x1) of something", // another driver
		"mlx5_core 0000:3b:00.0 Fatal error 1 detected",    // no ": "
	} {
		if m, ok := kmsg.ParseMlx5(msg); ok {
			t.Errorf("ParseMlx5(%q) = %+v, want not an mlx5 error", msg, m)
		}
	}
	if kmsg.IsHealthRecord("6,2,3,-;mlx5_core 0000:3b:00.0: mlx5e_update_carrier:2345:(pid 77): Link up") {
		t.Error("IsHealthRecord passes an mlx5_core line that is no error")
	}
}

// FuzzParseMlx5 feeds arbitrary messages to the mlx5_core parser: it never
// panics, and what it accepts names a known severity and a lower-case PCI
// address with its function.
//
//	go test -run '^$' -fuzz FuzzParseMlx5 -fuzztime 30s ./bcd/inventory/gpu/kmsg
func FuzzParseMlx5(f *testing.F) {
	for _, l := range mlx5Lines {
		f.Add(l.record[strings.Index(l.record, ";")+1:])
	}
	f.Add("mlx5_core ffffffff:ff:ff.7: fatal error")
	f.Fuzz(func(t *testing.T, msg string) {
		m, ok := kmsg.ParseMlx5(msg)
		if !ok {
			return
		}
		if m.Severity != kmsg.Mlx5Fatal && m.Severity != kmsg.Mlx5Error {
			t.Fatalf("severity %q", m.Severity)
		}
		if strings.ToLower(m.Address) != m.Address || len(m.Address) < len("0:0:0.0") || m.Address[len(m.Address)-2] != '.' {
			t.Fatalf("address %q", m.Address)
		}
		if again, ok := kmsg.ParseMlx5("mlx5_core " + m.Address + ": " + m.Text); !ok || again != m {
			t.Fatalf("%+v does not read back: %+v, %v", m, again, ok)
		}
	})
}
