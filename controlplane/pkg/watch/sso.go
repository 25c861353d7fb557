package watch

import (
	"context"
	"errors"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/sso"
	"github.com/better-compute/better-compute/controlplane/store"
)

// SSO is the sign-in through the OpenID provider the page offers
// (sso.Service).
type SSO interface {
	// StartPage returns the provider's URL to send the browser to and the
	// login id to keep in its cookie (also the OAuth state).
	StartPage(ctx context.Context, tenant, redirect string) (authURL, login string, err error)
	// FinishPage completes the sign-in at the callback.
	FinishPage(ctx context.Context, login, state, code, redirect string) (*sso.Grant, error)
	// Refresh renews a session's token with its refresh secret.
	Refresh(ctx context.Context, refresh string) (*sso.Grant, error)
	// Logout ends the session of a refresh secret.
	Logout(ctx context.Context, refresh string) (*store.OIDCSession, error)
}

// ssoCookie carries a sign-in's login id from the redirect to the
// provider to the callback. SameSite=Lax: the callback is a top-level
// navigation from the provider's site, on which a Strict cookie is not
// sent.
const ssoCookie = "bc_sso"

// ssoRenewBefore is how long before a signed-in session's token expires
// the page refreshes it (at the session's next request).
const ssoRenewBefore = 30 * time.Second

// ssoStart sends the browser to the provider (GET /watch/sso?tenant=T).
func (h *Handler) ssoStart(w http.ResponseWriter, r *http.Request) {
	if h.cfg.SSO == nil {
		h.render(w, r, http.StatusNotFound, "login.html", loginView{Error: "Single sign-on is not configured on this deployment (iam.oidc)."})
		return
	}
	tenant := r.URL.Query().Get("tenant")
	url, login, err := h.cfg.SSO.StartPage(r.Context(), tenant, h.callbackURL(r))
	if err != nil {
		h.ssoRefused(w, r, err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: ssoCookie, Value: login, Path: Path + "/sso", MaxAge: int(sso.LoginTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: h.cfg.Secure || r.TLS != nil})
	http.Redirect(w, r, url, http.StatusSeeOther)
}

// ssoCallback finishes the sign-in (GET /watch/sso/callback?code&state, or
// ?error from the provider) and opens a page session for the person.
func (h *Handler) ssoCallback(w http.ResponseWriter, r *http.Request) {
	if h.cfg.SSO == nil {
		h.render(w, r, http.StatusNotFound, "login.html", loginView{Error: "Single sign-on is not configured on this deployment (iam.oidc)."})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: ssoCookie, Path: Path + "/sso", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteLaxMode,
		Secure: h.cfg.Secure || r.TLS != nil})
	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		msg := "The provider did not sign you in (" + truncate(e, 64) + ")"
		if d := q.Get("error_description"); d != "" {
			msg += ": " + truncate(d, 256)
		}
		h.render(w, r, http.StatusUnauthorized, "login.html", loginView{Error: msg + "."})
		return
	}
	c, err := r.Cookie(ssoCookie)
	login := ""
	if err == nil {
		login = c.Value
	}
	g, err := h.cfg.SSO.FinishPage(r.Context(), login, q.Get("state"), q.Get("code"), h.callbackURL(r))
	if err != nil {
		h.ssoRefused(w, r, err)
		return
	}
	addr := h.cfg.CallerAddr(r.Context())
	p, err := h.cfg.Auth.Authenticate(r.Context(), g.Token, addr)
	if err != nil {
		h.render(w, r, http.StatusUnauthorized, "login.html", loginView{Error: "Signed in, but the session's token was not accepted from this address: " + err.Error()})
		return
	}
	if h.cfg.View != nil {
		if err := h.cfg.View(r.Context(), p, addr); err != nil {
			h.render(w, r, http.StatusForbidden, "login.html", loginView{Error: "You may not view the fleet from here: " + err.Error()})
			return
		}
	}
	sess := &session{tokenID: p.TokenID, tokenHash: iam.Hash(g.Token), role: p.Role, tenantID: p.TenantID, tenantPath: p.TenantPath,
		refresh: g.Refresh, tokenExpires: g.ExpiresAt, name: g.Session.DisplayName, groups: p.Groups}
	if p.TenantID != "" && p.TenantID != store.RootTenant {
		sess.within = p.TenantPath
	}
	id, err := h.sessions.create(sess)
	if err != nil {
		h.render(w, r, http.StatusServiceUnavailable, "login.html", loginView{Error: err.Error()})
		return
	}
	h.log.InfoContext(r.Context(), "Page session opened by single sign-on", "token_id", p.TokenID, "role", p.Role, "name", g.Session.DisplayName)
	http.SetCookie(w, h.cookie(r, id, 0))
	// A page, not a redirect: this response ends a navigation that began
	// on the provider's site, and a browser sends the SameSite=Strict
	// session cookie only on a navigation this site starts.
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = ssoDone.Execute(w, Path)
}

var ssoDone = template.Must(template.New("").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={{.}}">
<title>Better Compute · signed in</title></head>
<body><p>Signed in. <a href="{{.}}" id="continue">Open the fleet page</a>.</p></body></html>
`))

// callbackURL is the sign-in's callback as the browser reaches it:
// Config.PublicURL's, else the request's own scheme and host.
func (h *Handler) callbackURL(r *http.Request) string {
	if h.cfg.PublicURL != "" {
		return strings.TrimRight(h.cfg.PublicURL, "/") + Path + "/sso/callback"
	}
	scheme := "http"
	if r.TLS != nil || h.cfg.Secure {
		scheme = "https"
	}
	return scheme + "://" + r.Host + Path + "/sso/callback"
}

// ssoRefused renders a sign-in's refusal on the login form.
func (h *Handler) ssoRefused(w http.ResponseWriter, r *http.Request, err error) {
	code, msg := http.StatusServiceUnavailable, "Single sign-on failed: "+err.Error()
	var e *sso.Error
	if errors.As(err, &e) {
		switch e.Code {
		case sso.CodeDenied:
			code = http.StatusForbidden
		case sso.CodeUnauthenticated:
			code = http.StatusUnauthorized
		case sso.CodeInvalid:
			code = http.StatusBadRequest
		}
		msg = "Single sign-on: " + e.Message
	} else {
		h.log.WarnContext(r.Context(), "Page single sign-on failed", logkey.Err, err)
	}
	h.render(w, r, code, "login.html", loginView{Error: msg})
}

// renew refreshes a signed-in session's token shortly before it expires
// (the server holds its refresh secret): false when the session ended
// (the provider refused, the person's groups no longer give a role).
// A provider that cannot be reached keeps the session on its token while
// that lives.
func (h *Handler) renew(r *http.Request, s *session, id string) bool {
	now := h.now()
	if s.refresh == "" || now.Before(s.tokenExpires.Add(-ssoRenewBefore)) {
		return true
	}
	// One renewal of a session at a time: the page's requests come in
	// parallel, and a refresh secret works once.
	k := key(id)
	m := &h.renewing[k[0]%byte(len(h.renewing))]
	m.Lock()
	defer m.Unlock()
	cur := h.sessions.peek(id)
	if cur == nil {
		return false
	}
	if cur.refresh != s.refresh {
		*s = *cur // renewed by another request meanwhile
		return true
	}
	g, err := h.cfg.SSO.Refresh(r.Context(), s.refresh)
	if err != nil {
		var e *sso.Error
		if errors.As(err, &e) && e.Code != sso.CodeUnavailable {
			h.log.InfoContext(r.Context(), "Page session ended at its refresh", "token_id", s.tokenID, logkey.Err, err)
			h.sessions.end(id)
			return false
		}
		h.log.WarnContext(r.Context(), "Page session not refreshed now", "token_id", s.tokenID, logkey.Err, err)
		return now.Before(s.tokenExpires)
	}
	p, err := h.cfg.Auth.Authenticate(r.Context(), g.Token, h.cfg.CallerAddr(r.Context()))
	if err != nil {
		h.sessions.end(id)
		return false
	}
	h.sessions.update(id, func(x *session) {
		x.tokenID, x.tokenHash, x.role, x.tenantID, x.tenantPath = p.TokenID, iam.Hash(g.Token), p.Role, p.TenantID, p.TenantPath
		x.refresh, x.tokenExpires, x.groups = g.Refresh, g.ExpiresAt, p.Groups
	})
	*s = *h.sessions.peek(id)
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
