package policy_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/policy"
)

// BenchmarkCacheHit: an allowed read served from the cache.
func BenchmarkCacheHit(b *testing.B) {
	cache := policy.NewCache(policy.CacheConfig{})
	d := &counting{decide: func(policy.Input) policy.Decision { return policy.Decision{Allow: true, Reason: "ok"} }}
	in := policy.Input{Principal: policy.Principal{Token: "tok_00001", Tenant: tenant, Role: "viewer"}, Action: "nodes.get",
		SourceIP: netip.MustParseAddr("10.1.2.3"),
		Resource: policy.Resource{Tenant: tenant, Site: "site-1", Pool: "pool-1", Node: "node-1", Labels: map[string]string{"gpu": "h100"}},
		Fields:   map[string]any{"id": "node-1"}}
	for b.Loop() {
		cache.Decide(in, true, d)
	}
}

// BenchmarkDecide: a decision by a token-bound allow with a label
// selector, no condition.
func BenchmarkDecide(b *testing.B) {
	_, set := mustLoad(b, decideSrc)
	in := policy.Input{Principal: policy.Principal{Token: "tok_v", Tenant: tenant, Role: "viewer"}, Action: "nodes.drain",
		Resource: policy.Resource{Labels: map[string]string{"gpu": "h100", "rack": "r1"}}}
	for b.Loop() {
		set.Decide(in)
	}
}

// BenchmarkDecideCondition: a decision by a role-bound allow whose
// condition checks the address and the hour.
func BenchmarkDecideCondition(b *testing.B) {
	_, set := mustLoad(b, decideSrc)
	in := policy.Input{Principal: policy.Principal{Tenant: tenant, Role: "viewer"}, Action: "nodes.cordon",
		SourceIP: netip.MustParseAddr("10.1.2.3"), Time: time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)}
	for b.Loop() {
		if !set.Decide(in).Allow {
			b.Fatal("denied")
		}
	}
}

// BenchmarkParseHostile: Parse refusing files of MaxDocumentSize built to
// be slow: tests nested 9,000 deep (refused for their depth), nested
// at MaxDepth with a type error a line, and 130,000 one-line type errors.
func BenchmarkParseHostile(b *testing.B) {
	fit := func(line int) int { return (policy.MaxDocumentSize - 64) / line }
	for _, c := range []struct{ name, src string }{
		{"deep", hostileDeep(fit(2*9000+5), 9000)},
		{"at-max-depth", hostileDeep(fit(2*(policy.MaxDepth-2)+5), policy.MaxDepth-2)},
		{"wide", hostileWide(fit(8))},
		{"wide-one-line", "policies: []\ntests: [" + strings.Repeat("[1], ", fit(5)) + "]\n"},
	} {
		b.Run(c.name, func(b *testing.B) {
			src := []byte(c.src)
			if len(src) > policy.MaxDocumentSize {
				b.Fatalf("source is %d bytes", len(src))
			}
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				if _, err := policy.Parse(src); err == nil {
					b.Fatal("parsed")
				}
			}
		})
	}
}
