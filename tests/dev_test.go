package tests

import (
	"encoding/json"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/tests/testenv"
)

// TestDevTwiceOnOneDataDir: the README's first command, run a second time
// on the same data directory, shows its three simulated nodes, all ready,
// with the ids of the first run (the daemons keep their identities in the
// data directory), and no unreachable twins. A third run with fewer
// daemons keeps those and removes the nodes no daemon holds.
func TestDevTwiceOnOneDataDir(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, "better-compute")
	dataDir := t.TempDir()
	var firstIDs []string
	for run, n := range []int{3, 3, 2} {
		run++
		p := testenv.Start(t, testenv.BaseEnv(), bin, "dev", "--sim", strconv.Itoa(n), "--port", "0", "--gateway-port", "0", "--data-dir", dataDir)
		api := p.WaitLine(`API\s+(http://\S+?)/api\s`, 60*time.Second)[1]
		p.WaitLine(fmt.Sprintf(`%d simulated daemons connected`, n), 90*time.Second)
		code, out, errOut := testenv.Run(t, testenv.BaseEnv(), "", bin, "nodes", "list", "--server", api, "--data-dir", dataDir, "-o", "json")
		if code != 0 {
			t.Fatalf("run %d: nodes list: exit %d\n%s%s", run, code, out, errOut)
		}
		var list struct {
			Nodes []struct {
				ID       string `json:"id"`
				Hostname string `json:"hostname"`
				State    string `json:"state"`
			} `json:"nodes"`
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("run %d: nodes list -o json: %v\n%s", run, err, out)
		}
		ready := 0
		ids := map[string]string{}
		for _, n := range list.Nodes {
			if n.State == "ready" {
				ready++
			}
			ids[n.Hostname] = n.ID
		}
		if len(list.Nodes) != n || ready != n {
			t.Fatalf("run %d: %d nodes, %d ready, want %d and %d: %s", run, len(list.Nodes), ready, n, n, out)
		}
		names := []string{"sim-00000", "sim-00001", "sim-00002"}[:n]
		if run == 1 {
			for _, h := range names {
				firstIDs = append(firstIDs, ids[h])
			}
		}
		for i, h := range names {
			if ids[h] != firstIDs[i] {
				t.Errorf("run %d: %s is node %q, want %s as in the first run", run, h, ids[h], firstIDs[i])
			}
		}
		p.Stop(syscall.SIGTERM, 20*time.Second)
	}
}
