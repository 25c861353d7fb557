package policy

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"math"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// DecisionCacheTTL is how long a Cache serves an allowed read decision
// (DESIGN.md, "Tenancy and policies": allowed read decisions 10 s).
const DecisionCacheTTL = 10 * time.Second

// DefaultCacheEntries is a Cache's default bound on entries.
const DefaultCacheEntries = 100_000

// CacheConfig configures a Cache.
type CacheConfig struct {
	// TTL is how long an allowed decision is served. Defaults to
	// DecisionCacheTTL.
	TTL time.Duration
	// MaxEntries bounds the entries held. They are spread over 16 shards
	// by their hash (one shard below 1,024 entries), each holding its share:
	// when a new entry finds its shard full, the shard's expired entries
	// are dropped, and if that frees none, all of them. Defaults to
	// DefaultCacheEntries.
	MaxEntries int
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Cache serves allowed decisions of read actions for a while, so that
// repeated reads skip the evaluation. It holds only allowed decisions of
// calls the caller says are reads, never a denial, so a new deny or a
// revoked allow takes effect for writes at once and for reads within the
// TTL; call Clear when policies change to make it immediate. An entry is
// keyed on everything a decision reads but the time: the caller's token id,
// the verified address and the action exactly, and a 64-bit hash, seeded
// at random per Cache, of the caller's tenant, role and groups, the
// resource (ids, names, labels) and the request's fields; so one address's
// decision is never served to another. A condition on request.time may
// thus be up to the TTL late for cached reads. Calls without a token id, and
// calls of a caller holding grants (Input.Grants: their end must hold at
// once), are not cached. It is safe for concurrent use.
type Cache struct {
	cfg  CacheConfig
	seed maphash.Seed
	// gen counts Clears: a decision made across one is not kept.
	gen    atomic.Uint64
	shards []cacheShard
}

// cacheShards spreads the entries over locks, by the key's hash, when
// MaxEntries allows at least minShardEntries a shard; else one shard.
const (
	cacheShards     = 16
	minShardEntries = 64
)

type cacheShard struct {
	mu      sync.RWMutex
	entries map[cacheKey]cacheEntry
	max     int
	// Pad the shards apart so their locks do not share a cache line.
	_ [40]byte
}

type cacheKey struct {
	token, action string
	addr          netip.Addr
	// digest hashes the rest of the call (Cache.digest).
	digest uint64
}

type cacheEntry struct {
	d       Decision
	expires time.Time
}

// NewCache returns an empty Cache.
func NewCache(cfg CacheConfig) *Cache {
	cfg.TTL = cmp.Or(cfg.TTL, DecisionCacheTTL)
	cfg.MaxEntries = cmp.Or(cfg.MaxEntries, DefaultCacheEntries)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	n := cacheShards
	if cfg.MaxEntries < cacheShards*minShardEntries {
		n = 1
	}
	c := &Cache{cfg: cfg, seed: maphash.MakeSeed(), shards: make([]cacheShard, n)}
	for i := range c.shards {
		c.shards[i].entries = map[cacheKey]cacheEntry{}
		c.shards[i].max = cfg.MaxEntries / n
	}
	return c
}

// Decide returns d's decision on in: from the cache when read is true and
// an allowed decision for the same key is younger than the TTL; otherwise
// it asks d, and keeps the answer when read is true and it allows (and no
// Clear came in between).
func (c *Cache) Decide(in Input, read bool, d Decider) Decision {
	if !read || in.Principal.Token == "" || len(in.Grants) > 0 {
		return d.Decide(in)
	}
	key := cacheKey{token: in.Principal.Token, action: in.Action, addr: in.SourceIP, digest: c.digest(&in)}
	sh := &c.shards[key.digest%uint64(len(c.shards))]
	now := c.cfg.Now()
	gen := c.gen.Load()
	sh.mu.RLock()
	e, ok := sh.entries[key]
	sh.mu.RUnlock()
	if ok && now.Before(e.expires) {
		return e.d
	}
	dec := d.Decide(in)
	if !dec.Allow {
		return dec
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if c.gen.Load() != gen {
		return dec
	}
	if len(sh.entries) >= sh.max {
		for k, e := range sh.entries {
			if !now.Before(e.expires) {
				delete(sh.entries, k)
			}
		}
		if len(sh.entries) >= sh.max {
			clear(sh.entries)
		}
	}
	sh.entries[key] = cacheEntry{d: dec, expires: now.Add(c.cfg.TTL)}
	return dec
}

// Clear drops every entry; a decision being made while Clear runs is not
// kept. Call it after the new policies are in place.
func (c *Cache) Clear() {
	c.gen.Add(1)
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		clear(sh.entries)
		sh.mu.Unlock()
	}
}

// Len returns the number of entries held, expired ones included.
func (c *Cache) Len() int {
	n := 0
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.RLock()
		n += len(sh.entries)
		sh.mu.RUnlock()
	}
	return n
}

// digest hashes what the key does not hold exactly: the caller's tenant,
// role and groups, the resource and the fields. Maps are hashed
// independently of their order.
func (c *Cache) digest(in *Input) uint64 {
	p, r := &in.Principal, &in.Resource
	h := c.str(0, p.Tenant)
	h = c.str(h, p.Role)
	h = mix(h, uint64(len(p.Groups)))
	for _, g := range p.Groups {
		h = c.str(h, g)
	}
	for _, s := range [...]string{r.Tenant, r.TenantName, r.Site, r.SiteName, r.Pool, r.PoolName, r.Node, r.NodeName} {
		h = c.str(h, s)
	}
	h = mix(h, uint64(len(r.Labels)))
	var sum uint64
	for k, v := range r.Labels {
		sum += c.str(c.str(1, k), v)
	}
	h = mix(h, sum)
	return c.value(h, in.Fields, 0)
}

// mix folds v into h.
func mix(h, v uint64) uint64 {
	h ^= v + 0x9e3779b97f4a7c15 + h<<6 + h>>2
	return h * 0xff51afd7ed558ccd
}

// str folds the seeded hash of s into h; an empty s, common among a
// resource's names, folds in a constant.
func (c *Cache) str(h uint64, s string) uint64 {
	if s == "" {
		return mix(h, 0x2545f4914f6cdd1d)
	}
	return mix(h, maphash.String(c.seed, s))
}

// value folds a field value with its type into h, maps independently of
// their order.
func (c *Cache) value(h uint64, v any, depth int) uint64 {
	if depth > 32 {
		return mix(h, '!')
	}
	switch v := v.(type) {
	case nil:
		return mix(h, 'n')
	case bool:
		if v {
			return mix(h, 'T')
		}
		return mix(h, 'F')
	case string:
		return c.str(mix(h, 's'), v)
	case int:
		return mix(mix(h, 'i'), uint64(v))
	case int64:
		return mix(mix(h, 'i'), uint64(v))
	case uint64:
		return mix(mix(h, 'u'), v)
	case float64:
		return mix(mix(h, 'f'), math.Float64bits(v))
	case []any:
		h = mix(mix(h, 'l'), uint64(len(v)))
		for _, e := range v {
			h = c.value(h, e, depth+1)
		}
		return h
	case map[string]any:
		var sum uint64
		for k, e := range v {
			sum += c.value(c.str(2, k), e, depth+1)
		}
		return mix(mix(mix(h, 'm'), uint64(len(v))), sum)
	default:
		// Any other type by its type and printed form (fmt prints maps
		// sorted by key).
		return c.str(mix(h, '?'), fmt.Sprintf("%T:%v", v, v))
	}
}
