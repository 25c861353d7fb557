package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

// testLifetimes: the aggregates the expiry metrics read (the earliest node
// certificate by state, the live API tokens' earliest expiry and how many
// end within a horizon) and the once-per-token warning of
// APITokensWarnExpiring with its token.expiring event.
func testLifetimes(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	now := time.Now().UTC().Truncate(time.Microsecond)
	week := 7 * 24 * time.Hour

	// Nodes: none with a certificate yet, then the earliest by state.
	if got := must(st.NodeCertEarliest(ctx, nil)); got != nil {
		t.Fatalf("earliest node certificate of an empty fleet = %v, want none", got)
	}
	pool := fixture(ctx, t, h)
	for _, n := range []struct {
		id    string
		left  time.Duration
		state string
	}{{"node_l1", 20 * time.Hour, store.NodeReady}, {"node_l2", 5 * time.Hour, store.NodeReady}, {"node_l3", -48 * time.Hour, store.NodeUnreachable}} {
		na := now.Add(n.left)
		must(st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: n.id, PoolID: pool.ID, Hostname: n.id, MachineID: "m-" + n.id, CertSerial: "01", CertNotAfter: &na}))
		check(t, st.NodeSetState(ctx, n.id, n.state))
	}
	addNode(ctx, t, h, pool, "node_l4") // no certificate: left out
	if got := must(st.NodeCertEarliest(ctx, nil)); got == nil || !got.Equal(now.Add(-48*time.Hour)) {
		t.Fatalf("earliest node certificate = %v, want the unreachable node's %v", got, now.Add(-48*time.Hour))
	}
	if got := must(st.NodeCertEarliest(ctx, []string{store.NodeReady, store.NodeDraining})); got == nil || !got.Equal(now.Add(5*time.Hour)) {
		t.Fatalf("earliest ready node certificate = %v, want %v", got, now.Add(5*time.Hour))
	}
	if got := must(st.NodeCertEarliest(ctx, []string{store.NodePoweredOff})); got != nil {
		t.Fatalf("earliest powered-off node certificate = %v, want none", got)
	}

	// API tokens: one without expiry, one far off, two within the week,
	// one expired, one revoked within the week.
	if s := must(st.APITokenExpiry(ctx, &store.APITokenExpiryParams{Within: week, Now: &now})); s.Earliest != nil || s.Within != 0 {
		t.Fatalf("expiry of no tokens = %+v", s)
	}
	tok := func(id string, left *time.Duration) {
		t.Helper()
		var exp *time.Time
		if left != nil {
			e := now.Add(*left)
			exp = &e
		}
		check(t, st.APITokenCreate(ctx, &store.APIToken{ID: id, Role: store.RoleViewer, ExpiresAt: exp}, []byte("hash-"+id)))
	}
	dur := func(d time.Duration) *time.Duration { return &d }
	tok("tok_forever", nil)
	tok("tok_far", dur(90*24*time.Hour))
	tok("tok_soon", dur(3*24*time.Hour))
	tok("tok_sooner", dur(2*time.Hour))
	tok("tok_gone", dur(-time.Hour))
	tok("tok_revoked", dur(time.Hour))
	check(t, st.APITokenRevoke(ctx, "tok_revoked"))
	s := must(st.APITokenExpiry(ctx, &store.APITokenExpiryParams{Within: week, Now: &now}))
	if s.Earliest == nil || !s.Earliest.Equal(now.Add(2*time.Hour)) || s.Within != 2 {
		t.Fatalf("token expiry = %+v (earliest %v), want tok_sooner's %v and 2 within a week", s, s.Earliest, now.Add(2*time.Hour))
	}
	// The database's clock (Now nil) sees the same tokens.
	if s := must(st.APITokenExpiry(ctx, &store.APITokenExpiryParams{Within: week})); s.Within != 2 {
		t.Fatalf("token expiry by the database's clock = %+v, want 2 within a week", s)
	}
	before := must(st.OutboxMaxID(ctx))
	got := must(st.APITokensWarnExpiring(ctx, &store.APITokenExpiryParams{Within: week, Now: &now}))
	slices.Sort(got)
	if !slices.Equal(got, []string{"tok_soon", "tok_sooner"}) {
		t.Fatalf("warned tokens = %v, want tok_soon and tok_sooner", got)
	}
	if again := must(st.APITokensWarnExpiring(ctx, &store.APITokenExpiryParams{Within: week, Now: &now})); len(again) != 0 {
		t.Fatalf("tokens warned twice: %v", again)
	}
	evs := must(st.OutboxQuery(ctx, &store.OutboxQueryParams{AfterID: before, Ascending: true, Limit: 10}))
	var subjects []string
	for _, e := range evs {
		if e.Topic != events.TokenExpiring {
			t.Fatalf("event %s after the warning, want only %s", e.Topic, events.TokenExpiring)
		}
		subjects = append(subjects, e.Key)
	}
	slices.Sort(subjects)
	if !slices.Equal(subjects, []string{"tok_soon", "tok_sooner"}) {
		t.Fatalf("token.expiring subjects = %v", subjects)
	}
	// 80 days on, tok_far is not within the week yet; 84 days on it is.
	later := now.Add(80 * 24 * time.Hour)
	if got := must(st.APITokensWarnExpiring(ctx, &store.APITokenExpiryParams{Within: week, Now: &later})); len(got) != 0 {
		t.Fatalf("warned at +80 days: %v", got)
	}
	later = now.Add(84 * 24 * time.Hour)
	if got := must(st.APITokensWarnExpiring(ctx, &store.APITokenExpiryParams{Within: week, Now: &later})); !slices.Equal(got, []string{"tok_far"}) {
		t.Fatalf("warned at +84 days: %v, want tok_far", got)
	}
}
