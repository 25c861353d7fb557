package api

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// accessLiveDoc makes root shells on pool a requestable by operators,
// approved by admins.
const accessLiveDoc = `policies:
  - name: root-shell-pool-a
    request:
      requesters: {roles: [operator]}
      approvers: {roles: [admin]}
      maxDuration: 4h
    statements:
      - effect: allow
        actions: [nodes.shell, nodes.shellAsRoot]
        resources: {pools: [a]}
`

// TestAccessEndsLiveTunnel: a root shell an access request's grant opened
// is decided again every round of checkLive for the principal it was
// opened with: told once a minute before the grant's end, closed at the
// end with one line naming the request (a second request for the same
// policy, pending, keeps nothing open), and closed at once after a
// revocation; a shell a grant did not open is not touched.
func TestAccessEndsLiveTunnel(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	var mu sync.Mutex
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	set := func(t time.Time) { mu.Lock(); now = t; mu.Unlock() }
	s := New(Config{Secret: strings.Repeat("s", 32), Now: clock}, st, nil)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s1", Region: "eu-1"})
	must(err)
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "a", SiteID: site.ID})
	must(err)
	_, err = st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_1", PoolID: pool.ID, Hostname: "n1", MachineID: "m1"})
	must(err)
	_, err = st.PolicyDocumentPut(ctx, &store.PolicyDocument{TenantID: store.RootTenant, Document: accessLiveDoc}, store.AnyPolicyVersion)
	must(err)
	secret, tok, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleOperator})
	must(err)
	op := &iam.Principal{TokenID: tok.ID, Role: store.RoleOperator, TenantID: store.RootTenant, TenantPath: store.RootTenant + "/"}
	addr := netip.MustParseAddr("192.0.2.1")

	// approved asks and approves a request at now for d.
	approved := func(d time.Duration) *store.AccessRequest {
		t.Helper()
		at := clock()
		r, err := st.AccessRequestCreate(ctx, &store.AccessRequestCreateParams{TenantID: store.RootTenant, Requester: op.Identity(),
			RequesterRole: op.Role, Policy: "root-shell-pool-a", Duration: d, Reason: "driver", Now: &at})
		must(err)
		r, err = st.AccessRequestDecide(ctx, &store.AccessRequestDecideParams{ID: r.ID, Approve: true, DecidedBy: "token:admin", Now: &at})
		must(err)
		s.policies.grantsChanged()
		return r
	}
	// open registers a live root shell as openTunnel does, and returns
	// the lines it was told and its end's cause.
	type shell struct {
		lines []string
		ended chan error
	}
	open := func() *shell {
		t.Helper()
		sh := &shell{ended: make(chan error, 1)}
		grant, end, err := s.tunnelGrant(ctx, op, addr, "node_1", tunnel.KindShell, true)
		must(err)
		if grant == "" {
			t.Fatal("the root shell does not rest on a grant")
		}
		c := &liveCall{tokenHash: sha256.Sum256([]byte(secret)), addr: addr, tokenID: tok.ID, nodeID: "node_1",
			access: &liveAccess{p: op, kind: tunnel.KindShell, asRoot: true, request: grant, end: end,
				notify: func(line string) { sh.lines = append(sh.lines, line) }},
			cancel: func(cause error) { sh.ended <- cause }}
		t.Cleanup(s.live.add(c))
		return sh
	}
	closed := func(sh *shell) string {
		select {
		case err := <-sh.ended:
			var re *RevokedError
			if !errors.As(err, &re) {
				t.Fatalf("ended with %v", err)
			}
			return re.Reason
		default:
			return ""
		}
	}

	// Before any grant the root shell is refused.
	if _, _, err := s.tunnelGrant(ctx, op, addr, "node_1", tunnel.KindShell, true); err == nil {
		t.Fatal("a root shell without a grant")
	}
	r := approved(10 * time.Minute)
	end := *r.End
	sh := open()
	// A plain shell (the operator's own right) rests on no grant.
	if grant, _, err := s.tunnelGrant(ctx, op, addr, "node_1", tunnel.KindShell, false); err != nil || grant != "" {
		t.Fatalf("a plain shell: grant %q, %v", grant, err)
	}
	// A second request for the same policy, pending, grants nothing.
	pendingAt := end.Add(-2 * time.Minute)
	set(pendingAt)
	_, err = st.AccessRequestCreate(ctx, &store.AccessRequestCreateParams{TenantID: store.RootTenant, Requester: op.Identity(),
		RequesterRole: op.Role, Policy: "root-shell-pool-a", Duration: time.Hour, Reason: "more", Now: &pendingAt})
	must(err)
	s.checkLive(ctx)
	if len(sh.lines) != 0 || closed(sh) != "" {
		t.Fatalf("two minutes before the end: told %q", sh.lines)
	}
	set(end.Add(-30 * time.Second))
	s.checkLive(ctx)
	s.checkLive(ctx)
	if len(sh.lines) != 1 || !strings.Contains(sh.lines[0], "access request "+r.ID+" ends at "+end.Format(time.RFC3339)+"; this shell closes then") {
		t.Fatalf("within the minute the shell was told %q, want one line", sh.lines)
	}
	if why := closed(sh); why != "" {
		t.Fatalf("closed before the end: %s", why)
	}
	set(end)
	s.checkLive(ctx)
	if why := closed(sh); why != "access ended: access request "+r.ID+" ended at "+end.Format(time.RFC3339) {
		t.Fatalf("at the end: %q", why)
	}
	if _, _, err := s.tunnelGrant(ctx, op, addr, "node_1", tunnel.KindShell, true); err == nil {
		t.Fatal("a new root shell after the end")
	}

	// A revocation closes it at the next round.
	r2 := approved(time.Hour)
	sh2 := open()
	s.checkLive(ctx)
	if why := closed(sh2); why != "" || len(sh2.lines) != 0 {
		t.Fatalf("an hour before its end: closed %q, told %q", why, sh2.lines)
	}
	revokeAt := clock().Add(time.Minute)
	set(revokeAt)
	_, err = st.AccessRequestRevoke(ctx, &store.AccessRequestRevokeParams{ID: r2.ID, RevokedBy: "token:admin", Note: "done", Now: &revokeAt})
	must(err)
	s.policies.grantsChanged()
	s.checkLive(ctx)
	if why := closed(sh2); why != "access ended: access request "+r2.ID+" was revoked by token:admin at "+revokeAt.Format(time.RFC3339) {
		t.Fatalf("after the revocation: %q", why)
	}

	// The sweep writes access.ended for the first one, once.
	s.sweepAccess(ctx, clock())
	s.accessSwept = time.Time{}
	s.sweepAccess(ctx, clock())
	rows, err := st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "access.ended"})
	must(err)
	if len(rows) != 1 || rows[0].Resource != r.ID {
		t.Fatalf("access.ended audit rows: %+v", rows)
	}
}
