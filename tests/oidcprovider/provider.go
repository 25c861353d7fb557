package oidcprovider

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/zitadel/oidc/v3/pkg/op"
)

// Config tunes a Provider. The zero value is usable.
type Config struct {
	// TokenLifetime is how long access and ID tokens live. Default 5 minutes.
	// Refresh tokens do not expire (they are single use). Note that x/oauth2
	// treats a token as expired 10 s early, so with a lifetime under 10 s
	// every TokenSource.Token call refreshes.
	TokenLifetime time.Duration
	// GroupsClaim names the ID token and userinfo claim that lists the
	// user's groups. Default "groups".
	GroupsClaim string
}

// Client is an OAuth client registered with the provider.
type Client struct {
	ID string
	// Secret authenticates a confidential client (client_secret_basic or
	// client_secret_post). Empty makes a public client, which must use PKCE.
	Secret string
	// RedirectURIs are the exact redirect URIs allowed in the authorization
	// code flow (http is accepted).
	RedirectURIs []string
}

// Provider is a running OpenID Connect provider. Its methods are safe for
// concurrent use.
type Provider struct {
	issuer string
	store  *store
	server *httptest.Server
}

const (
	devicePollInterval = time.Second
	deviceCodeLifetime = 5 * time.Minute
)

// Start serves a new provider on http://127.0.0.1:PORT (a free port), which
// is also its issuer, and stops it when the test ends. It fails the test if
// the provider cannot be built.
func Start(t testing.TB, cfg Config) *Provider {
	t.Helper()
	if cfg.TokenLifetime <= 0 {
		cfg.TokenLifetime = 5 * time.Minute
	}
	if cfg.GroupsClaim == "" {
		cfg.GroupsClaim = "groups"
	}
	st, err := newStore(cfg)
	if err != nil {
		t.Fatalf("oidcprovider: %v", err)
	}

	srv := httptest.NewUnstartedServer(nil) // listens on 127.0.0.1:0 already
	p := &Provider{issuer: "http://" + srv.Listener.Addr().String(), store: st, server: srv}
	handler, err := p.handler()
	if err != nil {
		srv.Close()
		t.Fatalf("oidcprovider: %v", err)
	}
	srv.Config.Handler = handler
	srv.Start()
	t.Cleanup(srv.Close)
	return p
}

// handler builds zitadel's provider and mounts the login and device pages
// beside it.
func (p *Provider) handler() (http.Handler, error) {
	config := &op.Config{
		CodeMethodS256:        true,
		AuthMethodPost:        true,
		GrantTypeRefreshToken: true,
		DeviceAuthorization: op.DeviceAuthorizationConfig{
			Lifetime:     deviceCodeLifetime,
			PollInterval: devicePollInterval,
			UserFormPath: "/device",
			UserCode:     op.UserCodeBase20,
		},
	}
	if _, err := rand.Read(config.CryptoKey[:]); err != nil {
		return nil, fmt.Errorf("access token key: %w", err)
	}
	// WithAllowInsecure: zitadel refuses an http:// issuer without it.
	provider, err := op.NewProvider(config, p.store, op.StaticIssuer(p.issuer), op.WithAllowInsecure())
	if err != nil {
		return nil, fmt.Errorf("new zitadel provider: %w", err)
	}
	ui := &pages{store: p.store, issuer: p.issuer, callback: op.AuthCallbackURL(provider)}
	mux := http.NewServeMux()
	ui.register(mux)
	mux.Handle("/", provider)
	return mux, nil
}

// Issuer is the provider's issuer URL, http://127.0.0.1:PORT (no trailing
// slash); discovery is at Issuer()+"/.well-known/openid-configuration".
func (p *Provider) Issuer() string { return p.issuer }

// AddClient registers (or replaces) a client. It may be called at any time.
func (p *Provider) AddClient(c Client) { p.store.addClient(c) }

// SetRedirectURIs replaces the redirect URIs of a registered client. It
// returns an error if no client has that ID.
func (p *Provider) SetRedirectURIs(clientID string, uris ...string) error {
	return p.store.setRedirectURIs(clientID, uris)
}

// AddUser registers (or replaces) a user who logs in with username and
// password. Its email is username@example.test, its name the username, and
// its subject Subject(username).
func (p *Provider) AddUser(username, password string, groups ...string) {
	p.store.addUser(username, password, groups)
}

// SetGroups replaces a user's groups; the next token issued for the user,
// a refreshed one included, carries them. It returns an error for an
// unknown user.
func (p *Provider) SetGroups(username string, groups ...string) error {
	return p.store.setGroups(username, groups)
}

// DisableUser stops a user: logins fail, the next refresh_token grant is
// refused with invalid_grant and userinfo answers an error. It returns an
// error for an unknown user.
func (p *Provider) DisableUser(username string) error {
	return p.store.disableUser(username)
}

// Subject is the stable "sub" the provider gives username (derived from the
// username alone, so it is the same in every provider).
func (p *Provider) Subject(username string) string { return subjectOf(username) }
