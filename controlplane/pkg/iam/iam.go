// Package iam authenticates API callers with bearer tokens and authorises
// their calls by role (DESIGN.md, "api"; issue "Commands end to end").
//
// A token is "bcat_" followed by 52 base32 characters (260 random bits); the
// store keeps only its SHA-256. Roles are ordered: viewer reads; operator also
// creates and cancels commands, cordons and drains; admin may do everything.
// A token may be limited to caller addresses (CIDRs) and may expire.
// Successful authentications are cached for up to 30 s, keyed by the token's
// hash and the caller's address, so a token used from one address is never
// served from the cache for another.
//
// Every token belongs to a tenant and holds its role within that tenant's
// subtree (docs/tenants.md). A token of a tenant that is suspended or
// deleted, or lies below one that is, is refused (ErrTenantStopped): the
// set of stopped tenants is re-read from the store at least every
// StoppedRefresh (5 s) and checked on every call, cached or not, so a
// suspension made by any process holds on every process within 10 s.
package iam

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// TokenPrefix starts every API token.
const TokenPrefix = "bcat_"

// TokenExpiryWarning is how long before its expiry a live API token is
// warned about: the iam role writes token.expiring once per token, doctor's
// iam.token-expiry warns, and bettercompute_api_tokens_expiring counts it
// (docs/metrics.md, docs/doctor.md).
const TokenExpiryWarning = 7 * 24 * time.Hour

// Errors of Authenticate.
var (
	ErrNoToken       = errors.New("no bearer token")
	ErrUnknownToken  = errors.New("unknown token")
	ErrTokenRevoked  = errors.New("token revoked")
	ErrTokenExpired  = errors.New("token expired")
	ErrAddressDenied = errors.New("token not allowed from this address")
	// ErrTenantStopped: the token's tenant, or one above it, is suspended
	// or deleted.
	ErrTenantStopped = errors.New("token's tenant is suspended or deleted")
)

// DefaultStoppedRefresh is how often an Authenticator re-reads the set of
// stopped tenants (Config.StoppedRefresh).
const DefaultStoppedRefresh = 5 * time.Second

// rank orders roles; unknown roles rank 0 and are allowed nothing.
func rank(role string) int {
	switch role {
	case store.RoleViewer:
		return 1
	case store.RoleOperator:
		return 2
	case store.RoleAdmin:
		return 3
	}
	return 0
}

// ValidRole reports whether role is admin, operator or viewer.
func ValidRole(role string) bool { return rank(role) > 0 }

// Allows reports whether a caller with role may call a method that requires
// required.
func Allows(role, required string) bool {
	return rank(role) > 0 && rank(role) >= rank(required)
}

// Principal is an authenticated caller.
type Principal struct {
	TokenID string
	Role    string
	// TenantID is the token's tenant; its role holds within the subtree
	// whose root it is.
	TenantID string
	// TenantPath is the tenant's store.Tenant.Path: a resource is the
	// caller's when its tenant's path starts with it.
	TenantPath string
	// Subject is the person a single sign-on session's token stands for
	// (store.APIToken.Subject: the provider's issuer and subject, which
	// stay the same across the session's refreshes); empty for an API
	// token of a machine or script.
	Subject string
	// Name is how the person is shown (the email or name claim); empty for
	// an API token.
	Name string
	// Groups are the person's groups at the provider as of the session's
	// last refresh (docs/sso.md); tenant policies bind them.
	Groups []string
	// SessionID is the single sign-on session the token belongs to
	// (store.OIDCSession); empty for an API token.
	SessionID string
}

// Identity names who p is across tokens: "user:" and the subject for a
// person signed in with single sign-on (the same through every refresh of
// every session), else "token:" and the API token's id. Access requests
// are made and approved by identities (docs/access.md).
func (p *Principal) Identity() string {
	if p.Subject != "" {
		return "user:" + p.Subject
	}
	return "token:" + p.TokenID
}

// Sees reports whether the resource of a tenant with path lies within the
// caller's subtree.
func (p *Principal) Sees(path string) bool {
	return path != "" && strings.HasPrefix(path, p.TenantPath)
}

// Hash is the stored form of a token.
func Hash(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// NewToken returns a fresh token string.
func NewToken() string {
	return TokenPrefix + strings.ToLower(rand.Text()+rand.Text())
}

// TokenStore is what the authenticator reads.
type TokenStore interface {
	APITokenBySecret(ctx context.Context, secretHash []byte) (*store.APIToken, error)
	TenantGet(ctx context.Context, idOrName string) (*store.Tenant, error)
	TenantsStopped(ctx context.Context) ([]string, error)
}

// Config configures an Authenticator.
type Config struct {
	// CacheTTL bounds how long a decision is reused. Defaults to 30 s; at
	// most 30 s.
	CacheTTL time.Duration
	// StoppedRefresh is how often the set of suspended or deleted tenants
	// is re-read. Defaults to DefaultStoppedRefresh (5 s); at most 5 s.
	StoppedRefresh time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Authenticator checks bearer tokens.
type Authenticator struct {
	store TokenStore
	ttl   time.Duration
	now   func() time.Time

	mu    sync.Mutex
	cache map[cacheKey]cached

	refresh time.Duration
	// stoppedMu guards stopped, read at stoppedAt; held while reading it
	// again, so one caller reads and the others wait for its answer.
	stoppedMu sync.Mutex
	stopped   map[string]bool
	stoppedAt time.Time
}

type cacheKey struct {
	hash [32]byte
	addr netip.Addr
}

type cached struct {
	p       Principal
	expires time.Time
}

// maxCache bounds the cache; past it, expired entries are dropped and, if
// still full, the cache is cleared.
const maxCache = 10000

// NewAuthenticator returns an Authenticator over st.
func NewAuthenticator(cfg Config, st TokenStore) *Authenticator {
	ttl := min(cmp.Or(cfg.CacheTTL, 30*time.Second), 30*time.Second)
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	refresh := min(cmp.Or(cfg.StoppedRefresh, DefaultStoppedRefresh), DefaultStoppedRefresh)
	return &Authenticator{store: st, ttl: ttl, now: now, cache: map[cacheKey]cached{}, refresh: refresh}
}

// tenantStopped reports whether tenant is suspended or deleted (or below
// one that is), from a set read at most Config.StoppedRefresh ago; fresh
// reads it from the store now.
func (a *Authenticator) tenantStopped(ctx context.Context, tenant string, fresh bool) (bool, error) {
	a.stoppedMu.Lock()
	defer a.stoppedMu.Unlock()
	now := a.now()
	if fresh || a.stopped == nil || now.Sub(a.stoppedAt) >= a.refresh || now.Before(a.stoppedAt) {
		ids, err := a.store.TenantsStopped(ctx)
		if err != nil {
			return false, fmt.Errorf("authenticate: read stopped tenants: %w", err)
		}
		a.stopped = make(map[string]bool, len(ids))
		for _, id := range ids {
			a.stopped[id] = true
		}
		a.stoppedAt = now
	}
	return a.stopped[tenant], nil
}

// checkTenant refuses p when its tenant is stopped.
func (a *Authenticator) checkTenant(ctx context.Context, p *Principal, fresh bool) error {
	stopped, err := a.tenantStopped(ctx, p.TenantID, fresh)
	if err != nil {
		return err
	}
	if stopped {
		return ErrTenantStopped
	}
	return nil
}

// Authenticate returns the principal of token called from addr; an
// IPv4-mapped IPv6 addr is compared as the IPv4 address it maps.
func (a *Authenticator) Authenticate(ctx context.Context, token string, addr netip.Addr) (*Principal, error) {
	if token == "" {
		return nil, ErrNoToken
	}
	addr = addr.Unmap()
	key := cacheKey{hash: sha256.Sum256([]byte(token)), addr: addr}
	now := a.now()
	a.mu.Lock()
	if c, ok := a.cache[key]; ok && now.Before(c.expires) {
		a.mu.Unlock()
		p := c.p
		if err := a.checkTenant(ctx, &p, false); err != nil {
			return nil, err
		}
		return &p, nil
	}
	a.mu.Unlock()
	if !strings.HasPrefix(token, TokenPrefix) {
		return nil, ErrUnknownToken
	}
	p, expires, err := a.lookup(ctx, key, now)
	if err != nil {
		return nil, err
	}
	if err := a.checkTenant(ctx, p, false); err != nil {
		return nil, err
	}
	a.mu.Lock()
	if len(a.cache) >= maxCache {
		for k, c := range a.cache {
			if !now.Before(c.expires) {
				delete(a.cache, k)
			}
		}
		if len(a.cache) >= maxCache {
			clear(a.cache)
		}
	}
	a.cache[key] = cached{p: *p, expires: expires}
	a.mu.Unlock()
	return p, nil
}

// Recheck authenticates token from addr again from the store, never from
// the cache, for calls that outlive one request (event streams, tunnels):
// they end when it fails with ErrTokenRevoked, ErrTokenExpired,
// ErrUnknownToken (deleted), ErrAddressDenied or ErrTenantStopped (read
// afresh, not from the stopped set of Authenticate). Such a refusal also drops
// every cached decision for the token in this process, so its next call is
// refused here at once. Other errors are the store's: the caller retries.
func (a *Authenticator) Recheck(ctx context.Context, token string, addr netip.Addr) (*Principal, error) {
	if token == "" {
		return nil, ErrNoToken
	}
	if !strings.HasPrefix(token, TokenPrefix) {
		return nil, ErrUnknownToken
	}
	return a.RecheckHash(ctx, sha256.Sum256([]byte(token)), addr)
}

// RecheckHash is Recheck for a token known by its SHA-256 (Hash) alone: the
// fleet page keeps a login's hash, never the token, and re-judges it from
// the store on every action it takes as that token.
func (a *Authenticator) RecheckHash(ctx context.Context, hash [32]byte, addr netip.Addr) (*Principal, error) {
	addr = addr.Unmap()
	key := cacheKey{hash: hash, addr: addr}
	p, _, err := a.lookup(ctx, key, a.now())
	if err == nil {
		if err = a.checkTenant(ctx, p, true); err != nil {
			p = nil
		}
	}
	if err != nil && IsRefusal(err) {
		a.mu.Lock()
		for k := range a.cache {
			if k.hash == key.hash {
				delete(a.cache, k)
			}
		}
		a.mu.Unlock()
	}
	return p, err
}

// IsRefusal reports whether err from Authenticate or Recheck refuses the
// token (none, unknown, revoked, expired or not from this address) rather
// than reports a store failure.
func IsRefusal(err error) bool {
	return errors.Is(err, ErrNoToken) || errors.Is(err, ErrUnknownToken) || errors.Is(err, ErrTokenRevoked) ||
		errors.Is(err, ErrTokenExpired) || errors.Is(err, ErrAddressDenied) || errors.Is(err, ErrTenantStopped)
}

// lookup reads the token from the store and judges it at now: its
// principal and how long the decision may be cached.
func (a *Authenticator) lookup(ctx context.Context, key cacheKey, now time.Time) (*Principal, time.Time, error) {
	addr := key.addr
	t, err := a.store.APITokenBySecret(ctx, key.hash[:])
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, time.Time{}, ErrUnknownToken
	case err != nil:
		return nil, time.Time{}, fmt.Errorf("authenticate: %w", err)
	case t.RevokedAt != nil:
		return nil, time.Time{}, ErrTokenRevoked
	case t.ExpiresAt != nil && !now.Before(*t.ExpiresAt):
		if t.SessionID != "" {
			return nil, time.Time{}, &SessionTokenExpired{SessionID: t.SessionID, TokenID: t.ID}
		}
		return nil, time.Time{}, ErrTokenExpired
	}
	if len(t.AllowCIDRs) > 0 && !slices.ContainsFunc(t.AllowCIDRs, func(c string) bool {
		p, err := netip.ParsePrefix(c)
		return err == nil && p.Contains(addr)
	}) {
		return nil, time.Time{}, ErrAddressDenied
	}
	expires := now.Add(a.ttl)
	if t.ExpiresAt != nil && t.ExpiresAt.Before(expires) {
		expires = *t.ExpiresAt
	}
	tenant, err := a.store.TenantGet(ctx, cmp.Or(t.TenantID, store.RootTenant))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, time.Time{}, ErrTenantStopped
	case err != nil:
		return nil, time.Time{}, fmt.Errorf("authenticate: %w", err)
	}
	return &Principal{TokenID: t.ID, Role: t.Role, TenantID: tenant.ID, TenantPath: tenant.Path,
		Subject: t.Subject, Name: t.DisplayName, Groups: t.Groups, SessionID: t.SessionID}, expires, nil
}

// SessionTokenExpired is ErrTokenExpired for a bearer token of a single
// sign-on session (docs/sso.md): the client refreshes it, and a call the
// token opened (a shell, an event stream) may outlive it while its session
// lives (Server.tokenEnded asks the session).
type SessionTokenExpired struct {
	SessionID, TokenID string
}

func (e *SessionTokenExpired) Error() string {
	return ErrTokenExpired.Error() + " (a signed-in session's token: refresh it, or run login)"
}

// Is makes a SessionTokenExpired an ErrTokenExpired.
func (e *SessionTokenExpired) Is(target error) bool { return target == ErrTokenExpired }

// Forget drops cached decisions (after a revocation in this process).
func (a *Authenticator) Forget() {
	a.mu.Lock()
	clear(a.cache)
	a.mu.Unlock()
}

// CreateParams describe a new API token.
type CreateParams struct {
	Role        string
	Description string
	// TTL is the token's life; 0 means no expiry.
	TTL        time.Duration
	AllowCIDRs []string
	// TenantID is the token's tenant; defaults to store.RootTenant. The
	// caller checks that it may make tokens there.
	TenantID string
}

// TokenCreator is what Create writes to.
type TokenCreator interface {
	APITokenCreate(ctx context.Context, t *store.APIToken, secretHash []byte) error
}

// Create makes a token and returns its secret (shown once) and record.
func Create(ctx context.Context, st TokenCreator, p CreateParams) (string, *store.APIToken, error) {
	if !ValidRole(p.Role) {
		return "", nil, fmt.Errorf("role %q: want admin, operator or viewer", p.Role)
	}
	if p.TTL < 0 {
		return "", nil, fmt.Errorf("ttl %v is negative", p.TTL)
	}
	cidrs := make([]string, 0, len(p.AllowCIDRs))
	for _, c := range p.AllowCIDRs {
		pfx, err := netip.ParsePrefix(c)
		if err != nil {
			a, aerr := netip.ParseAddr(c)
			if aerr != nil {
				return "", nil, fmt.Errorf("allowed CIDR %q is not an address or CIDR", c)
			}
			pfx = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		cidrs = append(cidrs, pfx.Masked().String())
	}
	secret := NewToken()
	t := &store.APIToken{ID: store.NewID("tok"), Role: p.Role, TenantID: cmp.Or(p.TenantID, store.RootTenant), Description: p.Description, AllowCIDRs: cidrs, CreatedAt: time.Now().UTC()}
	if p.TTL > 0 {
		exp := time.Now().Add(p.TTL).UTC()
		t.ExpiresAt = &exp
	}
	if err := st.APITokenCreate(ctx, t, Hash(secret)); err != nil {
		return "", nil, fmt.Errorf("create api token: %w", err)
	}
	return secret, t, nil
}
