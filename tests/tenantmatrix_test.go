package tests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// matrixAccessPolicy is each matrix tenant's policy document: one
// requestable policy every role may ask for and approve (docs/access.md).
const matrixAccessPolicy = `policies:
  - name: matrix-access
    request:
      requesters: {roles: [admin, operator, viewer]}
      approvers: {roles: [admin, operator, viewer]}
    statements:
      - {effect: allow, actions: [nodes.get]}
`

// tenantFixture is one tenant of the matrix with what it owns.
type tenantFixture struct {
	name, id      string
	child, child2 string // tenants below it: child is suspended and resumed, child2 deleted
	site          string // a site of its own
	pool, pool2   string // pools at the deployment's site: pool holds n1..n3, pool2 receives n3
	pool3         string // an empty pool, moved to child
	n1, n2, n3    string // n1: cordon, drain, commands, tunnels; n2: repairs; n3: moved, then deleted
	joinToken     string
	reservation   string // pending: its labels match no node, so it holds none
	remediation   string // the case its admin's nodes.gpuReset of n2 opened (phase 2)
	rollout       string // a rollout of pool3 (empty: it upgrades nothing)
	recording     string // a shell recording its admin's token opened on n1
	access        string // an access request for matrixAccessPolicy: approved in phase 1, revoked in phase 3
	access2       string // another, denied in phase 1
	sink          string // a file sink of its own (sinks.files[].tenant), named after it
	sinkFile      string
	gpu           string // a GPU of n1
	spareToken    string // an API token to revoke
	command       string
	tokens        map[string]*client.Client // by role
	tokenIDs      map[string]string         // by role
	secrets       map[string]string         // by role
	ids           []string                  // every id above: none may show in another tenant's answers
}

// matrixCase is how one API method is called in the matrix. req is the
// request (JSON) of a caller of tenant own acting on tenant target's
// objects. scoped methods: a role at least the method's may call it on its
// own tenant (ok: nil, or one of okCodes when a previous role's call
// already did it), is refused PERMISSION_DENIED below it, and acting on the
// other tenant's objects gets NOT_FOUND (list: success without one of its
// ids). Unscoped methods (root: true) are PERMISSION_DENIED to every token
// of either tenant, whatever the role.
type matrixCase struct {
	root bool
	// ownOnly: the request names no object (sites.create makes one in the
	// caller's tenant), so it is called on the own tenant only.
	ownOnly bool
	// anyIDs: the answer may name the other tenant's ids (audit.list: the
	// caller's own refused calls name what they asked for).
	anyIDs  bool
	phase   int // the order of the phases: 0 reads and harmless changes, 1 n1's state, 2 repairs, 3 moves, revokes, deletes, 4 resumes, 5 remediation.return
	list    bool
	req     func(own, target *tenantFixture) string
	okCodes []string
	// ownCheck, when set, checks the own tenant's answer (JSON).
	ownCheck func(own *tenantFixture, answer string) error
}

// TestTenantMatrix (issue 45, Done when), on each backend: one control plane, six
// FakeDaemons, two tenants each with its own pools and three nodes, and an
// admin, operator and viewer token each. For every method of api.proto
// (apiv1.Methods: a method without a case fails the test), each token calls
// it on its own tenant's objects and on the other's, and the answer is
// checked: what its role allows in its own tenant works (and a list shows
// its own rows), a role below is PERMISSION_DENIED, the other tenant's
// objects are NOT_FOUND and its rows absent from every list, and every
// method not scoped to tenants is PERMISSION_DENIED. Then `events watch`
// (CLI) and the SSE stream of each tenant's viewer print their tenant's
// node events and none of the other's, audit.list shows each admin its own
// tenant's rows only, the fleet page shows each tenant's admin and viewer
// its own nodes and none of the other's, and each tenant's file sink
// (sinks.files[].tenant) takes its own nodes' events and none of the
// other's.
func TestTenantMatrix(t *testing.T) {
	t.Parallel()
	forEachBackend(t, testTenantMatrix)
}

func testTenantMatrix(t *testing.T, backend string) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// Each tenant has a file sink of its own, configured by the tenant's id
	// (never a name, docs/tenants.md "Sinks"): it takes its subtree's
	// events only. The configuration is written before the tenants are
	// made, so the test makes them in the store with these ids.
	sinkDir := t.TempDir()
	tenantIDs := map[string]string{"matrix-a": "ten_matrixa", "matrix-b": "ten_matrixb"}
	d := newDeploymentWith(t, backend, deploymentConfig{top: fmt.Sprintf("sinks:\n  files:\n"+
		"    - {name: matrix-a, path: %s/a.jsonl, tenant: %s}\n    - {name: matrix-b, path: %s/b.jsonl, tenant: %s}\n",
		sinkDir, tenantIDs["matrix-a"], sinkDir, tenantIDs["matrix-b"])})
	admin := &client.Client{BaseURL: d.api + "/api", Token: d.adminToken}
	def, err := admin.PoolsGet(ctx, &apiv1.PoolRequest{Pool: "default"})
	if err != nil {
		t.Fatal(err)
	}

	// Six FakeDaemons join the pool default.
	file, _ := d.joinToken(6, time.Hour)
	tok, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for i := range 6 {
		fd, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: fmt.Sprintf("matrix-%d", i), Session: session.Config{StartJitter: -1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := fd.Join(ctx, d.gatewayURL, strings.TrimSpace(string(tok))); err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan error, 1)
		go func() { done <- fd.Run(runCtx) }()
		t.Cleanup(func() { stop(); <-done })
		nodes = append(nodes, fd.NodeID())
	}

	eventually(t, 60*time.Second, func() bool {
		l, err := admin.NodesList(ctx, &apiv1.ListNodesRequest{State: "ready"})
		return err == nil && len(l.Nodes) == 6
	}, func() string { return "the six FakeDaemons are not all ready" })

	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	fix := func(name string, ns []string) *tenantFixture {
		f := &tenantFixture{name: name, n1: ns[0], n2: ns[1], n3: ns[2], sink: name, sinkFile: sinkDir + "/" + name[len(name)-1:] + ".jsonl",
			tokens: map[string]*client.Client{}, tokenIDs: map[string]string{}, secrets: map[string]string{}}
		tn, err := d.st.TenantCreate(ctx, &store.TenantCreateParams{ID: tenantIDs[name], Name: name, ParentID: store.RootTenant})
		must("create tenant", err)
		f.id = tn.ID
		c, err := admin.TenantsCreate(ctx, &apiv1.CreateTenantRequest{Name: name + "-child", Parent: f.id})
		must("tenants.create child", err)
		f.child = c.Id
		c, err = admin.TenantsCreate(ctx, &apiv1.CreateTenantRequest{Name: name + "-child2", Parent: f.id})
		must("tenants.create child2", err)
		f.child2 = c.Id
		site, err := admin.SitesCreate(ctx, &apiv1.CreateSiteRequest{Name: name + "-site", Region: "r", Tenant: f.id})
		must("sites.create", err)
		f.site = site.Id
		for _, p := range []*string{&f.pool, &f.pool2, &f.pool3} {
			pool, err := admin.PoolsCreate(ctx, &apiv1.CreatePoolRequest{Name: fmt.Sprintf("%s-pool-%d", name, len(f.ids)), Site: def.SiteId, Tenant: f.id})
			must("pools.create", err)
			*p = pool.Id
			f.ids = append(f.ids, pool.Id)
		}
		// The nodes move in: one through the CLI, two through the API.
		d.cli(d.viaAPI("nodes", "move", f.n1, "--tenant", name, "--pool", f.pool)...)
		for _, n := range []string{f.n2, f.n3} {
			r, err := admin.NodesMove(ctx, &apiv1.MoveNodeRequest{Id: n, Tenant: f.id, Pool: f.pool})
			must("nodes.move", err)
			if r.Node.PoolId != f.pool {
				t.Fatalf("nodes.move %s = pool %s, want %s", n, r.Node.PoolId, f.pool)
			}
		}
		for _, n := range []string{f.n1, f.n2, f.n3} {
			if n, err := admin.NodesGet(ctx, &apiv1.NodeRequest{Id: n}); err != nil || n.Node.PoolId != f.pool {
				t.Fatalf("node after nodes move: %+v, %v", n, err)
			}
		}
		jt, err := admin.JoinTokensCreate(ctx, &apiv1.CreateJoinTokenRequest{Pool: f.pool, MaxUses: 1})
		must("joinTokens.create", err)
		f.joinToken = jt.JoinToken.Id
		for _, role := range []string{store.RoleAdmin, store.RoleOperator, store.RoleViewer, "spare"} {
			r := role
			if role == "spare" {
				r = store.RoleViewer
			}
			resp, err := admin.TokensCreate(ctx, &apiv1.CreateAPITokenRequest{Role: r, Tenant: f.id, Description: name + " " + role})
			must("tokens.create", err)
			if role == "spare" {
				f.spareToken = resp.ApiToken.Id
			} else {
				f.tokens[role] = &client.Client{BaseURL: d.api + "/api", Token: resp.Token}
				f.tokenIDs[role], f.secrets[role] = resp.ApiToken.Id, resp.Token
			}
			f.ids = append(f.ids, resp.ApiToken.Id)
		}
		res, err := admin.ReservationsCreate(ctx, reservationRequest(f.pool))
		must("reservations.create", err)
		f.reservation = res.Id
		f.ids = append(f.ids, res.Id)
		cmd, err := admin.CommandsCreate(ctx, &apiv1.CreateCommandsRequest{NodeIds: []string{f.n1}, Kind: "exec", Exec: &apiv1.ExecSpec{Argv: []string{"true"}}})
		must("commands.create", err)
		f.command = cmd.Commands[0].Id
		f.ids = append(f.ids, f.id, f.child, f.child2, f.site, f.n1, f.n2, f.n3, f.joinToken, f.spareToken, f.command)
		// A requestable policy (docs/access.md) and two requests for it by
		// an identity none of the matrix's tokens has.
		_, err = admin.PoliciesApply(ctx, &apiv1.PoliciesApplyRequest{Tenant: f.id, Document: matrixAccessPolicy})
		must("policies.apply of the requestable policy", err)
		for _, dst := range []*string{&f.access, &f.access2} {
			r, err := d.st.AccessRequestCreate(ctx, &store.AccessRequestCreateParams{TenantID: f.id, Requester: "token:matrix-requester",
				RequesterRole: store.RoleViewer, Policy: "matrix-access", Duration: time.Hour, Reason: "matrix"})
			must("store access request create", err)
			*dst = r.ID
			f.ids = append(f.ids, r.ID)
		}
		return f
	}
	a, b := fix("matrix-a", nodes[:3]), fix("matrix-b", nodes[3:])
	eventually(t, 60*time.Second, func() bool {
		l, err := admin.GpusList(ctx, &apiv1.ListGPUsRequest{Page: &apiv1.Page{Limit: 1000}})
		return err == nil && len(l.Gpus) == 6*8
	}, func() string { return "gpus.list does not show the six FakeDaemons' 48 GPUs" })
	for _, f := range []*tenantFixture{a, b} {
		l, err := admin.GpusList(ctx, &apiv1.ListGPUsRequest{Pool: f.pool, Page: &apiv1.Page{Limit: 1000}})
		must("gpus.list", err)
		for _, g := range l.Gpus {
			if g.NodeId == f.n1 {
				f.gpu = g.GpuUuid
			}
		}
		if f.gpu == "" {
			t.Fatalf("gpus.list of %s's pool shows no GPU of n1: %+v", f.name, l.Gpus)
		}
		// A rollout of its empty pool3, written to the store: this
		// deployment serves no downloads, so rollouts.create answers
		// INVALID_ARGUMENT past the tenant and role checks.
		ro, err := d.st.RolloutCreate(ctx, &store.RolloutCreateParams{PoolID: f.pool3, Version: "9.9.9", BaseURL: "https://matrix.invalid/api/downloads",
			Canary: 1, Wave: "1", MaxUnavailable: "1", Soak: time.Minute, Timeout: time.Minute, CreatedBy: "matrix"})
		must("store rollout create", err)
		f.rollout = ro.ID
		// A shell recording of its admin's, written to the store (no
		// shell runs here: tests/recordings_test.go records real ones).
		rec, err := d.st.RecordingCreate(ctx, &store.RecordingCreateParams{ID: "rec_matrix" + f.name[len(f.name)-1:],
			TunnelID: "tun_matrix" + f.name[len(f.name)-1:], NodeID: f.n1,
			CreatedBy: "token:" + f.tokenIDs[store.RoleAdmin]})
		must("store recording create", err)
		f.recording = rec.ID
		f.ids = append(f.ids, f.gpu, f.rollout, f.recording)
	}
	// nodes move is one audited call.
	if rows, err := d.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "nodes.move"}); err != nil || len(rows) != 6 {
		t.Fatalf("nodes.move audit rows = %d, %v; want 6", len(rows), err)
	}

	q := func(s string) string { return fmt.Sprintf("%q", s) }
	uniq := func(own *tenantFixture, what string) string {
		return fmt.Sprintf("%s-%s-%d", own.name, what, time.Now().UnixNano()%1e9)
	}
	scoped := func(phase int, req func(own, target *tenantFixture) string, okCodes ...string) matrixCase {
		return matrixCase{phase: phase, req: req, okCodes: okCodes}
	}
	list := func(req string, ownID func(*tenantFixture) string) matrixCase {
		return matrixCase{list: true, req: func(_, _ *tenantFixture) string { return req },
			ownCheck: func(own *tenantFixture, answer string) error {
				if id := ownID(own); id != "" && !strings.Contains(answer, q(id)) {
					return fmt.Errorf("its own %s is missing", id)
				}
				return nil
			}}
	}
	root := matrixCase{root: true, req: func(_, target *tenantFixture) string { return `{}` }}
	byID := func(phase int, field string, pick func(*tenantFixture) string, okCodes ...string) matrixCase {
		return scoped(phase, func(_, target *tenantFixture) string { return fmt.Sprintf(`{%q: %q}`, field, pick(target)) }, okCodes...)
	}
	cases := map[string]matrixCase{
		"tenants.create": scoped(0, func(own, target *tenantFixture) string {
			return fmt.Sprintf(`{"name": %q, "parent": %q}`, uniq(own, "t"), target.id)
		}),
		// The fixture's document, a requestable policy only: it changes no
		// other case's answer (no grant reaches a matrix token).
		"policies.apply": scoped(0, func(_, target *tenantFixture) string {
			return fmt.Sprintf(`{"tenant": %q, "document": %q}`, target.id, matrixAccessPolicy)
		}),
		"policies.test": scoped(0, func(_, target *tenantFixture) string {
			return fmt.Sprintf(`{"tenant": %q, "document": "policies: []\n"}`, target.id)
		}),
		"policies.get":    byID(0, "tenant", func(f *tenantFixture) string { return f.id }),
		"policies.list":   list(`{}`, func(*tenantFixture) string { return "" }),
		"tenants.list":    list(`{}`, func(f *tenantFixture) string { return f.child }),
		"tenants.get":     byID(0, "tenant", func(f *tenantFixture) string { return f.child }),
		"tenants.suspend": byID(3, "tenant", func(f *tenantFixture) string { return f.child }, apiv1.CodeConflict),
		"tenants.resume":  byID(4, "tenant", func(f *tenantFixture) string { return f.child }),
		"tenants.delete":  byID(3, "tenant", func(f *tenantFixture) string { return f.child2 }),
		"sites.create": {ownOnly: true, req: func(own, _ *tenantFixture) string { return fmt.Sprintf(`{"name": %q, "region": "r"}`, uniq(own, "s")) },
			ownCheck: func(own *tenantFixture, answer string) error {
				if !strings.Contains(answer, q(own.id)) {
					return errors.New("the site is not its tenant's")
				}
				return nil
			}},
		"sites.list": list(`{}`, func(f *tenantFixture) string { return f.site }),
		"pools.create": scoped(0, func(own, target *tenantFixture) string {
			return fmt.Sprintf(`{"name": %q, "site": %q}`, uniq(own, "p"), target.site)
		}),
		"pools.list": list(`{}`, func(f *tenantFixture) string { return f.pool }),
		"pools.get":  byID(0, "pool", func(f *tenantFixture) string { return f.pool }),
		"pools.setBudget": scoped(0, func(_, target *tenantFixture) string {
			return fmt.Sprintf(`{"pool": %q, "disruptionBudget": "2"}`, target.pool)
		}),
		"pools.move": scoped(3, func(_, target *tenantFixture) string {
			return fmt.Sprintf(`{"pool": %q, "tenant": %q}`, target.pool3, target.child)
		}),
		"joinTokens.create": scoped(0, func(_, target *tenantFixture) string { return fmt.Sprintf(`{"pool": %q, "maxUses": 1}`, target.pool) }),
		"joinTokens.list":   list(`{}`, func(f *tenantFixture) string { return f.joinToken }),
		"joinTokens.revoke": byID(3, "id", func(f *tenantFixture) string { return f.joinToken }),
		"nodes.list":        list(`{}`, func(f *tenantFixture) string { return f.n1 }),
		"nodes.get":         byID(0, "id", func(f *tenantFixture) string { return f.n1 }),
		"nodes.cordon":      byID(1, "id", func(f *tenantFixture) string { return f.n1 }),
		"nodes.uncordon":    byID(1, "id", func(f *tenantFixture) string { return f.n1 }),
		"nodes.drain":       byID(1, "id", func(f *tenantFixture) string { return f.n1 }),
		"nodes.delete":      byID(4, "id", func(f *tenantFixture) string { return f.n3 }),
		// A join token for the node's reinstall, in its pool.
		"nodes.reinstall": byID(0, "node", func(f *tenantFixture) string { return f.n1 }),
		// This deployment serves no downloads: nodes.add's answer past the
		// tenant and role checks is UNAVAILABLE (tests/nodes_add_test.go
		// shows it working).
		"nodes.add": byID(0, "pool", func(f *tenantFixture) string { return f.pool }, apiv1.CodeUnavailable),
		// The first role's repair holds n2; the next role's is CONFLICT
		// (held), which it reaches only past the tenant and role checks.
		"nodes.gpuReset":    scoped(2, func(_, target *tenantFixture) string { return fmt.Sprintf(`{"id": %q, "gpu": "0"}`, target.n2) }, apiv1.CodeConflict),
		"nodes.reboot":      byID(2, "id", func(f *tenantFixture) string { return f.n2 }, apiv1.CodeConflict),
		"nodes.setGPUCount": scoped(0, func(_, target *tenantFixture) string { return fmt.Sprintf(`{"id": %q, "count": 8}`, target.n1) }),
		"nodes.move": scoped(3, func(_, target *tenantFixture) string {
			return fmt.Sprintf(`{"id": %q, "tenant": %q, "pool": %q}`, target.n3, target.id, target.pool2)
		}),
		"commands.create": scoped(0, func(_, target *tenantFixture) string {
			return fmt.Sprintf(`{"nodeIds": [%q], "kind": "exec", "exec": {"argv": ["true"]}}`, target.n1)
		}),
		"commands.get":  byID(0, "id", func(f *tenantFixture) string { return f.command }),
		"commands.list": list(`{}`, func(f *tenantFixture) string { return f.command }),
		// The command may have ended: cancelling it then is CONFLICT.
		"commands.cancel":      byID(0, "id", func(f *tenantFixture) string { return f.command }, apiv1.CodeConflict),
		"gateways.list":        root,
		"gateways.drain":       root,
		"gateways.undrain":     root,
		"processes.list":       root,
		"pki.revoke":           root,
		"pki.rotationStart":    root,
		"pki.rotationStatus":   root,
		"pki.rotationAdvance":  root,
		"pki.rotationRollback": root,
		"release.pinsAdd":      root,
		"release.pinsStatus":   root,
		"release.pinsRemove":   root,
		"fleet.summary": {list: true, req: func(_, _ *tenantFixture) string { return `{}` },
			ownCheck: func(_ *tenantFixture, answer string) error {
				var r apiv1.FleetSummaryResponse
				if err := protojson.Unmarshal([]byte(answer), &r); err != nil {
					return err
				}
				if r.Nodes != 3 || r.Gpus != 3*8 {
					return fmt.Errorf("%d nodes and %d GPUs, want its own 3 and 24", r.Nodes, r.Gpus)
				}
				return nil
			}},
		"tokens.create": scoped(0, func(_, target *tenantFixture) string {
			return fmt.Sprintf(`{"role": "viewer", "tenant": %q}`, target.id)
		}),
		"tokens.list":           list(`{}`, func(f *tenantFixture) string { return f.spareToken }),
		"tokens.revoke":         byID(3, "id", func(f *tenantFixture) string { return f.spareToken }),
		"bmc.setCredentials":    root,
		"bmc.deleteCredentials": root,
		"audit.list":            {list: true, anyIDs: true, req: func(_, _ *tenantFixture) string { return `{"page": {"limit": 1000}}` }},
		"events.list":           list(`{"page": {"limit": 1000}}`, func(f *tenantFixture) string { return f.n1 }),
		// Each tenant's file sink is its own; it has no dead letters.
		"sinks.deadLetters": byID(0, "sink", func(f *tenantFixture) string { return f.sink }),
		"sinks.replay": scoped(0, func(_, target *tenantFixture) string {
			return fmt.Sprintf(`{"sink": %q, "all": true}`, target.sink)
		}),
		"tunnels.create": scoped(0, func(_, target *tenantFixture) string {
			return fmt.Sprintf(`{"node": %q, "kind": "shell"}`, target.n1)
		}),
	}
	// Reservations of a tenant's pools are its own; the placer may fail
	// one that no node matches, so cancelling or extending it is CONFLICT
	// past the tenant and role checks.
	cases["reservations.create"] = scoped(0, func(_, target *tenantFixture) string {
		b, err := protojson.Marshal(reservationRequest(target.pool))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	})
	cases["reservations.list"] = list(`{}`, func(f *tenantFixture) string { return f.reservation })
	cases["reservations.get"] = byID(0, "id", func(f *tenantFixture) string { return f.reservation })
	cases["reservations.extend"] = scoped(0, func(_, target *tenantFixture) string {
		return fmt.Sprintf(`{"id": %q, "end": %q}`, target.reservation, time.Now().Add(3*time.Hour).UTC().Format(time.RFC3339Nano))
	}, apiv1.CodeConflict)
	cases["reservations.cancel"] = byID(3, "id", func(f *tenantFixture) string { return f.reservation }, apiv1.CodeConflict)
	// GPUs and remediation cases of a tenant's pools are its own.
	cases["gpus.list"] = list(`{"page": {"limit": 1000}}`, func(f *tenantFixture) string { return f.n1 })
	rem := list(`{}`, func(f *tenantFixture) string { return f.remediation })
	rem.phase = 3
	cases["remediation.list"] = rem
	cases["remediation.get"] = byID(3, "id", func(f *tenantFixture) string { return f.remediation })
	// Pausing a paused case, or resuming a running one, or returning one
	// whose GPU still reads bad or that is closed, is CONFLICT past the
	// tenant and role checks.
	cases["remediation.pause"] = byID(3, "id", func(f *tenantFixture) string { return f.remediation }, apiv1.CodeConflict)
	cases["remediation.resume"] = byID(4, "id", func(f *tenantFixture) string { return f.remediation }, apiv1.CodeConflict)
	cases["remediation.return"] = byID(5, "id", func(f *tenantFixture) string { return f.remediation }, apiv1.CodeConflict)
	cases["remediation.history"] = byID(3, "nodeId", func(f *tenantFixture) string { return f.n2 })
	cases["remediation.resetBreaker"] = byID(0, "pool", func(f *tenantFixture) string { return f.pool })
	cases["remediation.breakers"] = list(`{}`, func(f *tenantFixture) string { return f.pool })
	cases["remediation.stats"] = list(`{}`, func(f *tenantFixture) string { return f.pool })
	cases["gpus.get"] = byID(0, "uuid", func(f *tenantFixture) string { return f.gpu })
	cases["capacity.summary"] = byID(0, "pool", func(f *tenantFixture) string { return f.pool })
	// Rollouts are their pool's tenant's. rollouts.create gets as far as
	// the release check (this deployment serves no downloads); pausing a
	// paused rollout or one that has finished (pool3 is empty) is CONFLICT.
	cases["rollouts.create"] = scoped(0, func(_, target *tenantFixture) string {
		return fmt.Sprintf(`{"pool": %q, "version": "9.9.9"}`, target.pool)
	}, apiv1.CodeInvalidArgument)
	cases["rollouts.list"] = list(`{}`, func(f *tenantFixture) string { return f.rollout })
	cases["rollouts.get"] = byID(0, "id", func(f *tenantFixture) string { return f.rollout })
	cases["rollouts.pause"] = byID(1, "id", func(f *tenantFixture) string { return f.rollout }, apiv1.CodeConflict)
	cases["rollouts.resume"] = byID(2, "id", func(f *tenantFixture) string { return f.rollout }, apiv1.CodeConflict)
	cases["rollouts.abort"] = byID(3, "id", func(f *tenantFixture) string { return f.rollout }, apiv1.CodeConflict)
	// A recording is the tenant's of the token that opened its shell.
	cases["recordings.list"] = list(`{}`, func(f *tenantFixture) string { return f.recording })
	cases["recordings.get"] = byID(0, "id", func(f *tenantFixture) string { return f.recording })
	// Access requests live in their requester's tenant. Every role may ask
	// for the requestable policy (its requesters and approvers bind every
	// role), on its own tenant's pool; the other's pool is NOT_FOUND. The
	// first role's approval, denial or revocation wins; the next roles'
	// find it decided (CONFLICT), past the tenant and role checks.
	cases["access.request"] = scoped(1, func(_, target *tenantFixture) string {
		return fmt.Sprintf(`{"policy": "matrix-access", "resource": "pool:%s", "duration": "60s", "reason": "matrix"}`, target.pool)
	})
	cases["access.list"] = list(`{}`, func(f *tenantFixture) string { return f.access })
	cases["access.approve"] = byID(1, "id", func(f *tenantFixture) string { return f.access }, apiv1.CodeConflict)
	cases["access.deny"] = byID(1, "id", func(f *tenantFixture) string { return f.access2 }, apiv1.CodeConflict)
	cases["access.revoke"] = byID(3, "id", func(f *tenantFixture) string { return f.access }, apiv1.CodeConflict)
	// events.list shows the node events written since n1 moved in: phase 1's.
	c := cases["events.list"]
	c.phase = 2
	cases["events.list"] = c

	methods := map[string]apiv1.Method{}
	for _, m := range apiv1.Methods {
		methods[m.Name] = m
		if _, ok := cases[m.Name]; !ok {
			t.Errorf("api.proto's method %s has no case in the tenant matrix: add one", m.Name)
		}
	}
	for name := range cases {
		if _, ok := methods[name]; !ok {
			t.Errorf("the matrix has a case for %s, which api.proto does not declare", name)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	rank := map[string]int{store.RoleViewer: 0, store.RoleOperator: 1, store.RoleAdmin: 2}
	call := func(c *client.Client, m apiv1.Method, body string) (string, error) {
		req := m.Request.ProtoReflect().New().Interface()
		if err := protojson.Unmarshal([]byte(body), req); err != nil {
			t.Fatalf("%s: the matrix's request %s: %v", m.Name, body, err)
		}
		resp := m.Response.ProtoReflect().New().Interface()
		if err := c.Call(ctx, m.Name, req, resp); err != nil {
			return "", err
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		return string(out), nil
	}
	codeOf := func(err error) string {
		var ae *client.Error
		if errors.As(err, &ae) {
			return ae.Code
		}
		if err != nil {
			return err.Error()
		}
		return "OK"
	}
	var mu sync.Mutex
	checked := 0
	check := func(m apiv1.Method, c matrixCase, own, target *tenantFixture, role string) {
		if c.ownOnly && own != target {
			return
		}
		body := c.req(own, target)
		answer, err := call(own.tokens[role], m, body)
		code := codeOf(err)
		what := fmt.Sprintf("%s's %s calling %s on %s's objects (%s)", own.name, role, m.Name, target.name, body)
		mu.Lock()
		checked++
		mu.Unlock()
		switch {
		case c.root || rank[role] < rank[m.Role]:
			if code != apiv1.CodePermissionDenied {
				t.Errorf("%s: %s %s, want PERMISSION_DENIED", what, code, answer)
			}
		case c.list:
			if err != nil {
				t.Errorf("%s: %v", what, err)
				return
			}
			if own == target && c.ownCheck != nil {
				if err := c.ownCheck(own, answer); err != nil {
					t.Errorf("%s: %v in %s", what, err, answer)
				}
			}
			other := a
			if own == a {
				other = b
			}
			for _, id := range other.ids {
				if c.anyIDs {
					break
				}
				if strings.Contains(answer, q(id)) {
					t.Errorf("%s: the answer shows %s's %s:\n%s", what, other.name, id, answer)
				}
			}
		case own != target:
			if code != apiv1.CodeNotFound {
				t.Errorf("%s: %s %s, want NOT_FOUND", what, code, answer)
			}
		default:
			if err != nil && !slices.Contains(c.okCodes, code) {
				t.Errorf("%s: %v, want success", what, err)
			} else if err == nil && c.ownCheck != nil {
				if err := c.ownCheck(own, answer); err != nil {
					t.Errorf("%s: %v in %s", what, err, answer)
				}
			}
		}
	}
	roles := []string{store.RoleAdmin, store.RoleOperator, store.RoleViewer}
	for phase := 0; phase <= 5; phase++ {
		if phase == 3 {
			for _, f := range []*tenantFixture{a, b} {
				l, err := admin.RemediationList(ctx, &apiv1.ListRemediationsRequest{NodeId: f.n2})
				if err != nil || len(l.Remediations) == 0 {
					t.Fatalf("%s's n2 has no remediation case after nodes.gpuReset: %+v, %v", f.name, l, err)
				}
				f.remediation = l.Remediations[0].Id
				// Paused, it takes no next step: it is still open for phase
				// 3's remediation.pause and phase 4's resume.
				if _, err := admin.RemediationPause(ctx, &apiv1.RemediationRequest{Id: f.remediation}); err != nil {
					t.Fatalf("%s's case %s (%s): remediation.pause as root: %v", f.name, f.remediation, l.Remediations[0].State, err)
				}
				f.ids = append(f.ids, f.remediation)
			}
		}
		var wg sync.WaitGroup
		for _, m := range apiv1.Methods {
			c := cases[m.Name]
			if c.phase != phase {
				continue
			}
			// Each method's calls in turn (admin first, so that a role below
			// finds what admin did); the methods of a phase run at once.
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, own := range []*tenantFixture{a, b} {
					for _, target := range []*tenantFixture{b, a} { // the other's first: it must change nothing
						for _, role := range roles {
							check(m, c, own, target, role)
						}
					}
				}
			}()
		}
		wg.Wait()
	}
	t.Logf("the matrix checked %d calls of %d methods", checked, len(apiv1.Methods))

	// The objects of phase 3 and 4 did what their own admin asked.
	for _, f := range []*tenantFixture{a, b} {
		if _, err := admin.NodesGet(ctx, &apiv1.NodeRequest{Id: f.n3}); codeOf(err) != apiv1.CodeNotFound {
			t.Errorf("%s's n3 after its admin's nodes.delete: %v", f.name, err)
		}
		if p, err := admin.PoolsGet(ctx, &apiv1.PoolRequest{Pool: f.pool3}); err != nil || p.TenantId != f.child {
			t.Errorf("%s's pool3 after pools.move: %+v, %v", f.name, p, err)
		}
		if tn, err := admin.TenantsGet(ctx, &apiv1.TenantRequest{Tenant: f.child}); err != nil || tn.Suspended {
			t.Errorf("%s's child after suspend and resume: %+v, %v", f.name, tn, err)
		}
	}

	testTenantStreams(ctx, t, d, admin, a, b)

	// Each tenant's file sink took its own nodes' events (the cordons of
	// testTenantStreams among them) and nothing of the other's.
	for _, f := range []*tenantFixture{a, b} {
		other := b
		if f == b {
			other = a
		}
		eventually(t, 30*time.Second, func() bool {
			body, _ := os.ReadFile(f.sinkFile)
			return strings.Contains(string(body), f.n1)
		}, func() string {
			return fmt.Sprintf("%s's sink file %s lacks its node %s's events", f.name, f.sinkFile, f.n1)
		})
		body, err := os.ReadFile(f.sinkFile)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range other.ids {
			if strings.Contains(string(body), q(id)) {
				t.Errorf("%s's sink file holds %s's %s", f.name, other.name, id)
			}
		}
	}
}

// testTenantStreams: each tenant's viewer watches events through the CLI
// (`events watch`) and the SSE stream (client.Watch); a cordon of the other
// tenant's node, then of its own, shows its own node's event and never the
// other's. audit.list of each admin shows its own cordons only; the fleet
// page (page, fragment, node, shell and GPU pages) shows each tenant's
// admin and viewer its own nodes and 404s the other's.
func testTenantStreams(ctx context.Context, t *testing.T, d *deployment, admin *client.Client, a, b *tenantFixture) {
	cli := testenv.Start(t, append(d.env, "BETTER_COMPUTE_TOKEN="+a.secrets[store.RoleViewer]), d.bc, "events", "watch",
		"--server", d.api, "-o", "json")
	var mu sync.Mutex
	var sse []string
	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		_ = b.tokens[store.RoleViewer].Watch(watchCtx, client.WatchParams{}, func(e *client.WatchEvent) error {
			mu.Lock()
			sse = append(sse, string(e.Data))
			mu.Unlock()
			return nil
		})
	}()
	seen := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(sse, "\n")
	}
	// Cordon and uncordon until each watcher has printed its own node's
	// event (a stream starts at the newest event: it may open after the
	// first cordon).
	toggle := false
	eventually(t, 60*time.Second, func() bool {
		toggle = !toggle
		for _, f := range []*tenantFixture{b, a} { // the other's first
			var err error
			if toggle {
				_, err = admin.NodesCordon(ctx, &apiv1.NodeRequest{Id: f.n1})
			} else {
				_, err = admin.NodesUncordon(ctx, &apiv1.NodeRequest{Id: f.n1})
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		return strings.Contains(cli.Output(), a.n1) && strings.Contains(seen(), b.n1)
	}, func() string {
		return fmt.Sprintf("events watch of %s's viewer:\n%s\nSSE stream of %s's viewer:\n%s", a.name, cli.Output(), b.name, seen())
	})
	// A cordon of the other's node came first each time: seen by now if at all.
	for _, n := range []string{b.n1, b.n2, b.n3} {
		if strings.Contains(cli.Output(), n) {
			t.Errorf("events watch of %s's viewer shows %s's node %s:\n%s", a.name, b.name, n, cli.Output())
		}
	}
	for _, n := range []string{a.n1, a.n2, a.n3} {
		if strings.Contains(seen(), n) {
			t.Errorf("the SSE stream of %s's viewer shows %s's node %s:\n%s", b.name, a.name, n, seen())
		}
	}

	// audit.list: each admin sees its own tenant's calls, not the other's.
	for _, f := range []*tenantFixture{a, b} {
		other := b
		if f == b {
			other = a
		}
		rows, err := f.tokens[store.RoleAdmin].AuditList(ctx, &apiv1.ListAuditRequest{Page: &apiv1.Page{Limit: 1000}})
		if err != nil {
			t.Fatal(err)
		}
		var own int
		for _, r := range rows.Entries {
			if strings.Contains(r.Actor, other.tokenIDs[store.RoleAdmin]) || strings.Contains(r.Actor, other.tokenIDs[store.RoleOperator]) {
				t.Errorf("%s's audit.list shows %s's row %+v", f.name, other.name, r)
			}
			if strings.Contains(r.Actor, f.tokenIDs[store.RoleOperator]) && r.Action == "nodes.cordon" && r.Outcome == "ok" {
				own++
			}
		}
		if own == 0 {
			t.Errorf("%s's audit.list lacks its operator's nodes.cordon: %d rows", f.name, len(rows.Entries))
		}
	}

	// The fleet page: each tenant's session shows its own nodes and none
	// of the other's; another tenant's node page is 404, as a node that
	// does not exist. The root's shows both.
	page := func(token string) func(path string) (int, string) {
		jar, _ := cookiejar.New(nil)
		c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		do := func(req *http.Request) (int, string) {
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(body)
		}
		form := url.Values{"token": {token}}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.api+"/watch/login", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", d.api)
		if code, body := do(req); code != http.StatusSeeOther {
			t.Fatalf("fleet page login: %d\n%s", code, body)
		}
		return func(path string) (int, string) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, d.api+path, nil)
			return do(req)
		}
	}
	for _, f := range []*tenantFixture{a, b} {
		other := b
		if f == b {
			other = a
		}
		for _, role := range []string{store.RoleAdmin, store.RoleViewer} {
			get := page(f.secrets[role])
			for _, path := range []string{"/watch", "/watch/fragment"} {
				code, body := get(path)
				if code != http.StatusOK || !strings.Contains(body, f.n1) || !strings.Contains(body, f.n2) {
					t.Errorf("fleet page %s of %s's %s: %d, want its nodes %s and %s:\n%s", path, f.name, role, code, f.n1, f.n2, body)
				}
				for _, id := range []string{other.n1, other.n2, other.pool, other.rollout, other.name + "-pool"} {
					if strings.Contains(body, id) {
						t.Errorf("fleet page %s of %s's %s shows %s's %s", path, f.name, role, other.name, id)
					}
				}
			}
			if code, body := get("/watch/nodes/" + f.n1); code != http.StatusOK || !strings.Contains(body, f.n1) {
				t.Errorf("node page of %s's own %s for its %s: %d", f.name, f.n1, role, code)
			}
			for _, path := range []string{"/watch/nodes/" + other.n1, "/watch/nodes/" + other.n1 + "/shell", "/watch/gpus/" + other.gpu} {
				if code, body := get(path); code != http.StatusNotFound || strings.Contains(body, other.n1) {
					t.Errorf("GET %s (%s's) by %s's %s: %d, want 404\n%s", path, other.name, f.name, role, code, body)
				}
			}
		}
	}
	if code, body := page(d.adminToken)("/watch/fragment"); code != http.StatusOK || !strings.Contains(body, a.n1) || !strings.Contains(body, b.n1) {
		t.Errorf("the root admin's fleet page: %d, want both tenants' nodes\n%s", code, body)
	}
}

// reservationRequest is a reservation of one GPU of pool for an hour from
// an hour ahead whose labels match no node: it never holds one.
func reservationRequest(pool string) *apiv1.CreateReservationRequest {
	now := time.Now()
	return &apiv1.CreateReservationRequest{Pool: pool, Gpus: 1, Labels: map[string]string{"matrix": "no-such-node"},
		Start: timestamppb.New(now.Add(time.Hour)), End: timestamppb.New(now.Add(2 * time.Hour)), Owner: "matrix"}
}
