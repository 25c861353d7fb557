package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"strings"
	"sync"
	"time"

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
}

// policies is one api process's view of every tenant's policies: compiled
// once per change, re-checked every PolicyRefresh, and a cache of allowed
// read decisions (policy.DecisionCacheTTL) dropped whenever they change.
type policies struct {
	catalog policy.Catalog
	store   policyStore
	log     *slog.Logger
	now     func() time.Time
	cache   *policy.Cache

	// mu is held while the documents are read: one caller reads, the
	// others wait for its answer.
	mu      sync.Mutex
	loaded  bool
	bundle  *policy.Bundle
	broken  map[string]error // tenants whose stored document no longer compiles
	stamp   int64
	checked time.Time
	dirty   bool
}

// view is the policies in force as one decision reads them.
type view struct {
	*policy.Bundle
	broken map[string]error
}

func newPolicies(table map[string]apiv1.Method, st policyStore, log *slog.Logger, now func() time.Time) *policies {
	cat := policy.NonMethodActions()
	for name, m := range table {
		cat[name] = m.Role
	}
	return &policies{catalog: cat, store: st, log: log, now: now, cache: policy.NewCache(policy.CacheConfig{Now: now})}
}

// changed makes the next decision re-read the documents (after an apply in
// this process).
func (ps *policies) changed() {
	ps.mu.Lock()
	ps.dirty = true
	ps.mu.Unlock()
}

// current returns the policies in force, re-read when PolicyRefresh has
// passed and the stamp moved. A failed read keeps the ones in force (and
// is tried again at the next call); before the first read succeeds it is
// an error, so that no call is decided without a tenant's deny statements.
func (ps *policies) current(ctx context.Context) (view, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	now := ps.now()
	if ps.loaded && !ps.dirty && now.Sub(ps.checked) < PolicyRefresh {
		return view{ps.bundle, ps.broken}, nil
	}
	stamp, err := ps.store.PolicyStamp(ctx)
	if err == nil && (!ps.loaded || ps.dirty || stamp != ps.stamp) {
		var b *policy.Bundle
		var broken map[string]error
		if b, broken, err = ps.load(ctx); err == nil {
			ps.bundle, ps.broken, ps.stamp, ps.loaded, ps.dirty = b, broken, stamp, true, false
			ps.cache.Clear()
		}
	}
	if err != nil {
		if !ps.loaded {
			return view{}, fmt.Errorf("read the tenants' policies: %w", err)
		}
		ps.log.WarnContext(ctx, "Policies not re-read; deciding by the ones in force", logkey.Err, err)
		return view{ps.bundle, ps.broken}, nil
	}
	ps.checked = now
	return view{ps.bundle, ps.broken}, nil
}

// load compiles every live tenant's document. A document that no longer
// compiles (a build that dropped an action it names) leaves its tenant's
// callers with policies.* only, so that an admin can mend it, rather than
// without its deny statements.
func (ps *policies) load(ctx context.Context) (*policy.Bundle, map[string]error, error) {
	var sets []*policy.Set
	broken := map[string]error{}
	for cursor := ""; ; {
		ds, err := ps.store.PolicyDocumentList(ctx, &store.ListParams{Cursor: cursor, Limit: store.MaxListLimit})
		if err != nil {
			return nil, nil, err
		}
		for _, d := range ds {
			cursor = d.TenantID
			doc, err := policy.Parse([]byte(d.Document))
			var set *policy.Set
			if err == nil {
				set, err = policy.Compile(d.TenantID, doc, ps.catalog)
			}
			if err != nil {
				ps.log.ErrorContext(ctx, "A tenant's policies no longer compile: its callers may call policies.* only until they are applied again",
					"tenant", d.TenantID, "version", d.Version, logkey.Err, err)
				broken[d.TenantID] = err
				continue
			}
			sets = append(sets, set)
		}
		if len(ds) < store.MaxListLimit {
			break
		}
	}
	b, err := policy.NewBundle(ps.catalog, sets...)
	return b, broken, err
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
	in := policy.Input{Principal: principalOf(d.p), Action: d.action, Resource: d.res, SourceIP: d.addr, Time: s.now()}
	if d.req != nil && v.Bound(in.Principal) {
		in.Fields = requestFields(d.req)
	}
	dec := s.policies.cache.Decide(in, d.read, v.Bundle)
	if !dec.Allow {
		return &Error{Code: apiv1.CodePermissionDenied, Message: fmt.Sprintf("%s refused: %s", d.action, dec.Reason)}
	}
	return nil
}

// bound reports whether a tenant policy binds p: only then can a decision
// depend on the resource, the address or the request.
func (s *Server) bound(ctx context.Context, p *iam.Principal) (bool, error) {
	v, err := s.policies.current(ctx)
	if err != nil {
		return false, &Error{Code: apiv1.CodeUnavailable, Message: err.Error()}
	}
	return v.Bound(principalOf(p)) || v.broken[p.TenantID] != nil, nil
}

func principalOf(p *iam.Principal) policy.Principal {
	return policy.Principal{Token: p.TokenID, Tenant: p.TenantID, Role: p.Role}
}

// requestFields is a request's fields as its JSON form has them
// (lowerCamelCase), for request.fields in conditions.
func requestFields(req proto.Message) map[string]any {
	b, err := marshal.Marshal(withoutSecrets(req))
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
// on: "id" for the nodes.* methods, "node" for tunnels.create and the
// others that have one.
func nodeField(name string, req proto.Message) string {
	fields := req.ProtoReflect().Descriptor().Fields()
	get := func(n string) string {
		if f := fields.ByName(protoreflect.Name(n)); f != nil && f.Kind() == protoreflect.StringKind && !f.IsList() {
			return req.ProtoReflect().Get(f).String()
		}
		return ""
	}
	if group, _, _ := cutMethod(name); group == "nodes" {
		if v := get("id"); v != "" {
			return v
		}
	}
	if v := get("node"); v != "" {
		return v
	}
	if v := get("node_id"); v != "" {
		return v
	}
	if ids := fields.ByName("node_ids"); ids != nil && ids.IsList() && ids.Kind() == protoreflect.StringKind {
		if l := req.ProtoReflect().Get(ids).List(); l.Len() == 1 {
			return l.Get(0).String()
		}
	}
	return ""
}

func cutMethod(name string) (group, method string, ok bool) {
	for i := range len(name) {
		if name[i] == '.' {
			return name[:i], name[i+1:], true
		}
	}
	return name, "", false
}

// nodeResource is what a policy sees of a node: its pool, site and tenant
// (ids and names) and labels. A node that does not exist is a resource
// with its id only (the handler answers NOT_FOUND when allowed).
func (s *Server) nodeResource(ctx context.Context, id string) (policy.Resource, error) {
	res := policy.Resource{Node: id}
	n, err := s.store.NodeGet(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return res, nil
	}
	if err != nil {
		return res, err
	}
	res.NodeName, res.Labels = n.Hostname, maps.Clone(n.Labels)
	return res, s.poolResource(ctx, n.PoolID, &res)
}

// poolResource fills res with a pool's id, name, site and tenant.
func (s *Server) poolResource(ctx context.Context, poolID string, res *policy.Resource) error {
	pool, err := s.store.PoolGet(ctx, poolID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	res.Pool, res.PoolName, res.Tenant = pool.ID, pool.Name, pool.TenantID
	if site, err := s.store.SiteGet(ctx, pool.SiteID); err == nil {
		res.Site, res.SiteName = site.ID, site.Name
	} else if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if t, err := s.store.TenantGet(ctx, pool.TenantID); err == nil {
		res.TenantName = t.Name
	} else if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	return nil
}

// requestResource is what method name acts on, for a caller whose
// decisions depend on it: the one node it names (nodes.*, tunnels.create,
// a command to one node), else the pool it names (a command to a pool,
// rollouts.create, reservations.create, pools.get, ...), else the caller's
// tenant only. A command to several nodes or a selector is decided here
// without a node and again for each node it resolves to (commandsCreate).
func (s *Server) requestResource(ctx context.Context, p *iam.Principal, name string, req proto.Message) (policy.Resource, error) {
	if id := nodeField(name, req); id != "" {
		return s.nodeResource(ctx, id)
	}
	if f := req.ProtoReflect().Descriptor().Fields().ByName("pool"); f != nil && f.Kind() == protoreflect.StringKind && !f.IsList() {
		if pool := req.ProtoReflect().Get(f).String(); pool != "" {
			res := policy.Resource{Pool: pool}
			return res, s.poolResource(ctx, pool, &res)
		}
	}
	return policy.Resource{Tenant: p.TenantID}, nil
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
	for _, id := range nodeIDs {
		res, err := s.nodeResource(ctx, id)
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
