package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/store"
)

// TestRemediationMethods: viewers read cases, operators pause, resume,
// return and reset breakers, each audited under the caller; return puts the
// node back in service and closes the case; bad input is a clear 400/404.
func TestRemediationMethods(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	site, err := f.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := f.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "gpus", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_r", PoolID: pool.ID, Hostname: "r", MachineID: "r"}); err != nil {
		t.Fatal(err)
	}
	c, err := f.st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_r", State: store.RemediationDetected, Finding: "xid",
		Resolution: "ESCALATE", XID: 48, Action: "escalate"}, "remediation:w")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: "node_r", Reason: store.DisruptionQuarantined, Owner: "remediation:" + c.ID}); err != nil {
		t.Fatal(err)
	}
	if err := f.st.NodeSetCordoned(ctx, "node_r", true); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationEscalated, Actor: "remediation:w"}); err != nil {
		t.Fatal(err)
	}
	viewer, operator := f.token(store.RoleViewer, 0), f.token(store.RoleOperator, 0)

	r := f.call("remediation.list", viewer, `{"pool":"gpus","openOnly":true}`, peer)
	if list, _ := r.Body["remediations"].([]any); r.Code != 200 || len(list) != 1 {
		t.Fatalf("list: %d %v", r.Code, r.Body)
	}
	if r := f.call("remediation.get", viewer, `{"id":"`+c.ID+`"}`, peer); r.Code != 200 || r.Body["state"] != "escalated" || r.Body["xid"] != float64(48) {
		t.Fatalf("get: %d %v", r.Code, r.Body)
	}
	wantCode(t, f.call("remediation.pause", viewer, `{"id":"`+c.ID+`"}`, peer), 403, "PERMISSION_DENIED", "")
	wantCode(t, f.call("remediation.list", viewer, `{"state":"bogus"}`, peer), 400, "INVALID_ARGUMENT", "state")
	wantCode(t, f.call("remediation.get", viewer, `{"id":"rem_none"}`, peer), 404, "NOT_FOUND", "id")
	wantCode(t, f.call("remediation.return", operator, `{"id":"rem_none"}`, peer), 404, "NOT_FOUND", "id")
	wantCode(t, f.call("remediation.resetBreaker", operator, `{"pool":"none"}`, peer), 404, "NOT_FOUND", "pool")
	// remediation.history (viewer): a node's memory; neither a node nor a
	// GPU, a GPU UUID with spaces or past its bound, a bad window or limit
	// are 400s naming the field.
	if r := f.call("remediation.history", viewer, `{"nodeId":"node_r"}`, peer); r.Code != 200 {
		t.Fatalf("history: %d %v", r.Code, r.Body)
	} else if cs, _ := r.Body["cases"].([]any); len(cs) != 1 {
		t.Fatalf("history of node_r: %v, want its one case", r.Body)
	}
	wantCode(t, f.call("remediation.history", viewer, `{}`, peer), 400, "INVALID_ARGUMENT", "nodeId")
	wantCode(t, f.call("remediation.history", viewer, `{"gpuUuid":"GPU with spaces"}`, peer), 400, "INVALID_ARGUMENT", "gpuUuid")
	wantCode(t, f.call("remediation.history", viewer, `{"gpuUuid":"`+strings.Repeat("x", 129)+`"}`, peer), 400, "INVALID_ARGUMENT", "gpuUuid")
	wantCode(t, f.call("remediation.history", viewer, `{"nodeId":"node_r","window":"0.5s"}`, peer), 400, "INVALID_ARGUMENT", "window")
	wantCode(t, f.call("remediation.history", viewer, `{"nodeId":"node_r","limit":1001}`, peer), 400, "INVALID_ARGUMENT", "limit")

	if r := f.call("remediation.pause", operator, `{"id":"`+c.ID+`"}`, peer); r.Code != 200 || r.Body["paused"] != true {
		t.Fatalf("pause: %d %v", r.Code, r.Body)
	}
	if r := f.call("remediation.resume", operator, `{"id":"`+c.ID+`"}`, peer); r.Code != 200 || r.Body["paused"] != nil {
		t.Fatalf("resume: %d %v", r.Code, r.Body)
	}
	if r := f.call("remediation.return", operator, `{"id":"`+c.ID+`","note":"GPU replaced"}`, peer); r.Code != 200 || r.Body["state"] != "returned" {
		t.Fatalf("return: %d %v", r.Code, r.Body)
	}
	wantCode(t, f.call("remediation.return", operator, `{"id":"`+c.ID+`"}`, peer), 409, "CONFLICT", "id")
	n, err := f.st.NodeGet(ctx, "node_r")
	if err != nil {
		t.Fatal(err)
	}
	if n.Cordoned || n.Disruption != "" {
		t.Fatalf("returned node: cordoned %v, disruption %q", n.Cordoned, n.Disruption)
	}
	if r := f.call("remediation.resetBreaker", operator, `{"pool":"gpus"}`, peer); r.Code != 200 || r.Body["poolId"] != pool.ID {
		t.Fatalf("reset: %d %v", r.Code, r.Body)
	}
	// Each change audited under the operator's token, by the API and by the store's move.
	rows, err := f.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "remediation.", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, a := range rows {
		seen[a.Action]++
	}
	for _, action := range []string{"remediation.pause", "remediation.resume", "remediation.return", "remediation.resetBreaker", "remediation.returned"} {
		if seen[action] == 0 {
			t.Errorf("no audit row %s: %v", action, seen)
		}
	}
}
