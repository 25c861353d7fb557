package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/policy"
)

// accessSrc holds a requestable policy without a bind (root shells on
// pool a, on request), one with a bind too, and a bound deny the grants
// cannot override.
const accessSrc = `policies:
  - name: root-shell-pool-a
    description: root shells on pool a, on request
    request:
      requesters: {roles: [operator]}
      approvers: {roles: [admin]}
      maxDuration: 4h
    statements:
      - effect: allow
        actions: [nodes.shell, nodes.shellAsRoot]
        resources: {pools: [a]}
  - name: drain-on-request
    bind: {tokens: [tok_bound]}
    request:
      requesters: {groups: [oncall]}
      approvers: {tokens: [tok_lead], groups: [leads]}
    statements:
      - effect: allow
        actions: [nodes.drain]
      - effect: deny
        actions: [nodes.cordon]
  - name: never-on-b
    bind: {roles: [operator]}
    statements:
      - effect: deny
        actions: [nodes.shellAsRoot]
        resources: {pools: [b]}
  - name: oncall-not-on-b
    bind: {groups: [oncall]}
    statements:
      - effect: deny
        actions: [nodes.drain]
        resources: {pools: [b]}
tests:
  - name: without a grant, no root shell
    caller: {token: tok_op, role: operator}
    action: nodes.shellAsRoot
    resource: {pool: a}
    expect: deny
  - name: with the grant, a root shell on a
    caller: {token: tok_op, role: operator, granted: [root-shell-pool-a]}
    action: nodes.shellAsRoot
    resource: {pool: a}
    expect: allow
  - name: the grant gives nothing on c
    caller: {token: tok_op, role: operator, granted: [root-shell-pool-a]}
    action: nodes.shellAsRoot
    resource: {pool: c}
    expect: deny
  - name: a viewer the requesters do not bind holds nothing
    caller: {token: tok_v, role: viewer, granted: [root-shell-pool-a]}
    action: nodes.shell
    resource: {pool: a}
    expect: deny
`

func TestParseRequestBlock(t *testing.T) {
	t.Parallel()
	doc, set := mustLoad(t, accessSrc)
	r := set.Requestable("root-shell-pool-a")
	if r == nil || r.MaxDuration() != 4*time.Hour || r.Name() != "root-shell-pool-a" {
		t.Fatalf("requestable root-shell-pool-a = %+v", r)
	}
	if d := set.Requestable("drain-on-request"); d == nil || d.MaxDuration() != policy.DefaultRequestDuration {
		t.Fatalf("drain-on-request's maxDuration: %+v, want the default %v", d, policy.DefaultRequestDuration)
	}
	if set.Requestable("never-on-b") != nil || set.Requestable("nope") != nil {
		t.Fatal("a policy without a request block, or one that does not exist, is requestable")
	}
	op := policy.Principal{Token: "tok_op", Tenant: tenant, Role: "operator"}
	admin := policy.Principal{Token: "tok_ad", Tenant: tenant, Role: "admin"}
	if !r.Requester(op) || r.Requester(admin) || r.Approver(op) || !r.Approver(admin) {
		t.Fatal("requesters and approvers of root-shell-pool-a bound the wrong roles")
	}
	d := set.Requestable("drain-on-request")
	if !d.Requester(policy.Principal{Role: "viewer", Groups: []string{"oncall"}}) ||
		!d.Approver(policy.Principal{Token: "tok_lead", Role: "viewer"}) || !d.Approver(policy.Principal{Role: "viewer", Groups: []string{"x", "leads"}}) ||
		d.Approver(policy.Principal{Role: "admin"}) {
		t.Fatal("drain-on-request's bindings by token and group")
	}
	for _, r := range doc.RunTests(set) {
		if !r.Passed() {
			t.Errorf("file test %q: want %s, got %s (%s)", r.Name, r.Want, r.Got, r.Reason)
		}
	}
	// The canonical form keeps the request block and leaves out the
	// empty bind.
	c, err := doc.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(c), "bind: {}") || !strings.Contains(string(c), "maxDuration: 4h") {
		t.Fatalf("canonical form:\n%s", c)
	}
	doc2, err := policy.Parse(c)
	if err != nil {
		t.Fatalf("canonical form does not parse: %v\n%s", err, c)
	}
	if diff := policy.Diff(doc, doc2); diff != "no change" {
		t.Fatalf("canonical form differs: %s", diff)
	}
	doc2.Policies[0].Request.MaxDuration = "2h"
	if diff := policy.Diff(doc, doc2); !strings.Contains(diff, "root-shell-pool-a (request changed)") {
		t.Fatalf("diff of a changed maxDuration: %s", diff)
	}
}

func TestParseRequestBlockErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		src  string
		want []string
	}{
		{"no approvers, no requesters", `policies:
  - name: p
    request: {maxDuration: 1h}
    statements: [{effect: allow, actions: [nodes.shell]}]
`, []string{"policies[0].request.requesters: required", "policies[0].request.approvers: required"}},
		{"bad bounds and names", `policies:
  - name: p
    request:
      requesters: {roles: [root]}
      approvers: {tokens: [""]}
      maxDuration: 8d
    statements: [{effect: allow, actions: [nodes.shell]}]
  - name: q
    request: {requesters: {roles: [operator]}, approvers: {roles: [admin]}, maxDuration: 30s}
    statements: [{effect: allow, actions: [nodes.shell]}]
  - name: r
    request: {requesters: {roles: [operator]}, approvers: {roles: [admin]}, maxDuration: 169h}
    statements: [{effect: allow, actions: [nodes.shell]}]
`, []string{
			`policies[0].request.requesters.roles[0]: "root": want admin, operator or viewer`,
			`policies[0].request.approvers.tokens[0]: empty`,
			`policies[0].request.maxDuration: "8d": want a duration such as 30m, 4h or 168h`,
			`policies[1].request.maxDuration: 30s: want 1m0s to 168h0m0s`,
			`policies[2].request.maxDuration: 169h: want 1m0s to 168h0m0s`,
		}},
		{"unknown key", `policies:
  - name: p
    request: {requesters: {roles: [operator]}, approvers: {roles: [admin]}, ttl: 1h}
    statements: [{effect: allow, actions: [nodes.shell]}]
`, []string{"policies[0].request.ttl: line 3: field ttl not found"}},
		{"neither bind nor request", `policies:
  - name: p
    statements: [{effect: allow, actions: [nodes.shell]}]
`, []string{"policies[0].bind: required: at least one of tokens, roles or groups (or a request block"}},
		{"tests granting what cannot be granted", `policies:
  - name: bound
    bind: {roles: [viewer]}
    statements: [{effect: allow, actions: [nodes.get]}]
tests:
  - name: t
    caller: {role: operator, granted: [bound, nosuch, ""]}
    action: nodes.get
    expect: allow
`, []string{
			`tests[0].caller.granted[0]: "bound": that policy has no request block`,
			`tests[0].caller.granted[1]: "nosuch": no policy of this file has that name`,
			`tests[0].caller.granted[2]: empty`,
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := policy.Parse([]byte(c.src))
			if err == nil {
				t.Fatal("parsed")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestDecideGranted: a grant brings its policy's statements while the
// call's time is before its end, allows only within its scope, still
// loses to a deny, names the request in the reason, and ends with the
// requester binding; the lockout's worst case and another tenant's caller
// ignore it.
func TestDecideGranted(t *testing.T) {
	t.Parallel()
	_, set := mustLoad(t, accessSrc)
	bundle, err := policy.NewBundle(catalog(), set)
	if err != nil {
		t.Fatal(err)
	}
	now := policy.DefaultTestTime
	op := policy.Principal{Token: "tok_op", Tenant: tenant, Role: "operator"}
	grant := policy.Grant{ID: "acr_1", Policy: "root-shell-pool-a", End: now.Add(2 * time.Minute)}
	poolA := policy.Resource{Pool: "pool_a1", PoolName: "a", Node: "node_1"}
	in := func(p policy.Principal, action string, res policy.Resource, at time.Time, gs ...policy.Grant) policy.Input {
		return policy.Input{Principal: p, Action: action, Resource: res, Time: at, Grants: gs}
	}
	cases := []struct {
		name   string
		in     policy.Input
		allow  bool
		reason string
		grant  string
	}{
		{"no grant", in(op, "nodes.shellAsRoot", poolA, now), false, "no policy allows nodes.shellAsRoot for role operator", ""},
		{"granted", in(op, "nodes.shellAsRoot", poolA, now, grant), true,
			`allowed by policy "root-shell-pool-a" statement 1 (granted by access request acr_1)`, "acr_1"},
		{"a shell is the built-in role's still", in(op, "nodes.shell", poolA, now, grant), true, "allowed by built-in role operator", ""},
		{"a second before its end", in(op, "nodes.shellAsRoot", poolA, grant.End.Add(-time.Second), grant), true, "", "acr_1"},
		{"at its end", in(op, "nodes.shellAsRoot", poolA, grant.End, grant), false, "no policy allows", ""},
		{"after its end", in(op, "nodes.shellAsRoot", poolA, grant.End.Add(time.Hour), grant), false, "no policy allows", ""},
		{"outside the policy's resources", in(op, "nodes.shellAsRoot", policy.Resource{Pool: "pool_c", PoolName: "c"}, now, grant), false, "no policy allows", ""},
		{"a deny bound to the caller wins", in(op, "nodes.shellAsRoot", policy.Resource{Pool: "b"}, now,
			policy.Grant{ID: "acr_2", Policy: "root-shell-pool-a", End: grant.End}), false, `denied by policy "never-on-b" statement 1`, ""},
		{"an action the policy does not name", in(op, "nodes.delete", poolA, now, grant), false, "no policy allows nodes.delete", ""},
		{"a scope that selects the resource", in(op, "nodes.shellAsRoot", poolA, now,
			policy.Grant{ID: "acr_3", Policy: "root-shell-pool-a", End: grant.End, Scope: &policy.Selector{Nodes: []string{"node_1"}}}), true, "acr_3", "acr_3"},
		{"a scope that does not", in(op, "nodes.shellAsRoot", poolA, now,
			policy.Grant{ID: "acr_4", Policy: "root-shell-pool-a", End: grant.End, Scope: &policy.Selector{Nodes: []string{"node_2"}}}), false, "no policy allows", ""},
		{"the requesters no longer bind the holder", in(policy.Principal{Token: "tok_op", Tenant: tenant, Role: "viewer"}, "nodes.shellAsRoot", poolA, now, grant),
			false, "no policy allows nodes.shellAsRoot for role viewer", ""},
		{"a policy that is not requestable", in(op, "nodes.shellAsRoot", policy.Resource{Pool: "b"}, now,
			policy.Grant{ID: "acr_5", Policy: "never-on-b", End: grant.End}), false, `denied by policy "never-on-b"`, ""},
		{"a policy of that name is gone", in(op, "nodes.shellAsRoot", poolA, now, policy.Grant{ID: "acr_6", Policy: "gone", End: grant.End}), false, "no policy allows", ""},
		{"another tenant's caller", in(policy.Principal{Token: "tok_op", Tenant: "ten_2", Role: "operator"}, "nodes.shellAsRoot", poolA, now, grant),
			false, "no policy allows", ""},
		{"a grant's deny applies as stated, scope or not", in(policy.Principal{Token: "tok_x", Tenant: tenant, Role: "operator", Groups: []string{"oncall"}},
			"nodes.cordon", poolA, now, policy.Grant{ID: "acr_7", Policy: "drain-on-request", End: grant.End, Scope: &policy.Selector{Pools: []string{"zzz"}}}),
			false, `denied by policy "drain-on-request" statement 2 (granted by access request acr_7)`, "acr_7"},
		{"a grant's allow for a viewer", in(policy.Principal{Token: "tok_x", Tenant: tenant, Role: "viewer", Groups: []string{"oncall"}},
			"nodes.drain", poolA, now, policy.Grant{ID: "acr_8", Policy: "drain-on-request", End: grant.End}),
			true, `allowed by policy "drain-on-request" statement 1 (granted by access request acr_8)`, "acr_8"},
		{"a bound deny wins over a grant's allow", in(policy.Principal{Token: "tok_x", Tenant: tenant, Role: "viewer", Groups: []string{"oncall"}},
			"nodes.drain", policy.Resource{Pool: "b"}, now, policy.Grant{ID: "acr_9", Policy: "drain-on-request", End: grant.End}),
			false, `denied by policy "oncall-not-on-b" statement 1`, ""},
	}
	for _, c := range cases {
		for name, d := range map[string]policy.Decider{"set": set, "bundle": bundle} {
			got := d.Decide(c.in)
			if got.Allow != c.allow || !strings.Contains(got.Reason, c.reason) || got.Grant != c.grant {
				t.Errorf("%s (%s): %+v, want allow %v, reason with %q, grant %q", c.name, name, got, c.allow, c.reason, c.grant)
			}
		}
	}
	// The lockout check decides in the worst case, and is asked without
	// grants: a grant it were given would still not lift a bound deny.
	w := set.DecideWorstCase(in(op, "nodes.shellAsRoot", policy.Resource{Pool: "b"}, now, grant))
	if w.Allow {
		t.Fatalf("worst case with a grant on pool b: %+v", w)
	}
}

// TestCacheSkipsGrants: a decision a grant made is never cached, so its
// end holds at once; the same read without grants is cached as before.
func TestCacheSkipsGrants(t *testing.T) {
	t.Parallel()
	_, set := mustLoad(t, accessSrc)
	now := policy.DefaultTestTime
	clock := now
	c := policy.NewCache(policy.CacheConfig{Now: func() time.Time { return clock }})
	op := policy.Principal{Token: "tok_op", Tenant: tenant, Role: "operator"}
	grant := policy.Grant{ID: "acr_1", Policy: "root-shell-pool-a", End: now.Add(time.Minute)}
	in := policy.Input{Principal: op, Action: "nodes.shellAsRoot", Resource: policy.Resource{Pool: "a"}, Time: now, Grants: []policy.Grant{grant}}
	if d := c.Decide(in, true, set); !d.Allow {
		t.Fatalf("granted read: %+v", d)
	}
	if c.Len() != 0 {
		t.Fatalf("the cache holds %d entries after a granted decision", c.Len())
	}
	clock, in.Time = grant.End, grant.End
	if d := c.Decide(in, true, set); d.Allow {
		t.Fatalf("at the grant's end: %+v", d)
	}
	plain := policy.Input{Principal: op, Action: "nodes.get", Time: now}
	c.Decide(plain, true, set)
	if c.Len() != 1 {
		t.Fatalf("the cache holds %d entries after a plain read, want 1", c.Len())
	}
}
