package tests

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/bootstrap"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// gatewayLeaseTTL is the gateway:<id> lease's life (DESIGN.md).
const gatewayLeaseTTL = 20 * time.Second

// TestGatewayAndNodeKilledTogether: kill -9 of a gateway and of the bcd
// holding a running command, at once. The dead gateway's session row is
// closed by the reaper once its lease expires, so the sweeper ends the
// command lost within the lease TTL plus 30 s, not at its deadline; the
// restarted bcd ends the process group its predecessor left behind.
func TestGatewayAndNodeKilledTogether(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newSplitDeployment(t, 1, 1)
	gw := d.gateways[0]

	site, err := d.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "kill", Region: "default"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := d.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "default", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := bootstrap.LoadBundle(ctx, d.st, testSecret)
	if err != nil {
		t.Fatal(err)
	}
	token, _, err := api.CreateJoinToken(ctx, d.st, bundle.GatewayPin(), pool.ID, time.Hour, 1, "e2e kill", "")
	if err != nil {
		t.Fatal(err)
	}
	m := newMachine(t, "kill-01")
	nodeID := m.mustJoin(gw.url, testenv.WriteFile(t, "token", token))
	bcd := m.node()
	eventually(t, 60*time.Second, func() bool {
		n, err := d.st.NodeGet(ctx, nodeID)
		return err == nil && n.State == store.NodeReady
	}, func() string { return "node " + nodeID + " not ready" })

	// A command that runs for ten minutes; its deadline is twenty.
	const marker = "600.4242"
	resp := &apiv1.CreateCommandsResponse{}
	if err := d.admin.Call(ctx, "commands.create", &apiv1.CreateCommandsRequest{NodeIds: []string{nodeID}, Kind: "exec",
		Exec: &apiv1.ExecSpec{Argv: []string{"sleep", marker}}, Timeout: durationpb.New(20 * time.Minute)}, resp); err != nil {
		t.Fatal(err)
	}
	id := resp.GetCommands()[0].GetId()
	eventually(t, 60*time.Second, func() bool {
		c, err := d.st.CommandGet(ctx, id)
		return err == nil && c.State == store.CommandRunning
	}, func() string { return "command " + id + " not running" })

	killed := time.Now()
	gw.p.Kill()
	bcd.Kill()
	if !orphanRunning(marker) {
		t.Fatal("the command's process did not outlive bcd: the test would not show it is ended later")
	}
	eventually(t, gatewayLeaseTTL+30*time.Second+20*time.Second, func() bool {
		c, err := d.st.CommandGet(ctx, id)
		return err == nil && c.State == store.CommandLost
	}, func() string {
		c, _ := d.st.CommandGet(ctx, id)
		return "command still " + c.State
	})
	took := time.Since(killed)
	t.Logf("command %s lost %v after kill -9 of its gateway and node", id, took.Round(time.Millisecond))
	if took > gatewayLeaseTTL+30*time.Second {
		t.Errorf("command lost %v after the kill, want within the gateway lease TTL plus 30 s (%v)", took, gatewayLeaseTTL+30*time.Second)
	}
	if _, err := d.st.SessionGet(ctx, nodeID); err == nil {
		t.Error("the dead gateway's session row is still there")
	}

	// bcd comes back on the same data directory: it recognises the
	// command it recorded and ends the process group left behind.
	m.node()
	eventually(t, 60*time.Second, func() bool { return !orphanRunning(marker) },
		func() string { return "the restarted bcd left the orphaned command running" })
}

// orphanRunning reports whether a process whose command line holds marker
// runs.
func orphanRunning(marker string) bool {
	out, err := exec.Command("pgrep", "-f", "sleep "+marker).Output()
	return err == nil && strings.TrimSpace(string(out)) != ""
}
