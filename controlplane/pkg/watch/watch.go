package watch

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/feed"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Path is the page's route; every route of the page lies under it.
const Path = "/watch"

// CookieName is the page session's cookie, scoped to Path.
const CookieName = "bc_watch"

// ContentSecurityPolicy is sent with every response of the page, with a
// nonce of its own (nonce, base64url of 128 random bits): scripts, images
// and connections from the page's own origin only; styles from it too, or
// a <style> element carrying the nonce (the terminal library makes its
// own, and the shell page's script gives each the nonce); no framing, no
// <base>, forms posting to the origin only.
func ContentSecurityPolicy(nonce string) string {
	return "default-src 'self'; script-src 'self'; style-src 'self' 'nonce-" + nonce +
		"'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
}

// Store is what the page reads: a viewer's reads of the storage seam.
type Store interface {
	APITokenBySecret(ctx context.Context, secretHash []byte) (*store.APIToken, error)
	// TenantsStopped ends the session of a tenant's token once its tenant
	// (or one above it) is suspended or deleted.
	TenantsStopped(ctx context.Context) ([]string, error)
	NodeCounts(ctx context.Context) ([]*store.NodeCount, error)
	NodeList(ctx context.Context, p *store.NodeListParams) ([]*store.Node, error)
	SiteList(ctx context.Context, p *store.ListParams) ([]*store.Site, error)
	// PoolList with ListParams.Within lists a tenant's subtree's pools:
	// what a tenant's session sees (scope.go).
	PoolList(ctx context.Context, p *store.ListParams) ([]*store.Pool, error)
	CommandCountOpen(ctx context.Context) (map[string]int, error)
	OutboxMaxID(ctx context.Context) (int64, error)
	OutboxList(ctx context.Context, afterID int64, limit int) ([]*store.OutboxEntry, error)
	RolloutList(ctx context.Context, p *store.RolloutListParams) ([]*store.Rollout, error)
	RolloutNodes(ctx context.Context, rolloutID string) ([]*store.RolloutNode, error)
	// The GPU map, the queue, capacity and the node and GPU pages.
	NodeGet(ctx context.Context, id string) (*store.Node, error)
	NodeSummaries(ctx context.Context, p *store.ListParams) ([]*store.Node, error)
	NodeInventories(ctx context.Context, ids []string) (map[string][]byte, error)
	SessionGet(ctx context.Context, nodeID string) (*store.Session, error)
	CommandList(ctx context.Context, p *store.CommandListParams) ([]*store.Command, error)
	OutboxQuery(ctx context.Context, p *store.OutboxQueryParams) ([]*store.OutboxEntry, error)
	RemediationList(ctx context.Context, p *store.RemediationListParams) ([]*store.Remediation, error)
	RemediationOpenFor(ctx context.Context, nodeID string) (*store.Remediation, error)
	RemediationRecent(ctx context.Context, nodeID string, since time.Time, limit int) ([]*store.Remediation, error)
	RemediationBreakers(ctx context.Context) ([]*store.RemediationBreaker, error)
	ReservationSlots(ctx context.Context, p *store.ReservationSlotsParams) ([]*store.ReservationSlot, error)
	ReservationsOpen(ctx context.Context, poolIDs []string) ([]*store.Reservation, error)
	// The previews of actions (preview.go).
	PoolGet(ctx context.Context, idOrName string) (*store.Pool, error)
	PoolBudget(ctx context.Context, poolID string) (*store.PoolBudget, error)
	RemediationGet(ctx context.Context, id string) (*store.Remediation, error)
	RolloutGet(ctx context.Context, id string) (*store.Rollout, error)
	NodeReservedNow(ctx context.Context, nodeID string, now *time.Time) (*store.Reservation, error)
}

// Authenticator checks the API token a login offers (iam.Authenticator).
type Authenticator interface {
	Authenticate(ctx context.Context, token string, addr netip.Addr) (*iam.Principal, error)
}

// Config configures the page.
type Config struct {
	// Auth checks login tokens. Required.
	Auth Authenticator
	// CallerAddr returns a request's verified caller address (api.CallerAddr),
	// which token CIDRs are checked against. Required.
	CallerAddr func(context.Context) netip.Addr
	// Secure marks the cookie Secure even on a request that did not come
	// over TLS itself (TLS ends at a proxy in front); requests over TLS
	// always get it.
	Secure bool
	// IdleTimeout ends a session not used for this long. Defaults to 30 min.
	IdleTimeout time.Duration
	// MaxLifetime ends a session this long after login, used or not.
	// Defaults to 12 h.
	MaxLifetime time.Duration
	// MaxSessions bounds the live sessions of the process. Defaults to
	// 10,000.
	MaxSessions int
	// TokenRecheck is how often a session's API token is re-read, so that
	// revoking or expiring it ends the session. Defaults to 30 s.
	TokenRecheck time.Duration
	// PageSize is the number of nodes the node list shows per page.
	// Defaults to 100; at most store.MaxListLimit - 1.
	PageSize int
	// Events is the number of latest events shown. Defaults to 20.
	Events int
	// GPUCacheTTL is the longest the fleet's snapshot (a scan of every
	// node, the GPU map's and the counts' source) is reused while neither
	// the newest event id nor the node counts move; when either moves the
	// next request reads it again. Defaults to 5 s.
	GPUCacheTTL time.Duration
	// CollapseAt is the most nodes a group of the GPU map shows cell by
	// cell; a larger group shows its counts until it is opened. Defaults
	// to 64.
	CollapseAt int
	// MaxOpenNodes bounds the nodes an opened group shows. Defaults to
	// 1000.
	MaxOpenNodes int
	// Feed is the process's event feed (api.Server.Feed): the stream
	// follows it for new events. Required.
	Feed *feed.Feed
	// PollInterval is how often the event stream, without a new event,
	// looks for changed node or command counts (the changes that write no
	// event). Defaults to 500 ms.
	PollInterval time.Duration
	// KeepAlive is the interval of the stream's keep-alive comments.
	// Defaults to 15 s.
	KeepAlive time.Duration
	// Actions carries out the page's actions as the session's token
	// (api.Server gives one). Nil: the page only shows.
	Actions Actions
	// View, when set, decides whether the token may see the fleet from
	// addr (the API's policies: nodes.list and events.list), at the login
	// and on every request of the session after it; an error refuses the
	// login, or ends the session, with its message. Nil: every viewer may.
	View func(ctx context.Context, p *iam.Principal, addr netip.Addr) error
	// SSO, when set, offers people single sign-on through the OpenID
	// provider (sso.Service; docs/sso.md): GET /watch/sso and its
	// callback. Nil: the page takes API tokens only.
	SSO SSO
	// PublicURL is the API's origin as browsers reach it (host.publicURL),
	// for the sign-in's callback URL. Empty: the request's own.
	PublicURL string
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

//go:embed assets
var assets embed.FS

var templates = template.Must(template.New("").Funcs(template.FuncMap{
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"list": func(g *gpuRow) []*gpuRow { return []*gpuRow{g} },
	"tsp": func(t *time.Time) string {
		if t == nil {
			return "never"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
}).ParseFS(assets, "assets/*.html"))

// Handler serves the page.
type Handler struct {
	cfg      Config
	store    Store
	log      *slog.Logger
	now      func() time.Time
	sessions *sessions
	fc       fleetCache
	hub      *hub
	static   http.Handler
	// renewing makes each signed-in session's token renewals one at a
	// time (striped by session).
	renewing [64]sync.Mutex
}

// New returns the page's handler over st; Register mounts it.
func New(cfg Config, st Store, log *slog.Logger) (*Handler, error) {
	if cfg.Auth == nil || cfg.CallerAddr == nil || cfg.Feed == nil {
		return nil, errors.New("watch: Auth, CallerAddr and Feed are required")
	}
	cfg.IdleTimeout = cmp.Or(cfg.IdleTimeout, 30*time.Minute)
	cfg.MaxLifetime = cmp.Or(cfg.MaxLifetime, 12*time.Hour)
	cfg.MaxSessions = cmp.Or(cfg.MaxSessions, 10000)
	cfg.TokenRecheck = cmp.Or(cfg.TokenRecheck, 30*time.Second)
	cfg.PageSize = cmp.Or(cfg.PageSize, 100)
	cfg.Events = cmp.Or(cfg.Events, 20)
	cfg.GPUCacheTTL = cmp.Or(cfg.GPUCacheTTL, 5*time.Second)
	cfg.CollapseAt = cmp.Or(cfg.CollapseAt, 64)
	cfg.MaxOpenNodes = cmp.Or(cfg.MaxOpenNodes, 1000)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, 500*time.Millisecond)
	cfg.KeepAlive = cmp.Or(cfg.KeepAlive, 15*time.Second)
	if cfg.PageSize < 1 || cfg.PageSize >= store.MaxListLimit {
		return nil, fmt.Errorf("watch: page size %d: want 1 to %d", cfg.PageSize, store.MaxListLimit-1)
	}
	if cfg.IdleTimeout < 0 || cfg.MaxLifetime < 0 || cfg.MaxSessions < 1 || cfg.Events < 1 {
		return nil, errors.New("watch: negative lifetime or non-positive limit")
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	h := &Handler{cfg: cfg, store: st, log: log, now: now,
		sessions: newSessions(cfg.IdleTimeout, cfg.MaxLifetime, cfg.MaxSessions, now),
		static:   http.StripPrefix(Path+"/static/", http.FileServerFS(static))}
	h.hub = newHub(st, cfg.Feed, cfg.PollInterval, log)
	return h, nil
}

// Register mounts the page's routes on mux: GET /watch (the page, or the
// login form), POST /watch/login, POST /watch/logout, GET /watch/fragment
// (the live part of the page), GET /watch/events (the page's event
// stream) and GET /watch/static/ (its script and style).
func (h *Handler) Register(mux *http.ServeMux) {
	mux.Handle("GET "+Path, h.secured(h.page))
	mux.Handle("POST "+Path+"/login", h.secured(h.login))
	mux.Handle("POST "+Path+"/logout", h.secured(h.logout))
	mux.Handle("GET "+Path+"/fragment", h.secured(h.fragment))
	mux.Handle("GET "+Path+"/events", h.secured(h.events))
	mux.Handle("GET "+Path+"/static/{file...}", h.secured(h.serveStatic))
	mux.Handle("GET "+Path+"/nodes/{id}", h.secured(h.nodePage))
	mux.Handle("GET "+Path+"/gpus/{uuid}", h.secured(h.gpuPage))
	mux.Handle("GET "+Path+"/nodes/{id}/shell", h.secured(h.shellPage))
	mux.Handle("GET "+Path+"/actions/{name}/preview", h.secured(h.previewAction))
	mux.Handle("POST "+Path+"/actions/{name}", h.secured(h.act))
	mux.Handle("GET "+Path+"/tunnels/{ticket}", h.secured(h.tunnel))
	mux.Handle("GET "+Path+"/sso", h.secured(h.ssoStart))
	mux.Handle("GET "+Path+"/sso/callback", h.secured(h.ssoCallback))
}

// secured adds the page's security headers to every response.
func (h *Handler) secured(fn http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		nonce := newNonce()
		hd.Set("Content-Security-Policy", ContentSecurityPolicy(nonce))
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		// same-origin, not no-referrer: under no-referrer a browser sends
		// "Origin: null" with the page's own form posts.
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("Cache-Control", "no-store")
		fn(w, r.WithContext(context.WithValue(r.Context(), nonceKey{}, nonce)))
	})
}

// nonceKey keys a response's CSP nonce in its request's context.
type nonceKey struct{}

// newNonce returns 128 random bits, base64url without padding.
func newNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// nonceOf is the CSP nonce of the response to r ("" outside secured).
func nonceOf(r *http.Request) string {
	n, _ := r.Context().Value(nonceKey{}).(string)
	return n
}

// staticFiles are the files under /watch/static/: the page's own script
// and style, and the terminal library with its licence (assets/xterm,
// @xterm/xterm as published, unchanged).
var staticFiles = []string{"watch.js", "watch.css", "actions.js", "shell.js",
	"xterm/xterm.js", "xterm/xterm.css", "xterm/LICENSE"}

func (h *Handler) serveStatic(w http.ResponseWriter, r *http.Request) {
	switch {
	case slices.Contains(staticFiles, r.PathValue("file")):
		h.static.ServeHTTP(w, r)
	default:
		http.NotFound(w, r)
	}
}

// current returns the request's live page session and its id, re-reading
// its API token every TokenRecheck (a tenant's token: at least every
// iam.DefaultStoppedRefresh): a token revoked or expired since the login,
// or whose tenant was suspended or deleted, ends the session. nil when
// there is none.
func (h *Handler) current(r *http.Request) (*session, string) {
	c, err := r.Cookie(CookieName)
	if err != nil {
		return nil, ""
	}
	s := h.sessions.get(c.Value)
	if s == nil {
		return nil, ""
	}
	now := h.now()
	if h.cfg.SSO != nil && !h.renew(r, s, c.Value) {
		return nil, ""
	}
	if h.cfg.View != nil {
		p := &iam.Principal{TokenID: s.tokenID, Role: s.role, TenantID: s.tenantID, TenantPath: s.tenantPath, Groups: s.groups}
		if err := h.cfg.View(r.Context(), p, h.cfg.CallerAddr(r.Context())); err != nil {
			h.log.InfoContext(r.Context(), "Page session ended: the token may not view the fleet from here", "token_id", s.tokenID, logkey.Err, err)
			h.sessions.end(c.Value)
			return nil, ""
		}
	}
	recheck := h.cfg.TokenRecheck
	if s.within != "" {
		recheck = min(recheck, iam.DefaultStoppedRefresh)
	}
	if now.Sub(s.checked) < recheck {
		return s, c.Value
	}
	t, err := h.store.APITokenBySecret(r.Context(), s.tokenHash)
	if err == nil {
		var stopped bool
		if stopped, err = h.tenantStopped(r.Context(), s, t); err == nil && stopped {
			h.sessions.end(c.Value)
			return nil, ""
		}
	}
	switch {
	case errors.Is(err, store.ErrNotFound), err == nil && t.RevokedAt != nil, err == nil && t.ExpiresAt != nil && !now.Before(*t.ExpiresAt):
		h.sessions.end(c.Value)
		return nil, ""
	case err != nil:
		// The database is away: keep the session; the page's reads will
		// fail on their own.
		h.log.WarnContext(r.Context(), "Page session token check failed", logkey.Err, err)
		return s, c.Value
	}
	h.sessions.markChecked(c.Value, now)
	return s, c.Value
}

// tenantStopped reports whether the tenant of s's token t (not the root),
// or one above it, is suspended or deleted: its session ends.
func (h *Handler) tenantStopped(ctx context.Context, s *session, t *store.APIToken) (bool, error) {
	if s.within == "" {
		return false, nil
	}
	stopped, err := h.store.TenantsStopped(ctx)
	if err != nil {
		return false, fmt.Errorf("read stopped tenants: %w", err)
	}
	return slices.Contains(stopped, t.TenantID), nil
}

// cookie returns the page session cookie carrying value; maxAge -1 deletes
// it.
func (h *Handler) cookie(r *http.Request, value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: CookieName, Value: value, Path: Path, MaxAge: maxAge, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: h.cfg.Secure || r.TLS != nil}
}

// sameOrigin reports whether a form post came from the page's own origin:
// its Origin header names the host it was sent to, or, without one (or
// with "null", which a privacy setting may send), the browser says
// Sec-Fetch-Site: same-origin (a header no page can set). A post with
// neither is refused.
func sameOrigin(r *http.Request) bool {
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		_, host, ok := strings.Cut(o, "://")
		return ok && strings.EqualFold(host, r.Host)
	}
	return r.Header.Get("Sec-Fetch-Site") == "same-origin"
}

// maxFormBytes bounds a login or logout form.
const maxFormBytes = 4 << 10

type loginView struct {
	Error string
	// SSO shows the single sign-on link (Config.SSO is set).
	SSO bool
}

func (h *Handler) render(w http.ResponseWriter, r *http.Request, code int, name string, data any) {
	if v, ok := data.(loginView); ok {
		v.SSO = h.cfg.SSO != nil
		data = v
	}
	var b bytes.Buffer
	if err := templates.ExecuteTemplate(&b, name, data); err != nil {
		h.log.ErrorContext(r.Context(), "Render the fleet page", "template", name, logkey.Err, err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(b.Bytes())
}

// login exchanges an API token (any role) for a page session.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		h.render(w, r, http.StatusForbidden, "login.html", loginView{Error: "This login did not come from this page; open " + Path + " and log in there."})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		h.render(w, r, http.StatusBadRequest, "login.html", loginView{Error: "The login form could not be read."})
		return
	}
	token := strings.TrimSpace(r.PostForm.Get("token"))
	if token == "" {
		h.render(w, r, http.StatusUnauthorized, "login.html", loginView{Error: "Enter an API token."})
		return
	}
	p, err := h.cfg.Auth.Authenticate(r.Context(), token, h.cfg.CallerAddr(r.Context()))
	if err != nil || !iam.Allows(p.Role, store.RoleViewer) {
		msg := "That token was not accepted: it is unknown, revoked, expired or not allowed from this address."
		code := http.StatusUnauthorized
		if err != nil && !isTokenRefusal(err) {
			h.log.WarnContext(r.Context(), "Page login failed", logkey.Err, err)
			msg, code = "The token could not be checked now; try again.", http.StatusServiceUnavailable
		}
		h.render(w, r, code, "login.html", loginView{Error: msg})
		return
	}
	if h.cfg.View != nil {
		if err := h.cfg.View(r.Context(), p, h.cfg.CallerAddr(r.Context())); err != nil {
			h.render(w, r, http.StatusForbidden, "login.html", loginView{Error: "This token may not view the fleet from here: " + err.Error()})
			return
		}
	}
	sess := &session{tokenID: p.TokenID, tokenHash: iam.Hash(token), role: p.Role, tenantID: p.TenantID, tenantPath: p.TenantPath}
	if p.TenantID != "" && p.TenantID != store.RootTenant {
		// A tenant's token sees its subtree's part of the fleet (scope.go).
		sess.within = p.TenantPath
	}
	id, err := h.sessions.create(sess)
	if err != nil {
		h.render(w, r, http.StatusServiceUnavailable, "login.html", loginView{Error: err.Error()})
		return
	}
	h.log.InfoContext(r.Context(), "Page session opened", "token_id", p.TokenID, "role", p.Role)
	http.SetCookie(w, h.cookie(r, id, 0))
	http.Redirect(w, r, Path, http.StatusSeeOther)
}

func isTokenRefusal(err error) bool {
	return slices.ContainsFunc([]error{iam.ErrNoToken, iam.ErrUnknownToken, iam.ErrTokenRevoked, iam.ErrTokenExpired, iam.ErrAddressDenied},
		func(e error) bool { return errors.Is(err, e) })
}

// logout ends the page session; it needs the session's form token.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	s, id := h.current(r)
	if s == nil {
		http.SetCookie(w, h.cookie(r, "", -1))
		http.Redirect(w, r, Path, http.StatusSeeOther)
		return
	}
	if !sameOrigin(r) || r.ParseForm() != nil || subtle.ConstantTimeCompare([]byte(r.PostForm.Get("csrf")), []byte(s.csrf)) != 1 {
		http.Error(w, "logout refused: not from this page", http.StatusForbidden)
		return
	}
	h.sessions.end(id)
	if s.refresh != "" && h.cfg.SSO != nil {
		// Signing out of the page ends the sign-in: nothing else holds it.
		if _, err := h.cfg.SSO.Logout(r.Context(), s.refresh); err != nil {
			h.log.WarnContext(r.Context(), "Page sign-out: the session could not be ended", logkey.Err, err)
		}
	}
	h.log.InfoContext(r.Context(), "Page session ended", "token_id", s.tokenID)
	http.SetCookie(w, h.cookie(r, "", -1))
	http.Redirect(w, r, Path, http.StatusSeeOther)
}

// cursorRE is what a node id cursor may look like.
var cursorRE = regexp.MustCompile(`^[a-z0-9_]{0,64}$`)

// query reads the node list's filter and cursor; ok is false for values
// the page never makes.
func query(r *http.Request) (filter, cursor string, ok bool) {
	if len(r.URL.RawQuery) > maxQueryBytes {
		return "", "", false
	}
	filter, cursor = r.URL.Query().Get("state"), r.URL.Query().Get("after")
	if filter != "" && !slices.Contains(nodeStates, filter) {
		return "", "", false
	}
	return filter, cursor, cursorRE.MatchString(cursor)
}

// page serves the whole page, or the login form without a session.
func (h *Handler) page(w http.ResponseWriter, r *http.Request) {
	s, _ := h.current(r)
	if s == nil {
		h.render(w, r, http.StatusOK, "login.html", loginView{})
		return
	}
	h.serveView(w, r, s, "page.html")
}

// fragment serves the live part of the page, which the script swaps in;
// 401 without a session.
func (h *Handler) fragment(w http.ResponseWriter, r *http.Request) {
	s, _ := h.current(r)
	if s == nil {
		http.Error(w, "no page session", http.StatusUnauthorized)
		return
	}
	h.serveView(w, r, s, "fleet")
}

func (h *Handler) serveView(w http.ResponseWriter, r *http.Request, s *session, name string) {
	filter, cursor, ok := query(r)
	if !ok {
		http.Error(w, "bad state or after: state is one of "+strings.Join(nodeStates, ", ")+", after a node id", http.StatusBadRequest)
		return
	}
	mq, err := parseMapQuery(r.URL.Query().Get)
	if err != nil {
		http.Error(w, "bad map query: "+err.Error(), http.StatusBadRequest)
		return
	}
	sc, err := h.scopeOf(r.Context(), s)
	var v *view
	if err == nil {
		v, err = h.load(r.Context(), sc, filter, cursor, mq)
	}
	if err != nil {
		h.log.ErrorContext(r.Context(), "Load the fleet page", logkey.Err, err)
		http.Error(w, "the fleet could not be read now", http.StatusServiceUnavailable)
		return
	}
	v.CSRF, v.Act = s.csrf, h.actingFor(s)
	h.render(w, r, http.StatusOK, name, v)
}

// maxQueryBytes bounds a page's whole query string.
const maxQueryBytes = 2048

// isFragment reports whether a node or GPU page was asked for its live
// part only (the script's refresh).
func isFragment(r *http.Request) bool { return r.URL.Query().Get("fragment") == "1" }

// nodePage serves /watch/nodes/{id}: the node's inventory, session,
// versions, BMC state, reservations, cases and timeline.
func (h *Handler) nodePage(w http.ResponseWriter, r *http.Request) {
	s, _ := h.current(r)
	if s == nil {
		h.unauthenticated(w, r)
		return
	}
	id := r.PathValue("id")
	if !nodeIDRE.MatchString(id) {
		http.Error(w, "bad node id: a node id looks like node_...", http.StatusBadRequest)
		return
	}
	sc, err := h.scopeOf(r.Context(), s)
	var v *nodeView
	if err == nil {
		v, err = h.loadNode(r.Context(), sc, id)
	}
	h.serveDetail(w, r, s, "node", v, err)
}

// gpuPage serves /watch/gpus/{uuid}: one GPU across the nodes it was seen
// in.
func (h *Handler) gpuPage(w http.ResponseWriter, r *http.Request) {
	s, _ := h.current(r)
	if s == nil {
		h.unauthenticated(w, r)
		return
	}
	uuid := r.PathValue("uuid")
	if !gpuUUIDRE.MatchString(uuid) {
		http.Error(w, "bad GPU UUID: at most 128 letters, digits, '.', ':', '_' and '-'", http.StatusBadRequest)
		return
	}
	sc, err := h.scopeOf(r.Context(), s)
	var v *gpuView
	if err == nil {
		v, err = h.loadGPU(r.Context(), sc, uuid)
	}
	h.serveDetail(w, r, s, "gpu", v, err)
}

func (h *Handler) unauthenticated(w http.ResponseWriter, r *http.Request) {
	if isFragment(r) {
		http.Error(w, "no page session", http.StatusUnauthorized)
		return
	}
	h.render(w, r, http.StatusOK, "login.html", loginView{})
}

// serveDetail renders a node or GPU page (name "node" or "gpu"), or its
// live part with ?fragment=1.
func (h *Handler) serveDetail(w http.ResponseWriter, r *http.Request, s *session, name string, v any, err error) {
	switch {
	case errors.Is(err, errNoSuch):
		http.Error(w, "the fleet has no such "+name, http.StatusNotFound)
		return
	case err != nil:
		h.log.ErrorContext(r.Context(), "Load the fleet page", "page", name, logkey.Err, err)
		http.Error(w, "the fleet could not be read now", http.StatusServiceUnavailable)
		return
	}
	switch dv := v.(type) {
	case *nodeView:
		dv.CSRF, dv.Act = s.csrf, h.actingFor(s)
	case *gpuView:
		dv.CSRF = s.csrf
	}
	if isFragment(r) {
		h.render(w, r, http.StatusOK, name+"-main", v)
		return
	}
	h.render(w, r, http.StatusOK, name+".html", v)
}
