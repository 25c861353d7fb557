package kmsg_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/kmsg"
)

// Lines as drivers of several generations write them (from NVIDIA's XID
// documentation and field reports), as /dev/kmsg hands them out.
var realLines = []struct {
	record string
	want   kmsg.Xid
	since  time.Duration
}{
	{"3,1412,5729011203,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1903, name=python3, GPU has fallen off the bus.",
		kmsg.Xid{Domain: 0, Bus: 0x3b, Code: 79, PID: 1903, Name: "python3", Text: "GPU has fallen off the bus."}, 5729011203 * time.Microsecond},
	{"4,880,120000000,-;NVRM: Xid (PCI:0000:b1:00): 31, pid=27463, name=pt_main_thread, Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1c_d8000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ\n SUBSYSTEM=pci\n DEVICE=+pci:0000:b1:00.0",
		kmsg.Xid{Bus: 0xb1, Code: 31, PID: 27463, Name: "pt_main_thread", Text: "Ch 00000008, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f1c_d8000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"}, 120 * time.Second},
	{"4,77,9000,-;NVRM: Xid (PCI:0000:07:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1): Out Of Range Address",
		kmsg.Xid{Bus: 0x07, Code: 13, Text: "Graphics SM Warp Exception on (GPC 0, TPC 1): Out Of Range Address"}, 9 * time.Millisecond},
	{"3,90,1,-,caller=T12;NVRM: Xid (PCI:0001:c7:00): 94, pid='<unknown>', name=<unknown>, Contained: CE User Channel (0x2). RST: No, D-RST: No",
		kmsg.Xid{Domain: 1, Bus: 0xc7, Code: 94, Name: "<unknown>", Text: "Contained: CE User Channel (0x2). RST: No, D-RST: No"}, time.Microsecond},
	{"4,5,60,-;NVRM: Xid (0000:17:00): 48, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
		kmsg.Xid{Bus: 0x17, Code: 48, Text: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0."}, 60 * time.Microsecond},
}

func TestParseRealLines(t *testing.T) {
	t.Parallel()
	for _, l := range realLines {
		r, err := kmsg.ParseRecord(l.record)
		if err != nil {
			t.Fatalf("%q: %v", l.record, err)
		}
		if r.SinceBoot != l.since {
			t.Errorf("%q: since boot %v, want %v", l.record, r.SinceBoot, l.since)
		}
		x, ok := kmsg.ParseXid(r.Message)
		if !ok || x != l.want {
			t.Errorf("%q:\n got %+v %v\nwant %+v", l.record, x, ok, l.want)
		}
		if !kmsg.IsXidRecord(l.record) {
			t.Errorf("IsXidRecord(%q) = false", l.record)
		}
	}
	x, _ := kmsg.ParseXid(realLines[0].want.Text + " NVRM: Xid (PCI:0000:3b:00): 79, x")
	if got, want := x.PCIKey(), kmsg.NVMLBusKey("00000000:3B:00.0"); got != want || got != "00000000:3B:00" {
		t.Errorf("PCIKey %q, NVMLBusKey %q", got, want)
	}
	if kmsg.NVMLBusKey("nonsense") != "" {
		t.Error("NVMLBusKey of nonsense is not empty")
	}
}

func TestParseRefusesOthers(t *testing.T) {
	t.Parallel()
	for _, rec := range []string{
		"6,1,2,-;usb 1-1: new high-speed USB device",
		"6,1,2,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
		"3,1,2,-;NVRM: Xid (PCI:0000:3b:00): , pid=1",
		"3,1,2,-;NVRM: Xid (PCI:0000:3b): 79, x",
		"3,1,2,-;NVRM: Xid (PCI:0000:3b:00:00): 79",
		"3,1,2,-;NVRM: Xid (PCI:zz:3b:00): 79",
		"3,1,2,-;NVRM: Xid (PCI:0000:3b:00 79",
		"3,1,2,-;NVRM: Xid (PCI:0000:3b:00): 99999999999",
		"no header",
		"3,1;short",
		"x,1,2,-;NVRM: Xid (PCI:0000:3b:00): 79",
	} {
		if kmsg.IsXidRecord(rec) {
			t.Errorf("IsXidRecord(%q) = true", rec)
		}
	}
}

// Follow reads what is there (the look-back), then what is added.
func TestFollowFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "kmsg")
	if err := os.WriteFile(path, []byte(realLines[0].record+"\n6,2,3,-;other\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 8)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- kmsg.Follow(ctx, path, func(r string) { got <- r }) }()
	next := func() string {
		select {
		case r := <-got:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("no record")
			return ""
		}
	}
	if r := next(); r != realLines[0].record {
		t.Errorf("first record %q", r)
	}
	if r := next(); r != "6,2,3,-;other" {
		t.Errorf("second record %q", r)
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(realLines[2].record[:10])
	_, _ = f.WriteString(realLines[2].record[10:] + "\n")
	f.Close()
	if r := next(); r != realLines[2].record {
		t.Errorf("appended record %q", r)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Follow = %v", err)
	}
	if err := kmsg.Follow(t.Context(), filepath.Join(t.TempDir(), "none"), func(string) {}); err == nil {
		t.Error("Follow of a missing file succeeded")
	}
}

// FuzzParseKmsgXid feeds arbitrary records to the parser: it never panics,
// and what it accepts is consistent (the PCI key reads back the same, the
// text has no newline, and the line names its code).
//
//	go test -run '^$' -fuzz FuzzParseKmsgXid -fuzztime 30s ./bcd/inventory/gpu/kmsg
func FuzzParseKmsgXid(f *testing.F) {
	for _, l := range realLines {
		f.Add(l.record)
	}
	f.Add("3,1,2,-;NVRM: Xid (PCI:ffffffff:ff:ff): 4294967295, pid=-1, name=, ")
	f.Fuzz(func(t *testing.T, rec string) {
		r, err := kmsg.ParseRecord(rec)
		if err != nil {
			if kmsg.IsXidRecord(rec) {
				t.Fatalf("IsXidRecord accepts a record ParseRecord refuses: %q", rec)
			}
			return
		}
		if strings.Contains(r.Message, "\n") || r.SinceBoot < 0 {
			t.Fatalf("record %+v", r)
		}
		x, ok := kmsg.ParseXid(r.Message)
		if !ok {
			return
		}
		if key := x.PCIKey(); kmsg.NVMLBusKey(key+".0") != key {
			t.Fatalf("PCI key %q does not read back", key)
		}
		if x.PID < 0 || strings.Contains(x.Text, "\n") {
			t.Fatalf("xid %+v", x)
		}
	})
}
