package iam_test

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
)

// tokens is an in-memory token table that counts lookups, so the tests can
// see when a decision came from the cache.
type tokens struct {
	mu      sync.Mutex
	byHash  map[string]*store.APIToken
	lookups int
}

func newTokens() *tokens { return &tokens{byHash: map[string]*store.APIToken{}} }

func (s *tokens) APITokenCreate(_ context.Context, t *store.APIToken, hash []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := *t
	s.byHash[string(hash)] = &c
	return nil
}

func (s *tokens) APITokenBySecret(_ context.Context, hash []byte) (*store.APIToken, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookups++
	t, ok := s.byHash[string(hash)]
	if !ok {
		return nil, store.ErrNotFound
	}
	c := *t
	return &c, nil
}

// TenantGet knows the root tenant only: these tests' tokens are the root's
// (TestTenantStopped runs on the real store).
func (s *tokens) TenantGet(_ context.Context, id string) (*store.Tenant, error) {
	if id != store.RootTenant {
		return nil, store.ErrNotFound
	}
	return &store.Tenant{ID: store.RootTenant, Name: store.RootTenant, Path: store.RootTenant + "/"}, nil
}

func (s *tokens) TenantsStopped(context.Context) ([]string, error) { return nil, nil }

func (s *tokens) revoke(id string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.byHash {
		if t.ID == id {
			t.RevokedAt = &at
		}
	}
}

func (s *tokens) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lookups
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

var (
	ctx   = context.Background()
	inNet = netip.MustParseAddr("10.1.2.3")
	other = netip.MustParseAddr("192.0.2.7")
)

func TestRoles(t *testing.T) {
	for _, c := range []struct {
		role, required string
		want           bool
	}{
		{store.RoleAdmin, store.RoleAdmin, true}, {store.RoleAdmin, store.RoleViewer, true},
		{store.RoleOperator, store.RoleAdmin, false}, {store.RoleOperator, store.RoleOperator, true},
		{store.RoleViewer, store.RoleOperator, false}, {"root", store.RoleViewer, false}, {"", "", false},
	} {
		if got := iam.Allows(c.role, c.required); got != c.want {
			t.Errorf("Allows(%q, %q) = %v", c.role, c.required, got)
		}
	}
}

func TestCreateRefusesBadInput(t *testing.T) {
	st := newTokens()
	for _, p := range []iam.CreateParams{
		{Role: "root"},
		{Role: store.RoleViewer, TTL: -time.Second},
		{Role: store.RoleViewer, AllowCIDRs: []string{"10.0.0.0/33"}},
		{Role: store.RoleViewer, AllowCIDRs: []string{"example.com"}},
	} {
		if _, _, err := iam.Create(ctx, st, p); err == nil {
			t.Errorf("Create(%+v) accepted", p)
		}
	}
	// An address is its own /32 (or /128); a CIDR is stored masked.
	_, tok, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleViewer, AllowCIDRs: []string{"10.1.2.3", "10.9.9.9/8", "2001:db8::1"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.1.2.3/32", "10.0.0.0/8", "2001:db8::1/128"}; !equal(tok.AllowCIDRs, want) {
		t.Fatalf("AllowCIDRs = %v, want %v", tok.AllowCIDRs, want)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestAuthenticateCIDR(t *testing.T) {
	st := newTokens()
	secret, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleOperator, AllowCIDRs: []string{"10.0.0.0/8"}})
	if err != nil {
		t.Fatal(err)
	}
	a := iam.NewAuthenticator(iam.Config{}, st)
	if p, err := a.Authenticate(ctx, secret, inNet); err != nil || p.Role != store.RoleOperator {
		t.Fatalf("from inside the CIDR: %v %v", p, err)
	}
	if _, err := a.Authenticate(ctx, secret, other); !errors.Is(err, iam.ErrAddressDenied) {
		t.Fatalf("from outside the CIDR: %v", err)
	}
	// An IPv4-mapped IPv6 peer compares as IPv4 (docs/api.md).
	if _, err := a.Authenticate(ctx, secret, netip.MustParseAddr("::ffff:10.1.2.3")); err != nil {
		t.Fatalf("IPv4-mapped peer inside the CIDR: %v", err)
	}
	// A decision cached for one address says nothing about another.
	if _, err := a.Authenticate(ctx, secret, other); !errors.Is(err, iam.ErrAddressDenied) {
		t.Fatalf("second call from outside: %v", err)
	}
}

func TestAuthenticateRefusals(t *testing.T) {
	st := newTokens()
	c := &clock{now: time.Now()}
	a := iam.NewAuthenticator(iam.Config{Now: c.Now}, st)
	if _, err := a.Authenticate(ctx, "", inNet); !errors.Is(err, iam.ErrNoToken) {
		t.Fatalf("no token: %v", err)
	}
	if _, err := a.Authenticate(ctx, "not-a-token", inNet); !errors.Is(err, iam.ErrUnknownToken) {
		t.Fatalf("malformed token: %v", err)
	}
	if _, err := a.Authenticate(ctx, iam.NewToken(), inNet); !errors.Is(err, iam.ErrUnknownToken) {
		t.Fatalf("unknown token: %v", err)
	}
	if st.count() != 1 {
		t.Fatalf("a token without the %s prefix reached the store (%d lookups)", iam.TokenPrefix, st.count())
	}
	secret, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleViewer, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// Create stamps expiry by the wall clock; the authenticator judges by
	// its own: move it past the hour.
	c.add(time.Hour + time.Minute)
	if _, err := a.Authenticate(ctx, secret, inNet); !errors.Is(err, iam.ErrTokenExpired) {
		t.Fatalf("expired token: %v", err)
	}
}

// The cache keys on token and address, lives at most CacheTTL (30 s at
// most) and never beyond the token's expiry; Forget drops it at once.
func TestCacheAndRevocation(t *testing.T) {
	st := newTokens()
	c := &clock{now: time.Now()}
	a := iam.NewAuthenticator(iam.Config{Now: c.Now, CacheTTL: time.Hour}, st) // capped at 30 s
	secret, tok, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := a.Authenticate(ctx, secret, inNet); err != nil {
			t.Fatal(err)
		}
	}
	if st.count() != 1 {
		t.Fatalf("three calls from one address: %d lookups, want 1 (cached)", st.count())
	}
	if _, err := a.Authenticate(ctx, secret, other); err != nil || st.count() != 2 {
		t.Fatalf("another address is another cache entry: %v, %d lookups", err, st.count())
	}
	// Revoked in the store: the cached decision holds until it expires
	// (at most 30 s), then the revocation is seen.
	st.revoke(tok.ID, c.Now())
	if _, err := a.Authenticate(ctx, secret, inNet); err != nil {
		t.Fatalf("within the cache's life: %v", err)
	}
	c.add(30 * time.Second)
	if _, err := a.Authenticate(ctx, secret, inNet); !errors.Is(err, iam.ErrTokenRevoked) {
		t.Fatalf("30 s after a revocation elsewhere: %v", err)
	}
	// A revocation through this process: Forget makes it take effect at once.
	secret2, tok2, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(ctx, secret2, inNet); err != nil {
		t.Fatal(err)
	}
	st.revoke(tok2.ID, c.Now())
	a.Forget()
	if _, err := a.Authenticate(ctx, secret2, inNet); !errors.Is(err, iam.ErrTokenRevoked) {
		t.Fatalf("after Forget: %v", err)
	}
}

// A decision cached for a token that expires sooner than the cache's life
// ends with the token.
func TestCacheEndsWithToken(t *testing.T) {
	st := newTokens()
	c := &clock{now: time.Now()}
	a := iam.NewAuthenticator(iam.Config{Now: c.Now}, st)
	secret, tok, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleViewer, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.now = tok.ExpiresAt.Add(-5 * time.Second)
	c.mu.Unlock()
	if _, err := a.Authenticate(ctx, secret, inNet); err != nil {
		t.Fatalf("5 s before expiry: %v", err)
	}
	c.add(6 * time.Second)
	if _, err := a.Authenticate(ctx, secret, inNet); !errors.Is(err, iam.ErrTokenExpired) {
		t.Fatalf("1 s after expiry, with a decision cached 6 s ago: %v", err)
	}
}

// Recheck reads the store whatever the cache holds, and a refusal drops the
// token's cached decisions for every address, so a token revoked by
// another process is refused here at once once a long-lived call saw it.
func TestRecheck(t *testing.T) {
	st := newTokens()
	c := &clock{now: time.Now()}
	a := iam.NewAuthenticator(iam.Config{Now: c.Now}, st)
	secret, tok, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []netip.Addr{inNet, other} {
		if _, err := a.Authenticate(ctx, secret, addr); err != nil {
			t.Fatal(err)
		}
	}
	if p, err := a.Recheck(ctx, secret, inNet); err != nil || p.TokenID != tok.ID || st.count() != 3 {
		t.Fatalf("Recheck of a live token = %+v, %v after %d lookups; want its principal from a third lookup", p, err, st.count())
	}
	st.revoke(tok.ID, c.Now())
	if _, err := a.Recheck(ctx, secret, inNet); !errors.Is(err, iam.ErrTokenRevoked) || !iam.IsRefusal(err) {
		t.Fatalf("Recheck of a revoked token: %v, want ErrTokenRevoked", err)
	}
	if _, err := a.Authenticate(ctx, secret, other); !errors.Is(err, iam.ErrTokenRevoked) {
		t.Fatalf("Authenticate from another address after Recheck saw the revocation: %v, want ErrTokenRevoked (cache dropped)", err)
	}
	if _, err := a.Recheck(ctx, "", inNet); !errors.Is(err, iam.ErrNoToken) {
		t.Fatalf("Recheck of no token: %v", err)
	}
}
