package main

import (
	"bytes"
	"os"
	"runtime"
	"strings"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Files bcd reads about its host for Join and Hello (the agent's scans read
// the rest, see package bcd/inventory).
const (
	machineIDFile = "/etc/machine-id"
	bootIDFile    = "/proc/sys/kernel/random/boot_id"
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
