package doctor

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// IDProcesses is the check of the processes table (issue 40).
const IDProcesses = "control-plane.processes"

// Processes checks the registered control-plane processes at now (the
// database's clock): a row not refreshed within staleAfter (three
// host.processes.heartbeatInterval) warns, naming it: the process hangs, or
// stopped without deleting its row and is pruned after
// host.processes.pruneAfter. Builds more than one release apart warn too:
// one minor version of skew is what a rolling upgrade runs
// (docs/upgrade-control-plane.md, after Kubernetes' and Teleport's skew
// policies); a different major version, or minor versions two or more
// apart, is beyond it. Versions that are not semantic (dev builds) are left
// out of the skew and counted.
func Processes(ps []*store.Process, now time.Time, staleAfter time.Duration) Result {
	if len(ps) == 0 {
		return result(IDProcesses, OK, "no process is registered (a build from before the processes table, or none runs)")
	}
	var stale, warn []string
	for _, p := range ps {
		if silent := now.Sub(p.HeartbeatAt); silent > staleAfter {
			stale = append(stale, fmt.Sprintf("%s (%s on %s, silent %s)", p.ID, strings.Join(p.Roles, ","), p.Hostname, short(silent)))
		}
	}
	var oldest, newest semver
	unparsed := 0
	byVersion := map[string][]string{}
	for _, p := range ps {
		v, ok := parseSemver(p.Version)
		if !ok {
			unparsed++
			continue
		}
		byVersion[p.Version] = append(byVersion[p.Version], p.ID)
		if oldest.raw == "" || v.compare(oldest) < 0 {
			oldest = v
		}
		if newest.raw == "" || v.compare(newest) > 0 {
			newest = v
		}
	}
	detail := []string{fmt.Sprintf("%d process(es)", len(ps))}
	if newest.raw != "" {
		var rows []string
		for _, raw := range sortedKeys(byVersion) {
			rows = append(rows, fmt.Sprintf("%s: %s", raw, some(byVersion[raw])))
		}
		detail = append(detail, strings.Join(rows, "; "))
	}
	if unparsed > 0 {
		detail = append(detail, fmt.Sprintf("%d without a semantic version", unparsed))
	}
	if len(stale) > 0 {
		slices.Sort(stale)
		warn = append(warn, fmt.Sprintf("%d process row(s) not refreshed for over %s: hung, or killed and not yet pruned: %s",
			len(stale), short(staleAfter), strings.Join(stale, ", ")))
	}
	if newest.raw != "" && (newest.major != oldest.major || newest.minor > oldest.minor+1) {
		warn = append(warn, fmt.Sprintf("builds %s and %s run together: more than one release apart; upgrade the older processes (docs/upgrade-control-plane.md)",
			oldest.raw, newest.raw))
	}
	if len(warn) > 0 {
		return result(IDProcesses, Warn, strings.Join(warn, "; "), detail...)
	}
	return result(IDProcesses, OK, fmt.Sprintf("%d process(es) registered and heartbeating, within one release of each other", len(ps)), detail...)
}
