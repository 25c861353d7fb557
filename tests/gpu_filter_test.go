package tests

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/tests/testenv"
)

// nodes list --gpu-model A100 --min-gpus 8 finds the FakeDaemons that report
// the mock DGX A100 and not the others; fleet.summary counts their GPUs.
func TestNodesListGPUFilters(t *testing.T) {
	t.Parallel()
	dataDir := filepath.Join(t.TempDir(), "data")
	env := []string{"BETTER_COMPUTE_DATA_DIR=" + dataDir}
	bc := testenv.Binary(t, "better-compute")
	cfg := testenv.WriteFile(t, "better-compute.yaml", serveConfig)
	p := testenv.Start(t, env, bc, "serve", "--config", cfg)
	api := "http://" + p.WaitLine(`msg="API listening" addr=(\S+)`, 60*time.Second)[1]
	gw := p.WaitLine(`msg="Gateway listening" .*public_url=(\S+)`, 30*time.Second)[1]
	tokenFile := filepath.Join(t.TempDir(), "token")
	if code, _, errOut := testenv.Run(t, env, "", bc, "--config", cfg, "join-tokens", "create", "--server", api, "--pool", "default", "--max-uses", "4", "--out", tokenFile); code != 0 {
		t.Fatalf("join-tokens create: %s", errOut)
	}
	token := strings.TrimSpace(readFile(t, tokenFile))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := func(prefix string, noInventory bool) []string {
		f, err := sim.NewFleet(sim.FleetConfig{GatewayURL: gw, Token: token, N: 2, NamePrefix: prefix, NoInventory: noInventory,
			Session: session.Config{StartJitter: -1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Join(ctx); err != nil {
			t.Fatal(err)
		}
		go f.Run(ctx)
		if err := f.WaitFor(ctx, func(s sim.FleetStats) bool { return s.Connected == 2 }); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, d := range f.Daemons() {
			ids = append(ids, d.NodeID())
		}
		return ids
	}
	dgx := run("dgx", false)
	plain := run("cpu", true)
	list := func(args ...string) []string {
		t.Helper()
		code, out, errOut := testenv.Run(t, env, "", bc, append([]string{"--config", cfg, "nodes", "list", "--server", api, "-o", "json"}, args...)...)
		if code != 0 {
			t.Fatalf("nodes list %v: %s", args, errOut)
		}
		var resp struct {
			Nodes []struct {
				ID string `json:"id"`
			} `json:"nodes"`
		}
		if err := json.Unmarshal([]byte(out), &resp); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, n := range resp.Nodes {
			ids = append(ids, n.ID)
		}
		slices.Sort(ids)
		return ids
	}
	slices.Sort(dgx)
	var got []string
	deadline := time.Now().Add(15 * time.Second)
	for { // the inventories arrive right after Welcome
		if got = list("--gpu-model", "A100", "--min-gpus", "8"); slices.Equal(got, dgx) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !slices.Equal(got, dgx) {
		t.Fatalf("--gpu-model A100 --min-gpus 8 = %v, want the DGX FakeDaemons %v (not %v)", got, dgx, plain)
	}
	if got := list("--gpu-model", "a100", "--min-gpus", "9"); len(got) != 0 {
		t.Fatalf("--min-gpus 9 = %v, want none", got)
	}
	if got := list("--gpu-model", "H100"); len(got) != 0 {
		t.Fatalf("--gpu-model H100 = %v, want none", got)
	}
	if got := list("--gpu-health", "failed"); len(got) != 0 {
		t.Fatalf("--gpu-health failed = %v, want none", got)
	}
	if got := list(); len(got) != 4 {
		t.Fatalf("all nodes = %v, want 4", got)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
