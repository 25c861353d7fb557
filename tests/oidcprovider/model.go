package oidcprovider

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"time"

	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

type user struct {
	subject, username, password string
	groups                      []string
	disabled                    bool
}

func subjectOf(username string) string {
	sum := sha256.Sum256([]byte(username))
	return "user-" + hex.EncodeToString(sum[:8])
}

// client implements op.Client. The store hands out copies, so a client seen
// by zitadel never changes under it.
type client struct {
	id, secret    string
	redirectURIs  []string
	tokenLifetime time.Duration
}

var _ op.Client = client{}

func (c client) GetID() string                    { return c.id }
func (c client) RedirectURIs() []string           { return slices.Clone(c.redirectURIs) }
func (c client) PostLogoutRedirectURIs() []string { return nil }
func (c client) LoginURL(authRequestID string) string {
	return "/login?authRequestID=" + authRequestID
}
func (c client) AccessTokenType() op.AccessTokenType { return op.AccessTokenTypeBearer }
func (c client) IDTokenLifetime() time.Duration      { return c.tokenLifetime }
func (c client) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c client) IsScopeAllowed(scope string) bool     { return false } // only the standard scopes
func (c client) ClockSkew() time.Duration             { return 0 }
func (c client) IDTokenUserinfoClaimsAssertion() bool { return true } // email, name in the ID token
func (c client) DevMode() bool                        { return true } // http redirect URIs

func (c client) GrantTypes() []oidc.GrantType {
	return []oidc.GrantType{oidc.GrantTypeCode, oidc.GrantTypeRefreshToken, oidc.GrantTypeDeviceCode}
}

// ApplicationType: a public client is native (PKCE, no secret), a
// confidential one web.
func (c client) ApplicationType() op.ApplicationType {
	if c.secret == "" {
		return op.ApplicationTypeNative
	}
	return op.ApplicationTypeWeb
}

func (c client) AuthMethod() oidc.AuthMethod {
	if c.secret == "" {
		return oidc.AuthMethodNone
	}
	return oidc.AuthMethodBasic // client_secret_post is accepted too
}

func (c client) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(scopes []string) []string { return scopes }
}

func (c client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(scopes []string) []string { return scopes }
}

// authRequest implements op.AuthRequest; the store hands out copies.
type authRequest struct {
	id, clientID, redirectURI, state, nonce string
	scopes                                  []string
	responseType                            oidc.ResponseType
	responseMode                            oidc.ResponseMode
	challenge                               *oidc.CodeChallenge
	subject                                 string
	authTime                                time.Time
	done                                    bool
}

var _ op.AuthRequest = (*authRequest)(nil)

func newAuthRequest(id string, r *oidc.AuthRequest) *authRequest {
	a := &authRequest{
		id: id, clientID: r.ClientID, redirectURI: r.RedirectURI, state: r.State, nonce: r.Nonce,
		scopes: r.Scopes, responseType: r.ResponseType, responseMode: r.ResponseMode,
	}
	if r.CodeChallenge != "" {
		a.challenge = &oidc.CodeChallenge{Challenge: r.CodeChallenge, Method: r.CodeChallengeMethod}
	}
	return a
}

func (a *authRequest) GetID() string                         { return a.id }
func (a *authRequest) GetACR() string                        { return "" }
func (a *authRequest) GetAMR() []string                      { return []string{"pwd"} }
func (a *authRequest) GetAudience() []string                 { return []string{a.clientID} }
func (a *authRequest) GetAuthTime() time.Time                { return a.authTime }
func (a *authRequest) GetClientID() string                   { return a.clientID }
func (a *authRequest) GetCodeChallenge() *oidc.CodeChallenge { return a.challenge }
func (a *authRequest) GetNonce() string                      { return a.nonce }
func (a *authRequest) GetRedirectURI() string                { return a.redirectURI }
func (a *authRequest) GetResponseType() oidc.ResponseType    { return a.responseType }
func (a *authRequest) GetResponseMode() oidc.ResponseMode    { return a.responseMode }
func (a *authRequest) GetScopes() []string                   { return a.scopes }
func (a *authRequest) GetState() string                      { return a.state }
func (a *authRequest) GetSubject() string                    { return a.subject }
func (a *authRequest) Done() bool                            { return a.done }

// accessToken is what an opaque access token stands for.
type accessToken struct {
	id, clientID, subject string
	scopes, audience      []string
	expiry                time.Time
}

// refreshToken is a grant kept for a refresh token; it implements
// op.RefreshTokenRequest (the store hands out copies).
type refreshToken struct {
	token, clientID, subject string
	scopes, audience, amr    []string
	authTime                 time.Time
}

var _ op.RefreshTokenRequest = (*refreshToken)(nil)

func (r *refreshToken) GetAMR() []string                 { return r.amr }
func (r *refreshToken) GetAudience() []string            { return r.audience }
func (r *refreshToken) GetAuthTime() time.Time           { return r.authTime }
func (r *refreshToken) GetClientID() string              { return r.clientID }
func (r *refreshToken) GetScopes() []string              { return r.scopes }
func (r *refreshToken) GetSubject() string               { return r.subject }
func (r *refreshToken) SetCurrentScopes(scopes []string) { r.scopes = scopes }
