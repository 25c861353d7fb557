package agent

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Files a heartbeat's readings come from.
const (
	loadavgFile = "/proc/loadavg"
	uptimeFile  = "/proc/uptime"
	meminfoFile = "/proc/meminfo"
)

// readings fills a heartbeat's load averages, uptime and available memory
// from /proc; fields it cannot read stay zero.
func readings(hb *sessionv1.Heartbeat) {
	if f := strings.Fields(firstLine(loadavgFile)); len(f) >= 3 {
		hb.Load1, _ = strconv.ParseFloat(f[0], 64)
		hb.Load5, _ = strconv.ParseFloat(f[1], 64)
		hb.Load15, _ = strconv.ParseFloat(f[2], 64)
	}
	if f := strings.Fields(firstLine(uptimeFile)); len(f) >= 1 {
		if up, err := strconv.ParseFloat(f[0], 64); err == nil && up > 0 {
			hb.UptimeSeconds = uint64(up)
		}
	}
	hb.MemoryAvailableBytes = memAvailable()
}

// firstLine returns the first line of path, trimmed; "" when unreadable.
func firstLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	return strings.TrimSpace(string(line))
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
