package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/policy"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// PolicyRefresh is how often an api process checks whether any tenant's
// policies changed (store.PolicyStamp) before it decides a call: a change
// made through another process holds here within it, and the allowed
// decisions it cached are dropped then (docs/policies.md).
const PolicyRefresh = 5 * time.Second

// policyStore is what the evaluator reads.
type policyStore interface {
	PolicyStamp(ctx context.Context) (int64, error)
	PolicyDocumentList(ctx context.Context, p *store.ListParams) ([]*store.PolicyDocument, error)
	AccessGrantsActive(ctx context.Context, now *time.Time) ([]*store.AccessRequest, error)
}

// policies is one api process's view of every tenant's policies: compiled
// when a tenant's document changes, re-checked every PolicyRefresh, each
// view with its own cache of allowed read decisions
// (policy.DecisionCacheTTL), dropped with it.
type policies struct {
	catalog policy.Catalog
	store   policyStore
	log     *slog.Logger
	now     func() time.Time

	// refreshing is held by the one caller that reads the documents; the
	// others decide by the view in force meanwhile (they wait only for the
	// first view, and after an apply in this process).
	refreshing sync.Mutex

	mu      sync.Mutex // guards the fields below
	view    *view      // nil until the first read succeeds
	checked time.Time
	// dirty counts applies made through this process; clean is the count
	// the view in force has seen. gdirty and gclean count the same of
	// approvals and revocations of access requests (the grants).
	dirty, clean   int
	gdirty, gclean int
}

// view is the policies in force as one decision reads them.
type view struct {
	*policy.Bundle
	// broken are the tenants whose stored document no longer compiles.
	broken map[string]error
	stamp  int64
	// versions and sets are what was compiled, by tenant: a refresh
	// compiles again only the documents whose version changed.
	versions map[string]int64
	sets     map[string]*policy.Set
	cache    *policy.Cache
	// grants are the approved access requests whose end was ahead when
	// they were read (every PolicyRefresh), by tenant and identity
	// (grantKey); each decision compares their end with its time.
	grants map[string][]policy.Grant
	// grantsAt is when the grants were last read (staleGrants).
	grantsAt time.Time
}

// grantKey is the key of view.grants: a tenant and an identity
// (iam.Principal.Identity).
func grantKey(tenant, identity string) string { return tenant + " " + identity }

// grantsOf returns the grants p holds (their end may have passed since
// they were read: Decide compares).
func (v *view) grantsOf(p *iam.Principal) []policy.Grant {
	return v.grants[grantKey(p.TenantID, p.Identity())]
}

// withGrants returns a copy of v deciding with the active requests rs.
func (v *view) withGrants(rs []*store.AccessRequest) *view {
	nv := *v
	nv.grants = make(map[string][]policy.Grant, len(rs))
	for _, r := range rs {
		if r.End == nil {
			continue
		}
		k := grantKey(r.TenantID, r.Requester)
		nv.grants[k] = append(nv.grants[k], policy.Grant{ID: r.ID, Policy: r.Policy, Scope: accessScope(r), End: *r.End})
	}
	return &nv
}

// accessScope is the selector of a request's resource scope, by id; nil
// for none.
func accessScope(r *store.AccessRequest) *policy.Selector {
	switch r.ScopeKind {
	case store.AccessScopePool:
		return &policy.Selector{Pools: []string{r.ScopeID}}
	case store.AccessScopeSite:
		return &policy.Selector{Sites: []string{r.ScopeID}}
	case store.AccessScopeNode:
		return &policy.Selector{Nodes: []string{r.ScopeID}}
	case store.AccessScopeTenant:
		return &policy.Selector{Tenants: []string{r.ScopeID}}
	}
	return nil
}

func newPolicies(table map[string]apiv1.Method, st policyStore, log *slog.Logger, now func() time.Time) *policies {
	cat := policy.NonMethodActions()
	for name, m := range table {
		cat[name] = m.Role
	}
	return &policies{catalog: cat, store: st, log: log, now: now}
}

// changed makes the next decision re-read the documents, waiting for them
// (after an apply in this process).
func (ps *policies) changed() {
	ps.mu.Lock()
	ps.dirty++
	ps.mu.Unlock()
}

// grantsChanged makes the next decision re-read the grants, waiting for
// them (after an approval or a revocation in this process).
func (ps *policies) grantsChanged() {
	ps.mu.Lock()
	ps.gdirty++
	ps.mu.Unlock()
}

// due reports the view in force and whether it must be re-read: always
// before the first read and after an apply, approval or revocation here
// (wait), else once PolicyRefresh has passed.
func (ps *policies) due() (v *view, refresh, wait bool, dirty, gdirty int) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	wait = ps.view == nil || ps.dirty != ps.clean || ps.gdirty != ps.gclean
	return ps.view, wait || ps.now().Sub(ps.checked) >= PolicyRefresh, wait, ps.dirty, ps.gdirty
}

// current returns the policies in force, re-read when PolicyRefresh has
// passed and the stamp moved, and the grants, re-read every
// PolicyRefresh. A failed read keeps the ones in force (and is tried
// again at the next call); before the first read of the documents
// succeeds it is an error, so that no call is decided without a tenant's
// deny statements.
func (ps *policies) current(ctx context.Context) (*view, error) {
	v, refresh, wait, _, _ := ps.due()
	if !refresh {
		return v, nil
	}
	if wait {
		ps.refreshing.Lock()
	} else if !ps.refreshing.TryLock() {
		return v, nil // another caller is reading them
	}
	defer ps.refreshing.Unlock()
	v, refresh, _, dirty, gdirty := ps.due()
	if !refresh {
		return v, nil
	}
	stamp, err := ps.store.PolicyStamp(ctx)
	if err == nil && (v == nil || dirty != ps.clean || stamp != v.stamp) {
		var nv *view
		if nv, err = ps.load(ctx, v, stamp); err == nil {
			v = nv
		}
	}
	if err != nil {
		if v == nil {
			return nil, fmt.Errorf("read the tenants' policies: %w", err)
		}
		ps.log.WarnContext(ctx, "Policies not re-read; deciding by the ones in force", logkey.Err, err)
		return ps.staleGrants(v), nil
	}
	now := ps.now()
	if grants, err := ps.store.AccessGrantsActive(ctx, &now); err == nil {
		v = v.withGrants(grants)
		v.grantsAt = now
	} else {
		// The grants read before stay a while (their ends still hold); a
		// revocation waits for the next read, at most GrantsStale.
		ps.log.WarnContext(ctx, "Access grants not re-read; deciding by the ones read before", logkey.Err, err)
		v = ps.staleGrants(v)
		gdirty = ps.gclean
	}
	ps.mu.Lock()
	ps.view, ps.checked, ps.clean, ps.gclean = v, ps.now(), dirty, gdirty
	ps.mu.Unlock()
	return v, nil
}

// GrantsStale is how long after its last good read an api process still
// decides by the access grants it read: past it, while the store cannot
// be read, grants are dropped (they only add rights: a revocation made
// elsewhere must not wait for the store to come back).
const GrantsStale = 3 * PolicyRefresh

// staleGrants is v without its grants once they were last read more than
// GrantsStale ago.
func (ps *policies) staleGrants(v *view) *view {
	if len(v.grants) == 0 || ps.now().Sub(v.grantsAt) <= GrantsStale {
		return v
	}
	ps.log.Warn("Access grants dropped: not read for longer than GrantsStale", "last_read", v.grantsAt)
	nv := v.withGrants(nil)
	nv.grantsAt = v.grantsAt
	ps.mu.Lock()
	if ps.view == v {
		ps.view = nv
	}
	ps.mu.Unlock()
	return nv
}

// load reads every live tenant's document and compiles those changed
// since old. A document that no longer compiles (a build that dropped an
// action it names) leaves its tenant's callers with policies.* only, so
// that an admin can mend it, rather than without its deny statements.
func (ps *policies) load(ctx context.Context, old *view, stamp int64) (*view, error) {
	v := &view{broken: map[string]error{}, stamp: stamp, versions: map[string]int64{}, sets: map[string]*policy.Set{},
		cache: policy.NewCache(policy.CacheConfig{Now: ps.now})}
	if old != nil {
		v.grants, v.grantsAt = old.grants, old.grantsAt // until they are read again, after this
	}
	for cursor := ""; ; {
		ds, err := ps.store.PolicyDocumentList(ctx, &store.ListParams{Cursor: cursor, Limit: store.MaxListLimit})
		if err != nil {
			return nil, err
		}
		for _, d := range ds {
			cursor = d.TenantID
			v.versions[d.TenantID] = d.Version
			if old != nil && old.versions[d.TenantID] == d.Version {
				if set := old.sets[d.TenantID]; set != nil {
					v.sets[d.TenantID] = set
				} else if err := old.broken[d.TenantID]; err != nil {
					v.broken[d.TenantID] = err
				}
				continue
			}
			doc, err := policy.Parse([]byte(d.Document))
			var set *policy.Set
			if err == nil {
				set, err = policy.Compile(d.TenantID, doc, ps.catalog)
			}
			if err != nil {
				ps.log.ErrorContext(ctx, "A tenant's policies no longer compile: its callers may call policies.* only until they are applied again",
					"tenant", d.TenantID, "version", d.Version, logkey.Err, err)
				v.broken[d.TenantID] = err
				continue
			}
			v.sets[d.TenantID] = set
		}
		if len(ds) < store.MaxListLimit {
			break
		}
	}
	b, err := policy.NewBundle(ps.catalog, slices.Collect(maps.Values(v.sets))...)
	v.Bundle = b
	return v, err
}

// decision is one call's question to the evaluator.
type decision struct {
	p      *iam.Principal
	addr   netip.Addr
	action string
	res    policy.Resource
	req    proto.Message // its fields are request.fields; nil for none
	read   bool          // an allowed decision may be cached
}

// decide asks the policies in force; nil when allowed, else the
// PERMISSION_DENIED (or UNAVAILABLE, when they cannot be read) to answer.
func (s *Server) decide(ctx context.Context, d decision) error {
	v, err := s.policies.current(ctx)
	if err != nil {
		return &Error{Code: apiv1.CodeUnavailable, Message: err.Error()}
	}
	if err := v.broken[d.p.TenantID]; err != nil && !strings.HasPrefix(d.action, "policies.") {
		return &Error{Code: apiv1.CodePermissionDenied, Message: fmt.Sprintf(
			"%s refused: tenant %s's policies no longer compile (%v); an admin must apply them again (policy apply)", d.action, d.p.TenantID, err)}
	}
	in := policy.Input{Principal: principalOf(d.p), Action: d.action, Resource: d.res, SourceIP: d.addr, Time: s.now(),
		Grants: v.grantsOf(d.p)}
	if d.req != nil && (v.Bound(in.Principal) || len(in.Grants) > 0) {
		in.Fields = requestFields(d.req)
	}
	// A caller holding grants is never served from the cache, nor is its
	// decision kept: a grant's end holds at once (policy.Cache).
	dec := v.cache.Decide(in, d.read, v.Bundle)
	if !dec.Allow {
		return &Error{Code: apiv1.CodePermissionDenied, Message: fmt.Sprintf("%s refused: %s", d.action, dec.Reason)}
	}
	return nil
}

// bound reports whether a tenant policy binds p, or p holds grants: only
// then can a decision depend on the resource, the address or the request.
func (s *Server) bound(ctx context.Context, p *iam.Principal) (bool, error) {
	v, err := s.policies.current(ctx)
	if err != nil {
		return false, &Error{Code: apiv1.CodeUnavailable, Message: err.Error()}
	}
	return v.Bound(principalOf(p)) || v.broken[p.TenantID] != nil || len(v.grantsOf(p)) > 0, nil
}

func principalOf(p *iam.Principal) policy.Principal {
	return policy.Principal{Token: p.TokenID, Tenant: p.TenantID, Role: p.Role, Groups: p.Groups}
}

// requestFields is a request's fields as its JSON form has them
// (lowerCamelCase), for request.fields in conditions.
func requestFields(req proto.Message) map[string]any {
	// Every field, those at their default value too: a condition reads
	// request.fields.asRoot == false as the request says it, not as a
	// missing key.
	b, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(withoutSecrets(req))
	if err != nil {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m
}

// nodeField is the request field that names the one node a method acts
// on: "id" for the nodes.* methods, "node" (tunnels.create), "nodeId" or
// a single "nodeIds" entry for the others.
func nodeField(name string, req proto.Message) string {
	if group, _, _ := strings.Cut(name, "."); group == "nodes" {
		if v := stringField(req, "id"); v != "" {
			return v
		}
	}
	if v := stringField(req, "node"); v != "" {
		return v
	}
	if v := stringField(req, "node_id"); v != "" {
		return v
	}
	if ids := req.ProtoReflect().Descriptor().Fields().ByName("node_ids"); ids != nil && ids.IsList() && ids.Kind() == protoreflect.StringKind {
		if l := req.ProtoReflect().Get(ids).List(); l.Len() == 1 {
			return l.Get(0).String()
		}
	}
	return ""
}

// stringField is req's string field name ("" when it has none).
func stringField(req proto.Message, name string) string {
	if f := req.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(name)); f != nil && f.Kind() == protoreflect.StringKind && !f.IsList() {
		return req.ProtoReflect().Get(f).String()
	}
	return ""
}

// nodeResource is what a policy sees of a node: its pool, site and tenant
// (ids and names) and labels. A node that does not exist, or that lies
// outside p's subtree, is a resource with the id asked for only: a policy
// cannot tell another tenant's node from a missing one (the handler
// answers NOT_FOUND for both when allowed).
//
// pools, when not nil, keeps the pool part of each pool read (nil: the
// pool is outside p's subtree or gone) for the next node of one call: a
// command to many nodes reads each pool once.
func (s *Server) nodeResource(ctx context.Context, p *iam.Principal, id string, pools map[string]*policy.Resource) (policy.Resource, error) {
	res := policy.Resource{Node: id}
	n, err := s.store.NodeGet(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return res, nil
	}
	if err != nil {
		return res, err
	}
	pool, seen := pools[n.PoolID]
	if !seen {
		var pr policy.Resource
		ok, err := s.poolResource(ctx, p, n.PoolID, &pr)
		if err != nil {
			return res, err
		}
		if ok {
			pool = &pr
		}
		if pools != nil {
			pools[n.PoolID] = pool
		}
	}
	if pool == nil {
		return res, nil
	}
	full := *pool
	full.Node, full.NodeName, full.Labels = n.ID, n.Hostname, maps.Clone(n.Labels)
	return full, nil
}

// poolResource fills res with a pool's id, name, site and tenant (ids and
// names) when the pool exists and lies within p's subtree; ok is false
// (and res unchanged) otherwise.
func (s *Server) poolResource(ctx context.Context, p *iam.Principal, idOrName string, res *policy.Resource) (ok bool, err error) {
	pool, err := s.store.PoolGet(ctx, idOrName)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if ok, err := s.sees(ctx, p, pool.TenantID); err != nil || !ok {
		return false, err
	}
	r := *res
	r.Pool, r.PoolName = pool.ID, pool.Name
	if site, err := s.store.SiteGet(ctx, pool.SiteID); err == nil {
		r.Site, r.SiteName = site.ID, site.Name
	} else if !errors.Is(err, store.ErrNotFound) {
		return false, err
	}
	if err := s.tenantResource(ctx, p, pool.TenantID, &r); err != nil {
		return false, err
	}
	*res = r
	return true, nil
}

// tenantResource sets res's tenant to the tenant idOrName names (its id
// and name) when it lies within p's subtree, else to idOrName as given.
func (s *Server) tenantResource(ctx context.Context, p *iam.Principal, idOrName string, res *policy.Resource) error {
	res.Tenant, res.TenantName = idOrName, ""
	t, err := s.store.TenantGet(ctx, idOrName)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if t.DeletedAt == nil && p.Sees(t.Path) {
		res.Tenant, res.TenantName = t.ID, t.Name
	}
	return nil
}

// requestResources are what method name acts on, for a caller whose
// decisions depend on it; each must be allowed. First the one node the
// request names (nodes.*, tunnels.create, a command to one node), else the
// pool it names (a command to a pool, rollouts.create,
// reservations.create, pools.*, joinTokens.create, ...), else the tenant
// it names (tokens.create, tenants.*, policies.*, ...), else the caller's
// own tenant. A request that names a tenant besides its node or pool
// (nodes.move, pools.move: the destination) is decided on that tenant too,
// and nodes.move on its destination pool. A command to several nodes or a
// selector is decided on each node it resolves to (commandsCreate).
func (s *Server) requestResources(ctx context.Context, p *iam.Principal, name string, req proto.Message) ([]policy.Resource, error) {
	var out []policy.Resource
	if id := nodeField(name, req); id != "" {
		res, err := s.nodeResource(ctx, p, id, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, res)
	} else if pool := stringField(req, "pool"); pool != "" && name != "nodes.move" {
		res := policy.Resource{Pool: pool}
		if _, err := s.poolResource(ctx, p, pool, &res); err != nil {
			return nil, err
		}
		out = append(out, res)
	}
	tenant := stringField(req, "tenant")
	if len(out) > 0 && tenant == "" {
		return out, nil
	}
	if tenant == "" {
		tenant = p.TenantID
	}
	var res policy.Resource
	if err := s.tenantResource(ctx, p, tenant, &res); err != nil {
		return nil, err
	}
	if pool := stringField(req, "pool"); pool != "" && name == "nodes.move" {
		res.Pool = pool
		if _, err := s.poolResource(ctx, p, pool, &res); err != nil {
			return nil, err
		}
	}
	return append(out, res), nil
}

// decideOnNodes decides actions for p on each node (tunnels.create's
// nodes.shell, commands.create on each target): by p's built-in role alone
// when no tenant policy binds p, else on each node's resource, at most
// one store read per node. The first refusal names its node.
func (s *Server) decideOnNodes(ctx context.Context, p *iam.Principal, nodeIDs []string, actions ...string) error {
	bound, err := s.bound(ctx, p)
	if err != nil {
		return err
	}
	addr := CallerAddr(ctx)
	if !bound {
		for _, a := range actions {
			if err := s.decide(ctx, decision{p: p, addr: addr, action: a}); err != nil {
				return err
			}
		}
		return nil
	}
	pools := map[string]*policy.Resource{}
	for _, id := range nodeIDs {
		res, err := s.nodeResource(ctx, p, id, pools)
		if err != nil {
			return err
		}
		for _, a := range actions {
			if err := s.decide(ctx, decision{p: p, addr: addr, action: a, res: res}); err != nil {
				if e, ok := err.(*Error); ok && len(nodeIDs) > 1 {
					e.Message = "on node " + id + ": " + e.Message
				}
				return err
			}
		}
	}
	return nil
}

// tunnelActions are the actions a tunnel of kind is decided as
// (docs/policies.md): nodes.shell or nodes.portForward, and
// nodes.shellAsRoot for a root shell.
func tunnelActions(kind string, asRoot bool) []string {
	if kind == tunnel.KindPort {
		return []string{policy.ActionNodesPortForward}
	}
	if asRoot {
		return []string{policy.ActionNodesShell, policy.ActionNodesShellAsRoot}
	}
	return []string{policy.ActionNodesShell}
}
