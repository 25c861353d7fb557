package api

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/policy"
	"github.com/better-compute/better-compute/controlplane/pkg/watch"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// mountWatch serves the fleet page, GET /watch and the routes under it
// (package watch). Its cookie authorises only those routes: serveRPC reads
// bearer tokens alone, so a page session never reaches the API. The page's
// actions are API calls all the same (pageActions): the page's own routes
// call the API's methods as the token the page was opened with. The page's
// stream follows the server's event feed: one outbox reader per process.
func (s *Server) mountWatch() {
	cfg := watch.Config{Auth: s.auth, CallerAddr: CallerAddr, Feed: s.feed, Actions: pageActions{s}, View: s.mayView,
		Secure: s.cfg.TLSCertFile != "" || strings.HasPrefix(s.cfg.PublicURL, "https://")}
	if s.cfg.SSO != nil {
		cfg.SSO, cfg.PublicURL = s.cfg.SSO, s.cfg.PublicURL
	}
	h, err := watch.New(cfg, s.store, s.log)
	if err != nil {
		panic("api: " + err.Error()) // only a bad Config fails, and this one is fixed
	}
	h.Register(s.mux)
}

// pageActions are the fleet page's actions (watch.Actions): each is the
// API method's own call (invoke: its role, checks, handler and audit row
// under the token), and its shell the API's own tunnel (openTunnel).
type pageActions struct{ s *Server }

// Principal judges the page session's token again from the store.
func (a pageActions) Principal(ctx context.Context, tokenHash [32]byte, addr netip.Addr) (*iam.Principal, error) {
	return a.s.auth.RecheckHash(ctx, tokenHash, addr)
}

// Allows reports whether role may call method.
func (a pageActions) Allows(role, method string) bool { return a.s.allows(role, method) }

// Call calls method as p, the token's in-flight limit counted as for any
// API call; a refusal is a *watch.ActionError with the API's code and
// status.
func (a pageActions) Call(ctx context.Context, p *iam.Principal, addr netip.Addr, method, body string) ([]byte, error) {
	s := a.s
	if !s.inFlight.acquire(p.TokenID) {
		return nil, pageError(exhausted(inFlightRetryAfter, "this token has %d API calls in flight, the most it may (host.limits.inFlightPerToken); wait for one to end",
			s.inFlight.max))
	}
	defer s.inFlight.release(p.TokenID)
	resp, err := s.invoke(ctx, p, addr, method, func(req proto.Message) error {
		if err := unmarshal.Unmarshal([]byte(body), req); err != nil {
			return invalid("", "malformed request: %v", err)
		}
		return nil
	})
	if err != nil {
		if _, known := toAPIError(err); !known {
			return nil, err
		}
		return nil, pageError(err)
	}
	return marshal.Marshal(resp)
}

func pageError(err error) *watch.ActionError {
	e, _ := toAPIError(err)
	return &watch.ActionError{Status: e.status(), Code: e.Code, Message: e.Message}
}

// ServeTunnel opens the tunnel of ticket for p, as serveTunnel does.
func (a pageActions) ServeTunnel(w http.ResponseWriter, r *http.Request, p *iam.Principal, tokenHash [32]byte, ticket string) {
	a.s.openTunnel(w, r, p, CallerAddr(r.Context()), tokenHash, ticket)
}

// mayView decides whether p may see the fleet page from addr: the page
// shows nodes and events, so nodes.list and events.list on p's tenant, by
// the same evaluator as every call (a refusal's message says why).
//
// Only a refusal is an error: when the store cannot be read the session
// stays, and the page's own reads fail on their own (as for its token
// check).
func (s *Server) mayView(ctx context.Context, p *iam.Principal, addr netip.Addr) error {
	bound, err := s.bound(ctx, p)
	if err != nil || !bound {
		return nil
	}
	var res policy.Resource
	if err := s.tenantResource(ctx, p, p.TenantID, &res); err != nil {
		return nil
	}
	for _, action := range []string{"nodes.list", "events.list"} {
		err := s.decide(ctx, decision{p: p, addr: addr, action: action, res: res, read: true})
		if e, ok := err.(*Error); ok && e.Code == apiv1.CodePermissionDenied {
			return errors.New(e.Message)
		}
	}
	return nil
}
