package oidcprovider

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// This file implements op.Storage (and op.CanSetUserinfoFromRequest) for
// zitadel.

var (
	_ op.Storage                   = (*store)(nil)
	_ op.CanSetUserinfoFromRequest = (*store)(nil)
)

func (s *store) Health(context.Context) error { return nil }

func (s *store) GetClientByClientID(_ context.Context, clientID string) (op.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[clientID]
	if !ok {
		return nil, fmt.Errorf("unknown client %q", clientID)
	}
	return c, nil
}

func (s *store) AuthorizeClientIDSecret(_ context.Context, clientID, secret string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[clientID]
	if !ok {
		return fmt.Errorf("unknown client %q", clientID)
	}
	if c.secret == "" {
		return fmt.Errorf("client %q is public: it has no secret", clientID)
	}
	if subtle.ConstantTimeCompare([]byte(c.secret), []byte(secret)) != 1 {
		return fmt.Errorf("wrong secret for client %q", clientID)
	}
	return nil
}

// CreateAuthRequest stores an authorization request until the login page
// completes it. There are no browser sessions, so prompt=none always fails.
func (s *store) CreateAuthRequest(_ context.Context, r *oidc.AuthRequest, _ string) (op.AuthRequest, error) {
	if slices.Contains(r.Prompt, oidc.PromptNone) {
		return nil, oidc.ErrLoginRequired()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a := newAuthRequest(rand.Text(), r)
	s.authRequests[a.id] = a
	c := *a
	return &c, nil
}

func (s *store) AuthRequestByID(_ context.Context, id string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.authRequests[id]
	if !ok {
		return nil, fmt.Errorf("unknown authorization request %q", id)
	}
	c := *a
	return &c, nil
}

func (s *store) AuthRequestByCode(_ context.Context, code string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.authRequests[s.codes[code]]
	if !ok {
		return nil, errors.New("unknown or used authorization code")
	}
	if _, err := s.activeUser(a.subject); err != nil {
		return nil, err
	}
	c := *a
	return &c, nil
}

func (s *store) SaveAuthCode(_ context.Context, id, code string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.codes[code] = id
	return nil
}

// DeleteAuthRequest is called once the code is exchanged: the code is spent.
func (s *store) DeleteAuthRequest(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.authRequests, id)
	for code, reqID := range s.codes {
		if reqID == id {
			delete(s.codes, code)
		}
	}
	return nil
}

func (s *store) CreateAccessToken(_ context.Context, r op.TokenRequest) (string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.newAccessToken(r)
	return t.id, t.expiry, nil
}

// CreateAccessAndRefreshTokens issues an access token and a refresh token.
// On a refresh_token grant (current != "") the used refresh token is
// replaced: each refresh token is good for one refresh.
func (s *store) CreateAccessAndRefreshTokens(_ context.Context, r op.TokenRequest, current string) (string, string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if current != "" {
		if _, ok := s.refreshTokens[current]; !ok {
			return "", "", time.Time{}, oidc.ErrInvalidGrant().WithDescription("refresh token already used")
		}
		delete(s.refreshTokens, current)
	}
	t := s.newAccessToken(r)
	rt := &refreshToken{token: rand.Text(), clientID: t.clientID, subject: t.subject, scopes: t.scopes, audience: t.audience}
	if ir, ok := r.(op.IDTokenRequest); ok {
		rt.amr, rt.authTime = ir.GetAMR(), ir.GetAuthTime()
	}
	s.refreshTokens[rt.token] = rt
	return t.id, rt.token, t.expiry, nil
}

// newAccessToken records an access token. The caller holds mu.
func (s *store) newAccessToken(r op.TokenRequest) accessToken {
	t := accessToken{
		id:       rand.Text(),
		subject:  r.GetSubject(),
		scopes:   slices.Clone(r.GetScopes()),
		audience: slices.Clone(r.GetAudience()),
		expiry:   time.Now().Add(s.cfg.TokenLifetime),
	}
	if cr, ok := r.(interface{ GetClientID() string }); ok {
		t.clientID = cr.GetClientID()
	}
	s.accessTokens[t.id] = t
	return t
}

// TokenRequestByRefreshToken refuses the refresh tokens of disabled users
// (zitadel answers invalid_grant).
func (s *store) TokenRequestByRefreshToken(_ context.Context, token string) (op.RefreshTokenRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rt, ok := s.refreshTokens[token]
	if !ok {
		return nil, errors.New("unknown or used refresh token")
	}
	if _, err := s.activeUser(rt.subject); err != nil {
		return nil, err
	}
	c := *rt
	return &c, nil
}

func (s *store) GetRefreshTokenInfo(_ context.Context, _ string, token string) (string, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rt, ok := s.refreshTokens[token]
	if !ok {
		return "", "", op.ErrInvalidRefreshToken
	}
	return rt.subject, rt.token, nil
}

func (s *store) TerminateSession(_ context.Context, subject, clientID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, t := range s.accessTokens {
		if t.subject == subject && t.clientID == clientID {
			delete(s.accessTokens, id)
		}
	}
	for token, rt := range s.refreshTokens {
		if rt.subject == subject && rt.clientID == clientID {
			delete(s.refreshTokens, token)
		}
	}
	return nil
}

func (s *store) RevokeToken(_ context.Context, tokenOrID, _ string, clientID string) *oidc.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.accessTokens[tokenOrID]; ok {
		if t.clientID != clientID {
			return oidc.ErrInvalidClient().WithDescription("token was not issued to this client")
		}
		delete(s.accessTokens, tokenOrID)
	}
	if rt, ok := s.refreshTokens[tokenOrID]; ok {
		if rt.clientID != clientID {
			return oidc.ErrInvalidClient().WithDescription("token was not issued to this client")
		}
		delete(s.refreshTokens, tokenOrID)
	}
	return nil
}

func (s *store) SigningKey(context.Context) (op.SigningKey, error) { return s.key, nil }

func (s *store) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

func (s *store) KeySet(context.Context) ([]op.Key, error) {
	return []op.Key{publicKey{s.key}}, nil
}

// SetUserinfoFromScopes is deprecated in zitadel; SetUserinfoFromRequest
// does the work.
func (s *store) SetUserinfoFromScopes(context.Context, *oidc.UserInfo, string, string, []string) error {
	return nil
}

// SetUserinfoFromRequest fills the claims of an ID token.
func (s *store) SetUserinfoFromRequest(_ context.Context, info *oidc.UserInfo, r op.IDTokenRequest, scopes []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.setUserinfo(info, r.GetSubject(), scopes)
}

// SetUserinfoFromToken answers the userinfo endpoint.
func (s *store) SetUserinfoFromToken(_ context.Context, info *oidc.UserInfo, tokenID, _, _ string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.liveAccessToken(tokenID)
	if err != nil {
		return err
	}
	return s.setUserinfo(info, t.subject, t.scopes)
}

func (s *store) SetIntrospectionFromToken(_ context.Context, resp *oidc.IntrospectionResponse, tokenID, _, _ string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.liveAccessToken(tokenID)
	if err != nil {
		return err
	}
	info := new(oidc.UserInfo)
	if err := s.setUserinfo(info, t.subject, t.scopes); err != nil {
		return err
	}
	resp.SetUserInfo(info)
	resp.Scope, resp.ClientID, resp.Expiration = t.scopes, t.clientID, oidc.FromTime(t.expiry)
	return nil
}

// liveAccessToken returns an unexpired access token. The caller holds mu.
func (s *store) liveAccessToken(id string) (accessToken, error) {
	t, ok := s.accessTokens[id]
	if !ok {
		return t, errors.New("unknown access token")
	}
	if time.Now().After(t.expiry) {
		return t, errors.New("access token expired")
	}
	return t, nil
}

// setUserinfo sets the user's current claims: sub always, and with the
// scope openid name, preferred_username, email, email_verified and the
// groups claim. The caller holds mu.
func (s *store) setUserinfo(info *oidc.UserInfo, subject string, scopes []string) error {
	u, err := s.activeUser(subject)
	if err != nil {
		return err
	}
	info.Subject = u.subject // zitadel copies it over the ID token's sub: never leave it empty
	if !slices.Contains(scopes, oidc.ScopeOpenID) {
		return nil
	}
	info.Name, info.PreferredUsername = u.username, u.username
	info.Email, info.EmailVerified = u.username+"@example.test", true
	info.AppendClaims(s.cfg.GroupsClaim, append([]string{}, u.groups...))
	return nil
}

func (s *store) GetPrivateClaimsFromScopes(context.Context, string, string, []string) (map[string]any, error) {
	return nil, nil // access tokens are opaque
}

func (s *store) GetKeyByIDAndClientID(context.Context, string, string) (*jose.JSONWebKey, error) {
	return nil, errors.New("private_key_jwt is not supported")
}

func (s *store) ValidateJWTProfileScopes(context.Context, string, []string) ([]string, error) {
	return nil, errors.New("the JWT profile grant is not supported")
}
