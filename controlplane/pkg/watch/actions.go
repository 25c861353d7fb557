package watch

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// Actions carries out the page's actions through the API (api.Server
// gives one): the same method table, role check, handlers and audit rows as
// a call with a bearer token, so each action has one owner and the page
// adds no authorisation of its own. A page without Actions only shows.
type Actions interface {
	// Principal judges the API token a page session was opened with, known
	// by its SHA-256 (iam.Hash), from the store again for caller address
	// addr (iam.Authenticator.RecheckHash): revoked, expired, deleted or
	// address-denied tokens fail with the iam errors.
	Principal(ctx context.Context, tokenHash [32]byte, addr netip.Addr) (*iam.Principal, error)
	// Allows reports whether role may call API method (such as
	// "nodes.cordon"), by the API's method table.
	Allows(role, method string) bool
	// Call calls API method as p from addr with body, the request's
	// protojson, and returns the response's protojson. A refusal (role,
	// budget, conflict, bad request) is an *ActionError.
	Call(ctx context.Context, p *iam.Principal, addr netip.Addr, method, body string) ([]byte, error)
	// ServeTunnel opens the tunnel of ticket (made by tunnels.create for
	// p) and upgrades r to its WebSocket, exactly as the API's
	// GET {basePath}/tunnels/{ticket} does after reading a bearer token;
	// tokenHash keeps the tunnel open only while the token holds.
	ServeTunnel(w http.ResponseWriter, r *http.Request, p *iam.Principal, tokenHash [32]byte, ticket string)
}

// ActionError is an API method's refusal as the page passes it on: its
// HTTP status and the API's code and message.
type ActionError struct {
	Status  int
	Code    string
	Message string
}

func (e *ActionError) Error() string { return e.Code + ": " + e.Message }

// HeaderCSRF carries a page session's form token on every action the
// page's script sends: a form another site makes a browser post cannot
// set a header, and a script of another origin cannot read the token.
const HeaderCSRF = "X-Watch-CSRF"

// Targets of an action: what its "target" names.
const (
	targetNode    = "node"
	targetCase    = "case"
	targetRollout = "rollout"
	targetPool    = "pool"
)

// action is one thing the page can do: its name on the page (the route
// POST /watch/actions/{name}), the API method that does it and what it
// acts on.
type action struct {
	Name, Method, Target, Label string
}

// actions are the page's actions, in the order the page offers them.
// Each is its API method's: the page keeps no rule of its own.
var actions = []action{
	{"cordon", "nodes.cordon", targetNode, "Cordon"},
	{"uncordon", "nodes.uncordon", targetNode, "Uncordon"},
	{"drain", "nodes.drain", targetNode, "Drain"},
	{"gpu-reset", "nodes.gpuReset", targetNode, "Reset GPU"},
	{"reboot", "nodes.reboot", targetNode, "Reboot"},
	{"power-on", "commands.create", targetNode, "Power on"},
	{"power-off", "commands.create", targetNode, "Power off"},
	{"power-cycle", "commands.create", targetNode, "Power cycle"},
	{"shell", "tunnels.create", targetNode, "Shell"},
	{"return", "remediation.return", targetCase, "Return to service"},
	{"case-pause", "remediation.pause", targetCase, "Pause case"},
	{"case-resume", "remediation.resume", targetCase, "Resume case"},
	{"rollout-pause", "rollouts.pause", targetRollout, "Pause"},
	{"rollout-resume", "rollouts.resume", targetRollout, "Resume"},
	{"rollout-abort", "rollouts.abort", targetRollout, "Abort"},
	{"breaker-reset", "remediation.resetBreaker", targetPool, "Reset breaker"},
}

func actionNamed(name string) (action, bool) {
	i := slices.IndexFunc(actions, func(a action) bool { return a.Name == name })
	if i < 0 {
		return action{}, false
	}
	return actions[i], true
}

// acting is what a rendered page may offer its session: which actions its
// role allows, or why it offers none.
type acting struct {
	allowed map[string]bool
	// Why says why the page offers no action ("" when it offers some).
	Why string
}

// Can reports whether the page offers action name.
func (a *acting) Can(name string) bool { return a != nil && a.allowed[name] }

// Any reports whether the page offers any action.
func (a *acting) Any() bool { return a != nil && len(a.allowed) > 0 }

// actingFor is what session s may do on the page.
func (h *Handler) actingFor(s *session) *acting {
	if h.cfg.Actions == nil {
		return &acting{Why: "This page only shows: its process takes no actions."}
	}
	a := &acting{allowed: map[string]bool{}}
	for _, ac := range actions {
		if h.cfg.Actions.Allows(s.role, ac.Method) {
			a.allowed[ac.Name] = true
		}
	}
	if len(a.allowed) == 0 {
		a.Why = fmt.Sprintf("Your token's role, %s, may only look: cordon, drain, repairs, shells, rollout and breaker actions need an operator token.", s.role)
	}
	return a
}

// actionRequest is the body of POST /watch/actions/{name}.
type actionRequest struct {
	// Target is the node's, case's or rollout's id, or the pool's name or
	// id.
	Target string `json:"target"`
	// GPU is gpu-reset's GPU: its UUID or index on the node.
	GPU string `json:"gpu,omitempty"`
	// Reason is recorded with an abort; Note with an ordered repair.
	Reason string `json:"reason,omitempty"`
}

// maxActionBytes bounds an action's body.
const maxActionBytes = 4 << 10

// apiBody is the API request of action a for req.
func (a action) apiBody(req *actionRequest) string {
	m := map[string]any{}
	switch a.Target {
	case targetPool:
		m["pool"] = req.Target
	default:
		m["id"] = req.Target
	}
	switch a.Name {
	case "gpu-reset":
		m["gpu"] = req.GPU
	case "rollout-abort":
		if req.Reason != "" {
			m["reason"] = req.Reason
		}
	case "shell":
		m = map[string]any{"node": req.Target, "kind": "shell"}
	case "power-on", "power-off", "power-cycle":
		// As `better-compute bmc on|off|cycle --node N`: the node's own
		// BMC, through its bcd.
		m = map[string]any{"nodeIds": []string{req.Target}, "kind": "power." + strings.TrimPrefix(a.Name, "power-"),
			"power": map[string]string{}}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// writeJSON writes v with code.
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// refusal is the JSON body of a refused action.
type refusal struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// actor checks a request for an action of session s: from the page's own
// origin, carrying the session's form token in HeaderCSRF, and its token
// still good (judged again from the store). It writes the refusal and
// returns nil when any fails.
func (h *Handler) actor(w http.ResponseWriter, r *http.Request) (*session, *iam.Principal) {
	if h.cfg.Actions == nil {
		writeJSON(w, http.StatusNotFound, refusal{apiv1.CodeNotFound, "this page takes no actions"})
		return nil, nil
	}
	s, id := h.current(r)
	if s == nil {
		writeJSON(w, http.StatusUnauthorized, refusal{apiv1.CodeUnauthenticated, "no page session: log in on " + Path})
		return nil, nil
	}
	if !sameOrigin(r) || subtle.ConstantTimeCompare([]byte(r.Header.Get(HeaderCSRF)), []byte(s.csrf)) != 1 {
		h.log.WarnContext(r.Context(), "Page action refused: not from the page", "token_id", s.tokenID, "path", r.URL.Path)
		writeJSON(w, http.StatusForbidden, refusal{apiv1.CodePermissionDenied, "refused: this request did not come from the page (the " + HeaderCSRF + " header with the session's form token is missing or wrong)"})
		return nil, nil
	}
	p, err := h.cfg.Actions.Principal(r.Context(), [32]byte(s.tokenHash), h.cfg.CallerAddr(r.Context()))
	switch {
	case err != nil && iam.IsRefusal(err):
		h.sessions.end(id)
		writeJSON(w, http.StatusUnauthorized, refusal{apiv1.CodeUnauthenticated, "the token this page was opened with no longer holds (" + err.Error() + "): log in again"})
		return nil, nil
	case err != nil:
		h.log.WarnContext(r.Context(), "Page action: token check failed", logkey.Err, err)
		writeJSON(w, http.StatusServiceUnavailable, refusal{apiv1.CodeUnavailable, "the token could not be checked now; try again"})
		return nil, nil
	}
	return s, p
}

// act serves POST /watch/actions/{name}: the action's API method called
// as the session's token, its refusal passed on as the API gave it.
func (h *Handler) act(w http.ResponseWriter, r *http.Request) {
	a, ok := actionNamed(r.PathValue("name"))
	if !ok {
		writeJSON(w, http.StatusNotFound, refusal{apiv1.CodeNotFound, "no page action " + r.PathValue("name")})
		return
	}
	_, p := h.actor(w, r)
	if p == nil {
		return
	}
	var req actionRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, maxActionBytes)).Decode(&req); err != nil || req.Target == "" {
		writeJSON(w, http.StatusBadRequest, refusal{apiv1.CodeInvalidArgument, "the body must be JSON naming the target"})
		return
	}
	resp, err := h.cfg.Actions.Call(r.Context(), p, h.cfg.CallerAddr(r.Context()), a.Method, a.apiBody(&req))
	var ae *ActionError
	switch {
	case errors.As(err, &ae):
		writeJSON(w, ae.Status, refusal{ae.Code, ae.Message})
		return
	case err != nil:
		h.log.ErrorContext(r.Context(), "Page action failed", "action", a.Name, logkey.Err, err)
		writeJSON(w, http.StatusInternalServerError, refusal{apiv1.CodeInternal, "the action failed: see the api's log"})
		return
	}
	h.log.InfoContext(r.Context(), "Page action", "action", a.Name, "method", a.Method, "target", req.Target, "token_id", p.TokenID)
	out := map[string]any{"ok": true, "action": a.Name, "target": req.Target}
	if a.Name == "shell" {
		var t struct {
			Ticket string `json:"ticket"`
		}
		if err := json.Unmarshal(resp, &t); err != nil || t.Ticket == "" {
			writeJSON(w, http.StatusInternalServerError, refusal{apiv1.CodeInternal, "tunnels.create returned no ticket"})
			return
		}
		out["path"] = Path + "/tunnels/" + t.Ticket
	}
	writeJSON(w, http.StatusOK, out)
}

// tunnel serves GET /watch/tunnels/{ticket}: the WebSocket of a shell the
// page asked for (POST /watch/actions/shell), opened as the session's
// token. A browser sends no header of its own on a WebSocket: the cookie
// authorises it, the ticket (one use, 30 s, made for this token) names it,
// and the upgrade is accepted from the page's own origin only.
func (h *Handler) tunnel(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Actions == nil {
		http.NotFound(w, r)
		return
	}
	s, _ := h.current(r)
	if s == nil {
		writeJSON(w, http.StatusUnauthorized, refusal{apiv1.CodeUnauthenticated, "no page session"})
		return
	}
	if !sameOrigin(r) {
		writeJSON(w, http.StatusForbidden, refusal{apiv1.CodePermissionDenied, "refused: this request did not come from the page"})
		return
	}
	p, err := h.cfg.Actions.Principal(r.Context(), [32]byte(s.tokenHash), h.cfg.CallerAddr(r.Context()))
	if err != nil {
		writeJSON(w, http.StatusUnauthorized, refusal{apiv1.CodeUnauthenticated, "the token this page was opened with no longer holds: log in again"})
		return
	}
	h.cfg.Actions.ServeTunnel(w, r, p, [32]byte(s.tokenHash), r.PathValue("ticket"))
}

// shellView is the shell page of a node.
type shellView struct {
	CSRF, Nonce string
	Node        *store.Node
	Act         *acting
}

// shellPage serves /watch/nodes/{id}/shell: a terminal (xterm.js) on the
// node, through the same tunnel and authorisation as `nodes shell`.
func (h *Handler) shellPage(w http.ResponseWriter, r *http.Request) {
	s, _ := h.current(r)
	if s == nil {
		h.render(w, r, http.StatusOK, "login.html", loginView{})
		return
	}
	id := r.PathValue("id")
	if !nodeIDRE.MatchString(id) {
		http.Error(w, "bad node id: a node id looks like node_...", http.StatusBadRequest)
		return
	}
	sc, err := h.scopeOf(r.Context(), s)
	var n *store.Node
	if err == nil {
		n, err = h.store.NodeGet(r.Context(), id)
	}
	if err == nil && !sc.pool(n.PoolID) {
		err = store.ErrNotFound // another tenant's: as a node that does not exist
	}
	switch {
	case errors.Is(err, store.ErrNotFound):
		http.Error(w, "the fleet has no such node", http.StatusNotFound)
		return
	case err != nil:
		http.Error(w, "the fleet could not be read now", http.StatusServiceUnavailable)
		return
	}
	h.render(w, r, http.StatusOK, "shell.html", &shellView{CSRF: s.csrf, Nonce: nonceOf(r), Node: n, Act: h.actingFor(s)})
}
