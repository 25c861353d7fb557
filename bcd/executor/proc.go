package executor

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Proc is what the executor reads and does to the machine's processes to
// recognise, after a restart, the process groups an earlier bcd left
// behind. The default, ProcFS("/proc"), reads procfs; tests pass a fake.
type Proc interface {
	// BootID returns /proc/sys/kernel/random/boot_id, which changes on
	// every boot.
	BootID() (string, error)
	// StartTime returns when process pid started: field 22 of
	// /proc/<pid>/stat, in clock ticks since boot. It fails with an error
	// wrapping os.ErrNotExist when there is no such process.
	StartTime(pid int) (uint64, error)
	// GroupAlive reports whether process group pgid has a member that is
	// not a zombie.
	GroupAlive(pgid int) (bool, error)
	// KillGroup sends sig to process group pgid (kill(-pgid, sig)).
	KillGroup(pgid int, sig syscall.Signal) error
}

// ProcFS is a Proc on the procfs mounted at its path ("/proc").
type ProcFS string

// BootID implements Proc.
func (p ProcFS) BootID() (string, error) {
	b, err := os.ReadFile(filepath.Join(string(p), "sys/kernel/random/boot_id"))
	if err != nil {
		return "", fmt.Errorf("read boot id: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// StartTime implements Proc.
func (p ProcFS) StartTime(pid int) (uint64, error) {
	st, err := p.stat(pid)
	if err != nil {
		return 0, err
	}
	return st.start, nil
}

// GroupAlive implements Proc: it looks through every process in procfs.
func (p ProcFS) GroupAlive(pgid int) (bool, error) {
	ents, err := os.ReadDir(string(p))
	if err != nil {
		return false, fmt.Errorf("list processes: %w", err)
	}
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		st, err := p.stat(pid)
		if err != nil {
			continue // gone since the listing
		}
		if st.pgrp == pgid && st.state != 'Z' && st.state != 'X' {
			return true, nil
		}
	}
	return false, nil
}

// KillGroup implements Proc.
func (ProcFS) KillGroup(pgid int, sig syscall.Signal) error {
	if pgid <= 1 {
		return fmt.Errorf("refusing to signal process group %d", pgid)
	}
	return syscall.Kill(-pgid, sig)
}

// procStat is what the executor needs of /proc/<pid>/stat.
type procStat struct {
	state byte   // field 3
	pgrp  int    // field 5
	start uint64 // field 22
}

func (p ProcFS) stat(pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join(string(p), strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, fmt.Errorf("read process %d: %w", pid, err)
	}
	st, ok := parseStat(b)
	if !ok {
		return procStat{}, fmt.Errorf("read process %d: malformed stat %q", pid, b)
	}
	return st, nil
}

// parseStat reads "pid (comm) state ppid pgrp ... starttime ...": comm may
// hold spaces and parentheses, so the fields are counted from the last ')'.
func parseStat(b []byte) (procStat, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || len(f[0]) != 1 { // f[0] is field 3
		return procStat{}, false
	}
	pgrp, err1 := strconv.Atoi(f[2])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil {
		return procStat{}, false
	}
	return procStat{state: f[0][0], pgrp: pgrp, start: start}, true
}
