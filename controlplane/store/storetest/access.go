package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

// testAccessRequests: a request is pending until decided; approve sets
// its start and end, deny its note; of two approvers at once one wins and
// the other is ErrConflict; a pending request older than 24 h reads
// expired and cannot be decided; revoke ends an approved request's access
// at once; the active grants are the approved requests whose end is
// ahead; the sweep stores expired ones once, each with access.ended and
// an audit row; one identity may hold 20 pending; lists filter by tenant,
// subtree, state and requester. Every step writes its event.
func testAccessRequests(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	t0 := time.Now().UTC().Truncate(time.Second)
	at := func(d time.Duration) *time.Time { v := t0.Add(d); return &v }
	child := must(st.TenantCreate(ctx, &store.TenantCreateParams{Name: "access-child", ParentID: store.RootTenant}))
	create := func(requester, tenant string, now *time.Time) *store.AccessRequest {
		return must(st.AccessRequestCreate(ctx, &store.AccessRequestCreateParams{TenantID: tenant, Requester: requester,
			RequesterName: "Ada", RequesterRole: store.RoleOperator, Policy: "root-shell", ScopeKind: store.AccessScopePool,
			ScopeID: "pool_a", ScopeName: "a", Duration: 2 * time.Minute, Reason: "fix the driver", Now: now}))
	}

	if _, err := st.AccessRequestGet(ctx, "acr_none", nil); err == nil {
		t.Fatal("get of an unknown request")
	} else {
		wantErr(t, err, store.ErrNotFound)
	}
	r := create("user:ada", store.RootTenant, at(0))
	if r.State != store.AccessPending || r.Requester != "user:ada" || r.RequesterName != "Ada" || r.ScopeID != "pool_a" ||
		r.Duration != 2*time.Minute || !r.CreatedAt.Equal(t0) || r.Start != nil || r.End != nil || r.DecidedAt != nil || len(r.ID) != len("acr_")+26 {
		t.Fatalf("created %+v", r)
	}
	got := must(st.AccessRequestGet(ctx, r.ID, at(time.Minute)))
	if got.State != store.AccessPending || got.Reason != "fix the driver" || got.ScopeKind != store.AccessScopePool {
		t.Fatalf("get %+v", got)
	}

	// Two approvers at once: one wins, the other is a conflict.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = st.AccessRequestDecide(ctx, &store.AccessRequestDecideParams{ID: r.ID, Approve: true,
				DecidedBy: fmt.Sprintf("token:approver%d", i), Now: at(time.Minute)})
		})
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("two approvers at once: %v and %v; want one success and one conflict", errs[0], errs[1])
	}
	for _, err := range errs {
		if err != nil {
			wantErr(t, err, store.ErrConflict)
		}
	}
	ok := must(st.AccessRequestGet(ctx, r.ID, at(time.Minute)))
	if ok.State != store.AccessApproved || ok.Start == nil || !ok.Start.Equal(t0.Add(time.Minute)) || !ok.End.Equal(t0.Add(3*time.Minute)) ||
		(ok.DecidedBy != "token:approver0" && ok.DecidedBy != "token:approver1") {
		t.Fatalf("approved %+v", ok)
	}
	if !ok.Active(t0.Add(2*time.Minute)) || ok.Active(t0.Add(3*time.Minute)) {
		t.Fatal("Active around the end")
	}
	_, err := st.AccessRequestDecide(ctx, &store.AccessRequestDecideParams{ID: r.ID, DecidedBy: "token:x", Note: "late", Now: at(time.Minute)})
	wantErr(t, err, store.ErrConflict)
	_, err = st.AccessRequestDecide(ctx, &store.AccessRequestDecideParams{ID: "acr_none", Approve: true, Now: at(time.Minute)})
	wantErr(t, err, store.ErrNotFound)

	// Active grants: approved and its end ahead, on every tenant.
	grantIDs := func(now *time.Time) []string {
		var out []string
		for _, g := range must(st.AccessGrantsActive(ctx, now)) {
			out = append(out, g.ID)
		}
		return out
	}
	if g := grantIDs(at(2 * time.Minute)); !slices.Equal(g, []string{r.ID}) {
		t.Fatalf("active grants during the access: %q", g)
	}
	if g := grantIDs(at(3 * time.Minute)); len(g) != 0 {
		t.Fatalf("active grants at the end: %q", g)
	}
	// At its end it reads expired and cannot be revoked.
	if e := must(st.AccessRequestGet(ctx, r.ID, at(3*time.Minute))); e.State != store.AccessExpired {
		t.Fatalf("at the end: %s", e.State)
	}
	_, err = st.AccessRequestRevoke(ctx, &store.AccessRequestRevokeParams{ID: r.ID, RevokedBy: "user:ada", Now: at(3 * time.Minute)})
	wantErr(t, err, store.ErrConflict)

	// Deny, and revoke an approved one before its end: its access ends
	// at the revocation.
	d := create("token:tok_b", child.ID, at(0))
	denied := must(st.AccessRequestDecide(ctx, &store.AccessRequestDecideParams{ID: d.ID, DecidedBy: "user:lead", DecidedByName: "Lead",
		Note: "not today", Now: at(time.Second)}))
	if denied.State != store.AccessDenied || denied.Note != "not today" || denied.Start != nil || denied.DecidedByName != "Lead" {
		t.Fatalf("denied %+v", denied)
	}
	v := create("token:tok_b", child.ID, at(0))
	must(st.AccessRequestDecide(ctx, &store.AccessRequestDecideParams{ID: v.ID, Approve: true, DecidedBy: "user:lead", Now: at(time.Second)}))
	if g := grantIDs(at(10 * time.Second)); !slices.Contains(g, v.ID) {
		t.Fatalf("active grants after the approval: %q", g)
	}
	rv := must(st.AccessRequestRevoke(ctx, &store.AccessRequestRevokeParams{ID: v.ID, RevokedBy: "token:tok_b", Note: "done", Now: at(20 * time.Second)}))
	if rv.State != store.AccessRevoked || !rv.End.Equal(t0.Add(20*time.Second)) || rv.Note != "done" || rv.DecidedBy != "token:tok_b" {
		t.Fatalf("revoked %+v", rv)
	}
	if g := grantIDs(at(21 * time.Second)); slices.Contains(g, v.ID) {
		t.Fatalf("active grants after the revocation: %q", g)
	}
	_, err = st.AccessRequestRevoke(ctx, &store.AccessRequestRevokeParams{ID: v.ID, RevokedBy: "token:tok_b", Now: at(21 * time.Second)})
	wantErr(t, err, store.ErrConflict)
	_, err = st.AccessRequestRevoke(ctx, &store.AccessRequestRevokeParams{ID: "acr_none", Now: at(21 * time.Second)})
	wantErr(t, err, store.ErrNotFound)
	// A pending request may be withdrawn.
	w := create("token:tok_b", child.ID, at(0))
	if x := must(st.AccessRequestRevoke(ctx, &store.AccessRequestRevokeParams{ID: w.ID, RevokedBy: "token:tok_b", Now: at(time.Second)})); x.State != store.AccessRevoked || x.End != nil {
		t.Fatalf("withdrawn %+v", x)
	}

	// A pending request expires undecided after 24 h.
	old := create("user:ada", store.RootTenant, at(-store.AccessPendingTTL))
	if e := must(st.AccessRequestGet(ctx, old.ID, at(0))); e.State != store.AccessExpired {
		t.Fatalf("a request 24 h old reads %s", e.State)
	}
	_, err = st.AccessRequestDecide(ctx, &store.AccessRequestDecideParams{ID: old.ID, Approve: true, DecidedBy: "token:x", Now: at(0)})
	wantErr(t, err, store.ErrConflict)

	// Lists: by tenant, subtree, state (as of now) and requester.
	list := func(p store.AccessRequestListParams) []string {
		var out []string
		for _, x := range must(st.AccessRequestList(ctx, &p)) {
			out = append(out, x.ID)
		}
		return out
	}
	if l := list(store.AccessRequestListParams{ListParams: store.ListParams{Within: child.Path}, Now: at(0)}); len(l) != 3 || slices.Contains(l, r.ID) {
		t.Fatalf("the child's subtree lists %q", l)
	}
	if l := list(store.AccessRequestListParams{TenantID: store.RootTenant, State: store.AccessExpired, Now: at(5 * time.Minute)}); !slices.Contains(l, r.ID) || !slices.Contains(l, old.ID) {
		t.Fatalf("the root's expired requests: %q", l)
	}
	if l := list(store.AccessRequestListParams{Requester: "token:tok_b", State: store.AccessDenied, Now: at(0)}); !slices.Equal(l, []string{d.ID}) {
		t.Fatalf("tok_b's denied requests: %q", l)
	}
	if l := list(store.AccessRequestListParams{ListParams: store.ListParams{Limit: 2}, Now: at(0)}); len(l) != 2 {
		t.Fatalf("a page of 2: %q", l)
	} else if next := list(store.AccessRequestListParams{ListParams: store.ListParams{Cursor: l[1], Limit: 1000}, Now: at(0)}); len(next) != 3 || slices.Contains(next, l[0]) {
		t.Fatalf("the page after %s: %q", l[1], next)
	}

	// The sweep stores both expired ones once, with access.ended and an
	// audit row each.
	swept := must(st.AccessRequestSweep(ctx, at(5*time.Minute)))
	var sweptIDs []string
	for _, x := range swept {
		sweptIDs = append(sweptIDs, x.ID)
		if x.State != store.AccessExpired {
			t.Errorf("swept %s is %s", x.ID, x.State)
		}
	}
	slices.Sort(sweptIDs)
	want := []string{r.ID, old.ID}
	slices.Sort(want)
	if !slices.Equal(sweptIDs, want) {
		t.Fatalf("swept %q, want %q", sweptIDs, want)
	}
	if again := must(st.AccessRequestSweep(ctx, at(6*time.Minute))); len(again) != 0 {
		t.Fatalf("swept again: %d", len(again))
	}
	rows := must(st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "access.ended"}))
	if len(rows) != 2 || rows[0].Actor != "access" {
		t.Fatalf("access.ended audit rows: %+v", rows)
	}

	// One identity holds at most 20 pending; expired ones do not count,
	// nor do another identity's.
	for range store.MaxPendingAccessRequests {
		create("user:ada", store.RootTenant, at(time.Hour))
	}
	_, err = st.AccessRequestCreate(ctx, &store.AccessRequestCreateParams{TenantID: store.RootTenant, Requester: "user:ada",
		RequesterRole: store.RoleOperator, Policy: "p", Duration: time.Minute, Reason: "x", Now: at(time.Hour)})
	wantErr(t, err, store.ErrAccessPendingLimit)
	create("user:bob", store.RootTenant, at(time.Hour))
	create("user:ada", store.RootTenant, at(time.Hour+store.AccessPendingTTL+time.Second))

	// The events of each step, in order, with their states.
	var steps []string
	for _, e := range must(st.OutboxList(ctx, 0, store.MaxListLimit)) {
		var env struct {
			Data events.AccessData `json:"data"`
		}
		if e.Key != r.ID && e.Key != v.ID {
			continue
		}
		if err := json.Unmarshal(e.Payload, &env); err != nil {
			t.Fatal(err)
		}
		steps = append(steps, fmt.Sprintf("%s %s→%s", e.Topic[len("com.better-compute."):], env.Data.PreviousState, env.Data.State))
		if env.Data.RequestID != e.Key || env.Data.Policy != "root-shell" || env.Data.Resource != "pool:pool_a" || env.Data.DurationSeconds != 120 {
			t.Errorf("event %s data %+v", e.Topic, env.Data)
		}
	}
	wantSteps := []string{"access.requested →pending", "access.approved pending→approved", "access.requested →pending",
		"access.approved pending→approved", "access.revoked approved→revoked", "access.ended approved→expired"}
	if !slices.Equal(steps, wantSteps) {
		t.Fatalf("events\n  %q\nwant\n  %q", steps, wantSteps)
	}
	if errors.Is(store.ErrAccessPendingLimit, store.ErrConflict) {
		t.Fatal("the pending limit is not a conflict")
	}
}

// produceAccessEvents writes every access.* type: requested, approved,
// denied, revoked and ended.
func produceAccessEvents(ctx context.Context, t *testing.T, h *Harness) {
	t.Helper()
	st := h.Store
	now := time.Now()
	req := func() *store.AccessRequest {
		return must(st.AccessRequestCreate(ctx, &store.AccessRequestCreateParams{TenantID: store.RootTenant, Requester: "token:tok_ev",
			RequesterRole: store.RoleViewer, Policy: "p", Duration: time.Minute, Reason: "events", Now: &now}))
	}
	a, d, v := req(), req(), req()
	must(st.AccessRequestDecide(ctx, &store.AccessRequestDecideParams{ID: a.ID, Approve: true, DecidedBy: "token:tok_ok", Now: &now}))
	must(st.AccessRequestDecide(ctx, &store.AccessRequestDecideParams{ID: d.ID, DecidedBy: "token:tok_ok", Note: "no", Now: &now}))
	must(st.AccessRequestRevoke(ctx, &store.AccessRequestRevokeParams{ID: v.ID, RevokedBy: "token:tok_ev", Now: &now}))
	later := now.Add(2 * time.Minute)
	if swept := must(st.AccessRequestSweep(ctx, &later)); len(swept) != 1 || swept[0].ID != a.ID {
		t.Fatalf("swept %d requests, want %s", len(swept), a.ID)
	}
}
