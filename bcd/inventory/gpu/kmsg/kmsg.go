// Package kmsg reads NVIDIA XID errors from the kernel log: the "NVRM: Xid"
// lines the NVIDIA driver writes, as /dev/kmsg hands them out.
//
// A /dev/kmsg record is "PRI,SEQ,USEC,FLAGS[,...];MESSAGE" followed by
// optional continuation lines starting with a space (the kernel's
// Documentation/ABI/testing/dev-kmsg): PRI is the syslog priority and
// facility, SEQ the record's sequence number, USEC the time since boot in
// microseconds. The driver's XID line reads, for example,
//
//	NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python3, GPU has fallen off the bus.
//
// (older drivers leave out pid= and name=, or the "PCI:" prefix). Reading
// /dev/kmsg from a fresh file descriptor starts at the oldest record the
// kernel still holds, which is the look-back: an XID raised before bcd
// started is seen too.
//
// Reading /dev/kmsg needs root (or CAP_SYSLOG); bcd's unprivileged unit sets
// ProtectKernelLogs=yes, so there the root helper reads it and passes on
// only the XID records (package bcd/helper, operation "kmsg.xid").
package kmsg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// DefaultPath is the kernel's log device.
const DefaultPath = "/dev/kmsg"

// Record is one /dev/kmsg record.
type Record struct {
	// Priority is the syslog priority and facility (PRI), for example 3
	// for kern.err.
	Priority int
	// Seq is the record's sequence number; it only grows within a boot.
	Seq uint64
	// SinceBoot is when the kernel logged it, since boot (USEC).
	SinceBoot time.Duration
	// Message is the text after the ';', without continuation lines, with
	// the kernel's \xNN escapes left as they are.
	Message string
}

// ErrMalformed is wrapped by ParseRecord's errors.
var ErrMalformed = errors.New("malformed kmsg record")

// ParseRecord parses one record as read from /dev/kmsg (one read, possibly
// ending in a newline and continuation lines). Errors wrap ErrMalformed.
func ParseRecord(s string) (Record, error) {
	head, msg, ok := strings.Cut(s, ";")
	if !ok {
		return Record{}, fmt.Errorf("%w: no ';'", ErrMalformed)
	}
	f := strings.Split(head, ",")
	if len(f) < 4 {
		return Record{}, fmt.Errorf("%w: %d header fields, want at least 4", ErrMalformed, len(f))
	}
	pri, err1 := strconv.ParseUint(f[0], 10, 16)
	seq, err2 := strconv.ParseUint(f[1], 10, 64)
	usec, err3 := strconv.ParseUint(f[2], 10, 63)
	if err := errors.Join(err1, err2, err3); err != nil || usec > uint64(time.Duration(1<<63-1)/time.Microsecond) {
		return Record{}, fmt.Errorf("%w: header %q", ErrMalformed, head)
	}
	msg, _, _ = strings.Cut(msg, "\n")
	return Record{Priority: int(pri), Seq: seq, SinceBoot: time.Duration(usec) * time.Microsecond, Message: msg}, nil
}

// Xid is one XID error the driver logged.
type Xid struct {
	// Domain, Bus and Device are the PCI address of the GPU, for example
	// 0, 0x3b and 0 for "0000:3b:00".
	Domain uint32
	Bus    uint8
	Device uint8
	// Code is the XID number.
	Code uint32
	// PID and Name are the process the driver blamed; 0 and "" when the
	// line does not say.
	PID  int
	Name string
	// Text is the rest of the line after the code (and pid=, name=).
	Text string
}

// PCIKey is the GPU's address as "DDDDDDDD:BB:DD", upper-case hex, the
// first three parts of NVML's bus id ("00000000:3B:00.0"): what
// [NVMLBusKey] gives for the same GPU.
func (x Xid) PCIKey() string { return fmt.Sprintf("%08X:%02X:%02X", x.Domain, x.Bus, x.Device) }

// NVMLBusKey converts an NVML PCI bus id ("00000000:3B:00.0", or the short
// "0000:3b:00.0") to the key PCIKey gives; "" when it is not one.
func NVMLBusKey(busID string) string {
	d, b, dev, ok := parsePCI(strings.TrimSpace(strings.SplitN(busID, ".", 2)[0]))
	if !ok {
		return ""
	}
	return Xid{Domain: d, Bus: b, Device: dev}.PCIKey()
}

const xidMarker = "NVRM: Xid ("

// ParseXid reads an XID from a kernel log message (a Record's Message); ok
// is false when the message is not a well-formed NVRM Xid line.
func ParseXid(msg string) (x Xid, ok bool) {
	i := strings.Index(msg, xidMarker)
	if i < 0 {
		return Xid{}, false
	}
	rest := msg[i+len(xidMarker):]
	addr, rest, found := strings.Cut(rest, "):")
	if !found {
		return Xid{}, false
	}
	addr = strings.TrimPrefix(addr, "PCI:")
	if x.Domain, x.Bus, x.Device, ok = parsePCI(addr); !ok {
		return Xid{}, false
	}
	rest = strings.TrimLeft(rest, " ")
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	code, err := strconv.ParseUint(rest[:n], 10, 32)
	if err != nil {
		return Xid{}, false
	}
	x.Code = uint32(code)
	rest = strings.TrimLeft(strings.TrimPrefix(rest[n:], ","), " ")
	if v, after, found := strings.Cut(rest, ","); found && strings.HasPrefix(v, "pid=") {
		if pid, err := strconv.Atoi(strings.TrimPrefix(v, "pid=")); err == nil && pid >= 0 {
			x.PID = pid
		}
		rest = strings.TrimLeft(after, " ")
		if v, after, found := strings.Cut(rest, ","); found && strings.HasPrefix(v, "name=") {
			x.Name = strings.TrimPrefix(v, "name=")
			rest = strings.TrimLeft(after, " ")
		}
	}
	x.Text = strings.TrimSpace(rest)
	return x, true
}

// parsePCI reads "DDDD:BB:DD": a domain of up to 16 hex digits with a value
// below 2^32, bus and device of up to 2.
func parsePCI(s string) (domain uint32, bus, dev uint8, ok bool) {
	p := strings.Split(s, ":")
	if len(p) != 3 || p[0] == "" || len(p[0]) > 16 || p[1] == "" || len(p[1]) > 2 || p[2] == "" || len(p[2]) > 2 {
		return 0, 0, 0, false
	}
	d, err1 := strconv.ParseUint(p[0], 16, 32)
	b, err2 := strconv.ParseUint(p[1], 16, 8)
	v, err3 := strconv.ParseUint(p[2], 16, 8)
	if errors.Join(err1, err2, err3) != nil {
		return 0, 0, 0, false
	}
	return uint32(d), uint8(b), uint8(v), true
}

// IsXidRecord reports whether a raw /dev/kmsg record carries an NVRM Xid
// line (the helper's filter: it passes on nothing else).
func IsXidRecord(s string) bool {
	r, err := ParseRecord(s)
	if err != nil {
		return false
	}
	_, ok := ParseXid(r.Message)
	return ok
}

// Follow reads the records of the kernel log at path (DefaultPath when
// empty) from the oldest one the kernel holds, passing each raw record to
// fn, and then waits for new ones until ctx ends (it returns nil then).
// Records the kernel overwrote before they were read are skipped. It fails
// when path cannot be opened or read.
func Follow(ctx context.Context, path string, fn func(record string)) error {
	if path == "" {
		path = DefaultPath
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open kernel log: %w", err)
	}
	defer f.Close()
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 8192) // the kernel's record limit is 1 KiB of text plus its escapes
	var pend string           // a file's last line, not yet ended
	for {
		n, err := f.Read(buf)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, syscall.EPIPE):
			continue // records overwritten before they were read
		case errors.Is(err, syscall.EINVAL):
			return fmt.Errorf("read kernel log: %w (buffer too small)", err)
		case errors.Is(err, io.EOF):
			// A regular file (tests): nothing more until it grows.
			if !sleep(ctx, 50*time.Millisecond) {
				return nil
			}
			continue
		case err != nil:
			return fmt.Errorf("read kernel log: %w", err)
		}
		pend += string(buf[:n])
		for {
			line, rest, found := strings.Cut(pend, "\n")
			if !found {
				break
			}
			pend = rest
			// A device read is one record, ended by a newline, with
			// continuation lines that start with a space; a file holds
			// one record per line.
			if line != "" && line[0] != ' ' {
				fn(line)
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
