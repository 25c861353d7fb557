package kmsg

import "strings"

// AER severities, as ParseAER names them.
const (
	AERCorrected = "corrected"
	AERNonFatal  = "non-fatal"
	AERFatal     = "fatal"
)

// AER is one PCIe Advanced Error Reporting error the kernel logged for a
// device (drivers/pci/pcie/aer.c, aer_print_error), for example
//
//	nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)
//	nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, id=3b00(Requester ID)
//	nvidia 0000:3b:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Non-Fatal), type=Transaction Layer, (Requester ID)
//
// (kernels before 4.17 leave out "AER: "; 6.x kernels write
// "Correctable"/"Uncorrectable" for "Corrected"/"Uncorrected").
type AER struct {
	// Domain, Bus and Device are the PCI address of the device the line
	// is about (the word before the first ": "), as in [Xid].
	Domain uint32
	Bus    uint8
	Device uint8
	// Severity is AERCorrected, AERNonFatal or AERFatal.
	Severity string
	// Type is the layer the kernel names, for example "Physical Layer";
	// empty when the line names none.
	Type string
}

// PCIKey is the device's address as [Xid.PCIKey] writes it.
func (a AER) PCIKey() string { return Xid{Domain: a.Domain, Bus: a.Bus, Device: a.Device}.PCIKey() }

const aerMarker = "PCIe Bus Error: severity="

// ParseAER reads an AER error from a kernel log message (a Record's
// Message); ok is false when the message is not a "PCIe Bus Error" line
// of a device with a PCI address and a severity it knows.
func ParseAER(msg string) (a AER, ok bool) {
	i := strings.Index(msg, aerMarker)
	if i < 0 {
		return AER{}, false
	}
	// "<driver> DDDD:BB:DD.F: ..." : the address ends at the first ": ".
	head, _, found := strings.Cut(msg[:i], ": ")
	if !found {
		return AER{}, false
	}
	sp := strings.LastIndexByte(head, ' ')
	addr, _, _ := strings.Cut(head[sp+1:], ".")
	if a.Domain, a.Bus, a.Device, ok = parsePCI(addr); !ok {
		return AER{}, false
	}
	rest := msg[i+len(aerMarker):]
	sev, rest, _ := strings.Cut(rest, ",")
	switch strings.TrimSpace(sev) {
	case "Corrected", "Correctable":
		a.Severity = AERCorrected
	case "Uncorrected (Non-Fatal)", "Uncorrectable (Non-Fatal)":
		a.Severity = AERNonFatal
	case "Uncorrected (Fatal)", "Uncorrectable (Fatal)":
		a.Severity = AERFatal
	default:
		return AER{}, false
	}
	if t, ok := strings.CutPrefix(strings.TrimSpace(rest), "type="); ok {
		a.Type, _, _ = strings.Cut(t, ",")
		a.Type = strings.TrimSpace(a.Type)
	}
	return a, true
}

// IsHealthRecord reports whether a raw /dev/kmsg record carries a line a
// health reader of bcd reads: an NVRM Xid line, a PCIe AER error or an
// mlx5_core error (ParseMlx5; the InfiniBand reader's) (the root helper's
// filter: it passes on nothing else).
func IsHealthRecord(s string) bool {
	r, err := ParseRecord(s)
	if err != nil {
		return false
	}
	if _, ok := ParseXid(r.Message); ok {
		return true
	}
	if _, ok := ParseAER(r.Message); ok {
		return true
	}
	_, ok := ParseMlx5(r.Message)
	return ok
}
