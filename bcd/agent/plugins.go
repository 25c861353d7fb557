package agent

import (
	"cmp"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// DefaultPluginDir is where bcd looks for bcx-<name> plugins.
const DefaultPluginDir = "/usr/lib/bcd/plugins"

// PluginsIn lists the plugins installed in dir for the Inventory: each
// executable bcx-<name>, its version as it answers --version (within 5 s),
// and whether it answered. A plugin that does not answer is reported
// unhealthy with why; a missing dir means no plugins.
func PluginsIn(dir string) func() []*sessionv1.PluginInfo {
	dir = cmp.Or(dir, DefaultPluginDir)
	return func() []*sessionv1.PluginInfo {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil
		}
		var out []*sessionv1.PluginInfo
		for _, e := range entries {
			name, ok := strings.CutPrefix(e.Name(), "bcx-")
			if !ok || name == "" || e.IsDir() {
				continue
			}
			info := &sessionv1.PluginInfo{Name: name}
			path := filepath.Join(dir, e.Name())
			fi, err := os.Stat(path)
			switch {
			case err != nil:
				info.Message = err.Error()
			case fi.Mode()&0o111 == 0:
				info.Message = "not executable"
			case fi.Mode()&0o022 != 0:
				info.Message = "writable by group or others: refused"
			default:
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				b, err := exec.CommandContext(ctx, path, "--version").Output()
				cancel()
				if err != nil {
					info.Message = "does not answer --version: " + err.Error()
				} else {
					info.Version = versionOf(string(b))
					info.Healthy = true
				}
			}
			out = append(out, info)
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		return out
	}
}

// versionOf takes the version word of a --version line such as
// "bcx-ipmi 0.2.0 (commit abc, go1.26)".
func versionOf(s string) string {
	fields := strings.Fields(s)
	for _, f := range fields {
		if f != "" && (f[0] >= '0' && f[0] <= '9' || f[0] == 'v') {
			return strings.TrimPrefix(f, "v")
		}
	}
	if len(fields) > 0 {
		return fields[len(fields)-1]
	}
	return ""
}
