package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/sso"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// ssoPollWait is how long one poll of a device flow waits for the person
// at most before answering pending (the CLI polls again at once).
const ssoPollWait = 20 * time.Second

// ssoMaxBody bounds a request to the sign-in endpoints.
const ssoMaxBody = 4 << 10

// ssoRequest is every sign-in endpoint's body.
type ssoRequest struct {
	Tenant       string `json:"tenant"`
	Login        string `json:"login"`
	RefreshToken string `json:"refreshToken"`
}

// ssoLimiter bounds the sign-in calls of one source address: 2 a second,
// bursts of 20 (a device flow's start, its polls and the refreshes of
// one person need far fewer), so that nobody can fill the store with
// logins or the provider with calls.
type ssoLimiter struct {
	mu sync.Mutex
	m  map[netip.Addr]*rate.Limiter
}

const ssoLimiterMax = 10000

func (l *ssoLimiter) allow(a netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil || len(l.m) >= ssoLimiterMax {
		l.m = map[netip.Addr]*rate.Limiter{}
	}
	lim := l.m[a]
	if lim == nil {
		lim = rate.NewLimiter(2, 20)
		l.m[a] = lim
	}
	return lim.Allow()
}

// mountSSO mounts the sign-in endpoints under basePath.
func (s *Server) mountSSO() {
	s.mux.HandleFunc("POST "+s.cfg.BasePath+apiv1.SSODevicePath, s.serveSSO(s.ssoDevice))
	s.mux.HandleFunc("POST "+s.cfg.BasePath+apiv1.SSOTokenPath, s.serveSSO(s.ssoToken))
	s.mux.HandleFunc("POST "+s.cfg.BasePath+apiv1.SSOLogoutPath, s.serveSSO(s.ssoLogout))
}

// serveSSO reads a sign-in request and writes fn's answer.
func (s *Server) serveSSO(fn func(ctx context.Context, req *ssoRequest, addr netip.Addr) (any, int, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		addr := CallerAddr(r.Context())
		if s.cfg.SSO == nil {
			s.writeError(w, r, notFound("single sign-on is not configured on this deployment (iam.oidc): use an API token"))
			return
		}
		if !s.ssoLimit.allow(addr) {
			s.writeError(w, r, exhausted(time.Second, "too many sign-in calls from %s: wait a second", addr))
			return
		}
		var req ssoRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, ssoMaxBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			s.writeError(w, r, invalid("", "the body must be a JSON object of at most %d bytes with tenant, login or refreshToken: %v", ssoMaxBody, err))
			return
		}
		resp, code, err := fn(r.Context(), &req, addr)
		if err != nil {
			var e *sso.Error
			if errors.As(err, &e) {
				err = &Error{Code: e.Code, Message: e.Message}
			}
			s.writeError(w, r, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(resp)
	}
}

func (s *Server) ssoDevice(ctx context.Context, req *ssoRequest, _ netip.Addr) (any, int, error) {
	d, err := s.cfg.SSO.StartDevice(ctx, strings.TrimSpace(req.Tenant))
	if err != nil {
		return nil, 0, err
	}
	return &apiv1.SSODeviceResponse{Login: d.Login, VerificationURI: d.VerificationURI, VerificationURIComplete: d.VerificationURIComplete,
		UserCode: d.UserCode, Interval: int(d.Interval / time.Second), ExpiresAt: d.ExpiresAt.UTC()}, http.StatusOK, nil
}

func (s *Server) ssoToken(ctx context.Context, req *ssoRequest, addr netip.Addr) (any, int, error) {
	var g *sso.Grant
	var err error
	action := "sso.refresh"
	switch {
	case req.Login != "" && req.RefreshToken != "":
		return nil, 0, invalid("", "give login (to finish a device flow) or refreshToken (to refresh), not both")
	case req.Login != "":
		action = "sso.login"
		g, err = s.cfg.SSO.PollDevice(ctx, req.Login, ssoPollWait)
		if errors.Is(err, sso.ErrPending) {
			return &apiv1.SSOTokenResponse{Pending: true, Interval: 1}, http.StatusAccepted, nil
		}
	case req.RefreshToken != "":
		g, err = s.cfg.SSO.Refresh(ctx, req.RefreshToken)
	default:
		return nil, 0, invalid("", "give login (to finish a device flow) or refreshToken (to refresh)")
	}
	if err != nil {
		var e *sso.Error
		if req.RefreshToken != "" && errors.As(err, &e) && e.Code == sso.CodeUnauthenticated {
			s.tokensRevoked() // the refusal may have ended the session
		}
		return nil, 0, err
	}
	if g.Revoked {
		s.tokensRevoked()
	}
	s.auditSession(ctx, g.Session, action, addr)
	return grantResponse(g), http.StatusOK, nil
}

func (s *Server) ssoLogout(ctx context.Context, req *ssoRequest, addr netip.Addr) (any, int, error) {
	sess, err := s.cfg.SSO.Logout(ctx, req.RefreshToken)
	if err != nil {
		return nil, 0, err
	}
	s.tokensRevoked()
	if sess != nil {
		s.auditSession(ctx, sess, "sso.logout", addr)
	}
	return struct{}{}, http.StatusOK, nil
}

// tokensRevoked makes a revocation made through this process hold here at
// once: cached authentications are dropped and open calls checked now.
func (s *Server) tokensRevoked() {
	s.auth.Forget()
	s.live.checkNow()
}

// grantResponse is what the client keeps of a grant.
func grantResponse(g *sso.Grant) *apiv1.SSOTokenResponse {
	return &apiv1.SSOTokenResponse{Token: g.Token, ExpiresAt: g.ExpiresAt.UTC(), RefreshToken: g.Refresh,
		SessionExpiresAt: g.Session.ExpiresAt.UTC(), Name: g.Session.DisplayName, Tenant: g.TenantName,
		Role: g.Session.Role, Groups: g.Session.Groups}
}

// auditSession writes the audit row of a sign-in or refresh, under the
// person.
func (s *Server) auditSession(ctx context.Context, sess *store.OIDCSession, action string, addr netip.Addr) {
	p := &iam.Principal{TenantID: sess.TenantID, Subject: sess.Subject}
	details, _ := json.Marshal(map[string]any{"session": sess.ID, "role": sess.Role, "groups": sess.Groups, "name": sess.DisplayName})
	e := &store.AuditEntry{Actor: p.Identity(), Action: action, Resource: sess.ID, Outcome: "ok", TenantID: sess.TenantID,
		SourceIP: addr.String(), Details: details}
	if _, err := s.store.AuditInsert(context.WithoutCancel(ctx), e); err != nil {
		s.log.ErrorContext(ctx, "Audit write failed", "action", action, logkey.Err, err)
	}
}
