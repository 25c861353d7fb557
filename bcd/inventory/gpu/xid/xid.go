// Package xid is NVIDIA's XID catalogue as data: for every XID error code
// the driver can raise, NVIDIA's mnemonic and its immediate and
// investigatory resolutions, and the one resolution bcd reports for it.
//
// # Source
//
// The table is xid-catalog.csv beside this file, embedded in the binary. It
// is NVIDIA's public XID catalogue (https://docs.nvidia.com/deploy/xid-errors/,
// the "Catalog" sheet, as published in 2025), carried as data: columns code,
// mnemonic, immediate_resolution, investigatory_resolution; lines starting
// with "#" are comments. To follow a newer catalogue, replace the file; the
// tests check that every row still parses and classifies.
//
// # Resolutions
//
// A code's Resolution is NVIDIA's immediate resolution word as the catalogue
// spells it ("IGNORE", "RESTART_APP", "RESET_GPU", "RESTART_BM",
// "RESTART_VM", "CONTACT_SUPPORT", "CHECK_MECHANICALS", ...), with one
// exception: where the catalogue leaves it blank or names a WORKFLOW_* (a
// multi-step workflow whose text is not in the data and is not guessed),
// the Resolution is [Escalate], the conservative default: quarantine the
// node and escalate to a person. A code the catalogue does not list at all
// is classified the same way ([Catalog.Classify]).
//
// XID 154 (GPU_RECOVERY_ACTION_CHANGED) is the other exception: the
// catalogue's immediate resolution for it is "XID_154", a pointer to
// itself rather than an action, and its investigatory column reads "N/A
// Informational only regarding another Xid", so its Resolution is [Ignore]:
// it never acts by itself. What it announces, the driver's new
// recovery action, is read from NVML (FI_DEV_GET_GPU_RECOVERY_ACTION) and
// acted on as that reading's own finding.
package xid

import (
	"bytes"
	_ "embed"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
)

//go:embed xid-catalog.csv
var catalogCSV []byte

// Resolution words bcd reports. All but Escalate are NVIDIA's own words from
// the catalogue; a code may carry other words of NVIDIA's too
// ("CHECK_MECHANICALS", "UPDATE_SWFW", ...), passed on as the catalogue
// spells them.
const (
	// Ignore: nothing to do (NVIDIA's IGNORE).
	Ignore = "IGNORE"
	// RestartApp: the application that hit the error should be restarted;
	// the GPU is fine (NVIDIA's RESTART_APP).
	RestartApp = "RESTART_APP"
	// ResetGPU: the GPU must be reset before it takes work again (NVIDIA's
	// RESET_GPU).
	ResetGPU = "RESET_GPU"
	// RestartVM: the virtual machine must be restarted (NVIDIA's
	// RESTART_VM).
	RestartVM = "RESTART_VM"
	// RestartBM: the bare-metal machine must be rebooted (NVIDIA's
	// RESTART_BM).
	RestartBM = "RESTART_BM"
	// ContactSupport: NVIDIA support must look at it (NVIDIA's
	// CONTACT_SUPPORT).
	ContactSupport = "CONTACT_SUPPORT"
	// Escalate is ours, not NVIDIA's: the conservative default for a code
	// whose immediate resolution is blank or a WORKFLOW_*, or that the
	// catalogue does not list. Quarantine the node and escalate to a
	// person.
	Escalate = "ESCALATE"
)

// Entry is one XID code of the catalogue.
type Entry struct {
	// Code is the XID number, for example 79.
	Code uint32
	// Mnemonic is NVIDIA's name of the code, for example
	// "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"; empty for a code the
	// catalogue does not list.
	Mnemonic string
	// Immediate is the immediate_resolution column as written (may be
	// empty or a WORKFLOW_*).
	Immediate string
	// Investigatory is the investigatory_resolution column as written
	// (free text in places, for example "IGNORE (sympathetic)").
	Investigatory string
	// Resolution is what bcd reports: Immediate, or Escalate where
	// Immediate is blank or a WORKFLOW_* (see the package documentation).
	Resolution string
}

// Catalog is the parsed XID table. Its methods are safe for concurrent use
// (it is never changed after Parse).
type Catalog struct {
	byCode map[uint32]Entry
}

// ErrBadCatalog is wrapped by every Parse error.
var ErrBadCatalog = errors.New("bad XID catalogue")

// Load parses the catalogue embedded in bcd (xid-catalog.csv). It fails only
// when that file is malformed, which the package's tests rule out.
func Load() (*Catalog, error) { return Parse(bytes.NewReader(catalogCSV)) }

// header is the first non-comment line the file must have.
var header = []string{"code", "mnemonic", "immediate_resolution", "investigatory_resolution"}

// Parse reads a catalogue in xid-catalog.csv's format: comment lines
// starting with "#", the header line code,mnemonic,immediate_resolution,
// investigatory_resolution, then one row per code (CRLF or LF line ends).
// Errors wrap ErrBadCatalog and name the line: a wrong header, a row
// without exactly four fields, a code that is not a number from 0 to
// 2^32-1, a repeated code, an empty mnemonic, or a resolution word that is
// not upper-case letters, digits and underscores.
func Parse(r io.Reader) (*Catalog, error) {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	cr.FieldsPerRecord = -1
	c := &Catalog{byCode: map[uint32]Entry{}}
	for n := 0; ; n++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		line, _ := cr.FieldPos(0)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadCatalog, err)
		}
		if len(rec) != 4 {
			return nil, fmt.Errorf("%w: line %d: %d fields, want 4", ErrBadCatalog, line, len(rec))
		}
		for i := range rec {
			rec[i] = strings.TrimSpace(rec[i])
		}
		if n == 0 {
			if !slices.Equal(rec, header) {
				return nil, fmt.Errorf("%w: line %d: header %q, want %q", ErrBadCatalog, line, rec, header)
			}
			continue
		}
		code, err := strconv.ParseUint(rec[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: code %q is not a number", ErrBadCatalog, line, rec[0])
		}
		if _, dup := c.byCode[uint32(code)]; dup {
			return nil, fmt.Errorf("%w: line %d: code %d listed twice", ErrBadCatalog, line, code)
		}
		if rec[1] == "" {
			return nil, fmt.Errorf("%w: line %d: code %d has no mnemonic", ErrBadCatalog, line, code)
		}
		if !word(rec[2]) {
			return nil, fmt.Errorf("%w: line %d: code %d: immediate resolution %q is not one word", ErrBadCatalog, line, code, rec[2])
		}
		c.byCode[uint32(code)] = Entry{Code: uint32(code), Mnemonic: rec[1], Immediate: rec[2], Investigatory: rec[3],
			Resolution: resolveCode(uint32(code), rec[2])}
	}
	if len(c.byCode) == 0 {
		return nil, fmt.Errorf("%w: no codes", ErrBadCatalog)
	}
	return c, nil
}

// word reports whether s is empty or one upper-case word (A-Z, 0-9, _).
func word(s string) bool {
	for _, r := range s {
		if (r < 'A' || r > 'Z') && (r < '0' || r > '9') && r != '_' {
			return false
		}
	}
	return true
}

// Resolve maps an immediate resolution as the catalogue writes it to the one
// bcd reports: blank or WORKFLOW_* gives Escalate, anything else itself.
func Resolve(immediate string) string {
	immediate = strings.TrimSpace(immediate)
	if immediate == "" || strings.HasPrefix(immediate, "WORKFLOW_") {
		return Escalate
	}
	return immediate
}

// RecoveryActionChanged is XID 154, GPU_RECOVERY_ACTION_CHANGED: NVIDIA's
// catalogue calls it "Informational only regarding another Xid"; the
// driver's recovery action it announces is read from NVML.
const RecoveryActionChanged uint32 = 154

// resolveCode is Resolve for code: XID 154 is informational (Ignore)
// whatever its immediate column says (see the package documentation).
func resolveCode(code uint32, immediate string) string {
	if code == RecoveryActionChanged {
		return Ignore
	}
	return Resolve(immediate)
}

// Lookup returns the catalogue's entry for code and whether it lists it.
func (c *Catalog) Lookup(code uint32) (Entry, bool) {
	e, ok := c.byCode[code]
	return e, ok
}

// Classify returns code's entry, or for a code the catalogue does not list
// an Entry with only Code set and Resolution Escalate (the conservative
// default).
func (c *Catalog) Classify(code uint32) Entry {
	if e, ok := c.byCode[code]; ok {
		return e
	}
	return Entry{Code: code, Resolution: resolveCode(code, "")}
}

// Entries returns every entry, by code.
func (c *Catalog) Entries() []Entry {
	out := make([]Entry, 0, len(c.byCode))
	for _, code := range slices.Sorted(maps.Keys(c.byCode)) {
		out = append(out, c.byCode[code])
	}
	return out
}

// Impact is what an XID of a resolution does to its GPU's health while it
// holds (until the GPU is reset or the machine reboots).
type Impact int

// The impacts, in increasing order.
const (
	// ImpactNone: the GPU stays healthy; the XID is only an event (IGNORE,
	// RESTART_APP: the application failed, not the GPU).
	ImpactNone Impact = iota
	// ImpactDegraded: the GPU works but a person should look (CONTACT_SUPPORT,
	// CHECK_*, UPDATE_SWFW and any word not named here).
	ImpactDegraded
	// ImpactFailed: the GPU must take no work until it is reset or the
	// machine rebooted (RESET_GPU, RESTART_VM, RESTART_BM, ESCALATE).
	ImpactFailed
)

// ImpactOf returns the impact of resolution r (see Impact).
func ImpactOf(r string) Impact {
	switch r {
	case Ignore, RestartApp:
		return ImpactNone
	case ResetGPU, RestartVM, RestartBM, Escalate:
		return ImpactFailed
	default:
		return ImpactDegraded
	}
}

// Rank orders resolutions by how much they call for, so that a GPU (or a
// node) reports the strongest of its causes': "" < IGNORE < RESTART_APP <
// RESET_GPU < RESTART_VM < RESTART_BM < a word that needs a person
// (CONTACT_SUPPORT, CHECK_*, UPDATE_SWFW, any other) < ESCALATE.
func Rank(r string) int {
	switch r {
	case "":
		return 0
	case Ignore:
		return 1
	case RestartApp:
		return 2
	case ResetGPU:
		return 3
	case RestartVM:
		return 4
	case RestartBM:
		return 5
	case Escalate:
		return 7
	default:
		return 6
	}
}
