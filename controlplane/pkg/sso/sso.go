// Package sso signs people in through the organisation's OpenID Connect
// provider (issue 47; DESIGN.md, "Tenancy and policies"; docs/sso.md).
//
// The control plane is a client of the provider (iam.oidc): the CLI's
// `better-compute login` runs the OAuth device authorization grant (RFC
// 8628) through it, and the fleet page the authorization code grant with
// PKCE (RFC 7636). Either ends in a session (store.OIDCSession): the person's
// subject, the tenant and role their groups map to (iam.oidc.groups), and
// the provider's refresh token, which never leaves the control plane. The
// client gets a short-lived bearer token (iam.oidc.tokenTTL, an API token
// row of the session) and a refresh secret; each refresh refreshes at the
// provider and reads the groups again, so a group removed there loses its
// rights at the next refresh, and a person whose groups no longer map to a
// role in the session's tenant is signed out.
package sso

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// RefreshPrefix starts every refresh secret.
const RefreshPrefix = "bcrt_"

// LoginTTL bounds a sign-in in progress: a device code the person has not
// approved, or a page login whose callback has not come, within it is
// refused afterwards (the provider's own device code life may be shorter).
const LoginTTL = 10 * time.Minute

// Bounds of what the provider's ID token may carry.
const (
	MaxGroups   = 1000
	MaxGroupLen = 256
)

// Codes of Error: the API's error codes (apiv1, their one definition) the
// HTTP endpoints answer with.
const (
	CodeInvalid         = apiv1.CodeInvalidArgument
	CodeUnauthenticated = apiv1.CodeUnauthenticated
	CodeDenied          = apiv1.CodePermissionDenied
	CodeUnavailable     = apiv1.CodeUnavailable
)

// Error is a refusal with the API error code to answer it with.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// ErrPending: the person has not approved the device code yet; poll again
// after the interval.
var ErrPending = errors.New("authorization pending: approve the code in the browser")

// Store is what the service reads and writes.
type Store interface {
	store.OIDCSessionStore
	TenantGet(ctx context.Context, idOrName string) (*store.Tenant, error)
}

// Config configures a Service.
type Config struct {
	OIDC config.OIDC
	// HTTP is the client the provider is called with. Defaults to one with
	// a 15 s timeout.
	HTTP *http.Client
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Service signs people in; safe for concurrent use.
type Service struct {
	cfg   Config
	store Store
	log   *slog.Logger
	now   func() time.Time

	mu       sync.Mutex
	provider *oidc.Provider // discovered at first use; nil until it succeeds

	// refreshing serialises the refreshes of one session in this process
	// (striped by session id): the provider rotates its refresh token, so
	// two refreshes with one would see the second refused.
	refreshing [64]sync.Mutex
}

// lock holds the refresh lock of session id until the returned function.
func (s *Service) lock(id string) func() {
	h := sha256.Sum256([]byte(id))
	m := &s.refreshing[h[0]%byte(len(s.refreshing))]
	m.Lock()
	return m.Unlock
}

// New returns the service; the provider is discovered at first use (and
// again after a failure), so a provider that is down at start delays only
// sign-ins.
func New(cfg Config, st Store, log *slog.Logger) *Service {
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 15 * time.Second}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, store: st, log: log, now: cfg.Now}
}

// Issuer is the provider's issuer URL.
func (s *Service) Issuer() string { return s.cfg.OIDC.Issuer }

// ctx carries the service's HTTP client to go-oidc and x/oauth2.
func (s *Service) ctx(ctx context.Context) context.Context {
	return oidc.ClientContext(ctx, s.cfg.HTTP)
}

// oauth returns the provider and the OAuth client of this deployment;
// redirect is the page's callback URL ("" for the device flow and
// refreshes).
func (s *Service) oauth(ctx context.Context, redirect ...string) (*oidc.Provider, *oauth2.Config, error) {
	s.mu.Lock()
	p := s.provider
	s.mu.Unlock()
	if p == nil {
		var err error
		if p, err = oidc.NewProvider(s.ctx(ctx), s.cfg.OIDC.Issuer); err != nil {
			return nil, nil, &Error{Code: CodeUnavailable, Message: fmt.Sprintf("the OpenID provider %s cannot be reached: %v", s.cfg.OIDC.Issuer, err)}
		}
		s.mu.Lock()
		s.provider = p
		s.mu.Unlock()
	}
	scopes := append([]string{oidc.ScopeOpenID, "profile", "email", oidc.ScopeOfflineAccess}, s.cfg.OIDC.Scopes...)
	return p, &oauth2.Config{ClientID: s.cfg.OIDC.ClientID, ClientSecret: s.cfg.OIDC.ClientSecret,
		Endpoint: p.Endpoint(), RedirectURL: strings.Join(redirect, ""), Scopes: scopes}, nil
}

// Grant is what a sign-in or a refresh gives the client.
type Grant struct {
	// Token is the bearer token (an API token of the session), valid until
	// ExpiresAt.
	Token     string
	ExpiresAt time.Time
	// Refresh is the refresh secret; each refresh replaces it.
	Refresh string
	Session *store.OIDCSession
	// TenantName is the session's tenant's name.
	TenantName string
	// Revoked: the refresh revoked the session's earlier tokens (the
	// person's role or groups changed).
	Revoked bool
}

// DeviceStart is a device flow begun for the CLI: the person opens
// VerificationURI and enters UserCode (or opens VerificationURIComplete),
// while the CLI polls with Login every Interval.
type DeviceStart struct {
	Login                   string
	VerificationURI         string
	VerificationURIComplete string
	UserCode                string
	Interval                time.Duration
	ExpiresAt               time.Time
}

// StartDevice begins a device flow for a sign-in to tenant ("" for the one
// the person's groups map to).
func (s *Service) StartDevice(ctx context.Context, tenant string) (*DeviceStart, error) {
	if err := checkTenantArg(tenant); err != nil {
		return nil, err
	}
	p, oc, err := s.oauth(ctx)
	if err != nil {
		return nil, err
	}
	if p.Endpoint().DeviceAuthURL == "" {
		return nil, &Error{Code: CodeUnavailable, Message: "the OpenID provider offers no device authorization endpoint (device_authorization_endpoint): sign in on the fleet page instead"}
	}
	da, err := oc.DeviceAuth(s.ctx(ctx))
	if err != nil {
		return nil, providerError("start the device flow", err)
	}
	now := s.now()
	expires := now.Add(LoginTTL)
	if !da.Expiry.IsZero() && da.Expiry.Before(expires) {
		expires = da.Expiry
	}
	interval := max(int(da.Interval), 1)
	id := secret("")
	if err := s.store.OIDCLoginPut(ctx, hash(id), &store.OIDCLogin{Kind: "device", Tenant: tenant, DeviceCode: da.DeviceCode,
		Interval: interval, CreatedAt: now, ExpiresAt: expires}); err != nil {
		return nil, err
	}
	return &DeviceStart{Login: id, VerificationURI: da.VerificationURI, VerificationURIComplete: da.VerificationURIComplete,
		UserCode: da.UserCode, Interval: time.Duration(interval) * time.Second, ExpiresAt: expires}, nil
}

// PollDevice asks the provider, for up to wait, whether the person
// approved the device flow login: a Grant once they have, ErrPending while
// not yet, an *Error when it was denied, expired or is unknown.
func (s *Service) PollDevice(ctx context.Context, login string, wait time.Duration) (*Grant, error) {
	l, err := s.login(ctx, login, "device")
	if err != nil {
		return nil, err
	}
	_, oc, err := s.oauth(ctx)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(s.ctx(ctx), min(wait, l.ExpiresAt.Sub(s.now())))
	defer cancel()
	tok, err := oc.DeviceAccessToken(pctx, &oauth2.DeviceAuthResponse{DeviceCode: l.DeviceCode, Interval: int64(l.Interval), Expiry: l.ExpiresAt})
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			if !s.now().Before(l.ExpiresAt) {
				_ = s.store.OIDCLoginDelete(ctx, hash(login))
				return nil, &Error{Code: CodeUnauthenticated, Message: "the sign-in expired before it was approved: run login again"}
			}
			return nil, ErrPending
		}
		var re *oauth2.RetrieveError
		if errors.As(err, &re) && (re.ErrorCode == "access_denied" || re.ErrorCode == "expired_token") {
			_ = s.store.OIDCLoginDelete(ctx, hash(login))
			if re.ErrorCode == "access_denied" {
				return nil, &Error{Code: CodeDenied, Message: "the sign-in was denied in the browser"}
			}
			return nil, &Error{Code: CodeUnauthenticated, Message: "the sign-in expired before it was approved: run login again"}
		}
		return nil, providerError("poll the device flow", err)
	}
	if err := s.store.OIDCLoginDelete(ctx, hash(login)); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, &Error{Code: CodeUnauthenticated, Message: "this sign-in was finished already"}
		}
		return nil, err
	}
	return s.start(ctx, tok, "", l.Tenant, "cli")
}

// StartPage begins the fleet page's sign-in: the URL to send the browser
// to, and the login id to keep in the browser's cookie (it is also the
// OAuth state). redirect is the page's callback URL as the browser reaches
// it; the provider must list it for the client.
func (s *Service) StartPage(ctx context.Context, tenant, redirect string) (authURL, login string, err error) {
	if err := checkTenantArg(tenant); err != nil {
		return "", "", err
	}
	_, oc, err := s.oauth(ctx, redirect)
	if err != nil {
		return "", "", err
	}
	now := s.now()
	login, verifier, nonce := secret(""), oauth2.GenerateVerifier(), secret("")
	if err := s.store.OIDCLoginPut(ctx, hash(login), &store.OIDCLogin{Kind: "page", Tenant: tenant, Verifier: verifier, Nonce: nonce,
		CreatedAt: now, ExpiresAt: now.Add(LoginTTL)}); err != nil {
		return "", "", err
	}
	return oc.AuthCodeURL(login, oauth2.S256ChallengeOption(verifier), oidc.Nonce(nonce)), login, nil
}

// FinishPage completes the page's sign-in at its callback: login is the
// browser cookie's, state and code the callback's query, redirect the
// callback URL StartPage was given.
func (s *Service) FinishPage(ctx context.Context, login, state, code, redirect string) (*Grant, error) {
	if login == "" || state != login {
		return nil, &Error{Code: CodeDenied, Message: "this sign-in was not started from this browser (its state does not match): start it again from the fleet page"}
	}
	l, err := s.login(ctx, login, "page")
	if err != nil {
		return nil, err
	}
	if err := s.store.OIDCLoginDelete(ctx, hash(login)); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, &Error{Code: CodeUnauthenticated, Message: "this sign-in was finished already"}
		}
		return nil, err
	}
	_, oc, err := s.oauth(ctx, redirect)
	if err != nil {
		return nil, err
	}
	tok, err := oc.Exchange(s.ctx(ctx), code, oauth2.VerifierOption(l.Verifier))
	if err != nil {
		return nil, providerError("exchange the authorization code", err)
	}
	return s.start(ctx, tok, l.Nonce, l.Tenant, "page")
}

// login reads a sign-in in progress of kind.
func (s *Service) login(ctx context.Context, id, kind string) (*store.OIDCLogin, error) {
	if id == "" || len(id) > 128 {
		return nil, &Error{Code: CodeInvalid, Message: "login: want the id the sign-in's start returned"}
	}
	l, err := s.store.OIDCLoginGet(ctx, hash(id))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, &Error{Code: CodeUnauthenticated, Message: "no such sign-in in progress (it finished, expired or was never started): start it again"}
	case err != nil:
		return nil, err
	case l.Kind != kind:
		return nil, &Error{Code: CodeInvalid, Message: "login: not a " + kind + " sign-in"}
	case !s.now().Before(l.ExpiresAt):
		_ = s.store.OIDCLoginDelete(ctx, hash(id))
		return nil, &Error{Code: CodeUnauthenticated, Message: "the sign-in expired: start it again"}
	}
	return l, nil
}

// person is what an ID token says of who signed in.
type person struct {
	subject, name string
	groups        []string
}

// identify verifies tok's ID token (signature, issuer, audience, expiry,
// and nonce when one was sent) and reads the person from it.
func (s *Service) identify(ctx context.Context, tok *oauth2.Token, nonce string) (*person, error) {
	p, _, err := s.oauth(ctx)
	if err != nil {
		return nil, err
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return nil, &Error{Code: CodeUnavailable, Message: "the OpenID provider answered without an ID token"}
	}
	idt, err := p.Verifier(&oidc.Config{ClientID: s.cfg.OIDC.ClientID, Now: s.now}).Verify(s.ctx(ctx), raw)
	if err != nil {
		return nil, &Error{Code: CodeUnauthenticated, Message: "the provider's ID token does not verify: " + err.Error()}
	}
	if nonce != "" && idt.Nonce != nonce {
		return nil, &Error{Code: CodeUnauthenticated, Message: "the provider's ID token carries another sign-in's nonce"}
	}
	var claims map[string]any
	if err := idt.Claims(&claims); err != nil {
		return nil, &Error{Code: CodeUnauthenticated, Message: "the provider's ID token claims cannot be read: " + err.Error()}
	}
	groups, err := groupsOf(claims[s.cfg.OIDC.GroupsClaim])
	if err != nil {
		return nil, &Error{Code: CodeDenied, Message: fmt.Sprintf("the ID token's %s claim: %v", s.cfg.OIDC.GroupsClaim, err)}
	}
	name, _ := claims["email"].(string)
	if name == "" {
		name, _ = claims["name"].(string)
	}
	return &person{subject: idt.Issuer + "#" + idt.Subject, name: truncate(cmp.Or(name, idt.Subject), 256), groups: groups}, nil
}

// groupsOf reads a groups claim: a list of strings (or one string), at
// most MaxGroups of at most MaxGroupLen bytes; absent is none.
func groupsOf(v any) ([]string, error) {
	var out []string
	switch g := v.(type) {
	case nil:
	case string:
		out = []string{g}
	case []any:
		if len(g) > MaxGroups {
			return nil, fmt.Errorf("%d groups: at most %d", len(g), MaxGroups)
		}
		for _, x := range g {
			str, ok := x.(string)
			if !ok {
				return nil, fmt.Errorf("want a list of strings, got a %T in it", x)
			}
			out = append(out, str)
		}
	default:
		return nil, fmt.Errorf("want a list of strings, got %T", v)
	}
	for _, g := range out {
		if len(g) > MaxGroupLen {
			return nil, fmt.Errorf("a group of %d bytes: at most %d", len(g), MaxGroupLen)
		}
		if strings.ContainsFunc(g, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return nil, fmt.Errorf("group %q holds a control character", truncate(g, 64))
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// assign maps groups to the tenant and role the person holds: in tenant
// (an id or name; "" for the one tenant the groups map to), the highest
// role of the iam.oidc.groups entries whose group they are in.
func (s *Service) assign(ctx context.Context, groups []string, tenant string) (*store.Tenant, string, error) {
	var want *store.Tenant
	if tenant != "" {
		t, err := s.store.TenantGet(ctx, tenant)
		if errors.Is(err, store.ErrNotFound) || (err == nil && t.DeletedAt != nil) {
			return nil, "", &Error{Code: CodeDenied, Message: fmt.Sprintf("tenant %q: no such tenant", tenant)}
		}
		if err != nil {
			return nil, "", err
		}
		if t.SuspendedAt != nil {
			return nil, "", &Error{Code: CodeDenied, Message: fmt.Sprintf("tenant %s is suspended", t.Name)}
		}
		want = t
	}
	roles := map[string]string{} // tenant id: highest role
	tenants := map[string]*store.Tenant{}
	for _, m := range s.cfg.OIDC.Groups {
		if !slices.Contains(groups, m.Group) {
			continue
		}
		t, err := s.store.TenantGet(ctx, m.Tenant)
		if errors.Is(err, store.ErrNotFound) || (err == nil && t.DeletedAt != nil) {
			s.log.WarnContext(ctx, "iam.oidc.groups names a tenant that does not exist", "group", m.Group, "tenant", m.Tenant)
			continue
		}
		if err != nil {
			return nil, "", err
		}
		if want != nil && t.ID != want.ID {
			continue
		}
		tenants[t.ID] = t
		if cur := roles[t.ID]; cur == "" || iam.Allows(m.Role, cur) {
			roles[t.ID] = m.Role
		}
	}
	switch len(roles) {
	case 0:
		where := ""
		if want != nil {
			where = " in tenant " + want.Name
		}
		return nil, "", &Error{Code: CodeDenied, Message: fmt.Sprintf("none of your groups at the provider (%s) gives a role%s (iam.oidc.groups)",
			cmp.Or(strings.Join(groups, ", "), "none"), where)}
	case 1:
		for id, role := range roles {
			if tenants[id].SuspendedAt != nil {
				return nil, "", &Error{Code: CodeDenied, Message: fmt.Sprintf("tenant %s is suspended", tenants[id].Name)}
			}
			return tenants[id], role, nil
		}
	}
	var names []string
	for _, t := range tenants {
		names = append(names, t.Name)
	}
	slices.Sort(names)
	return nil, "", &Error{Code: CodeInvalid, Message: fmt.Sprintf("your groups give roles in tenants %s: name one with --tenant", strings.Join(names, ", "))}
}

// start opens a session for the person tok identifies.
func (s *Service) start(ctx context.Context, tok *oauth2.Token, nonce, tenant, client string) (*Grant, error) {
	who, err := s.identify(ctx, tok, nonce)
	if err != nil {
		return nil, err
	}
	t, role, err := s.assign(ctx, who.groups, tenant)
	if err != nil {
		return nil, err
	}
	now := s.now().UTC()
	sess := &store.OIDCSession{ID: store.NewID("ses"), Subject: who.subject, DisplayName: who.name, TenantID: t.ID, Role: role,
		Groups: who.groups, Client: client, ProviderRefresh: tok.RefreshToken, CreatedAt: now, RefreshedAt: now,
		ExpiresAt: now.Add(s.cfg.OIDC.SessionTTL.Duration)}
	g, apiTok, secretHash := s.grant(sess, t)
	if err := s.store.OIDCSessionStart(ctx, sess, hash(g.Refresh), apiTok, secretHash); err != nil {
		return nil, fmt.Errorf("start the session: %w", err)
	}
	s.log.InfoContext(ctx, "Signed in", "session_id", sess.ID, "subject", sess.Subject, "name", sess.DisplayName,
		"tenant", t.ID, "role", role, "client", client)
	return g, nil
}

// grant makes the next bearer token and refresh secret of sess.
func (s *Service) grant(sess *store.OIDCSession, t *store.Tenant) (*Grant, *store.APIToken, []byte) {
	expires := s.now().UTC().Add(s.cfg.OIDC.TokenTTL.Duration)
	if sess.ExpiresAt.Before(expires) {
		expires = sess.ExpiresAt
	}
	token := iam.NewToken()
	apiTok := &store.APIToken{ID: store.NewID("tok"), Role: sess.Role, TenantID: sess.TenantID,
		Description: truncate("signed in: "+sess.DisplayName, 256), ExpiresAt: &expires}
	return &Grant{Token: token, ExpiresAt: expires, Refresh: secret(RefreshPrefix), Session: sess, TenantName: t.Name}, apiTok, iam.Hash(token)
}

// Refresh gives the holder of a refresh secret its session's next token:
// it refreshes at the provider and maps the groups again. A session that
// ended, expired, whose provider refuses the refresh, or whose groups no
// longer give a role in its tenant is refused UNAUTHENTICATED (and ended);
// a provider that cannot be reached is UNAVAILABLE and ends nothing. When
// the person's role or groups changed, the session's earlier tokens are
// revoked, so what they opened closes.
func (s *Service) Refresh(ctx context.Context, refresh string) (*Grant, error) {
	if !strings.HasPrefix(refresh, RefreshPrefix) || len(refresh) > 128 {
		return nil, &Error{Code: CodeUnauthenticated, Message: "not a refresh secret of this deployment: run login"}
	}
	sess, err := s.store.OIDCSessionByRefresh(ctx, hash(refresh))
	if err == nil {
		defer s.lock(sess.ID)()
		// Read again under the lock: a refresh with the same secret may
		// have replaced it meanwhile.
		sess, err = s.store.OIDCSessionByRefresh(ctx, hash(refresh))
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, &Error{Code: CodeUnauthenticated, Message: "this sign-in ended or its refresh secret was used already: run login again"}
	}
	if err != nil {
		return nil, err
	}
	if sess.EndedAt != nil {
		return nil, &Error{Code: CodeUnauthenticated, Message: "signed out: " + sess.EndReason}
	}
	next, t, err := s.refreshAtProvider(ctx, sess)
	if err != nil {
		return nil, err
	}
	changed := next.Role != sess.Role || !slices.Equal(next.Groups, sess.Groups)
	g, apiTok, secretHash := s.grant(next, t)
	if err := s.store.OIDCSessionRefresh(ctx, next, hash(refresh), hash(g.Refresh), apiTok, secretHash, changed); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, &Error{Code: CodeUnauthenticated, Message: "this refresh secret was used already: run login again"}
		}
		return nil, fmt.Errorf("refresh the session: %w", err)
	}
	g.Revoked = changed
	if changed {
		s.log.InfoContext(ctx, "Session refreshed with other rights: its earlier tokens are revoked", "session_id", sess.ID,
			"role", next.Role, "was", sess.Role, "groups", strings.Join(next.Groups, ","))
	}
	return g, nil
}

// Revalidate refreshes at the provider, by itself, a session whose client
// holds calls open (a shell) but has not refreshed for iam.oidc.tokenTTL,
// so that a group removed at the provider reaches what is open as it
// reaches the next command (Server.sessionEnded calls it). It returns why
// the session may no longer be used ("" while it may): the session ended
// or expired, the provider refused, or no role is left; a changed role
// revokes the session's tokens (the open calls close; the client's next
// refresh gets the new role). A provider that cannot be reached is an
// error and changes nothing.
func (s *Service) Revalidate(ctx context.Context, sessionID string) (string, error) {
	defer s.lock(sessionID)()
	sess, err := s.store.OIDCSessionGet(ctx, sessionID)
	if errors.Is(err, store.ErrNotFound) {
		return "the sign-in ended", nil
	}
	if err != nil {
		return "", err
	}
	if sess.EndedAt != nil {
		return "signed out (" + sess.EndReason + ")", nil
	}
	if s.now().Sub(sess.RefreshedAt) < s.cfg.OIDC.TokenTTL.Duration {
		return "", nil
	}
	next, _, err := s.refreshAtProvider(ctx, sess)
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Code == CodeUnauthenticated {
			return e.Message, nil
		}
		return "", err
	}
	changed := next.Role != sess.Role || !slices.Equal(next.Groups, sess.Groups)
	if err := s.store.OIDCSessionRevalidated(ctx, next, sess.ProviderRefresh, changed); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return "", nil // refreshed by another meanwhile: judged at the next check
		}
		return "", err
	}
	if changed {
		s.log.InfoContext(ctx, "Session revalidated with other rights: its tokens are revoked", "session_id", sess.ID,
			"role", next.Role, "was", sess.Role, "groups", strings.Join(next.Groups, ","))
		return "your role or groups at the provider changed (now " + next.Role + "): refresh or sign in again", nil
	}
	return "", nil
}

// refreshAtProvider refreshes sess at the provider and maps the groups
// again: the session as it is to be next (the new provider refresh
// token, groups, role, name, RefreshedAt) and its tenant. A refusal that
// ends the session ends it here and is UNAUTHENTICATED; a refusal because
// another refresh of the session came first ends nothing.
func (s *Service) refreshAtProvider(ctx context.Context, sess *store.OIDCSession) (*store.OIDCSession, *store.Tenant, error) {
	now := s.now().UTC()
	if !sess.Live(now) {
		s.end(ctx, sess, "its session time (iam.oidc.sessionTTL) ended")
		return nil, nil, &Error{Code: CodeUnauthenticated, Message: "this sign-in ended at " + sess.ExpiresAt.Format(time.RFC3339) + ": run login again"}
	}
	if sess.ProviderRefresh == "" {
		return nil, nil, &Error{Code: CodeUnauthenticated, Message: "the provider gave this sign-in no refresh token (offline_access): run login again"}
	}
	_, oc, err := s.oauth(ctx)
	if err != nil {
		return nil, nil, err
	}
	tok, err := oc.TokenSource(s.ctx(ctx), &oauth2.Token{RefreshToken: sess.ProviderRefresh, Expiry: time.Unix(1, 0)}).Token()
	if err != nil {
		var re *oauth2.RetrieveError
		if errors.As(err, &re) && re.Response != nil && re.Response.StatusCode >= 400 && re.Response.StatusCode < 500 {
			if cur, cerr := s.store.OIDCSessionGet(ctx, sess.ID); cerr == nil && cur.EndedAt == nil && cur.ProviderRefresh != sess.ProviderRefresh {
				// Another process refreshed first (the provider rotates its
				// refresh token): nothing ended.
				return nil, nil, &Error{Code: CodeUnauthenticated, Message: "this sign-in was refreshed meanwhile: use its newest token, or run login again"}
			}
			reason := "the provider refused the refresh (" + cmp.Or(re.ErrorCode, re.Response.Status) + ")"
			s.end(ctx, sess, reason)
			return nil, nil, &Error{Code: CodeUnauthenticated, Message: "signed out: " + reason + ": run login again"}
		}
		return nil, nil, providerError("refresh at the provider", err)
	}
	who, err := s.identify(ctx, tok, "")
	if err != nil {
		return nil, nil, err
	}
	if who.subject != sess.Subject {
		s.end(ctx, sess, "the provider's refresh named another person")
		return nil, nil, &Error{Code: CodeUnauthenticated, Message: "signed out: the provider's refresh named another person"}
	}
	t, role, err := s.assign(ctx, who.groups, sess.TenantID)
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Code == CodeDenied {
			s.end(ctx, sess, e.Message)
			return nil, nil, &Error{Code: CodeUnauthenticated, Message: "signed out: " + e.Message}
		}
		return nil, nil, err
	}
	next := *sess
	next.Role, next.Groups, next.DisplayName, next.RefreshedAt = role, who.groups, who.name, now
	if tok.RefreshToken != "" {
		next.ProviderRefresh = tok.RefreshToken
	}
	return &next, t, nil
}

// Logout ends the session of a refresh secret and returns it (nil when
// the secret names no live session: signed out already).
func (s *Service) Logout(ctx context.Context, refresh string) (*store.OIDCSession, error) {
	if !strings.HasPrefix(refresh, RefreshPrefix) || len(refresh) > 128 {
		return nil, &Error{Code: CodeInvalid, Message: "refreshToken: not a refresh secret of this deployment"}
	}
	sess, err := s.store.OIDCSessionByRefresh(ctx, hash(refresh))
	if errors.Is(err, store.ErrNotFound) || (err == nil && sess.EndedAt != nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return sess, s.store.OIDCSessionEnd(ctx, sess.ID, "signed out")
}

// end ends sess for reason, logging a failure (the next use tries again).
func (s *Service) end(ctx context.Context, sess *store.OIDCSession, reason string) {
	if err := s.store.OIDCSessionEnd(ctx, sess.ID, reason); err != nil {
		s.log.WarnContext(ctx, "Cannot end a session", "session_id", sess.ID, logkey.Err, err)
		return
	}
	s.log.InfoContext(ctx, "Session ended", "session_id", sess.ID, "subject", sess.Subject, "reason", reason)
}

// providerError is an error of a call to the provider: its OAuth error
// when it answered with one (INVALID_ARGUMENT for the client's mistakes,
// such as a code used twice), else UNAVAILABLE.
func providerError(op string, err error) error {
	var re *oauth2.RetrieveError
	if errors.As(err, &re) && re.ErrorCode != "" {
		msg := re.ErrorCode
		if re.ErrorDescription != "" {
			msg += ": " + re.ErrorDescription
		}
		return &Error{Code: CodeUnauthenticated, Message: fmt.Sprintf("%s: the provider refused (%s)", op, msg)}
	}
	return &Error{Code: CodeUnavailable, Message: fmt.Sprintf("%s: the OpenID provider: %v", op, err)}
}

// checkTenantArg bounds a requested tenant name.
func checkTenantArg(tenant string) error {
	if len(tenant) > 128 {
		return &Error{Code: CodeInvalid, Message: "tenant: at most 128 bytes"}
	}
	return nil
}

// secret returns prefix and 256 random bits, base64url.
func secret(prefix string) string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (Go 1.24+)
	return prefix + base64.RawURLEncoding.EncodeToString(b[:])
}

func hash(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
