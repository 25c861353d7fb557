package inventory

import (
	"bufio"
	"bytes"
	"io/fs"
	"slices"
	"strconv"
	"strings"
)

// keptCPUFlags reports whether a /proc/cpuinfo flag (x86 "flags", arm64
// "Features") is one the control plane schedules on: vector and matrix
// extensions, crypto, virtualisation support, and "hypervisor" (a guest).
func keptCPUFlags(f string) bool {
	switch f {
	// x86
	case "sse4_2", "avx", "avx2", "fma", "f16c",
		"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl",
		"avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
		"amx_tile", "amx_bf16", "amx_int8",
		"aes", "sha_ni", "vmx", "svm", "hypervisor",
		// arm64
		"asimd", "sve", "sve2", "sha2", "pmull", "atomics", "i8mm", "bf16":
		return true
	}
	return false
}

// readCPU parses /proc/cpuinfo: Threads counts "processor" entries, Model
// is the first "model name" (or "Hardware" on boards without one), Sockets
// counts distinct "physical id"s and Cores distinct (physical id, core id)
// pairs. Without topology lines (most arm64 kernels) there is one socket
// and one thread per core.
func readCPU(root fs.FS) CPU {
	var c CPU
	b, err := fs.ReadFile(root, "proc/cpuinfo")
	if err != nil {
		return c
	}
	type core struct{ pkg, id string }
	var (
		pkgs     = map[string]bool{}
		cores    = map[core]bool{}
		pkg      string
		flags    string
		hardware string
	)
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20) // flags lines exceed bufio's 64 KiB default on some CPUs
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch k {
		case "processor":
			c.Threads++
			pkg = ""
		case "model name":
			if c.Model == "" {
				c.Model = v
			}
		case "Hardware":
			hardware = v
		case "physical id":
			pkg = v
			pkgs[v] = true
		case "core id":
			cores[core{pkg, v}] = true
		case "flags", "Features":
			if flags == "" {
				flags = v
			}
		case "cpu cores":
			// Used below only when core ids are missing.
			if n, err := strconv.Atoi(v); err == nil && len(cores) == 0 && c.Cores == 0 {
				c.Cores = n
			}
		}
	}
	if c.Model == "" {
		c.Model = hardware
	}
	c.Sockets = len(pkgs)
	if c.Sockets == 0 && c.Threads > 0 {
		c.Sockets = 1
	}
	switch {
	case len(cores) > 0:
		c.Cores = len(cores)
	case c.Cores > 0:
		c.Cores *= c.Sockets // "cpu cores" is per package
	default:
		c.Cores = c.Threads
	}
	for f := range strings.FieldsSeq(flags) {
		if keptCPUFlags(f) {
			c.Flags = append(c.Flags, f)
		}
	}
	slices.Sort(c.Flags)
	c.Flags = slices.Compact(c.Flags)
	return c
}
