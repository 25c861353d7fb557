package tests

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/serve"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// tenantsFrom is the build before tenants (issue 45): the commit this
// branch grew from, whose newest migration is 0023.
const tenantsFrom = "ffb37918a4712aa8193ac4de17d4dcc71083e8c1"

// TestTenantMigrationFromPreviousBuild (issue 45): a deployment made by
// the build before tenants (its `dev --sim 2`: the embedded default with two
// simulated daemons) holds an admin token, an operator token it made and a
// command that ran. This build's `dev` on the same data directory migrates
// it: both tokens, both nodes (same ids, ready again) and the command are
// the root tenant's and work as before — the old operator token reads the
// old command and runs a new one to success, the pools are the root's, and
// tenants.list holds the root alone.
func TestTenantMigrationFromPreviousBuild(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	prev := testenv.BuildRelease(t, tenantsFrom, "0.0.0-e2e-previous")
	bin := testenv.Binary(t, "better-compute")
	dataDir := t.TempDir()
	run := func(bin string) (*testenv.Proc, string) {
		p := testenv.Start(t, testenv.BaseEnv(), bin, "dev", "--sim", "2", "--port", "0", "--gateway-port", "0", "--data-dir", dataDir)
		api := p.WaitLine(`API\s+(http://\S+?/api)\s`, 90*time.Second)[1]
		p.WaitLine(`2 simulated daemons connected`, 120*time.Second)
		return p, api
	}
	runCommand := func(c *client.Client, nodeID string) *apiv1.Command {
		t.Helper()
		resp, err := c.CommandsCreate(ctx, &apiv1.CreateCommandsRequest{NodeIds: []string{nodeID}, Kind: "exec", Exec: &apiv1.ExecSpec{Argv: []string{"true"}}})
		if err != nil || len(resp.Commands) != 1 {
			t.Fatalf("commands.create: %+v, %v", resp, err)
		}
		var cmd *apiv1.Command
		eventually(t, 60*time.Second, func() bool {
			got, err := c.CommandsGet(ctx, &apiv1.GetCommandRequest{Id: resp.Commands[0].Id})
			if err != nil {
				t.Fatal(err)
			}
			cmd = got.Command
			return cmd.State == "succeeded"
		}, func() string { return "the command never succeeded: " + cmd.String() })
		return cmd
	}
	nodeIDs := func(c *client.Client) []string {
		t.Helper()
		list, err := c.NodesList(ctx, &apiv1.ListNodesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, n := range list.Nodes {
			ids = append(ids, n.Id)
		}
		slices.Sort(ids)
		return ids
	}

	// The previous build's deployment.
	p, api := run(prev.BetterCompute)
	b, err := os.ReadFile(filepath.Join(dataDir, serve.AdminTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	admin := &client.Client{BaseURL: api, Token: strings.TrimSpace(string(b))}
	tok, err := admin.TokensCreate(ctx, &apiv1.CreateAPITokenRequest{Role: store.RoleOperator, Description: "made by the previous build"})
	if err != nil {
		t.Fatal(err)
	}
	operator := &client.Client{BaseURL: api, Token: tok.Token}
	before := nodeIDs(operator)
	if len(before) != 2 {
		t.Fatalf("the previous build's nodes = %v", before)
	}
	old := runCommand(operator, before[0])
	p.Stop(syscall.SIGTERM, 30*time.Second)

	// This build on the same data directory migrates it.
	_, api = run(bin)
	admin.BaseURL, operator.BaseURL = api, api
	if after := nodeIDs(operator); !slices.Equal(after, before) {
		t.Fatalf("nodes after the upgrade = %v, want %v", after, before)
	}
	got, err := operator.CommandsGet(ctx, &apiv1.GetCommandRequest{Id: old.Id})
	if err != nil || got.Command.State != "succeeded" {
		t.Fatalf("the previous build's command after the upgrade: %+v, %v", got, err)
	}
	runCommand(operator, before[1])
	toks, err := admin.TokensList(ctx, &apiv1.ListAPITokensRequest{})
	if err != nil || len(toks.ApiTokens) < 2 {
		t.Fatalf("tokens.list = %+v, %v", toks, err)
	}
	for _, x := range toks.ApiTokens {
		if x.TenantId != store.RootTenant {
			t.Errorf("token %s (%s) is tenant %q's, want root's", x.Id, x.Description, x.TenantId)
		}
	}
	pools, err := operator.PoolsList(ctx, &apiv1.ListPoolsRequest{})
	if err != nil || len(pools.Pools) == 0 {
		t.Fatalf("pools.list = %+v, %v", pools, err)
	}
	for _, x := range pools.Pools {
		if x.TenantId != store.RootTenant {
			t.Errorf("pool %s is tenant %q's, want root's", x.Name, x.TenantId)
		}
	}
	ts, err := operator.TenantsList(ctx, &apiv1.ListTenantsRequest{})
	if err != nil || len(ts.Tenants) != 1 || ts.Tenants[0].Id != store.RootTenant || ts.Tenants[0].Suspended {
		t.Fatalf("tenants.list after the upgrade = %+v, %v; want the root alone", ts, err)
	}
}
