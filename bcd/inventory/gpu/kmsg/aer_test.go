package kmsg_test

import (
	"strings"
	"testing"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/kmsg"
)

// aerLines are AER lines as kernels of several generations write them
// (drivers/pci/pcie/aer.c): 4.x without "AER: ", 5.x "Corrected", 6.x
// "Correctable".
var aerLines = []struct {
	record, key, severity, typ string
}{
	{"3,812,9123456,-;nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
		"00000000:3B:00", kmsg.AERCorrected, "Physical Layer"},
	{"3,813,9123457,-;nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, id=3b00(Requester ID)",
		"00000000:3B:00", kmsg.AERFatal, "Transaction Layer"},
	{"3,814,9123458,-;nvidia 0000:b7:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, (Requester ID)",
		"00000000:B7:00", kmsg.AERNonFatal, "Transaction Layer"},
	{"4,815,9123459,-;pcieport 0000:00:01.0: AER: PCIe Bus Error: severity=Correctable, type=Data Link Layer, (Transmitter ID)",
		"00000000:00:01", kmsg.AERCorrected, "Data Link Layer"},
}

func TestPCIeAERLines(t *testing.T) {
	for _, l := range aerLines {
		r, err := kmsg.ParseRecord(l.record)
		if err != nil {
			t.Fatal(err)
		}
		a, ok := kmsg.ParseAER(r.Message)
		if !ok || a.PCIKey() != l.key || a.Severity != l.severity || a.Type != l.typ {
			t.Errorf("ParseAER(%q) = %+v, %v; want %s %s %q", r.Message, a, ok, l.key, l.severity, l.typ)
		}
		if !kmsg.IsHealthRecord(l.record) {
			t.Errorf("IsHealthRecord(%q) = false", l.record)
		}
	}
	for _, msg := range []string{
		"pcieport 0000:00:01.0: AER: Corrected error message received from 0000:3b:00.0", // the port's summary line
		"nvidia 0000:3b:00.0: AER:   device [10de:20b0] error status/mask=00000001/0000a000",
		"nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Odd, type=Physical Layer",
		"PCIe Bus Error: severity=Corrected, type=Physical Layer",
		"nvidia zzzz:3b:00.0: PCIe Bus Error: severity=Corrected",
	} {
		if a, ok := kmsg.ParseAER(msg); ok {
			t.Errorf("ParseAER(%q) = %+v, want not an AER error", msg, a)
		}
	}
	if !kmsg.IsHealthRecord(realLines[0].record) || kmsg.IsHealthRecord("6,2,3,-;other") {
		t.Error("IsHealthRecord does not pass exactly the Xid, AER and mlx5 records")
	}
}

// FuzzParseAER feeds arbitrary messages to the AER parser: it never
// panics, and what it accepts names a known severity and an address that
// reads back.
//
//	go test -run '^$' -fuzz FuzzParseAER -fuzztime 30s ./bcd/inventory/gpu/kmsg
func FuzzParseAER(f *testing.F) {
	for _, l := range aerLines {
		f.Add(l.record[strings.Index(l.record, ";")+1:])
	}
	f.Add("x ffffffff:ff:ff.7: PCIe Bus Error: severity=Corrected,")
	f.Fuzz(func(t *testing.T, msg string) {
		a, ok := kmsg.ParseAER(msg)
		if !ok {
			return
		}
		switch a.Severity {
		case kmsg.AERCorrected, kmsg.AERNonFatal, kmsg.AERFatal:
		default:
			t.Fatalf("severity %q", a.Severity)
		}
		if key := a.PCIKey(); kmsg.NVMLBusKey(key+".0") != key {
			t.Fatalf("PCI key %q does not read back", key)
		}
	})
}
