package policy_test

import (
	"errors"
	"maps"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/policy"
)

const tenant = "ten_1"

// catalog is a small API: a few methods of each role plus the non-method
// actions.
func catalog() policy.Catalog {
	c := policy.Catalog{
		"nodes.get":       "viewer",
		"nodes.list":      "viewer",
		"pools.get":       "viewer",
		"nodes.cordon":    "operator",
		"nodes.drain":     "operator",
		"commands.create": "operator",
		"nodes.delete":    "admin",
		"tokens.create":   "admin",
	}
	maps.Copy(c, policy.NonMethodActions())
	return c
}

func mustLoad(t testing.TB, src string) (*policy.Document, *policy.Set) {
	t.Helper()
	doc, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	set, err := policy.Compile(tenant, doc, catalog())
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return doc, set
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		src  string
		want []string
	}{
		{"empty", "", []string{"policy file is empty"}},
		{"no policies key", "tests: []\n", []string{"policies: required"}},
		{"trailing document", "policies: []\n---\npolicies: []\n", []string{"more than one YAML document"}},
		{"unknown key", "policies:\n  - name: a\n    bind: {roles: [viewer]}\n    statements:\n      - effect: allow\n        actions: [nodes.get]\n        effects: deny\n",
			[]string{"policies[0].statements[0].effects: line 7: field effects not found"}},
		{"duplicate key", "policies: []\npolicies: []\n", []string{"already defined"}},
		{"wrong type", "policies:\n  - name: a\n    statements: 3\n", []string{"policies[0].statements: line 3:"}},
		{"bad name", "policies:\n  - name: Bad_Name\n    bind: {roles: [viewer]}\n    statements: [{effect: allow, actions: [nodes.get]}]\n",
			[]string{`policies[0].name: "Bad_Name": want lower-case`}},
		{"duplicate name and more", `policies:
  - name: a
    bind: {roles: [viewer]}
    statements: [{effect: allow, actions: [nodes.get]}]
  - name: a
    bind: {roles: [root], tokens: [""]}
    statements:
      - effect: permit
        actions: []
        resources: {pools: [a]}
        notResources: {pools: [b]}
      - effect: deny
        actions: ["nodes get"]
        resources: {}
`, []string{
			`policies[1].name: "a" is also the name of policies[0]`,
			`policies[1].bind.tokens[0]: empty`,
			`policies[1].bind.roles[0]: "root": want admin, operator or viewer`,
			`policies[1].statements[0].effect: "permit": want allow or deny`,
			`policies[1].statements[0].actions: required`,
			`policies[1].statements[0]: at most one of resources and notResources`,
			`policies[1].statements[1].actions[0]: "nodes get": character ' ' not allowed`,
			`policies[1].statements[1].resources: empty selector`,
		}},
		{"no binding, no statements", "policies:\n  - name: a\n", []string{"policies[0].bind: required", "policies[0].statements: required"}},
		{"tests", `policies: []
tests:
  - name: t
    caller: {token: tok}
    action: nodes.*
    sourceIp: 10.1.2
    time: yesterday
    fields: {a: {1: 2}}
    expect: yes
  - caller: {role: viewer}
    action: nodes.get
    expect: deny
`, []string{
			`tests[0].caller.role: required`,
			`tests[0].action: "nodes.*": character '*' not allowed`,
			`tests[0].sourceIp: "10.1.2": not an IP address`,
			`tests[0].time: "yesterday": want RFC 3339`,
			`tests[0].fields.a: a map's keys must be strings`,
			`tests[0].expect: "yes": want allow or deny`,
			`tests[1].name: required`,
		}},
		{"condition too long", "policies:\n  - name: a\n    bind: {roles: [viewer]}\n    statements: [{effect: allow, actions: [nodes.get], condition: '" + strings.Repeat("x", policy.MaxConditionLength+1) + "'}]\n",
			[]string{"policies[0].statements[0].condition: longer than 4096 bytes"}},
		{"too large", "policies: []\n#" + strings.Repeat("x", policy.MaxDocumentSize), []string{"more than 1048576"}},
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

func TestParseErrorsAreFieldErrors(t *testing.T) {
	t.Parallel()
	_, err := policy.Parse([]byte("policies:\n  - name: a\n    bind: {roles: [viewer]}\n    statements: [{effect: maybe, actions: [nodes.get]}]\n"))
	var fe *policy.FieldError
	if !errors.As(err, &fe) || fe.Path != "policies[0].statements[0].effect" {
		t.Fatalf("got %v (%#v)", err, fe)
	}
}

// hostileDeep is a policy file whose tests are lines lists nested depth
// deep, each a type error: "[[[...]]]" is not a test.
func hostileDeep(lines, depth int) string {
	line := "  - " + strings.Repeat("[", depth) + strings.Repeat("]", depth) + "\n"
	return "policies: []\ntests:\n" + strings.Repeat(line, lines)
}

// hostileWide is a policy file whose tests are n one-entry lists, each a
// type error.
func hostileWide(n int) string {
	return "policies: []\ntests:\n" + strings.Repeat("  - [1]\n", n)
}

// TestParseHostile: files that are deep or hold many type errors are
// refused with a bounded error: nesting past
// MaxDepth before decoding, with its line; type errors placed for the
// first ten and counted after. (Mapping every error to its place once
// took minutes for such a file; BenchmarkParseHostile
// times them at MaxDocumentSize.)
func TestParseHostile(t *testing.T) {
	t.Parallel()
	// The top-level map and the tests list count 2: a test 62 deep is 64.
	inBound := policy.MaxDepth - 2
	cases := []struct {
		name   string
		src    string
		want   []string
		maxLen int
	}{
		{"deep", hostileDeep(20, 9000), []string{"policy file: line 3: nested more than 64 deep"}, 100},
		{"one past the bound", hostileDeep(2, inBound+1), []string{"policy file: line 3: nested more than 64 deep"}, 100},
		{"deep in block style", "policies: []\ntests:\n  - name: t\n    fields:\n" + func() string {
			var b strings.Builder
			for i := range 70 {
				b.WriteString(strings.Repeat(" ", 6+i) + "k:\n")
			}
			return b.String()
		}(), []string{"policy file: line 66: nested more than 64 deep"}, 100},
		{"at the bound, many errors", hostileDeep(2000, inBound), []string{
			"tests[0]" + strings.Repeat("[0]", inBound-1) + ": line 3: cannot unmarshal !!seq into policy.Test",
			"tests[9]" + strings.Repeat("[0]", inBound-1) + ": line 12: cannot unmarshal !!seq into policy.Test",
			"and 1990 more errors",
		}, 11 * (3*inBound + 60)},
		{"wide", hostileWide(5000), []string{
			"tests[0][0]: line 3: cannot unmarshal !!seq into policy.Test",
			"tests[9][0]: line 12: cannot unmarshal !!seq into policy.Test",
			"and 4990 more errors",
		}, 11 * 60},
		{"wide on one line", "policies: []\ntests: [" + strings.Repeat("[1], ", 5000) + "]\n", []string{
			"tests[4999][0]: line 2: cannot unmarshal !!seq into policy.Test",
			"and 4990 more errors",
		}, 11 * 70},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if len(c.src) > policy.MaxDocumentSize {
				t.Fatalf("source is %d bytes", len(c.src))
			}
			_, err := policy.Parse([]byte(c.src))
			if err == nil {
				t.Fatal("parsed")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%.2000s", w, err)
				}
			}
			if len(err.Error()) > c.maxLen {
				t.Errorf("error is %d bytes, more than %d:\n%.2000s", len(err.Error()), c.maxLen, err)
			}
		})
	}
	// A file at the bound that is otherwise good parses.
	src := "policies: []\ntests:\n  - name: t\n    caller: {role: viewer}\n    action: nodes.get\n    expect: allow\n    fields: {a: " +
		strings.Repeat("[", 8) + strings.Repeat("]", 8) + "}\n"
	if _, err := policy.Parse([]byte(src)); err != nil {
		t.Errorf("fields nested 8 deep: %v", err)
	}
}

func TestCompileErrors(t *testing.T) {
	t.Parallel()
	src := `policies:
  - name: a
    bind: {roles: [viewer]}
    statements:
      - effect: allow
        actions: [nodes.get, nodes.frobnicate, "frob.*"]
      - effect: allow
        actions: [nodes.get]
        condition: 'request.sourceIp'
      - effect: allow
        actions: [nodes.get]
        condition: 'request.sourceIpp == ""'
      - effect: allow
        actions: [nodes.get]
        condition: 'inCidr(request.sourceIp, "10.0.0.0/33")'
      - effect: allow
        actions: [nodes.get]
        condition: 'resource.labels.all(k, resource.labels.all(j, request.fields.exists(f, f + k == j)))'
      - effect: deny
        actions: ["*"]
        condition: 'request.fields.x == 1 &&'
tests:
  - name: t
    caller: {role: viewer}
    action: nodes.frobnicate
    expect: deny
`
	doc, err := policy.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	_, err = policy.Compile(tenant, doc, catalog())
	if err == nil {
		t.Fatal("compiled")
	}
	for _, w := range []string{
		`policies[0].statements[0].actions[1]: unknown action "nodes.frobnicate"`,
		`policies[0].statements[0].actions[2]: pattern "frob.*" matches no known action`,
		`policies[0].statements[1].condition: condition is of type string, want bool`,
		`policies[0].statements[2].condition: 1:8: undefined field 'sourceIpp'`,
		`policies[0].statements[3].condition: 1:26: inCidr: "10.0.0.0/33" is not a CIDR`,
		`policies[0].statements[4].condition: costs up to`,
		`policies[0].statements[5].condition: 1:`,
		`tests[0].action: unknown action "nodes.frobnicate"`,
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
	if _, err := policy.Compile(tenant, doc, policy.Catalog{"nodes.get": "root"}); err == nil {
		t.Error("compiled with a bad catalog")
	}
}

const decideSrc = `policies:
  - name: pool-a-operators
    description: operators may drain and open shells on pool a only
    bind: {roles: [operator]}
    statements:
      - effect: allow
        actions: [nodes.shell]
        resources: {pools: [a]}
      - effect: deny
        actions: [nodes.drain, nodes.shell]
        notResources: {pools: [a]}
  - name: tok-viewer-h100
    bind: {tokens: [tok_v]}
    statements:
      - effect: allow
        actions: ["nodes.*"]
        resources: {labels: {gpu: h100, rack: "*"}}
  - name: gpu-team
    bind: {groups: [gpu-team]}
    statements:
      - effect: allow
        actions: [nodes.delete]
        resources: {sites: [s1], nodes: [node-1]}
  - name: office-hours
    bind: {roles: [viewer]}
    statements:
      - effect: allow
        actions: [nodes.cordon]
        condition: 'inCidr(request.sourceIp, "10.0.0.0/8") && request.time.getHours("UTC") < 18'
  - name: fail-closed
    bind: {tokens: [tok_f]}
    statements:
      - effect: deny
        actions: [nodes.get]
        condition: 'request.fields.id == "secret"'
      - effect: allow
        actions: [nodes.delete]
        condition: 'request.fields.confirm == true'
  - name: no-root
    bind: {roles: [admin]}
    statements:
      - effect: deny
        actions: ["*AsRoot"]
`

func TestDecide(t *testing.T) {
	t.Parallel()
	_, set := mustLoad(t, decideSrc)
	bundle, err := policy.NewBundle(catalog(), set)
	if err != nil {
		t.Fatal(err)
	}
	ten := func(p policy.Principal) policy.Principal {
		if p.Tenant == "" {
			p.Tenant = tenant
		}
		return p
	}
	day := time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)
	office := netip.MustParseAddr("10.1.2.3")
	cases := []struct {
		name   string
		in     policy.Input
		allow  bool
		reason string
	}{
		{"built-in operator drains in pool a", policy.Input{Principal: policy.Principal{Role: "operator"}, Action: "nodes.drain",
			Resource: policy.Resource{Pool: "a"}}, true, "allowed by built-in role operator"},
		{"pool a by name", policy.Input{Principal: policy.Principal{Role: "operator"}, Action: "nodes.drain",
			Resource: policy.Resource{Pool: "pool_9", PoolName: "a"}}, true, "allowed by built-in role operator"},
		{"deny wins over built-in", policy.Input{Principal: policy.Principal{Role: "operator"}, Action: "nodes.drain",
			Resource: policy.Resource{Pool: "b"}}, false, `denied by policy "pool-a-operators" statement 2`},
		{"no pool matches notResources", policy.Input{Principal: policy.Principal{Role: "operator"}, Action: "nodes.shell"},
			false, `denied by policy "pool-a-operators" statement 2`},
		{"deny binds by role only", policy.Input{Principal: policy.Principal{Role: "admin"}, Action: "nodes.drain",
			Resource: policy.Resource{Pool: "b"}}, true, "allowed by built-in role admin"},
		{"token allow by labels", policy.Input{Principal: policy.Principal{Token: "tok_v", Role: "viewer"}, Action: "nodes.drain",
			Resource: policy.Resource{Labels: map[string]string{"gpu": "h100", "rack": "r1"}}}, true, `allowed by policy "tok-viewer-h100" statement 1`},
		{"wildcard reaches non-method action", policy.Input{Principal: policy.Principal{Token: "tok_v", Role: "viewer"}, Action: "nodes.shellAsRoot",
			Resource: policy.Resource{Labels: map[string]string{"gpu": "h100", "rack": "r1"}}}, true, `allowed by policy "tok-viewer-h100" statement 1`},
		{"label key missing", policy.Input{Principal: policy.Principal{Token: "tok_v", Role: "viewer"}, Action: "nodes.drain",
			Resource: policy.Resource{Labels: map[string]string{"gpu": "h100"}}}, false, `no policy allows nodes.drain for role viewer`},
		{"label value differs", policy.Input{Principal: policy.Principal{Token: "tok_v", Role: "viewer"}, Action: "nodes.drain",
			Resource: policy.Resource{Labels: map[string]string{"gpu": "a100", "rack": "r1"}}}, false, `no policy allows nodes.drain for role viewer`},
		{"other token", policy.Input{Principal: policy.Principal{Token: "tok_w", Role: "viewer"}, Action: "nodes.drain",
			Resource: policy.Resource{Labels: map[string]string{"gpu": "h100", "rack": "r1"}}}, false, `no policy allows nodes.drain for role viewer`},
		{"group allow", policy.Input{Principal: policy.Principal{Role: "viewer", Groups: []string{"x", "gpu-team"}}, Action: "nodes.delete",
			Resource: policy.Resource{Site: "s1", NodeName: "node-1"}}, true, `allowed by policy "gpu-team" statement 1`},
		{"group, other site", policy.Input{Principal: policy.Principal{Role: "viewer", Groups: []string{"gpu-team"}}, Action: "nodes.delete",
			Resource: policy.Resource{Site: "s2", NodeName: "node-1"}}, false, `no policy allows nodes.delete for role viewer`},
		{"condition holds", policy.Input{Principal: policy.Principal{Role: "viewer"}, Action: "nodes.cordon", SourceIP: office, Time: day},
			true, `allowed by policy "office-hours" statement 1`},
		{"condition, mapped address", policy.Input{Principal: policy.Principal{Role: "viewer"}, Action: "nodes.cordon",
			SourceIP: netip.MustParseAddr("::ffff:10.9.9.9"), Time: day}, true, `allowed by policy "office-hours" statement 1`},
		{"condition, outside address", policy.Input{Principal: policy.Principal{Role: "viewer"}, Action: "nodes.cordon",
			SourceIP: netip.MustParseAddr("192.168.1.1"), Time: day}, false, `no policy allows nodes.cordon for role viewer`},
		{"condition, unknown address", policy.Input{Principal: policy.Principal{Role: "viewer"}, Action: "nodes.cordon", Time: day},
			false, `no policy allows nodes.cordon for role viewer`},
		{"condition, evening", policy.Input{Principal: policy.Principal{Role: "viewer"}, Action: "nodes.cordon", SourceIP: office,
			Time: day.Add(9 * time.Hour)}, false, `no policy allows nodes.cordon for role viewer`},
		{"deny condition holds", policy.Input{Principal: policy.Principal{Token: "tok_f", Role: "viewer"}, Action: "nodes.get",
			Fields: map[string]any{"id": "secret"}}, false, `denied by policy "fail-closed" statement 1`},
		{"deny condition false", policy.Input{Principal: policy.Principal{Token: "tok_f", Role: "viewer"}, Action: "nodes.get",
			Fields: map[string]any{"id": "other"}}, true, "allowed by built-in role viewer"},
		{"deny condition error fails closed", policy.Input{Principal: policy.Principal{Token: "tok_f", Role: "viewer"}, Action: "nodes.get"},
			false, `denied by policy "fail-closed" statement 1 (its condition failed: no such key: id)`},
		{"allow condition holds", policy.Input{Principal: policy.Principal{Token: "tok_f", Role: "viewer"}, Action: "nodes.delete",
			Fields: map[string]any{"confirm": true}}, true, `allowed by policy "fail-closed" statement 2`},
		{"allow condition error does not apply", policy.Input{Principal: policy.Principal{Token: "tok_f", Role: "viewer"}, Action: "nodes.delete"},
			false, `no policy allows nodes.delete for role viewer`},
		{"admin denied as root", policy.Input{Principal: policy.Principal{Role: "admin"}, Action: "nodes.shellAsRoot"},
			false, `denied by policy "no-root" statement 1`},
		{"admin denied commands as root", policy.Input{Principal: policy.Principal{Role: "admin"}, Action: "commands.createAsRoot"},
			false, `denied by policy "no-root" statement 1`},
		{"other tenant gets built-in only", policy.Input{Principal: policy.Principal{Tenant: "ten_2", Role: "operator"}, Action: "nodes.drain",
			Resource: policy.Resource{Pool: "b"}}, true, "allowed by built-in role operator"},
		{"viewer may not drain", policy.Input{Principal: policy.Principal{Role: "viewer"}, Action: "nodes.drain"},
			false, `no policy allows nodes.drain for role viewer`},
		{"unknown action", policy.Input{Principal: policy.Principal{Role: "admin"}, Action: "nodes.frob"},
			false, `unknown action "nodes.frob"`},
		{"unknown role", policy.Input{Principal: policy.Principal{Role: "root"}, Action: "nodes.get"},
			false, `no policy allows nodes.get for role "root"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.in.Principal = ten(c.in.Principal)
			for name, d := range map[string]policy.Decider{"set": set, "bundle": bundle} {
				got := d.Decide(c.in)
				if got.Allow != c.allow || got.Reason != c.reason {
					t.Errorf("%s: got %+v, want allow=%v %q", name, got, c.allow, c.reason)
				}
			}
		})
	}
}

// TestDecideWorstCase: a deny with a condition applies under
// DecideWorstCase whatever the condition says, an allow with one does
// not, and statements without one, selectors and bindings decide as in
// Decide. The denies are those a lockout check once missed: false for an
// input without address, fields or tenant name, true for every real call.
func TestDecideWorstCase(t *testing.T) {
	t.Parallel()
	_, set := mustLoad(t, `policies:
  - name: bypass
    bind: {roles: [admin]}
    statements:
      - effect: deny
        actions: [nodes.delete]
        condition: 'request.sourceIp != ""'
      - effect: deny
        actions: [tokens.create]
        condition: 'has(request.fields.document)'
      - effect: deny
        actions: [commands.create]
        resources: {pools: [b]}
        condition: 'resource.tenantName == ""'
  - name: viewers
    bind: {roles: [viewer]}
    statements:
      - effect: allow
        actions: [nodes.drain]
        condition: 'request.sourceIp == ""'
      - effect: allow
        actions: [nodes.cordon]
      - effect: deny
        actions: [nodes.get]
        resources: {pools: [secret]}
`)
	bundle, err := policy.NewBundle(catalog(), set)
	if err != nil {
		t.Fatal(err)
	}
	admin := policy.Principal{Tenant: tenant, Role: "admin"}
	viewer := policy.Principal{Tenant: tenant, Role: "viewer"}
	cases := []struct {
		name         string
		in           policy.Input
		decide, want string // reasons; "allowed ..." ones allow
	}{
		{"deny on an address", policy.Input{Principal: admin, Action: "nodes.delete"},
			"allowed by built-in role admin", `denied by policy "bypass" statement 1 (its condition taken to hold)`},
		{"deny on a field", policy.Input{Principal: admin, Action: "tokens.create"},
			"allowed by built-in role admin", `denied by policy "bypass" statement 2 (its condition taken to hold)`},
		{"deny on a name, selected", policy.Input{Principal: admin, Action: "commands.create",
			Resource: policy.Resource{Pool: "b", TenantName: "acme"}},
			"allowed by built-in role admin", `denied by policy "bypass" statement 3 (its condition taken to hold)`},
		{"deny on a name, not selected", policy.Input{Principal: admin, Action: "commands.create",
			Resource: policy.Resource{Pool: "a"}},
			"allowed by built-in role admin", "allowed by built-in role admin"},
		{"deny bound to another role", policy.Input{Principal: policy.Principal{Tenant: tenant, Role: "operator"}, Action: "commands.create",
			Resource: policy.Resource{Pool: "b"}},
			"allowed by built-in role operator", "allowed by built-in role operator"},
		{"allow with a condition", policy.Input{Principal: viewer, Action: "nodes.drain"},
			`allowed by policy "viewers" statement 1`, "no policy allows nodes.drain for role viewer"},
		{"allow without a condition", policy.Input{Principal: viewer, Action: "nodes.cordon"},
			`allowed by policy "viewers" statement 2`, `allowed by policy "viewers" statement 2`},
		{"deny without a condition", policy.Input{Principal: viewer, Action: "nodes.get", Resource: policy.Resource{Pool: "secret"}},
			`denied by policy "viewers" statement 3`, `denied by policy "viewers" statement 3`},
		{"deny without a condition, not selected", policy.Input{Principal: viewer, Action: "nodes.get", Resource: policy.Resource{Pool: "a"}},
			"allowed by built-in role viewer", "allowed by built-in role viewer"},
		{"other tenant", policy.Input{Principal: policy.Principal{Tenant: "ten_2", Role: "admin"}, Action: "nodes.delete"},
			"allowed by built-in role admin", "allowed by built-in role admin"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := set.Decide(c.in); got.Reason != c.decide || got.Allow != strings.HasPrefix(c.decide, "allowed") {
				t.Errorf("Decide: got %+v, want %q", got, c.decide)
			}
			for name, got := range map[string]policy.Decision{"set": set.DecideWorstCase(c.in), "bundle": bundle.DecideWorstCase(c.in)} {
				if got.Reason != c.want || got.Allow != strings.HasPrefix(c.want, "allowed") {
					t.Errorf("%s: DecideWorstCase: got %+v, want %q", name, got, c.want)
				}
			}
		})
	}
	// The denies' conditions do hold for a real call.
	call := policy.Input{Principal: admin, Action: "nodes.delete", SourceIP: netip.MustParseAddr("10.1.2.3")}
	if d := set.Decide(call); d.Allow {
		t.Errorf("a call with an address: %+v", d)
	}
	in := policy.Input{Principal: admin, Action: "nodes.delete"}
	if d := (*policy.Set)(nil).DecideWorstCase(in); d.Allow {
		t.Errorf("nil set allowed: %+v", d)
	}
	if d := (*policy.Bundle)(nil).DecideWorstCase(in); d.Allow {
		t.Errorf("nil bundle allowed: %+v", d)
	}
	if d := bundle.Without(tenant).DecideWorstCase(in); !d.Allow {
		t.Errorf("tenant without a set: %+v", d)
	}
}

// TestBuiltinsMatchCatalog: with no policies, every role is allowed
// exactly the actions whose least role ranks at or below it, and
// BuiltinRoles lists the same.
func TestBuiltinsMatchCatalog(t *testing.T) {
	t.Parallel()
	cat := catalog()
	bundle, err := policy.NewBundle(cat)
	if err != nil {
		t.Fatal(err)
	}
	rank := map[string]int{"viewer": 1, "operator": 2, "admin": 3}
	builtins := policy.BuiltinRoles(cat)
	if len(builtins) != 3 {
		t.Fatalf("%d built-in roles", len(builtins))
	}
	for i, role := range policy.Roles() {
		listed := map[string]bool{}
		for _, a := range builtins[i].Statements[0].Actions {
			listed[a] = true
		}
		if builtins[i].Name != role || builtins[i].Bind.Roles[0] != role {
			t.Errorf("built-in %d is %+v, want %s", i, builtins[i], role)
		}
		for action, least := range cat {
			want := rank[least] <= rank[role]
			d := bundle.Decide(policy.Input{Principal: policy.Principal{Tenant: tenant, Role: role}, Action: action})
			if d.Allow != want || listed[action] != want {
				t.Errorf("%s %s: decided %+v, listed %v, want %v", role, action, d, listed[action], want)
			}
		}
	}
	if d := (*policy.Bundle)(nil).Decide(policy.Input{Principal: policy.Principal{Role: "admin"}, Action: "nodes.get"}); d.Allow {
		t.Errorf("nil bundle allowed: %+v", d)
	}
}

func TestBundleWith(t *testing.T) {
	t.Parallel()
	_, set := mustLoad(t, decideSrc)
	empty, err := policy.NewBundle(catalog())
	if err != nil {
		t.Fatal(err)
	}
	in := policy.Input{Principal: policy.Principal{Tenant: tenant, Role: "operator"}, Action: "nodes.drain", Resource: policy.Resource{Pool: "b"}}
	with := empty.With(set)
	if !empty.Decide(in).Allow || with.Decide(in).Allow || !with.Without(tenant).Decide(in).Allow {
		t.Error("With or Without did not swap the tenant's set")
	}
	if with.Set(tenant) != set || empty.Set(tenant) != nil {
		t.Error("Set")
	}
	for _, c := range []struct {
		p    policy.Principal
		want bool
	}{
		{policy.Principal{Tenant: tenant, Role: "operator"}, true},
		{policy.Principal{Tenant: tenant, Role: "viewer", Token: "tok_v"}, true},
		{policy.Principal{Tenant: tenant, Groups: []string{"x", "gpu-team"}}, true},
		{policy.Principal{Tenant: tenant, Role: "root", Token: "tok_x", Groups: []string{"x"}}, false},
		{policy.Principal{Tenant: "ten_2", Role: "operator"}, false},
	} {
		if got := with.Bound(c.p); got != c.want {
			t.Errorf("Bound(%+v) = %v, want %v", c.p, got, c.want)
		}
	}
	if empty.Bound(policy.Principal{Tenant: tenant, Role: "operator"}) || (*policy.Bundle)(nil).Bound(policy.Principal{}) {
		t.Error("Bound without a set")
	}
	if _, err := policy.NewBundle(catalog(), set, set); err == nil {
		t.Error("two sets for one tenant accepted")
	}
}

func TestFileTests(t *testing.T) {
	t.Parallel()
	src := decideSrc + `tests:
  - name: drain on a is allowed
    caller: {token: tok_abc, role: operator}
    action: nodes.drain
    resource: {pool: a, site: s1, tenant: root, node: node_x, labels: {gpu: h100}}
    expect: allow
  - name: drain on b is denied
    caller: {role: operator}
    action: nodes.drain
    resource: {pool: b}
    expect: deny
  - name: office hours
    caller: {role: viewer}
    action: nodes.cordon
    sourceIp: 10.1.2.3
    time: 2026-12-07T10:00:00Z
    expect: allow
  - name: default time is noon
    caller: {role: viewer}
    action: nodes.cordon
    sourceIp: 10.1.2.3
    expect: allow
  - name: fields
    caller: {token: tok_f, role: viewer}
    action: nodes.get
    fields: {id: secret}
    expect: deny
  - name: groups
    caller: {role: viewer, groups: [gpu-team]}
    action: nodes.delete
    resource: {site: s1, nodeName: node-1}
    expect: allow
`
	doc, set, results, err := policy.Load(tenant, []byte(src), catalog())
	if err != nil {
		t.Fatal(err)
	}
	if doc == nil || set == nil || len(results) != 6 || !policy.AllPassed(results) {
		t.Fatalf("results %+v", results)
	}
	failing := src + `  - name: wrong
    caller: {role: viewer}
    action: nodes.drain
    expect: allow
`
	_, _, results, err = policy.Load(tenant, []byte(failing), catalog())
	if !errors.Is(err, policy.ErrTestsFailed) || !strings.Contains(err.Error(), `test "wrong": want allow, got deny (no policy allows nodes.drain for role viewer)`) {
		t.Fatalf("got %v", err)
	}
	if policy.AllPassed(results) || results[6].Passed() || !results[5].Passed() {
		t.Errorf("results %+v", results)
	}
}

func TestCanonical(t *testing.T) {
	t.Parallel()
	doc, _ := mustLoad(t, decideSrc+"tests:\n  - name: t\n    caller: {role: viewer}\n    action: nodes.get\n    time: 2026-12-07T10:00:00Z\n    fields: {a: [1, 2.5, x, true, null], b: {c: d}}\n    expect: allow\n")
	c1, err := doc.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	doc2, err := policy.Parse(c1)
	if err != nil {
		t.Fatalf("canonical form does not parse: %v\n%s", err, c1)
	}
	c2, err := doc2.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	if string(c1) != string(c2) {
		t.Errorf("canonical forms differ:\n%s\n%s", c1, c2)
	}
	if d := policy.Diff(doc, doc2); d != "no change" {
		t.Errorf("diff %q", d)
	}
	empty, err := (&policy.Document{Policies: []policy.Policy{}}).Canonical()
	if err != nil || string(empty) != "policies: []\n" {
		t.Errorf("empty: %q %v", empty, err)
	}
}

func TestDiff(t *testing.T) {
	t.Parallel()
	old, _ := mustLoad(t, decideSrc)
	changed := strings.NewReplacer(
		"tokens: [tok_v]", "tokens: [tok_v, tok_w]",
		"        actions: [nodes.delete]\n        condition: 'request.fields.confirm == true'\n", "        actions: [nodes.delete]\n",
		"  - name: no-root\n", "  - name: no-root-2\n",
	).Replace(decideSrc)
	changed += "      - effect: deny\n        actions: [nodes.delete]\n"
	new, _ := mustLoad(t, changed)
	got := policy.Diff(old, new)
	want := "added 1: no-root-2; removed 1: no-root; changed 2: tok-viewer-h100 (bind changed), fail-closed (statement 2 changed)"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if got := policy.Diff(nil, old); !strings.HasPrefix(got, "added 6: pool-a-operators, ") {
		t.Errorf("from nothing: %q", got)
	}
}

func TestMatchPatterns(t *testing.T) {
	t.Parallel()
	cat := catalog()
	for pattern, want := range map[string]int{
		"*":            len(cat),
		"nodes.*":      8,
		"*.get":        2,
		"*AsRoot":      2,
		"nodes.*Root*": 1,
		"n*s.g*t":      1,
		"**":           len(cat),
		"nodes.get":    1,
	} {
		src := "policies:\n  - name: p\n    bind: {roles: [viewer]}\n    statements: [{effect: allow, actions: [\"" + pattern + "\"]}]\n"
		_, set := mustLoad(t, src)
		allowed := 0
		for action := range cat {
			if set.Decide(policy.Input{Principal: policy.Principal{Tenant: tenant, Role: "viewer"}, Action: action}).Allow &&
				!cat.Allows("viewer", action) {
				allowed++
			}
		}
		builtin := 0
		for action := range cat {
			if cat.Allows("viewer", action) && matchesAny(pattern, action) {
				builtin++
			}
		}
		if allowed+builtin != want {
			t.Errorf("%q allows %d+%d actions, want %d", pattern, allowed, builtin, want)
		}
	}
}

// matchesAny is a slow reference for the patterns of TestMatchPatterns.
func matchesAny(pattern, action string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == action
	}
	if !strings.HasPrefix(action, parts[0]) {
		return false
	}
	rest := action[len(parts[0]):]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return strings.HasSuffix(rest, parts[len(parts)-1])
}
