package policy_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/policy"
)

// FuzzParse: any bytes either fail to parse or compile, or make a set that
// decides without panicking and whose canonical form parses back to the
// same canonical form.
func FuzzParse(f *testing.F) {
	f.Add([]byte(decideSrc))
	f.Add([]byte("policies: []\n"))
	f.Add([]byte(accessSrc))
	f.Add([]byte("policies:\n- {name: r, request: {requesters: {roles: [viewer]}, approvers: {groups: [g]}, maxDuration: 90m}, statements: [{effect: deny, actions: ['*']}]}\n" +
		"tests: [{name: t, caller: {role: viewer, granted: [r]}, action: nodes.get, expect: deny}]\n"))
	f.Add([]byte(`policies:
  - name: pool-a-operators
    bind: {tokens: [tok_abc], roles: [operator], groups: [gpu-team]}
    statements:
      - effect: allow
        actions: [nodes.drain, nodes.shell]
        resources: {pools: [a], labels: {gpu: "*"}}
      - effect: deny
        actions: ["nodes.*"]
        notResources: {tenants: [root], sites: [s1], nodes: [node_x]}
        condition: 'inCidr(request.sourceIp, "10.0.0.0/8") && request.time.getHours("UTC") < 18'
tests:
  - name: drain on a is allowed
    caller: {token: tok_abc, role: operator, groups: [gpu-team]}
    action: nodes.drain
    resource: {pool: a, site: s1, tenant: root, node: node_x, labels: {gpu: h100}}
    sourceIp: 10.1.2.3
    time: 2026-12-07T10:00:00Z
    fields: {id: node_x, n: [1, 2.5, true, null, {k: v}]}
    expect: allow
`))
	f.Add([]byte("policies:\n- {name: a, bind: {roles: [viewer]}, statements: [{effect: deny, actions: ['*']}]}\n---\n"))
	f.Add([]byte("policies: &a [*a]\n"))
	f.Add([]byte(hostileDeep(3, 100)))
	f.Add([]byte(hostileDeep(3, policy.MaxDepth-2)))
	f.Add([]byte(hostileWide(50)))
	cat := catalog()
	f.Fuzz(func(t *testing.T, src []byte) {
		doc, err := policy.Parse(src)
		if err != nil {
			return
		}
		c1, err := doc.Canonical()
		if err != nil {
			t.Fatalf("canonical: %v", err)
		}
		doc2, err := policy.Parse(c1)
		if err != nil {
			t.Fatalf("canonical form does not parse: %v\n%s", err, c1)
		}
		c2, err := doc2.Canonical()
		if err != nil {
			t.Fatalf("canonical again: %v", err)
		}
		if string(c1) != string(c2) {
			t.Fatalf("canonical form changed:\n%s\n%s", c1, c2)
		}
		set, err := policy.Compile(tenant, doc, cat)
		if err != nil {
			return
		}
		doc.RunTests(set)
		var grants []policy.Grant
		for _, p := range doc.Policies {
			if p.Request != nil {
				grants = append(grants, policy.Grant{ID: "acr_f", Policy: p.Name, End: policy.DefaultTestTime.Add(time.Hour),
					Scope: &policy.Selector{Pools: []string{"a"}}})
			}
		}
		for action := range cat {
			set.Decide(policy.Input{Principal: policy.Principal{Tenant: tenant, Role: "operator", Token: "tok_abc", Groups: []string{"gpu-team"}},
				Action: action, Resource: policy.Resource{Pool: "a", Labels: map[string]string{"gpu": "h100"}}, Time: policy.DefaultTestTime, Grants: grants})
		}
	})
}

// FuzzCondition: any condition either fails to compile or evaluates on any
// input without panicking, within the cost limit.
func FuzzCondition(f *testing.F) {
	f.Add(`inCidr(request.sourceIp, "10.0.0.0/8") && request.time.getHours("UTC") < 18`, "10.1.2.3", int64(1765101600), "h100", "id", "node_x")
	f.Add(`resource.labels.gpu == "h100" && caller.role == "operator"`, "", int64(0), "h100", "", "")
	f.Add(`request.fields.id.startsWith("node_") || "gpu-team" in caller.groups`, "::1", int64(-1), "", "id", "node_x")
	f.Add(`request.fields.exists(k, request.fields[k].size() > 3)`, "fe80::1%eth0", int64(1<<40), "x", "k", "vvvv")
	f.Add(`resource.pool.matches("^a-[0-9]+$") && request.method.split(".")[0] == "nodes"`, "10.0.0.1", int64(5), "", "", "")
	f.Add(`inCidr(request.fields.ip, request.fields.cidr)`, "", int64(0), "", "cidr", "bad")
	f.Add(`[1,2,3].map(x, x * 2).size() == 3 && duration("1h") < duration("2h")`, "", int64(0), "", "", "")
	f.Fuzz(func(t *testing.T, cond, ip string, unix int64, label, fieldKey, fieldValue string) {
		src := "policies:\n  - name: p\n    bind: {roles: [viewer]}\n    statements: [{effect: deny, actions: [nodes.get]}, {effect: allow, actions: [nodes.drain]}]\n"
		doc, err := policy.Parse([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		doc.Policies[0].Statements[0].Condition = cond
		doc.Policies[0].Statements[1].Condition = cond
		set, err := policy.Compile(tenant, doc, catalog())
		if err != nil {
			return
		}
		addr, _ := netip.ParseAddr(ip)
		for _, action := range []string{"nodes.get", "nodes.drain"} {
			in := policy.Input{
				Principal: policy.Principal{Tenant: tenant, Role: "viewer", Token: ip, Groups: []string{label}},
				Action:    action,
				Resource:  policy.Resource{Pool: label, Labels: map[string]string{"gpu": label}},
				SourceIP:  addr,
				Time:      time.Unix(unix, 0),
				Fields:    map[string]any{fieldKey: fieldValue, "n": unix, "ip": ip, "cidr": fieldValue, "list": []any{label, unix}},
			}
			start := time.Now()
			set.Decide(in)
			if d := time.Since(start); d > time.Second {
				t.Fatalf("decision took %s", d)
			}
		}
	})
}
