package tests

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// grantCloseWithin is how soon after a reservation's end the shells its
// grant allowed must be closed (issue 48).
const grantCloseWithin = 5 * time.Second

// TestReservationAccessShell: a reservation of a real bcd node in the
// root tenant's pool, made with --grant shell for tenant team-a (CLI
// reservations create --grant shell --tenant team-a), gives team-a's
// operator a shell there for exactly its window (and exec: --grant
// shell,exec): refused before the
// start; during it nodes shell opens on the reserved node (with the
// one-line notice that the window ends within a minute) and is refused
// on an unreserved node of the same pool, and a port forward (not
// granted) is refused; a viewer of team-a gets nothing; at the end the
// open shell is closed within 5 s with one line saying why, and a new
// one is refused.
func TestReservationAccessShell(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, tt := recordingTarget(t, "res-access", deploymentConfig{})
	admin := tt.admin

	node := reservableNode(t, d.st, tt.nodeID)
	const unreserved = "node_unreserved"
	if _, err := d.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: unreserved, PoolID: node.PoolID, Hostname: unreserved, MachineID: "m-unreserved"}); err != nil {
		t.Fatal(err)
	}

	// team-a's operator and viewer, and another tenant's operator.
	team, err := admin.TenantsCreate(ctx, &apiv1.CreateTenantRequest{Name: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.TenantsCreate(ctx, &apiv1.CreateTenantRequest{Name: "team-b"}); err != nil {
		t.Fatal(err)
	}
	tokenOf := func(tenant, role string) (*client.Client, string) {
		resp, err := admin.TokensCreate(ctx, &apiv1.CreateAPITokenRequest{Role: role, Tenant: tenant, Description: role + " of " + tenant})
		if err != nil {
			t.Fatal(err)
		}
		return &client.Client{BaseURL: d.api + "/api", Token: resp.Token}, resp.Token
	}
	opA, opAToken := tokenOf(team.Id, store.RoleOperator)
	viewerA, _ := tokenOf(team.Id, store.RoleViewer)
	opB, _ := tokenOf("team-b", store.RoleOperator)
	shellTarget := *tt
	shellTarget.env = []string{"BETTER_COMPUTE_URL=" + d.api, "BETTER_COMPUTE_TOKEN=" + opAToken}
	// refusedShell is nil when tunnels.create of kind on nodeID is refused
	// to c: NOT_FOUND as for any node outside its subtree, or, for a
	// viewer, PERMISSION_DENIED (tunnels need an operator).
	refusedShell := func(c *client.Client, nodeID, kind string) error {
		req := &apiv1.CreateTunnelRequest{Node: nodeID, Kind: kind}
		if kind == "port" {
			req.Port = 22
		}
		_, err := c.TunnelsCreate(ctx, req)
		if ae := (*client.Error)(nil); !errors.As(err, &ae) || (ae.Code != apiv1.CodeNotFound && ae.Code != apiv1.CodePermissionDenied) {
			return fmt.Errorf("tunnels.create %s on %s: %v, want NOT_FOUND (or PERMISSION_DENIED for a viewer)", kind, nodeID, err)
		}
		return nil
	}

	// The window starts 10 s ahead (room for the checks before it on a
	// busy machine) and lasts 20 s: within the notice's minute.
	start := time.Now().Add(10 * time.Second).UTC().Truncate(time.Second)
	end := start.Add(20 * time.Second)
	out := d.cli("reservations", "create", "--pool", node.PoolID, "--gpus", "1", "--owner", "team-a",
		"--start", start.Format(time.RFC3339), "--end", end.Format(time.RFC3339), "--grant", "shell,exec", "--tenant", "team-a")
	m := regexp.MustCompile(`reservation (res_\S+) is`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("reservations create printed %q", out)
	}
	resID := m[1]
	res, err := admin.ReservationsGet(ctx, &apiv1.GetReservationRequest{Id: resID})
	if err != nil || res.TenantId != team.Id || strings.Join(res.Grants, ",") != "exec,shell" {
		t.Fatalf("reservations get = %+v, %v; want tenant %s, grants exec,shell", res, err, team.Id)
	}
	// A right not in the set is refused, with the field named.
	_, err = admin.ReservationsCreate(ctx, &apiv1.CreateReservationRequest{Pool: node.PoolID, Gpus: 1, Owner: "x",
		End: timestamppb.New(time.Now().Add(time.Hour)), Grants: []string{"root"}})
	if ae := (*client.Error)(nil); !errors.As(err, &ae) || ae.Code != apiv1.CodeInvalidArgument || ae.Field != "grants" {
		t.Fatalf("reservations.create with grant root: %v, want INVALID_ARGUMENT on grants", err)
	}

	// Before the start: refused (placed or not, the window has not come).
	if err := refusedShell(opA, tt.nodeID, "shell"); err != nil {
		t.Fatalf("before the start: %v", err)
	}
	if now := time.Now(); !now.Before(start) {
		t.Fatalf("the check before the start ran at %v, after the start %v: the machine is too slow for this window", now, start)
	}

	// During it: the shell opens on the reserved node.
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, err := opA.TunnelsCreate(ctx, &apiv1.CreateTunnelRequest{Node: tt.nodeID, Kind: "shell"})
		return err == nil
	}, func() string {
		r, _ := admin.ReservationsGet(ctx, &apiv1.GetReservationRequest{Id: resID})
		return fmt.Sprintf("team-a's operator never got a shell ticket on the reserved node (reservation %+v)", r)
	})
	if now := time.Now(); now.Before(start) {
		t.Fatalf("a shell ticket at %v, before the start %v", now, start)
	}
	sh := startShell(t, &shellTarget, 24, 80)
	sh.send(t, "echo granted-$((6*7))\r")
	sh.expect(t, regexp.MustCompile(`granted-42\r`))
	// The window ends within a minute: the terminal was told, in one line.
	sh.expect(t, regexp.MustCompile(`reservation `+resID+` ends at `+regexp.QuoteMeta(end.Format(time.RFC3339))+`; this shell closes then`))

	// The shell's audit row names the reservation that granted it.
	var opened map[string]any
	testenv.Eventually(t, 10*time.Second, func() bool {
		rows, err := d.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "tunnels.open", Limit: 20})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.Outcome == "ok" && strings.Contains(string(r.Details), resID) {
				opened = map[string]any{"details": string(r.Details)}
				return true
			}
		}
		return false
	}, func() string { return "no tunnels.open audit row names reservation " + resID })
	t.Logf("tunnels.open audit: %v", opened)
	// nodes.get shows the reserved node to the holder's operator now.
	if _, err := opA.NodesGet(ctx, &apiv1.NodeRequest{Id: tt.nodeID}); err != nil {
		t.Errorf("nodes.get of the reserved node by team-a's operator during the window: %v", err)
	}
	// exec (granted): a command on the reserved node, which its maker
	// reads; none on the unreserved node.
	exec := func(nodeID string) (*apiv1.CreateCommandsResponse, error) {
		return opA.CommandsCreate(ctx, &apiv1.CreateCommandsRequest{NodeIds: []string{nodeID}, Kind: "exec",
			Exec: &apiv1.ExecSpec{Argv: []string{"echo", "exec-granted"}}})
	}
	cmds, err := exec(tt.nodeID)
	if err != nil || len(cmds.Commands) != 1 {
		t.Fatalf("commands.create exec on the reserved node by team-a's operator: %+v, %v", cmds, err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		got, err := opA.CommandsGet(ctx, &apiv1.GetCommandRequest{Id: cmds.Commands[0].Id, IncludeOutput: true})
		return err == nil && got.Command.State == store.CommandSucceeded && strings.Contains(got.Command.Stdout, "exec-granted")
	}, func() string {
		got, err := opA.CommandsGet(ctx, &apiv1.GetCommandRequest{Id: cmds.Commands[0].Id, IncludeOutput: true})
		return fmt.Sprintf("team-a's exec never succeeded with its output: %+v, %v", got, err)
	})
	if _, err := exec(unreserved); notFound(err) != nil {
		t.Errorf("commands.create exec on the unreserved node: %v", notFound(err))
	}
	// The same token: refused on an unreserved node of the same pool, and
	// for a port forward (not granted); a viewer of team-a and another
	// tenant's operator get nothing on the reserved node.
	for what, err := range map[string]error{
		"the unreserved node":                   refusedShell(opA, unreserved, "shell"),
		"a port forward":                        refusedShell(opA, tt.nodeID, "port"),
		"a viewer of team-a":                    refusedShell(viewerA, tt.nodeID, "shell"),
		"another tenant's operator":             refusedShell(opB, tt.nodeID, "shell"),
		"nodes.get of the unreserved node (NF)": func() error { _, err := opA.NodesGet(ctx, &apiv1.NodeRequest{Id: unreserved}); return notFound(err) }(),
	} {
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	code, stdout, stderr := testenv.Run(t, shellTarget.env, "", tt.bc, "nodes", "shell", unreserved)
	if code == 0 || !strings.Contains(stdout+stderr, "no node "+unreserved) {
		t.Errorf("nodes shell %s as team-a's operator: exit %d\n%s%s\nwant a refusal naming the node", unreserved, code, stdout, stderr)
	}

	// At the end: the open shell closes within 5 s, with one line.
	code = sh.exit(t, time.Until(end)+30*time.Second)
	closed := time.Now()
	if late := closed.Sub(end); late > grantCloseWithin {
		t.Fatalf("the shell closed %v after the reservation's end, want within %v\n%s", late, grantCloseWithin, sh.output())
	}
	if closed.Before(end) {
		t.Fatalf("the shell closed at %v, before the reservation's end %v:\n%s", closed, end, sh.output())
	}
	// The terminal's last bytes may still be on their way from the pty.
	ended := sh.wait(regexp.MustCompile(regexp.QuoteMeta("access ended: no reservation grants shell on node "+tt.nodeID)), 10*time.Second)
	if code == 0 || !ended {
		t.Fatalf("nodes shell exited %d at the end; want non-zero with the access-ended line:\n%s", code, sh.output())
	}
	t.Logf("the shell closed %v after the reservation's end", closed.Sub(end).Round(time.Millisecond))
	if err := refusedShell(opA, tt.nodeID, "shell"); err != nil {
		t.Fatalf("after the end: %v", err)
	}
}

// reservableNode gives the real node nodeID eight GPUs in the store
// (this machine has none; bcd reports its inventory again only every 5
// minutes), so that the placer can reserve it, and returns it.
func reservableNode(t *testing.T, st store.Store, nodeID string) *store.Node {
	t.Helper()
	ctx := context.Background()
	testenv.Eventually(t, 30*time.Second, func() bool {
		inv, err := st.NodeInventories(ctx, []string{nodeID})
		return err == nil && len(inv[nodeID]) > 0
	}, func() string { return "bcd's inventory was never stored" })
	inv := &sessionv1.Inventory{}
	for g := range 8 {
		inv.Gpus = append(inv.Gpus, &sessionv1.GPU{Index: uint32(g), Name: "NVIDIA H100 80GB HBM3",
			Uuid: fmt.Sprintf("GPU-acc-%d", g), MemoryTotalBytes: 81559 << 20})
	}
	b, err := protojson.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.NodeSetInventory(ctx, nodeID, b, "test-gpus"); err != nil {
		t.Fatal(err)
	}
	node, err := st.NodeGet(ctx, nodeID)
	if err != nil {
		t.Fatal(err)
	}
	return node
}

// TestReservationAccessCancel: a granted shell on a reservation that
// began already stays open across reservations extend (the rights move
// with the end; no notice, the end is far) and closes within 5 s of
// reservations cancel, with its one line; a new one is refused.
func TestReservationAccessCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, tt := recordingTarget(t, "res-cancel", deploymentConfig{})
	node := reservableNode(t, d.st, tt.nodeID)
	team, err := tt.admin.TenantsCreate(ctx, &apiv1.CreateTenantRequest{Name: "team-c"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tt.admin.TokensCreate(ctx, &apiv1.CreateAPITokenRequest{Role: store.RoleOperator, Tenant: team.Id, Description: "team-c"})
	if err != nil {
		t.Fatal(err)
	}
	op := &client.Client{BaseURL: d.api + "/api", Token: resp.Token}
	res, err := tt.admin.ReservationsCreate(ctx, &apiv1.CreateReservationRequest{Pool: node.PoolID, Gpus: 1, Owner: "team-c",
		End: timestamppb.New(time.Now().Add(10 * time.Minute)), Grants: []string{"shell"}, Tenant: "team-c"})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		_, err := op.TunnelsCreate(ctx, &apiv1.CreateTunnelRequest{Node: tt.nodeID, Kind: "shell"})
		return err == nil
	}, func() string { return "team-c's operator never got a shell ticket on the reserved node" })
	target := *tt
	target.env = []string{"BETTER_COMPUTE_URL=" + d.api, "BETTER_COMPUTE_TOKEN=" + resp.Token}
	sh := startShell(t, &target, 24, 80)
	sh.send(t, "echo before-$((1+1))\r")
	sh.expect(t, regexp.MustCompile(`before-2\r`))
	d.cli("reservations", "extend", res.Id, "--end", time.Now().Add(20*time.Minute).UTC().Format(time.RFC3339))
	sh.send(t, "echo extended-$((2+2))\r")
	sh.expect(t, regexp.MustCompile(`extended-4\r`))
	if strings.Contains(sh.output(), "this shell closes then") {
		t.Fatalf("a notice with the end 10 minutes away:\n%s", sh.output())
	}

	// Timed from before the CLI starts: an upper bound of the close's lag.
	cancelled := time.Now()
	d.cli("reservations", "cancel", res.Id, "--reason", "done early")
	code := sh.exit(t, 30*time.Second)
	if took := time.Since(cancelled); took > grantCloseWithin {
		t.Fatalf("the shell closed %v after reservations cancel, want within %v\n%s", took, grantCloseWithin, sh.output())
	}
	ended := sh.wait(regexp.MustCompile(regexp.QuoteMeta("access ended: no reservation grants shell on node "+tt.nodeID)), 10*time.Second)
	if code == 0 || !ended {
		t.Fatalf("nodes shell exited %d at the cancel; want non-zero with the access-ended line:\n%s", code, sh.output())
	}
	t.Logf("the shell closed %v after reservations cancel began", time.Since(cancelled).Round(time.Millisecond))
	if _, err := op.TunnelsCreate(ctx, &apiv1.CreateTunnelRequest{Node: tt.nodeID, Kind: "shell"}); notFound(err) != nil {
		t.Fatalf("after the cancel: %v", notFound(err))
	}
}

// notFound is nil when err is the API's NOT_FOUND.
func notFound(err error) error {
	if ae := (*client.Error)(nil); errors.As(err, &ae) && ae.Code == apiv1.CodeNotFound {
		return nil
	}
	return fmt.Errorf("%v, want NOT_FOUND", err)
}
