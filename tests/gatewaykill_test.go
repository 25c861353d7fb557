package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
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

	m, nodeID := d.joinMachine("kill-01", gw)
	bcd := m.node()
	d.waitSession(nodeID, gw)

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

// TestNodeReachesAGatewayAddedAfterItJoined: a node joined while only
// gateway A existed; B starts; A is drained (SIGTERM) and removed for good.
// The node moves to B, and a restarted bcd, whose join-time list names A
// alone, reaches B from the list it saved from B's Welcome.
func TestNodeReachesAGatewayAddedAfterItJoined(t *testing.T) {
	t.Parallel()
	d := newSplitDeployment(t, 1, 1)
	a := d.gateways[0]
	m, nodeID := d.joinMachine("moved-01", a)
	bcd := m.node()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bcd's output:\n%s", bcd.Output())
		}
	})
	d.waitSession(nodeID, a)

	b := d.startGateway("gateway-2")
	a.p.Signal(syscall.SIGTERM)
	if code := a.p.Wait(30 * time.Second); code != 0 {
		t.Errorf("%s exited %d after SIGTERM, want 0", a.name, code)
	}
	d.waitSession(nodeID, b)

	// The saved list: B's Welcome named B; the join named A alone. The
	// session row is written before the Welcome that bcd saves the list
	// from, so the file may lag the row a moment.
	var info struct {
		Gateways []string               `json:"gateways"`
		Known    []session.KnownGateway `json:"known_gateways"`
	}
	eventually(t, 30*time.Second, func() bool {
		raw, err := os.ReadFile(filepath.Join(m.dataDir, identity.InfoFile))
		if err != nil || json.Unmarshal(raw, &info) != nil {
			return false // written by rename: a reader sees the old or the new file
		}
		return slices.ContainsFunc(info.Known, func(k session.KnownGateway) bool { return k.URL == b.url })
	}, func() string { return fmt.Sprintf("identity.json known gateways %+v, want %s", info.Known, b.url) })
	if !slices.Equal(info.Gateways, []string{a.url}) {
		t.Fatalf("identity.json join-time gateways %v, want [%s]", info.Gateways, a.url)
	}
	bcd.Kill()
	m.node()
	d.waitSession(nodeID, b)
}

// joinMachine joins a new machine named name through gateway g with a
// one-use token of a pool of its own, and returns it and its node id.
func (d *splitDeployment) joinMachine(name string, g *splitProc) (*machine, string) {
	d.t.Helper()
	ctx := context.Background()
	site, err := d.st.SiteCreate(ctx, &store.SiteCreateParams{Name: name, Region: "default"})
	if err != nil {
		d.t.Fatal(err)
	}
	pool, err := d.st.PoolCreate(ctx, &store.PoolCreateParams{Name: name, SiteID: site.ID})
	if err != nil {
		d.t.Fatal(err)
	}
	bundle, err := bootstrap.LoadBundle(ctx, d.st, testSecret)
	if err != nil {
		d.t.Fatal(err)
	}
	token, _, err := api.CreateJoinToken(ctx, d.st, bundle.GatewayPin(), pool.ID, time.Hour, 1, "e2e "+name, "")
	if err != nil {
		d.t.Fatal(err)
	}
	m := newMachine(d.t, name)
	return m, m.mustJoin(g.url, testenv.WriteFile(d.t, "token", token))
}

// waitSession waits until node nodeID is ready with its session on g.
func (d *splitDeployment) waitSession(nodeID string, g *splitProc) {
	d.t.Helper()
	ctx := context.Background()
	eventually(d.t, 90*time.Second, func() bool {
		n, err := d.st.NodeGet(ctx, nodeID)
		s, serr := d.st.SessionGet(ctx, nodeID)
		return err == nil && serr == nil && n.State == store.NodeReady && s.GatewayID == g.id
	}, func() string { return "node " + nodeID + " not ready on " + g.name })
}

// startGateway starts one more gateway process and waits for its row.
func (d *splitDeployment) startGateway(name string) *splitProc {
	d.t.Helper()
	g := &splitProc{name: name, p: d.start(name, "gateway")}
	g.url = g.p.WaitLine(`msg="Gateway listening" .*public_url=(\S+)`, 60*time.Second)[1]
	eventually(d.t, 20*time.Second, func() bool {
		gws, err := d.st.GatewayList(context.Background())
		if err != nil {
			d.t.Fatal(err)
		}
		for _, row := range gws {
			if row.Address == g.url {
				g.id = row.ID
			}
		}
		return g.id != ""
	}, func() string { return name + " has no row in gateways" })
	d.gateways = append(d.gateways, g)
	return g
}

// orphanRunning reports whether a process whose command line holds marker
// runs.
func orphanRunning(marker string) bool {
	out, err := exec.Command("pgrep", "-f", "sleep "+marker).Output()
	return err == nil && strings.TrimSpace(string(out)) != ""
}
