// Command policy measures the policy evaluator (package policy, issue 46)
// at the scale of one large tenant: -policies policies (default 10,000),
// most bound to one of -tokens API tokens, some to a role or a group, with
// one to three statements each (allow or deny, exact actions or patterns,
// pool and label selectors; one in ten a deny, always with a selector; one
// in ten with a CEL condition), compiled once (and its canonical YAML
// parsed, when it fits a policy file). It then makes -n decisions (default
// 200,000) over -distinct different calls (callers, actions, resources,
// addresses and fields drawn at random, the calls drawn with a Zipf skew),
// first uncached (Set.Decide), then through the decision cache
// (policy.Cache, reads being the actions the viewer role may call), each
// on one goroutine and on GOMAXPROCS goroutines, and prints decisions per
// second and the p50 and p99 latency of a decision, with the cache's hit
// rate.
//
//	go run ./tests/bench/policy
//	go run ./tests/bench/policy -policies 20000 -n 1000000
//
// Nothing is asserted; it prints.
package main

import (
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/policy"
)

func main() {
	nPolicies := flag.Int("policies", 10000, "policies in the tenant")
	nTokens := flag.Int("tokens", 2000, "API tokens the policies are bound to")
	nGroups := flag.Int("groups", 50, "groups the policies are bound to")
	nPools := flag.Int("pools", 100, "pools the resources are in")
	n := flag.Int("n", 200000, "decisions per measurement")
	distinct := flag.Int("distinct", 20000, "different calls the decisions are drawn from")
	flag.Parse()
	if *nPolicies < 1 || *nTokens < 1 || *nGroups < 1 || *nPools < 1 || *n < 1 || *distinct < 1 {
		fmt.Fprintln(os.Stderr, "bench: want every count >= 1")
		os.Exit(2)
	}
	if err := run(*nPolicies, *nTokens, *nGroups, *nPools, *n, *distinct); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

const tenant = "ten_bench"

var roles = []string{"viewer", "operator", "admin"}

// catalog is an API of about 100 methods: the usual verbs on the usual
// nouns, with the roles the API gives them, and the non-method actions.
func catalog() policy.Catalog {
	cat := policy.NonMethodActions()
	for _, noun := range []string{"nodes", "pools", "sites", "commands", "reservations", "tokens", "tenants",
		"rollouts", "sinks", "events", "policies", "tunnels", "sessions", "images", "quotas"} {
		cat[noun+".get"] = "viewer"
		cat[noun+".list"] = "viewer"
		cat[noun+".watch"] = "viewer"
		cat[noun+".create"] = "operator"
		cat[noun+".update"] = "operator"
		cat[noun+".delete"] = "admin"
	}
	for _, m := range []string{"nodes.drain", "nodes.cordon", "nodes.uncordon", "nodes.reboot", "commands.cancel"} {
		cat[m] = "operator"
	}
	return cat
}

// conditions are the condition texts the policies draw from.
var conditions = []string{
	`inCidr(request.sourceIp, "10.0.0.0/8")`,
	`inCidr(request.sourceIp, "192.168.0.0/16") || inCidr(request.sourceIp, "172.16.0.0/12")`,
	`request.time.getHours("UTC") >= 8 && request.time.getHours("UTC") < 18`,
	`request.time.getDayOfWeek("UTC") in [1, 2, 3, 4, 5]`,
	`has(request.fields.id) && request.fields.id.startsWith("node-")`,
	`resource.labels.exists(k, k == "gpu") && resource.labels["gpu"] == "h100"`,
	`"oncall" in caller.groups || caller.role == "admin"`,
	`resource.pool.endsWith("-1") && inCidr(request.sourceIp, "10.1.0.0/16")`,
}

func run(nPolicies, nTokens, nGroups, nPools, n, distinct int) error {
	rng := mrand.New(mrand.NewPCG(1, 2))
	cat := catalog()
	actions := slices.Sorted(func(yield func(string) bool) {
		for a := range cat {
			if !yield(a) {
				return
			}
		}
	})
	patterns := []string{"nodes.*", "*.get", "*.list", "pools.*", "commands.*", "*"}
	pool := func(i int) string { return fmt.Sprintf("pool-%d", i) }
	gpus := []string{"h100", "a100", "l40s", "h200"}

	doc := &policy.Document{Policies: make([]policy.Policy, 0, nPolicies)}
	var nConds, nDeny, nPattern int
	for i := range nPolicies {
		p := policy.Policy{Name: fmt.Sprintf("p-%05d", i)}
		switch r := rng.IntN(100); {
		case r < 2:
			p.Bind.Roles = []string{roles[rng.IntN(len(roles))]}
		case r < 10:
			p.Bind.Groups = []string{fmt.Sprintf("group-%d", rng.IntN(nGroups))}
		default:
			for range 1 + rng.IntN(3) {
				p.Bind.Tokens = append(p.Bind.Tokens, fmt.Sprintf("tok_%05d", rng.IntN(nTokens)))
			}
			slices.Sort(p.Bind.Tokens)
			p.Bind.Tokens = slices.Compact(p.Bind.Tokens)
		}
		for range 1 + rng.IntN(3) {
			st := policy.Statement{Effect: policy.Allow}
			deny := rng.IntN(10) == 0
			if deny {
				st.Effect = policy.Deny
				nDeny++
			}
			if rng.IntN(10) == 0 {
				st.Actions = []string{patterns[rng.IntN(len(patterns))]}
				nPattern++
			} else {
				for range 1 + rng.IntN(3) {
					st.Actions = append(st.Actions, actions[rng.IntN(len(actions))])
				}
				slices.Sort(st.Actions)
				st.Actions = slices.Compact(st.Actions)
			}
			r := rng.IntN(10)
			if deny {
				// A deny names the pools or labels it fences off.
				r = rng.IntN(8)
			}
			switch {
			case r < 5:
				a, b := rng.IntN(nPools), rng.IntN(nPools)
				st.Resources = &policy.Selector{Pools: []string{pool(a)}}
				if b != a {
					st.Resources.Pools = append(st.Resources.Pools, pool(b))
				}
			case r < 7:
				st.Resources = &policy.Selector{Labels: map[string]string{"gpu": gpus[rng.IntN(len(gpus))]}}
			case r < 8:
				st.NotResources = &policy.Selector{Pools: []string{pool(rng.IntN(nPools))}}
			}
			if rng.IntN(10) == 0 {
				st.Condition = conditions[rng.IntN(len(conditions))]
				nConds++
			}
			p.Statements = append(p.Statements, st)
		}
		doc.Policies = append(doc.Policies, p)
	}
	canonical, err := doc.Canonical()
	if err != nil {
		return err
	}
	t0 := time.Now()
	set, err := policy.Compile(tenant, doc, cat)
	if err != nil {
		return fmt.Errorf("compile: %w", err)
	}
	took := time.Since(t0)
	_, nStatements := set.Len()
	fmt.Printf("setup: %d policies, %d statements (%d deny, %d patterns, %d with a condition), %d tokens, %d groups, %d actions; compiled in %s\n",
		nPolicies, nStatements, nDeny, nPattern, nConds, nTokens, nGroups, len(cat), took.Round(time.Millisecond))
	if len(canonical) > policy.MaxDocumentSize {
		fmt.Printf("file: canonical YAML %.1f MiB, over the %d MiB bound of a policy file: not parsed\n",
			float64(len(canonical))/(1<<20), policy.MaxDocumentSize>>20)
	} else {
		t0 = time.Now()
		if _, err := policy.Parse(canonical); err != nil {
			return fmt.Errorf("parse the canonical form: %w", err)
		}
		fmt.Printf("file: canonical YAML %.2f MiB, parsed in %s\n", float64(len(canonical))/(1<<20), time.Since(t0).Round(time.Millisecond))
	}

	// The calls: a token (its role fixed by its number), maybe groups, an
	// action (reads three times as likely), a resource, an address, fields.
	var reads []string
	for _, a := range actions {
		if cat[a] == "viewer" {
			reads = append(reads, a)
		}
	}
	base := time.Date(2026, 3, 2, 7, 0, 0, 0, time.UTC)
	calls := make([]policy.Input, distinct)
	isRead := make([]bool, distinct)
	for i := range calls {
		tok := rng.IntN(nTokens)
		in := policy.Input{
			Principal: policy.Principal{Token: fmt.Sprintf("tok_%05d", tok), Tenant: tenant, Role: roles[tok%len(roles)]},
			Resource: policy.Resource{Tenant: tenant, Site: "site-1", Pool: pool(rng.IntN(nPools)),
				Node: fmt.Sprintf("node-%d", rng.IntN(10000)), Labels: map[string]string{"gpu": gpus[rng.IntN(len(gpus))]}},
			SourceIP: netip.AddrFrom4([4]byte{[]byte{10, 192, 172, 203}[rng.IntN(4)], byte(rng.IntN(4)), byte(rng.IntN(256)), 1 + byte(rng.IntN(250))}),
			Time:     base.Add(time.Duration(rng.IntN(14*3600)) * time.Second),
		}
		if rng.IntN(4) == 0 {
			in.Principal.Groups = []string{fmt.Sprintf("group-%d", rng.IntN(nGroups)), "oncall"}
		}
		if rng.IntN(4) != 0 {
			in.Action = reads[rng.IntN(len(reads))]
		} else {
			in.Action = actions[rng.IntN(len(actions))]
		}
		in.Fields = map[string]any{"id": in.Resource.Node}
		calls[i], isRead[i] = in, cat[in.Action] == "viewer"
	}
	zipf := mrand.NewZipf(rng, 1.1, 1, uint64(distinct-1))
	order := make([]int, n)
	for i := range order {
		order[i] = int(zipf.Uint64())
	}

	var allowed int
	for _, i := range order {
		if set.Decide(calls[i]).Allow {
			allowed++
		}
	}
	fmt.Printf("calls: %d decisions over %d distinct calls (Zipf 1.1), %.0f %% reads, %.0f %% allowed\n",
		n, distinct, 100*float64(countTrue(order, isRead))/float64(n), 100*float64(allowed)/float64(n))

	procs := runtime.GOMAXPROCS(0)
	for _, g := range []int{1, procs} {
		lat, took := measure(order, g, func(i int) { set.Decide(calls[i]) })
		report(fmt.Sprintf("uncached, %2d goroutine(s)", g), lat, took)
	}
	for _, g := range []int{1, procs} {
		cache := policy.NewCache(policy.CacheConfig{})
		counted := &counter{d: set}
		lat, took := measure(order, g, func(i int) { cache.Decide(calls[i], isRead[i], counted) })
		report(fmt.Sprintf("cached,   %2d goroutine(s)", g), lat, took)
		fmt.Printf("    cache hit rate %.1f %% (%d entries)\n", 100*(1-float64(counted.n.Load())/float64(n)), cache.Len())
	}
	return nil
}

// counter counts the decisions the cache asks for.
type counter struct {
	n atomic.Int64
	d policy.Decider
}

func (c *counter) Decide(in policy.Input) policy.Decision {
	c.n.Add(1)
	return c.d.Decide(in)
}

// measure runs decide for every entry of order, split over g goroutines,
// and returns each call's latency and the wall time.
func measure(order []int, g int, decide func(int)) ([]time.Duration, time.Duration) {
	lat := make([]time.Duration, len(order))
	var wg sync.WaitGroup
	start := time.Now()
	for w := range g {
		wg.Go(func() {
			for k := w; k < len(order); k += g {
				t := time.Now()
				decide(order[k])
				lat[k] = time.Since(t)
			}
		})
	}
	wg.Wait()
	return lat, time.Since(start)
}

func report(what string, lat []time.Duration, took time.Duration) {
	slices.Sort(lat)
	pct := func(p int) time.Duration { return lat[min(len(lat)*p/100, len(lat)-1)] }
	fmt.Printf("%s: %9.0f decisions/s, p50 %v, p99 %v, max %v\n", what, float64(len(lat))/took.Seconds(), pct(50), pct(99), lat[len(lat)-1])
}

func countTrue(order []int, b []bool) int {
	var c int
	for _, i := range order {
		if b[i] {
			c++
		}
	}
	return c
}
