package policy_test

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/policy"
)

// counting decides by a function and counts the decisions it makes.
type counting struct {
	n      atomic.Int64
	decide func(policy.Input) policy.Decision
}

func (c *counting) Decide(in policy.Input) policy.Decision {
	c.n.Add(1)
	return c.decide(in)
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestCacheKeyedByAddress: a decision made for one address is never
// served to another, however the calls alternate.
func TestCacheKeyedByAddress(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cache := policy.NewCache(policy.CacheConfig{Now: clk.Now})
	office := netip.MustParseAddr("10.1.2.3")
	home := netip.MustParseAddr("192.0.2.7")
	d := &counting{decide: func(in policy.Input) policy.Decision {
		return policy.Decision{Allow: in.SourceIP == office, Reason: in.SourceIP.String()}
	}}
	in := policy.Input{Principal: policy.Principal{Token: "tok", Tenant: tenant, Role: "viewer"}, Action: "nodes.get"}
	for i := range 20 {
		addr := office
		if i%2 == 1 {
			addr = home
		}
		in.SourceIP = addr
		got := cache.Decide(in, true, d)
		if got.Allow != (addr == office) || got.Reason != addr.String() {
			t.Fatalf("call %d from %s: got %+v", i, addr, got)
		}
	}
	// The office's allow was decided once; the home's denial each time.
	if n := d.n.Load(); n != 11 {
		t.Errorf("%d decisions, want 11", n)
	}
}

func TestCache(t *testing.T) {
	t.Parallel()
	clk := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	cache := policy.NewCache(policy.CacheConfig{Now: clk.Now, MaxEntries: 4})
	allow := &counting{decide: func(policy.Input) policy.Decision { return policy.Decision{Allow: true, Reason: "ok"} }}
	deny := &counting{decide: func(policy.Input) policy.Decision { return policy.Decision{Reason: "no"} }}
	base := policy.Input{Principal: policy.Principal{Token: "tok", Tenant: tenant, Role: "viewer"}, Action: "nodes.get",
		Resource: policy.Resource{Node: "n1", Labels: map[string]string{"gpu": "h100"}}, Fields: map[string]any{"id": "n1", "n": 1}}
	calls := func(d *counting, in policy.Input, read bool, times int) int64 {
		before := d.n.Load()
		for range times {
			cache.Decide(in, read, d)
		}
		return d.n.Load() - before
	}
	if n := calls(allow, base, true, 5); n != 1 {
		t.Errorf("allowed read decided %d times, want 1", n)
	}
	if n := calls(allow, base, false, 3); n != 3 {
		t.Errorf("write decided %d times, want 3 (not cached)", n)
	}
	if n := calls(deny, base, true, 3); n != 0 {
		t.Errorf("cached allow not served: %d", n)
	}
	other := base
	other.Action = "nodes.list"
	if n := calls(deny, other, true, 3); n != 3 {
		t.Errorf("denial decided %d times, want 3 (never cached)", n)
	}
	for name, change := range map[string]func(*policy.Input){
		"fields":   func(in *policy.Input) { in.Fields = map[string]any{"id": "n2", "n": 1} },
		"field ty": func(in *policy.Input) { in.Fields = map[string]any{"id": "n1", "n": 1.0} },
		"labels":   func(in *policy.Input) { in.Resource.Labels = map[string]string{"gpu": "a100"} },
		"node":     func(in *policy.Input) { in.Resource.Node = "n2" },
		"pool":     func(in *policy.Input) { in.Resource.PoolName = "a" },
		"token":    func(in *policy.Input) { in.Principal.Token = "tok2" },
		"groups":   func(in *policy.Input) { in.Principal.Groups = []string{"g"} },
		"role":     func(in *policy.Input) { in.Principal.Role = "admin" },
	} {
		in := base
		change(&in)
		if n := calls(deny, in, true, 1); n != 1 {
			t.Errorf("%s: a changed call was served from the cache", name)
		}
	}
	// Same fields in another map: served.
	same := base
	same.Fields = map[string]any{"n": 1, "id": "n1"}
	if n := calls(deny, same, true, 1); n != 0 {
		t.Error("equal fields not served")
	}
	clk.add(policy.DecisionCacheTTL)
	if n := calls(allow, base, true, 2); n != 1 {
		t.Errorf("after the TTL decided %d times, want 1", n)
	}
	cache.Clear()
	if cache.Len() != 0 {
		t.Errorf("Len after Clear %d", cache.Len())
	}
	if n := calls(allow, base, true, 2); n != 1 {
		t.Errorf("after Clear decided %d times, want 1", n)
	}
	// No token: not cached.
	anon := base
	anon.Principal.Token = ""
	if n := calls(allow, anon, true, 2); n != 2 {
		t.Errorf("call without token decided %d times, want 2", n)
	}
	// The bound: past 4 entries the cache empties.
	for i := range 10 {
		in := base
		in.Resource.Node = string(rune('a' + i))
		calls(allow, in, true, 1)
		if cache.Len() > 4 {
			t.Fatalf("%d entries, bound 4", cache.Len())
		}
	}
}

// TestCacheClearDuringDecision: a decision made under the old policies is
// not kept when Clear runs while it is made.
func TestCacheClearDuringDecision(t *testing.T) {
	t.Parallel()
	cache := policy.NewCache(policy.CacheConfig{})
	in := policy.Input{Principal: policy.Principal{Token: "tok", Tenant: tenant, Role: "viewer"}, Action: "nodes.get"}
	d := &counting{decide: func(policy.Input) policy.Decision {
		cache.Clear()
		return policy.Decision{Allow: true}
	}}
	cache.Decide(in, true, d)
	if cache.Len() != 0 {
		t.Error("decision made across a Clear was kept")
	}
}
