package main

import (
	"bufio"
	"bytes"
	"os"
	"runtime"
	"strconv"
	"strings"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Files the agent reads about its host.
const (
	machineIDFile = "/etc/machine-id"
	bootIDFile    = "/proc/sys/kernel/random/boot_id"
	loadavgFile   = "/proc/loadavg"
	uptimeFile    = "/proc/uptime"
	meminfoFile   = "/proc/meminfo"
)

// readLine returns the first line of path, trimmed; "" when unreadable.
func readLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	return strings.TrimSpace(string(line))
}

// facts describes this machine for Join.
func facts(labels map[string]string) *sessionv1.NodeFacts {
	host, _ := os.Hostname()
	return &sessionv1.NodeFacts{
		Hostname:   host,
		MachineId:  readLine(machineIDFile),
		Os:         runtime.GOOS,
		Arch:       runtime.GOARCH,
		BcdVersion: bcdVersion(),
		BootId:     readLine(bootIDFile),
		Labels:     labels,
	}
}

// readings fills a heartbeat's load averages, uptime and available memory
// from /proc; fields it cannot read stay zero.
func readings(hb *sessionv1.Heartbeat) {
	if f := strings.Fields(readLine(loadavgFile)); len(f) >= 3 {
		hb.Load1, _ = strconv.ParseFloat(f[0], 64)
		hb.Load5, _ = strconv.ParseFloat(f[1], 64)
		hb.Load15, _ = strconv.ParseFloat(f[2], 64)
	}
	if f := strings.Fields(readLine(uptimeFile)); len(f) >= 1 {
		if up, err := strconv.ParseFloat(f[0], 64); err == nil && up > 0 {
			hb.UptimeSeconds = uint64(up)
		}
	}
	hb.MemoryAvailableBytes = memAvailable()
}

// memAvailable returns MemAvailable from /proc/meminfo in bytes, 0 when
// unknown.
func memAvailable() uint64 {
	f, err := os.Open(meminfoFile)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0
		}
		return kb * 1024
	}
	return 0
}
