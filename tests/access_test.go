package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// accessCloseWithin is how soon after an access request's end the shells
// its grant allowed must be closed (the checks of open calls run every
// second).
const accessCloseWithin = 5 * time.Second

// rootShellPolicy makes root shells on pool a requestable by the operator
// token requester, approved by admins, for up to 4 hours.
func rootShellPolicy(requester string) string {
	return fmt.Sprintf(`policies:
  - name: root-shell-pool-a
    description: root shells on pool a, on request
    request:
      requesters: {tokens: [%s]}
      approvers: {roles: [admin]}
      maxDuration: 4h
    statements:
      - effect: allow
        actions: [nodes.shell, nodes.shellAsRoot]
        resources: {pools: [a]}
tests:
  - name: granted, a root shell on a
    caller: {token: %s, role: operator, granted: [root-shell-pool-a]}
    action: nodes.shellAsRoot
    resource: {pool: a}
    expect: allow
  - name: not granted, none
    caller: {token: %s, role: operator}
    action: nodes.shellAsRoot
    resource: {pool: a}
    expect: deny
`, requester, requester, requester)
}

// TestAccessRequestRootShell (issue 47, Done when): an operator requests
// asRoot shells on pool a for 2 minutes; an admin approves; a root shell
// opens; at the end of the 2 minutes the shell is closed and a new one is
// refused; the requester cannot approve their own request. With a real
// bcd: before the request the operator's root shell is refused; the
// operator asks through the CLI and its own approval is refused; the
// admin approves through the CLI; nodes shell --as-root opens and id -u
// prints 0; the shell is told a minute before the end, closed within 5 s
// of it with one line naming the request, and a new root shell is
// refused; each step's audit row and event are there.
func TestAccessRequestRootShell(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d, tt := recordingTarget(t, "access-root", deploymentConfig{})
	admin := tt.admin

	// Pool a, holding the node.
	def, err := admin.PoolsGet(ctx, &apiv1.PoolRequest{Pool: "default"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.PoolsCreate(ctx, &apiv1.CreatePoolRequest{Name: "a", Site: def.SiteId}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.NodesMove(ctx, &apiv1.MoveNodeRequest{Id: tt.nodeID, Tenant: store.RootTenant, Pool: "a"}); err != nil {
		t.Fatal(err)
	}
	opSecret, opTok, err := iam.Create(ctx, d.st, iam.CreateParams{Role: store.RoleOperator, Description: "access operator"})
	if err != nil {
		t.Fatal(err)
	}
	op := &client.Client{BaseURL: d.api + "/api", Token: opSecret}
	asOp := func(args ...string) []string { return append(args, "--server", d.api, "--token", opSecret) }
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(rootShellPolicy(opTok.ID)), 0o600); err != nil {
		t.Fatal(err)
	}
	d.cli("policy", "apply", policyFile)

	rootShellRefused := func(when string) {
		t.Helper()
		_, err := op.TunnelsCreate(ctx, &apiv1.CreateTunnelRequest{Node: tt.nodeID, Kind: "shell", AsRoot: true})
		var ae *client.Error
		if !errors.As(err, &ae) || ae.Code != apiv1.CodePermissionDenied {
			t.Fatalf("%s: the operator's root shell ticket: %v, want PERMISSION_DENIED", when, err)
		}
		code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, "--config", d.cfgFile, "nodes", "shell", tt.nodeID, "--as-root",
			"--server", d.api, "--token", opSecret)
		if code == 0 || !strings.Contains(stdout+stderr, "PERMISSION_DENIED") {
			t.Fatalf("%s: nodes shell --as-root as the operator: exit %d\n%s%s\nwant a refusal", when, code, stdout, stderr)
		}
	}
	rootShellRefused("before the request")

	// The operator asks, through the CLI; its own approval is refused.
	out := d.cli(asOp("access", "request", "--policy", "root-shell-pool-a", "--resource", "pool:a", "--for", "2m",
		"--reason", "driver wedged a GPU; need nvidia-smi -r")...)
	m := regexp.MustCompile(`access request (acr_\S+) is pending`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("access request printed %q", out)
	}
	id := m[1]
	code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, append([]string{"--config", d.cfgFile}, asOp("access", "approve", id)...)...)
	if code != 1 || !strings.Contains(stderr, "PERMISSION_DENIED") || !strings.Contains(stderr, "may not approve its own request") {
		t.Fatalf("the operator's own approval: exit %d\n%s%s\nwant exit 1, PERMISSION_DENIED: may not approve its own request", code, stdout, stderr)
	}
	rootShellRefused("while the request is pending")
	var pending struct {
		Requests []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"requests"`
	}
	d.cliJSON(&pending, "access", "list", "--state", "pending")
	if len(pending.Requests) != 1 || pending.Requests[0].ID != id {
		t.Fatalf("access list --state pending: %+v, want %s", pending.Requests, id)
	}

	// The admin approves through the CLI: the operator's root shell opens.
	out = d.cli("access", "approve", id)
	if !strings.Contains(out, "access request "+id+" approved") {
		t.Fatalf("access approve printed %q", out)
	}
	req, err := d.st.AccessRequestGet(ctx, id, nil)
	if err != nil || req.State != store.AccessApproved || req.End == nil {
		t.Fatalf("after the approval: %+v, %v", req, err)
	}
	end := *req.End
	if got := req.End.Sub(*req.Start); got != 2*time.Minute {
		t.Fatalf("the access lasts %v, want 2m", got)
	}
	target := *tt
	target.env = []string{"BETTER_COMPUTE_URL=" + d.api, "BETTER_COMPUTE_TOKEN=" + opSecret}
	sh := startShell(t, &target, 24, 80, "--as-root")
	sh.send(t, "echo uid=$(id -u)\r")
	sh.expect(t, regexp.MustCompile(`uid=0\r`))
	// The tunnel's audit row names the request that granted it.
	testenv.Eventually(t, 10*time.Second, func() bool {
		rows, err := d.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "tunnels.open", Outcome: "ok", Limit: 20})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if r.Actor == "token:"+opTok.ID && strings.Contains(string(r.Details), id) {
				return true
			}
		}
		return false
	}, func() string { return "no tunnels.open audit row of the operator names " + id })

	// A minute before the end the shell is told, once; at the end it is
	// closed with one line naming the request.
	notice := regexp.MustCompile(`access request ` + id + ` ends at ` + regexp.QuoteMeta(end.UTC().Format(time.RFC3339)) + `; this shell closes then`)
	if !sh.wait(notice, time.Until(end.Add(-api.GrantNoticeBefore))+20*time.Second) {
		t.Fatalf("the shell was not told of the end a minute before it:\n%s", sh.output())
	}
	if told := time.Now(); told.Before(end.Add(-api.GrantNoticeBefore)) {
		t.Fatalf("the shell was told at %v, more than a minute before the end %v", told, end)
	}
	code = sh.exit(t, time.Until(end)+30*time.Second)
	closed := time.Now()
	if closed.Before(end) {
		t.Fatalf("the shell closed at %v, before the access's end %v:\n%s", closed, end, sh.output())
	}
	if late := closed.Sub(end); late > accessCloseWithin {
		t.Fatalf("the shell closed %v after the access's end, want within %v\n%s", late, accessCloseWithin, sh.output())
	}
	line := "access ended: access request " + id + " ended at " + end.UTC().Format(time.RFC3339)
	if !sh.wait(regexp.MustCompile(regexp.QuoteMeta(line)), 10*time.Second) || code == 0 {
		t.Fatalf("nodes shell exited %d at the end; want non-zero with %q:\n%s", code, line, sh.output())
	}
	t.Logf("the shell closed %v after the access's end", closed.Sub(end).Round(time.Millisecond))
	rootShellRefused("after the end")

	// Each step is an audit row and an event.
	testenv.Eventually(t, 20*time.Second, func() bool {
		r, err := d.st.AccessRequestGet(ctx, id, nil)
		return err == nil && r.State == store.AccessExpired && len(auditRows(t, d, "access.ended")) == 1
	}, func() string { return "the sweep never stored the request expired with its access.ended audit row" })
	type row struct{ actor, outcome string }
	want := map[string][]row{
		"access.request": {{"token:" + opTok.ID, "ok"}},
		"access.approve": {{"token:" + opTok.ID, apiv1.CodePermissionDenied}, {"", "ok"}},
		"access.ended":   {{"access", "ok"}},
		"tunnels.close":  {{"token:" + opTok.ID, "ok"}},
	}
	for action, rows := range want {
		got := auditRows(t, d, action)
		for _, w := range rows {
			found := false
			for _, g := range got {
				found = found || ((w.actor == "" || g.Actor == w.actor) && g.Outcome == w.outcome)
			}
			if !found {
				t.Errorf("no %s audit row by %q with outcome %s among %d", action, w.actor, w.outcome, len(got))
			}
		}
	}
	entries, err := d.st.OutboxList(ctx, 0, store.MaxListLimit)
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, e := range entries {
		if e.Key != id {
			continue
		}
		var env struct {
			Data events.AccessData `json:"data"`
		}
		if err := json.Unmarshal(e.Payload, &env); err != nil {
			t.Fatal(err)
		}
		steps = append(steps, strings.TrimPrefix(e.Topic, "com.better-compute.")+" "+env.Data.State)
	}
	if got := strings.Join(steps, ", "); got != "access.requested pending, access.approved approved, access.ended expired" {
		t.Fatalf("the request's events: %s", got)
	}
}

// TestAccessRequestNotARequester: an operator that the policy's
// requesters do not bind cannot ask for it (PERMISSION_DENIED, exit 1,
// audited), and nothing is stored.
func TestAccessRequestNotARequester(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newDeployment(t, backendSQLite)
	_, bound, err := iam.Create(ctx, d.st, iam.CreateParams{Role: store.RoleOperator, Description: "the requester"})
	if err != nil {
		t.Fatal(err)
	}
	otherSecret, other, err := iam.Create(ctx, d.st, iam.CreateParams{Role: store.RoleOperator, Description: "another operator"})
	if err != nil {
		t.Fatal(err)
	}
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(rootShellPolicy(bound.ID)), 0o600); err != nil {
		t.Fatal(err)
	}
	d.cli("policy", "apply", policyFile)
	code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, "--config", d.cfgFile, "access", "request", "--policy", "root-shell-pool-a",
		"--for", "2m", "--reason", "me too", "--server", d.api, "--token", otherSecret)
	if code != 1 || !strings.Contains(stderr, "PERMISSION_DENIED") || !strings.Contains(stderr, "request.requesters do not bind you") {
		t.Fatalf("another operator's request: exit %d\n%s%s\nwant exit 1, PERMISSION_DENIED naming the requesters", code, stdout, stderr)
	}
	rs, err := d.st.AccessRequestList(ctx, &store.AccessRequestListParams{})
	if err != nil || len(rs) != 0 {
		t.Fatalf("requests after the refusal: %d, %v", len(rs), err)
	}
	refused := false
	for _, e := range auditRows(t, d, "access.request") {
		refused = refused || (e.Actor == "token:"+other.ID && e.Outcome == apiv1.CodePermissionDenied)
	}
	if !refused {
		t.Fatal("the refused access.request has no audit row")
	}
}
