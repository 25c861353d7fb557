package tests

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// processesConfig compresses the processes table's timeouts
// (host.processes): a row is refreshed every 200 ms and pruned after 2 s
// of silence.
const processesConfig = `  processes:
    heartbeatInterval: 200ms
    pruneAfter: 2s
`

// processesPruneAfter is processesConfig's pruneAfter.
const processesPruneAfter = 2 * time.Second

// TestProcessesListSplitDeployment: `processes list` shows every process
// of a split deployment on PostgreSQL, an api-only one and a sinks,iam one
// included, each with its roles, version and schema; the row of a process
// killed with kill -9 is pruned by the others after the (compressed)
// timeout.
func TestProcessesListSplitDeployment(t *testing.T) {
	t.Parallel()
	d := newSplitDeploymentWith(t, 1, 1, func([]string) string { return processesConfig })
	sinksIAM := d.start("sinks-iam", "sinks,iam")
	sinksIAM.WaitLine(`msg="Worker roles running"`, 60*time.Second)

	want := []string{"api", "gateway", workerRoles, "sinks,iam"}
	var rows []processRow
	eventually(t, 30*time.Second, func() bool {
		rows = d.processes(t)
		var got []string
		for _, r := range rows {
			got = append(got, strings.Join(r.Roles, ","))
		}
		return !slices.ContainsFunc(want, func(w string) bool { return !slices.Contains(got, w) })
	}, func() string { return fmt.Sprintf("processes list = %+v, want one of each roles %v", rows, want) })
	for _, r := range rows {
		if r.Version == "" || r.Schema == "" || r.Pid == 0 {
			t.Errorf("process %s lacks its version, schema or pid: %+v", r.ID, r)
		}
	}
	t.Logf("processes list: %d processes: %+v", len(rows), rows)

	var killedID string
	for _, r := range rows {
		if r.Pid == sinksIAM.Pid() {
			killedID = r.ID
		}
	}
	if killedID == "" {
		t.Fatalf("no row has the sinks,iam process's pid %d: %+v", sinksIAM.Pid(), rows)
	}
	killed := time.Now()
	sinksIAM.Kill()
	eventually(t, processesPruneAfter+30*time.Second, func() bool {
		return !slices.ContainsFunc(d.processes(t), func(r processRow) bool { return r.ID == killedID })
	}, func() string { return "the killed process's row " + killedID + " is still listed" })
	t.Logf("the row of the process killed with kill -9 was gone %v after the kill (prune timeout %v)",
		time.Since(killed).Round(time.Millisecond), processesPruneAfter)
	// The others are still there.
	if n := len(d.processes(t)); n != len(rows)-1 {
		t.Errorf("%d processes listed after the kill, want %d", n, len(rows)-1)
	}
}

// processRow is one row of `processes list -o json`.
type processRow struct {
	ID      string   `json:"id"`
	Roles   []string `json:"roles"`
	Pid     int      `json:"pid"`
	Version string   `json:"version"`
	Schema  string   `json:"schema"`
}

// processes is `processes list -o json`.
func (d *splitDeployment) processes(t *testing.T) []processRow {
	t.Helper()
	var out struct {
		Processes []processRow `json:"processes"`
	}
	if err := json.Unmarshal([]byte(d.cli(t, "processes", "list", "-o", "json")), &out); err != nil {
		t.Fatal(err)
	}
	return out.Processes
}
