package oidcprovider

import (
	"errors"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
)

var scopes = []string{oidc.ScopeOpenID, "profile", "email", oidc.ScopeOfflineAccess}

// relyingParty is a client of the provider as the control plane or the CLI
// would build it: go-oidc discovery and verification, x/oauth2 flows.
type relyingParty struct {
	provider *oidc.Provider
	conf     *oauth2.Config
	verifier *oidc.IDTokenVerifier
}

func newRelyingParty(t *testing.T, p *Provider, c Client) *relyingParty {
	t.Helper()
	p.AddClient(c)
	provider, err := oidc.NewProvider(t.Context(), p.Issuer())
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	redirect := ""
	if len(c.RedirectURIs) > 0 {
		redirect = c.RedirectURIs[0]
	}
	return &relyingParty{
		provider: provider,
		conf: &oauth2.Config{
			ClientID: c.ID, ClientSecret: c.Secret, Endpoint: provider.Endpoint(),
			RedirectURL: redirect, Scopes: scopes,
		},
		verifier: provider.Verifier(&oidc.Config{ClientID: c.ID}),
	}
}

type idClaims struct {
	Subject string   `json:"sub"`
	Email   string   `json:"email"`
	Name    string   `json:"name"`
	Groups  []string `json:"groups"`
	Nonce   string   `json:"nonce"`
}

// verify checks the token response's ID token with go-oidc and returns its
// claims.
func (rp *relyingParty) verify(t *testing.T, tok *oauth2.Token) idClaims {
	t.Helper()
	raw, ok := tok.Extra("id_token").(string)
	if !ok || raw == "" {
		t.Fatal("token response has no id_token")
	}
	idt, err := rp.verifier.Verify(t.Context(), raw)
	if err != nil {
		t.Fatalf("verify ID token: %v", err)
	}
	var c idClaims
	if err := idt.Claims(&c); err != nil {
		t.Fatalf("ID token claims: %v", err)
	}
	return c
}

// deviceLogin runs the device flow, approving it concurrently with polling.
func (rp *relyingParty) deviceLogin(t *testing.T, p *Provider, username, password string) *oauth2.Token {
	t.Helper()
	ctx := t.Context()
	da, err := rp.conf.DeviceAuth(ctx)
	if err != nil {
		t.Fatalf("device authorization: %v", err)
	}
	approved := make(chan error, 1)
	go func() { approved <- p.ApproveDevice(ctx, da.UserCode, username, password) }()
	tok, err := rp.conf.DeviceAccessToken(ctx, da)
	if err := <-approved; err != nil {
		t.Fatalf("approve device: %v", err)
	}
	if err != nil {
		t.Fatalf("device access token: %v", err)
	}
	return tok
}

// refresh forces tok to be seen as expired and refreshes it through an
// oauth2 TokenSource, as a client would.
func (rp *relyingParty) refresh(t *testing.T, tok *oauth2.Token) (*oauth2.Token, error) {
	t.Helper()
	expired := *tok
	expired.Expiry = time.Now().Add(-time.Minute)
	return rp.conf.TokenSource(t.Context(), &expired).Token()
}

func wantClaims(t *testing.T, p *Provider, got idClaims, username string, groups ...string) {
	t.Helper()
	if got.Subject != p.Subject(username) || got.Email != username+"@example.test" || got.Name != username {
		t.Errorf("claims = %+v, want sub %s, email %s@example.test, name %s", got, p.Subject(username), username, username)
	}
	if !slices.Equal(got.Groups, groups) {
		t.Errorf("groups = %q, want %q", got.Groups, groups)
	}
}

func TestDeviceFlow(t *testing.T) {
	p := Start(t, Config{})
	p.AddUser("alice", "alice-pw", "admins", "devs")
	for _, c := range []Client{{ID: "controlplane", Secret: "cp-secret"}, {ID: "cli"}} {
		t.Run(c.ID, func(t *testing.T) {
			t.Parallel()
			rp := newRelyingParty(t, p, c)
			tok := rp.deviceLogin(t, p, "alice", "alice-pw")
			wantClaims(t, p, rp.verify(t, tok), "alice", "admins", "devs")
			if tok.RefreshToken == "" {
				t.Error("no refresh token though offline_access was asked")
			}

			info, err := rp.provider.UserInfo(t.Context(), oauth2.StaticTokenSource(tok))
			if err != nil {
				t.Fatalf("userinfo: %v", err)
			}
			var got idClaims
			if err := info.Claims(&got); err != nil {
				t.Fatal(err)
			}
			wantClaims(t, p, got, "alice", "admins", "devs")
		})
	}
}

func TestDeviceDenied(t *testing.T) {
	p := Start(t, Config{})
	p.AddUser("alice", "alice-pw")
	rp := newRelyingParty(t, p, Client{ID: "cli"})
	ctx := t.Context()
	da, err := rp.conf.DeviceAuth(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ApproveDevice(ctx, da.UserCode, "alice", "wrong"); err == nil {
		t.Fatal("ApproveDevice with a wrong password succeeded")
	} else {
		t.Logf("wrong password: %v", err)
	}
	if err := p.DenyDevice(ctx, da.UserCode, "alice", "alice-pw"); err != nil {
		t.Fatalf("deny: %v", err)
	}
	_, err = rp.conf.DeviceAccessToken(ctx, da)
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) || re.ErrorCode != "access_denied" {
		t.Fatalf("DeviceAccessToken after deny: %v, want access_denied", err)
	}
}

func TestRefreshCarriesNewGroupsAndStopsForDisabledUser(t *testing.T) {
	p := Start(t, Config{TokenLifetime: 2 * time.Second})
	p.AddUser("bob", "bob-pw", "devs")
	rp := newRelyingParty(t, p, Client{ID: "controlplane", Secret: "cp-secret"})
	tok := rp.deviceLogin(t, p, "bob", "bob-pw")
	if life := time.Until(tok.Expiry); life > 3*time.Second {
		t.Errorf("access token lives %v, want about 2s", life)
	}

	if err := p.SetGroups("bob", "ops"); err != nil {
		t.Fatal(err)
	}
	refreshed, err := rp.refresh(t, tok)
	if err != nil {
		t.Fatalf("refresh: %v", err)
	}
	wantClaims(t, p, rp.verify(t, refreshed), "bob", "ops")
	if refreshed.RefreshToken == tok.RefreshToken {
		t.Error("refresh token was not rotated")
	}
	if _, err := rp.refresh(t, tok); err == nil {
		t.Error("a used refresh token was accepted again")
	}

	if err := p.DisableUser("bob"); err != nil {
		t.Fatal(err)
	}
	_, err = rp.refresh(t, refreshed)
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) || re.ErrorCode != "invalid_grant" {
		t.Fatalf("refresh for a disabled user: %v, want invalid_grant", err)
	}
}

func TestCodeFlowWithPKCE(t *testing.T) {
	p := Start(t, Config{})
	for _, c := range []Client{{ID: "controlplane", Secret: "cp-secret"}, {ID: "cli"}} {
		t.Run(c.ID, func(t *testing.T) {
			t.Parallel()
			user := "carol-" + c.ID // SetGroups below must not race the other subtest
			p.AddUser(user, "carol-pw", "devs")
			// The callback URL is known late: register the client first,
			// then its redirect URI.
			c.RedirectURIs = []string{"http://127.0.0.1:1/" + c.ID + "/callback"}
			rp := newRelyingParty(t, p, Client{ID: c.ID, Secret: c.Secret})
			if err := p.SetRedirectURIs(c.ID, c.RedirectURIs...); err != nil {
				t.Fatal(err)
			}
			rp.conf.RedirectURL = c.RedirectURIs[0]

			verifier := oauth2.GenerateVerifier()
			authURL := rp.conf.AuthCodeURL("state-1", oauth2.S256ChallengeOption(verifier), oidc.Nonce("nonce-1"))
			code := browserLogin(t, authURL, rp.conf.RedirectURL, user, "carol-pw")

			tok, err := rp.conf.Exchange(t.Context(), code, oauth2.VerifierOption(verifier))
			if err != nil {
				t.Fatalf("exchange: %v", err)
			}
			claims := rp.verify(t, tok)
			wantClaims(t, p, claims, user, "devs")
			if claims.Nonce != "nonce-1" {
				t.Errorf("nonce = %q, want nonce-1", claims.Nonce)
			}

			if err := p.SetGroups(user, "devs", "ops"); err != nil {
				t.Fatal(err)
			}
			refreshed, err := rp.refresh(t, tok)
			if err != nil {
				t.Fatalf("refresh: %v", err)
			}
			wantClaims(t, p, rp.verify(t, refreshed), user, "devs", "ops")
		})
	}
}

func TestCodeFlowRefusals(t *testing.T) {
	p := Start(t, Config{})
	p.AddUser("carol", "carol-pw")
	redirect := "http://127.0.0.1:1/callback"
	rp := newRelyingParty(t, p, Client{ID: "cli", RedirectURIs: []string{redirect}})

	t.Run("wrong password", func(t *testing.T) {
		b := newTestBrowser(t, redirect)
		pg, err := get(t.Context(), b, rp.conf.AuthCodeURL("s", oauth2.S256ChallengeOption(oauth2.GenerateVerifier())))
		if err != nil {
			t.Fatalf("authorize: %v", err)
		}
		pg, err = pg.fillAndSubmit(t.Context(), b, map[string]string{"username": "carol", "password": "wrong"}, "")
		if err == nil || pg == nil || pg.status != http.StatusUnauthorized {
			t.Fatalf("wrong password: page %+v, err %v; want 401", pg, err)
		}
		if msg := pg.message(); msg != errCredentials.Error() {
			t.Errorf("#error = %q, want %q", msg, errCredentials)
		}
		// The form came back: the right password now logs in.
		pg, err = pg.fillAndSubmit(t.Context(), b, map[string]string{"username": "carol", "password": "carol-pw"}, "")
		if err != nil || pg.status != http.StatusFound {
			t.Fatalf("second try with the right password: %v", err)
		}
	})

	t.Run("public client without PKCE", func(t *testing.T) {
		code := browserLogin(t, rp.conf.AuthCodeURL("s"), redirect, "carol", "carol-pw")
		if _, err := rp.conf.Exchange(t.Context(), code); err == nil {
			t.Fatal("a public client exchanged a code without PKCE")
		}
	})
}

// newTestBrowser is a cookie-keeping http.Client that stops at the relying
// party's redirect URI instead of following it.
func newTestBrowser(t *testing.T, redirectURI string) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		if req.URL.Scheme+"://"+req.URL.Host+req.URL.Path == redirectURI {
			return http.ErrUseLastResponse
		}
		return nil
	}}
}

// browserLogin follows authURL to the login form, logs in and returns the
// authorization code the provider redirects to redirectURI with.
func browserLogin(t *testing.T, authURL, redirectURI, username, password string) string {
	t.Helper()
	ctx := t.Context()
	b := newTestBrowser(t, redirectURI)
	pg, err := get(ctx, b, authURL)
	if err != nil {
		t.Fatalf("authorize: %v", err)
	}
	pg, err = pg.fillAndSubmit(ctx, b, map[string]string{"username": username, "password": password}, "")
	if err != nil {
		t.Fatalf("log in: %v", err)
	}
	if pg.status != http.StatusFound {
		t.Fatalf("log in ended at %s with %d, want a redirect to %s", pg.url, pg.status, redirectURI)
	}
	loc, err := pg.url.Parse(pg.header.Get("Location"))
	if err != nil {
		t.Fatal(err)
	}
	q := loc.Query()
	if q.Get("error") != "" || q.Get("code") == "" {
		t.Fatalf("redirected to %s, want a code", loc)
	}
	if want := mustQuery(t, authURL).Get("state"); q.Get("state") != want {
		t.Fatalf("state = %q, want %q", q.Get("state"), want)
	}
	return q.Get("code")
}

func mustQuery(t *testing.T, rawURL string) url.Values {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query()
}
