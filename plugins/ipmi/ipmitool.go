package ipmi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// runIpmitool runs ipmitool against t as bmclib does (lanplus, -E with the
// password in IPMITOOL_PASSWORD and nothing else in the environment, -N 5)
// and returns its combined output.
func (s *Server) runIpmitool(ctx context.Context, t *target, args ...string) (string, error) {
	if s.ipmitool == "" {
		return "", fmt.Errorf("ipmitool is not installed: %w", errUnsupported)
	}
	argv := []string{"-I", "lanplus", "-H", strings.Trim(t.host, "[]"), "-p", strconv.Itoa(t.ipmiPort),
		"-U", t.username, "-E", "-N", "5", "-C", t.cipher}
	cmd := exec.CommandContext(ctx, s.ipmitool, append(argv, args...)...)
	cmd.Env = []string{"IPMITOOL_PASSWORD=" + t.password}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return string(out), ctx.Err()
	}
	if err != nil {
		return string(out), errors.New(strings.TrimSpace(string(out)) + ": " + err.Error())
	}
	return string(out), nil
}

// ipmitoolInfo reads `ipmitool mc info`.
func (s *Server) ipmitoolInfo(ctx context.Context, t *target) (*pluginv1.BMCInfoResponse, error) {
	out, err := s.runIpmitool(ctx, t, "mc", "info")
	if err != nil {
		return nil, err
	}
	return parseMCInfo(out), nil
}

// parseMCInfo reads the "Key : value" lines of `ipmitool mc info`.
func parseMCInfo(out string) *pluginv1.BMCInfoResponse {
	info := &pluginv1.BMCInfoResponse{Provider: pluginv1.Provider_PROVIDER_IPMITOOL}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		switch strings.TrimSpace(key) {
		case "Manufacturer Name":
			info.Vendor = val
		case "Product Name":
			info.Model = val
		case "Firmware Revision":
			info.FirmwareVersion = val
		}
	}
	return info
}
