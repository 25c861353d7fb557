package policy

import (
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
)

// Set is one tenant's compiled policies, ready to decide calls. It is
// immutable and safe for concurrent use.
//
// Statements are indexed by what binds them (a token id, a role, a group)
// and by exact action: patterns are expanded against the Catalog when the
// set is compiled, so a decision reads only the statements bound to its
// caller for its action, however many policies the tenant has.
type Set struct {
	tenant string
	cat    Catalog
	index  map[bindKey]*bucket
	// bound holds the bindings of every policy (keys without action).
	bound map[bindKey]bool
	// requestable holds the requestable policies by name: their request
	// blocks and their statements by exact action, for grants.
	requestable map[string]*Requestable
	policies    int
	statements  int
}

// Requestable is a requestable policy of a Set (its request block, as
// compiled): who may ask for it, who may approve, for how long at most.
type Requestable struct {
	name                  string
	requesters, approvers map[bindKey]bool
	maxDuration           time.Duration
	// index holds the policy's statements by exact action.
	index map[string]*bucket
}

// bindKind says what binds a statement to callers.
type bindKind uint8

const (
	byToken bindKind = iota + 1
	byRole
	byGroup
)

// bindKey is what the index is keyed on: a binding and an exact action.
type bindKey struct {
	kind   bindKind
	name   string
	action string
}

// bucket holds the statements bound by one key for one action.
type bucket struct {
	deny, allow []*statement
}

// statement is a compiled statement.
type statement struct {
	deny bool
	// sel, when set, selects resources; not inverts it (notResources).
	sel *Selector
	not bool
	// cond, when set, must hold.
	cond *condition
	// reason is the Decision.Reason when it decides.
	reason string
}

// Compile checks doc as Parse does (for a Document made in code), then
// against cat, and compiles it for tenant: every action must be in cat and
// every pattern must match one of its actions, every condition must
// compile (type bool, literal CIDRs valid, worst-case cost at most
// MaxConditionCost), every test's action must be known. All problems are
// returned, joined, each a *FieldError naming its place. Conditions are
// compiled here once, never per decision; identical condition texts share
// one program.
func Compile(tenant string, doc *Document, cat Catalog) (*Set, error) {
	if err := cat.Validate(); err != nil {
		return nil, err
	}
	if doc == nil {
		return nil, errors.New("compile policies: no document")
	}
	var l errorList
	doc.check(&l)
	if err := l.err(); err != nil {
		return nil, err
	}
	s := &Set{tenant: tenant, cat: maps.Clone(cat), index: map[bindKey]*bucket{}, bound: map[bindKey]bool{},
		requestable: map[string]*Requestable{}, policies: len(doc.Policies)}
	c := &compiler{cat: cat, l: &l, conds: map[string]*condition{}, condErrs: map[string]error{}}
	for i := range doc.Policies {
		p := &doc.Policies[i]
		keys := bindKeys(&p.Bind)
		for _, k := range keys {
			s.bound[k] = true
		}
		var req *Requestable
		if p.Request != nil {
			req = &Requestable{name: p.Name, requesters: keySet(&p.Request.Requesters), approvers: keySet(&p.Request.Approvers),
				maxDuration: p.Request.Duration(), index: map[string]*bucket{}}
			s.requestable[p.Name] = req
		}
		for j := range p.Statements {
			st, actions := c.statement(fmt.Sprintf("policies[%d].statements[%d]", i, j), p.Name, j, &p.Statements[j])
			s.statements++
			if req != nil {
				for _, a := range actions {
					req.index[a] = req.index[a].with(st)
				}
			}
			for _, k := range keys {
				for _, a := range actions {
					k.action = a
					b := s.index[k]
					if b == nil {
						b = &bucket{}
						s.index[k] = b
					}
					if st.deny {
						b.deny = append(b.deny, st)
					} else {
						b.allow = append(b.allow, st)
					}
				}
			}
		}
	}
	for i := range doc.Tests {
		if a := doc.Tests[i].Action; a != "" && cat[a] == "" {
			l.add(fmt.Sprintf("tests[%d].action", i), "unknown action %q", a)
		}
	}
	if err := l.err(); err != nil {
		return nil, err
	}
	return s, nil
}

// compiler compiles the statements of one document.
type compiler struct {
	cat Catalog
	l   *errorList
	// conds and condErrs hold the conditions compiled so far, by text.
	conds    map[string]*condition
	condErrs map[string]error
}

// statement compiles statement number j (from 0) of policy name, at path,
// and returns it with the actions it covers, patterns expanded.
func (c *compiler) statement(path, name string, j int, st *Statement) (*statement, []string) {
	actions := make([]string, 0, len(st.Actions))
	seen := map[string]bool{}
	for k, a := range st.Actions {
		exp := c.cat.expand(a)
		switch {
		case len(exp) > 0:
		case strings.Contains(a, "*"):
			c.l.add(fmt.Sprintf("%s.actions[%d]", path, k), "pattern %q matches no known action", a)
		default:
			c.l.add(fmt.Sprintf("%s.actions[%d]", path, k), "unknown action %q", a)
		}
		for _, e := range exp {
			if !seen[e] {
				seen[e] = true
				actions = append(actions, e)
			}
		}
	}
	cs := &statement{deny: st.Effect == Deny}
	verb := "allowed"
	if cs.deny {
		verb = "denied"
	}
	cs.reason = verb + " by policy " + strconv.Quote(name) + " statement " + strconv.Itoa(j+1)
	switch {
	case st.Resources != nil:
		cs.sel = st.Resources.clone()
	case st.NotResources != nil:
		cs.sel, cs.not = st.NotResources.clone(), true
	}
	if st.Condition != "" {
		cond, ok := c.conds[st.Condition]
		err := c.condErrs[st.Condition]
		if !ok && err == nil {
			if cond, err = compileCondition(st.Condition); err != nil {
				c.condErrs[st.Condition] = err
			} else {
				c.conds[st.Condition] = cond
			}
		}
		if err != nil {
			c.l.addErr(path+".condition", err)
		}
		cs.cond = cond
	}
	return cs, actions
}

// with returns b (a new bucket when nil) with st added.
func (b *bucket) with(st *statement) *bucket {
	if b == nil {
		b = &bucket{}
	}
	if st.deny {
		b.deny = append(b.deny, st)
	} else {
		b.allow = append(b.allow, st)
	}
	return b
}

// keySet returns the keys (without action) of b, as a set.
func keySet(b *Binding) map[bindKey]bool {
	m := map[bindKey]bool{}
	for _, k := range bindKeys(b) {
		m[k] = true
	}
	return m
}

// binds reports whether keys (a keySet) bind p: its token id, its role or
// one of its groups.
func binds(keys map[bindKey]bool, p *Principal) bool {
	if p.Token != "" && keys[bindKey{kind: byToken, name: p.Token}] {
		return true
	}
	if p.Role != "" && keys[bindKey{kind: byRole, name: p.Role}] {
		return true
	}
	for _, g := range p.Groups {
		if keys[bindKey{kind: byGroup, name: g}] {
			return true
		}
	}
	return false
}

// bindKeys returns the index keys (without action) binding p's callers.
func bindKeys(b *Binding) []bindKey {
	var keys []bindKey
	for _, t := range b.Tokens {
		keys = append(keys, bindKey{kind: byToken, name: t})
	}
	for _, r := range b.Roles {
		keys = append(keys, bindKey{kind: byRole, name: r})
	}
	for _, g := range b.Groups {
		keys = append(keys, bindKey{kind: byGroup, name: g})
	}
	return keys
}

// Tenant returns the tenant the set was compiled for.
func (s *Set) Tenant() string { return s.tenant }

// Len returns how many policies and statements the set holds.
func (s *Set) Len() (policies, statements int) { return s.policies, s.statements }

// Bound reports whether a policy of the set binds p (by its token id, its
// role or one of its groups, p being of the set's tenant): only then can a
// decision on p's calls depend on more than the action and p's role, so a
// caller may skip gathering the resource and the request's fields when it
// is false.
func (s *Set) Bound(p Principal) bool {
	if s == nil || p.Tenant != s.tenant {
		return false
	}
	return binds(s.bound, &p)
}

// Requestable returns the set's requestable policy name (one with a
// request block), or nil when it has none of that name or it is not
// requestable.
func (s *Set) Requestable(name string) *Requestable {
	if s == nil {
		return nil
	}
	return s.requestable[name]
}

// Name returns the policy's name.
func (r *Requestable) Name() string { return r.name }

// MaxDuration returns the longest time a request may ask for
// (request.maxDuration; DefaultRequestDuration when the file names none).
func (r *Requestable) MaxDuration() time.Duration { return r.maxDuration }

// Requester reports whether the policy's requesters bind p (by its token
// id, its role or one of its groups): whether p may ask for it, and
// whether a grant of it still holds for p.
func (r *Requestable) Requester(p Principal) bool { return binds(r.requesters, &p) }

// Approver reports whether the policy's approvers bind p. Whether p is
// the one who asked is the caller's to check: a requester never approves
// its own request.
func (r *Requestable) Approver(p Principal) bool { return binds(r.approvers, &p) }

// Decide decides a call (see the package doc, "Evaluation"). A caller of
// another tenant than the set's gets its built-in role only. A nil Set
// denies everything.
func (s *Set) Decide(in Input) Decision { return s.decide(&in, false) }

// DecideWorstCase decides a call as Decide does, but pessimistically, for
// checks that must hold whatever the call's address, time and fields,
// such as whether some token could still apply the tenant's policies
// after a change (package doc, "Worst case"): every statement with a
// condition is taken as if its condition held when it is a deny and as if
// it failed when it is an allow, without evaluating it. Bindings, actions
// and selectors match as in Decide, and statements without a condition
// and the built-in roles decide as there. A deny that applies only so
// gives the Reason `denied by policy "p" statement 2 (its condition taken
// to hold)`.
func (s *Set) DecideWorstCase(in Input) Decision { return s.decide(&in, true) }

// decide is Decide, or DecideWorstCase when worst is set.
func (s *Set) decide(in *Input, worst bool) Decision {
	if s == nil {
		return Decision{Reason: "no policy set loaded"}
	}
	if in.Principal.Tenant != s.tenant {
		return decideBuiltin(s.cat, in)
	}
	var gbuf [4]grantBucket
	granted := s.granted(in, gbuf[:0])
	if len(s.index) == 0 && len(granted) == 0 {
		return decideBuiltin(s.cat, in)
	}
	var buf [8]*bucket
	buckets := s.buckets(in, buf[:0])
	if len(buckets) == 0 && len(granted) == 0 {
		return decideBuiltin(s.cat, in)
	}
	var act *activation
	for _, b := range buckets {
		if d, ok := denies(in, b, worst, &act, nil); ok {
			return d
		}
	}
	for _, g := range granted {
		if d, ok := denies(in, g.b, worst, &act, g.g); ok {
			return d
		}
	}
	if s.cat.Allows(in.Principal.Role, in.Action) {
		return Decision{Allow: true, Reason: builtinReason(in.Principal.Role)}
	}
	for _, b := range buckets {
		for _, st := range b.allow {
			if worst && st.cond != nil {
				continue
			}
			// An allow whose condition fails does not apply.
			if ok, err := st.applies(in, &act); ok && err == nil {
				return Decision{Allow: true, Reason: st.reason}
			}
		}
	}
	for _, g := range granted {
		// A grant scoped to a resource allows on what its scope selects
		// only.
		if g.g.Scope != nil && !g.g.Scope.matchesIDs(&in.Resource) {
			continue
		}
		for _, st := range g.b.allow {
			if worst && st.cond != nil {
				continue
			}
			if ok, err := st.applies(in, &act); ok && err == nil {
				return Decision{Allow: true, Reason: st.reason + grantNote(g.g), Grant: g.g.ID}
			}
		}
	}
	return implicitDeny(s.cat, in)
}

// denies returns the decision of the first deny statement of b that
// applies to in (ok true), or ok false when none does; g is the grant that
// brought b (nil for statements bound to the caller), named in the reason.
func denies(in *Input, b *bucket, worst bool, act **activation, g *Grant) (Decision, bool) {
	note, id := "", ""
	if g != nil {
		note, id = grantNote(g), g.ID
	}
	for _, st := range b.deny {
		if worst && st.cond != nil {
			if st.selects(&in.Resource) {
				return Decision{Reason: st.reason + note + " (its condition taken to hold)", Grant: id}, true
			}
			continue
		}
		ok, err := st.applies(in, act)
		if err != nil {
			// A deny whose condition fails applies: fail closed.
			return Decision{Reason: st.reason + note + " (its condition failed: " + err.Error() + ")", Grant: id}, true
		}
		if ok {
			return Decision{Reason: st.reason + note, Grant: id}, true
		}
	}
	return Decision{}, false
}

// grantNote is what a reason adds for a statement a grant brought.
func grantNote(g *Grant) string { return " (granted by access request " + g.ID + ")" }

// grantBucket is a grant in force for a call and its policy's statements
// for the call's action.
type grantBucket struct {
	g *Grant
	b *bucket
}

// granted appends to buf the grants of in that hold for its call (their
// policy requestable in s, its requesters still binding the caller, the
// call's time before their end) with their policy's statements for the
// call's action.
func (s *Set) granted(in *Input, buf []grantBucket) []grantBucket {
	for i := range in.Grants {
		g := &in.Grants[i]
		if !in.Time.Before(g.End) {
			continue
		}
		r := s.requestable[g.Policy]
		if r == nil || !r.Requester(in.Principal) {
			continue
		}
		if b := r.index[in.Action]; b != nil {
			buf = append(buf, grantBucket{g: g, b: b})
		}
	}
	return buf
}

// buckets appends to buf the buckets bound to in's caller for its action:
// by token, by role, by each group.
func (s *Set) buckets(in *Input, buf []*bucket) []*bucket {
	p := &in.Principal
	if p.Token != "" {
		if b := s.index[bindKey{kind: byToken, name: p.Token, action: in.Action}]; b != nil {
			buf = append(buf, b)
		}
	}
	if p.Role != "" {
		if b := s.index[bindKey{kind: byRole, name: p.Role, action: in.Action}]; b != nil {
			buf = append(buf, b)
		}
	}
	for _, g := range p.Groups {
		if b := s.index[bindKey{kind: byGroup, name: g, action: in.Action}]; b != nil {
			buf = append(buf, b)
		}
	}
	return buf
}

// applies reports whether st applies to in: its selector matches and its
// condition holds. *act is made on the first condition reached.
func (st *statement) applies(in *Input, act **activation) (bool, error) {
	if !st.selects(&in.Resource) {
		return false, nil
	}
	if st.cond == nil {
		return true, nil
	}
	if *act == nil {
		*act = newActivation(in)
	}
	return st.cond.eval(*act)
}

// selects reports whether st's selector, if any, lets it apply to r.
func (st *statement) selects(r *Resource) bool {
	return st.sel == nil || st.sel.matches(r) != st.not
}

func decideBuiltin(cat Catalog, in *Input) Decision {
	if cat.Allows(in.Principal.Role, in.Action) {
		return Decision{Allow: true, Reason: builtinReason(in.Principal.Role)}
	}
	return implicitDeny(cat, in)
}

func builtinReason(role string) string {
	switch role {
	case "admin":
		return "allowed by built-in role admin"
	case "operator":
		return "allowed by built-in role operator"
	case "viewer":
		return "allowed by built-in role viewer"
	}
	return "allowed by built-in role " + role
}

func implicitDeny(cat Catalog, in *Input) Decision {
	if _, ok := cat[in.Action]; !ok {
		return Decision{Reason: "unknown action " + strconv.Quote(in.Action)}
	}
	role := in.Principal.Role
	if !iam.ValidRole(role) {
		role = strconv.Quote(role)
	}
	return Decision{Reason: "no policy allows " + in.Action + " for role " + role}
}

// matches reports whether s selects r.
func (s *Selector) matches(r *Resource) bool {
	return matchList(s.Tenants, r.Tenant, r.TenantName) &&
		matchList(s.Sites, r.Site, r.SiteName) &&
		matchList(s.Pools, r.Pool, r.PoolName) &&
		matchList(s.Nodes, r.Node, r.NodeName) &&
		matchLabels(s.Labels, r.Labels)
}

// matchesIDs reports whether s selects r by ids alone: a grant's scope
// names what the request resolved to, and a name (a node's self-reported
// hostname) must not stand in for another's id.
func (s *Selector) matchesIDs(r *Resource) bool {
	return matchList(s.Tenants, r.Tenant, "") && matchList(s.Sites, r.Site, "") &&
		matchList(s.Pools, r.Pool, "") && matchList(s.Nodes, r.Node, "") && matchLabels(s.Labels, r.Labels)
}

// matchList reports whether list is empty or names id or name; an empty
// id or name matches nothing.
func matchList(list []string, id, name string) bool {
	if len(list) == 0 {
		return true
	}
	for _, v := range list {
		if (id != "" && v == id) || (name != "" && v == name) {
			return true
		}
	}
	return false
}

// matchLabels reports whether labels has every key of want with its value,
// or any value where want's is "*".
func matchLabels(want, labels map[string]string) bool {
	for k, v := range want {
		got, ok := labels[k]
		if !ok || (v != "*" && v != got) {
			return false
		}
	}
	return true
}

func (s *Selector) clone() *Selector {
	c := *s
	c.Labels = maps.Clone(s.Labels)
	return &c
}

// Bundle holds every tenant's Set and decides a call by its caller's
// tenant's set; a tenant with none gets its built-in role only. It is
// immutable: With and Without return new bundles, to be swapped in whole
// (an atomic.Pointer) when a tenant's policies change.
type Bundle struct {
	cat  Catalog
	sets map[string]*Set
}

// NewBundle returns a Bundle deciding by cat's built-in roles and by sets,
// at most one per tenant.
func NewBundle(cat Catalog, sets ...*Set) (*Bundle, error) {
	if err := cat.Validate(); err != nil {
		return nil, err
	}
	b := &Bundle{cat: maps.Clone(cat), sets: make(map[string]*Set, len(sets))}
	for _, s := range sets {
		if _, dup := b.sets[s.tenant]; dup {
			return nil, fmt.Errorf("policy bundle: two sets for tenant %q", s.tenant)
		}
		b.sets[s.tenant] = s
	}
	return b, nil
}

// With returns a copy of b with s as its tenant's set, replacing any.
func (b *Bundle) With(s *Set) *Bundle {
	c := &Bundle{cat: b.cat, sets: maps.Clone(b.sets)}
	c.sets[s.tenant] = s
	return c
}

// Without returns a copy of b without tenant's set.
func (b *Bundle) Without(tenant string) *Bundle {
	c := &Bundle{cat: b.cat, sets: maps.Clone(b.sets)}
	delete(c.sets, tenant)
	return c
}

// Set returns tenant's set, or nil.
func (b *Bundle) Set(tenant string) *Set {
	if b == nil {
		return nil
	}
	return b.sets[tenant]
}

// Requestable returns tenant's requestable policy name (Set.Requestable),
// or nil.
func (b *Bundle) Requestable(tenant, name string) *Requestable {
	return b.Set(tenant).Requestable(name)
}

// Bound reports whether a policy of p's tenant binds p (Set.Bound); false
// for a nil Bundle.
func (b *Bundle) Bound(p Principal) bool {
	if b == nil {
		return false
	}
	return b.sets[p.Tenant].Bound(p)
}

// Decide decides a call by its caller's tenant's set, or by the built-in
// role when the tenant has none. A nil Bundle knows no catalog and denies
// everything: make one with NewBundle(cat) before the first set is loaded.
func (b *Bundle) Decide(in Input) Decision {
	if b == nil {
		return Decision{Reason: "no policies loaded"}
	}
	if s := b.sets[in.Principal.Tenant]; s != nil {
		return s.Decide(in)
	}
	return decideBuiltin(b.cat, &in)
}

// DecideWorstCase decides a call by its caller's tenant's set as
// Set.DecideWorstCase does, for checks that must hold whatever the call's
// address, time and fields; by the built-in role when the tenant has no
// set. A nil Bundle denies everything.
func (b *Bundle) DecideWorstCase(in Input) Decision {
	if b == nil {
		return Decision{Reason: "no policies loaded"}
	}
	if s := b.sets[in.Principal.Tenant]; s != nil {
		return s.DecideWorstCase(in)
	}
	return decideBuiltin(b.cat, &in)
}
