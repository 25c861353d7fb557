package tests

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/tests/testenv"
)

// TestDevTwiceOnOneDataDir: the README's first command, run a second time
// on the same data directory, shows its three simulated nodes, all ready:
// the simulated daemons of the first run (new keys each run) do not stay
// behind as unreachable twins.
func TestDevTwiceOnOneDataDir(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, "better-compute")
	dataDir := t.TempDir()
	for run := 1; run <= 2; run++ {
		p := testenv.Start(t, testenv.BaseEnv(), bin, "dev", "--sim", "3", "--port", "0", "--gateway-port", "0", "--data-dir", dataDir)
		api := p.WaitLine(`API\s+(http://\S+?)/api\s`, 60*time.Second)[1]
		p.WaitLine(`3 simulated daemons connected`, 90*time.Second)
		code, out, errOut := testenv.Run(t, testenv.BaseEnv(), "", bin, "nodes", "list", "--server", api, "--data-dir", dataDir, "-o", "json")
		if code != 0 {
			t.Fatalf("run %d: nodes list: exit %d\n%s%s", run, code, out, errOut)
		}
		var list struct {
			Nodes []struct {
				Hostname string `json:"hostname"`
				State    string `json:"state"`
			} `json:"nodes"`
		}
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("run %d: nodes list -o json: %v\n%s", run, err, out)
		}
		ready := 0
		for _, n := range list.Nodes {
			if n.State == "ready" {
				ready++
			}
		}
		if len(list.Nodes) != 3 || ready != 3 {
			t.Fatalf("run %d: %d nodes, %d ready, want 3 and 3: %s", run, len(list.Nodes), ready, out)
		}
		p.Stop(syscall.SIGTERM, 20*time.Second)
	}
}
