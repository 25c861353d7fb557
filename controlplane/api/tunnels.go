package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/recording"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Tunnel limits (docs/tunnels.md).
const (
	// TunnelTicketTTL is how long a tunnels.create ticket opens a tunnel.
	TunnelTicketTTL = 30 * time.Second
	// DefaultTunnelIdleTimeout closes a tunnel through which no frame
	// passed for that long (Config.TunnelIdleTimeout).
	DefaultTunnelIdleTimeout = 15 * time.Minute
	// TunnelsPath is the WebSocket route under basePath:
	// GET {basePath}/tunnels/{ticket}.
	TunnelsPath = "/tunnels/"
)

// tunnelsCreate stores a one-use ticket for a tunnel to a node.
func (s *Server) tunnelsCreate(ctx context.Context, p *iam.Principal, r *apiv1.CreateTunnelRequest) (*apiv1.CreateTunnelResponse, error) {
	switch r.GetKind() {
	case tunnel.KindShell:
		if r.GetPort() != 0 {
			return nil, invalid("port", "only kind port takes a port")
		}
	case tunnel.KindPort:
		if r.GetPort() < 1 || r.GetPort() > 65535 {
			return nil, invalid("port", "must be 1 to 65535")
		}
		if r.GetAsRoot() {
			return nil, invalid("asRoot", "only kind shell runs as root")
		}
	default:
		return nil, invalid("kind", "must be shell or port")
	}
	if r.GetNode() == "" {
		return nil, invalid("node", "required")
	}
	if err := s.decideOnNodes(ctx, p, []string{r.GetNode()}, tunnelActions(r.GetKind(), r.GetAsRoot())...); err != nil {
		if e, ok := err.(*Error); ok && r.GetAsRoot() && !iam.Allows(p.Role, store.RoleAdmin) {
			e.Message = "a root shell needs an admin token (role " + p.Role + "): " + e.Message
		}
		return nil, err
	}
	_, grant, err := s.nodeFor(ctx, p, r.GetNode(), tunnelRight(r.GetKind()))
	if err != nil {
		if isNotFound(err) {
			return nil, &Error{Code: apiv1.CodeNotFound, Field: "node", Message: "no node " + r.GetNode()}
		}
		return nil, err
	}
	if grant != nil && r.GetAsRoot() {
		return nil, &Error{Code: apiv1.CodePermissionDenied, Field: "asRoot", Message: "reservation " + grant.ReservationID +
			" grants a shell as the node's command user, not a root shell"}
	}
	secret := rand.Text()
	sum := sha256.Sum256([]byte(secret))
	now := s.unauth.now()
	t, err := s.store.TunnelCreate(ctx, &store.TunnelCreateParams{ID: store.NewID("tun"), SecretHash: sum[:], NodeID: r.GetNode(),
		Kind: r.GetKind(), Port: int(r.GetPort()), AsRoot: r.GetAsRoot(), CreatedBy: "token:" + p.TokenID, TTL: TunnelTicketTTL, Now: &now})
	if err != nil {
		return nil, err
	}
	ticket := t.ID + "." + secret
	return &apiv1.CreateTunnelResponse{Id: t.ID, Ticket: ticket, Path: s.cfg.BasePath + TunnelsPath + ticket,
		ExpireTime: timestamppb.New(t.ExpiresAt)}, nil
}

// serveTunnel handles GET {basePath}/tunnels/{ticket}: the caller's bearer
// token (an operator's, the one that made the ticket; an admin's for a root
// shell) and the header X-Better-Compute: 1 are checked, the ticket used
// once, the tunnel opened on the node through Config.Tunnels, and only then
// the request upgraded to a WebSocket carrying TunnelFrame messages. Every
// refusal before the upgrade is an HTTP error with the API's JSON body and
// an audit row (tunnels.open); the tunnel's end writes tunnels.close with
// the bytes each way and the exit status.
func (s *Server) serveTunnel(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	addr := CallerAddr(ctx)
	p, err := s.auth.Authenticate(ctx, bearerToken(r), addr)
	if err != nil {
		if reason := unauthenticatedReason(err); reason != "" {
			s.refuseUnauthenticated(ctx, reason, "tunnels.open", addr)
			s.writeError(w, r, &Error{Code: apiv1.CodeUnauthenticated, Message: err.Error() + " (a ticket alone opens nothing: send the bearer token that made it)"})
			return
		}
		s.writeError(w, r, err)
		return
	}
	if r.Header.Get(HeaderCSRF) != "1" {
		id, _, _ := strings.Cut(r.PathValue("ticket"), ".")
		s.audit(ctx, p, "tunnels.open", id, "denied", addr, nil)
		s.writeError(w, r, &Error{Code: apiv1.CodePermissionDenied, Message: "missing header " + HeaderCSRF + ": 1 (required on every API call)"})
		return
	}
	s.openTunnel(w, r, p, addr, sha256.Sum256([]byte(bearerToken(r))), r.PathValue("ticket"))
}

// openTunnel uses ticket ("<id>.<secret>") for caller p from addr, whose
// token hashes to tokenHash, opens its tunnel on the node and upgrades r to
// the WebSocket that carries it until either side ends: the part of
// serveTunnel after the caller is known, and of the fleet page's shell
// (pageActions.ServeTunnel), whose caller is its session's token. Checks,
// refusals and audit rows are serveTunnel's. The WebSocket upgrade accepts
// a browser's request only from the host's own origin (the library's
// default: a page of another site cannot open it with the page's cookie).
func (s *Server) openTunnel(w http.ResponseWriter, r *http.Request, p *iam.Principal, addr netip.Addr, tokenHash [32]byte, ticket string) {
	ctx := r.Context()
	id, secret, _ := strings.Cut(ticket, ".")
	refuse := func(e *Error) {
		s.audit(ctx, p, "tunnels.open", id, auditOutcome(e), addr, nil)
		s.writeError(w, r, e)
	}
	// A caller no policy binds is refused by its role before the ticket is
	// read; one a policy binds, on the ticket's node below.
	bound, err := s.bound(ctx, p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !bound && !iam.Allows(p.Role, store.RoleOperator) {
		refuse(&Error{Code: apiv1.CodePermissionDenied, Message: fmt.Sprintf("role %s may not open tunnels (needs operator)", p.Role)})
		return
	}
	t, err := s.store.TunnelGet(ctx, id)
	if errors.Is(err, store.ErrNotFound) || secret == "" {
		refuse(notFound("no such tunnel ticket"))
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if t.CreatedBy != "token:"+p.TokenID {
		refuse(&Error{Code: apiv1.CodePermissionDenied, Message: "the ticket was made by another token: open it with the token that called tunnels.create"})
		return
	}
	// The ticket may outlive a policy that allowed it: decided again, once,
	// on one view of the policies and grants. A tunnel an access request's
	// grant allowed (docs/access.md), or any of a caller that holds grants,
	// is decided again every round of checkLive, and closes when it is
	// refused: the grant ended, was revoked, or no longer allows it.
	request, end, err := s.tunnelGrant(ctx, p, addr, t.NodeID, t.Kind, t.AsRoot)
	if err != nil {
		if e, ok := err.(*Error); ok {
			if t.AsRoot && !iam.Allows(p.Role, store.RoleAdmin) {
				e.Message = "a root shell needs an admin token: " + e.Message
			}
			refuse(e)
			return
		}
		s.writeError(w, r, err)
		return
	}
	var access *liveAccess
	if request != "" || s.holdsGrants(ctx, p) {
		access = &liveAccess{p: p, kind: t.Kind, asRoot: t.AsRoot, request: request, end: end}
	}
	// A node outside the caller's subtree is open to it only while a
	// reservation grants it the right: checked again here (the ticket may
	// outlive the grant), and every round of checkLive while it is open.
	var grant *store.ReservationGrant
	if within(p) != "" {
		_, g, err := s.nodeFor(ctx, p, t.NodeID, tunnelRight(t.Kind))
		switch {
		case isNotFound(err) || (g != nil && t.AsRoot):
			refuse(grantRefusal(tunnelRight(t.Kind), t.NodeID))
			return
		case err != nil:
			s.writeError(w, r, err)
			return
		}
		grant = g
	}
	sum := sha256.Sum256([]byte(secret))
	now := s.unauth.now()
	if _, err := s.store.TunnelUse(ctx, &store.TunnelUseParams{ID: id, SecretHash: sum[:], Now: &now}); err != nil {
		switch {
		case errors.Is(err, store.ErrTunnelTicketInvalid):
			refuse(notFound("no such tunnel ticket"))
		case errors.Is(err, store.ErrTunnelTicketUsed):
			refuse(&Error{Code: apiv1.CodePermissionDenied, Message: "the ticket was used already: tickets open one tunnel (call tunnels.create again)"})
		case errors.Is(err, store.ErrTunnelTicketExpired):
			refuse(&Error{Code: apiv1.CodePermissionDenied, Message: fmt.Sprintf("the ticket expired: tickets open a tunnel within %s of tunnels.create", TunnelTicketTTL)})
		default:
			s.writeError(w, r, err)
		}
		return
	}
	if s.cfg.Tunnels == nil {
		s.closeTunnel(ctx, p, t, addr, tunnel.Result{Reason: "no tunnel relay"}, "")
		refuse(&Error{Code: apiv1.CodeUnavailable, Message: "this api process relays no tunnels: configure the internal control API (host.gateway.internal, docs/tunnels.md)"})
		return
	}
	open := &sessionv1.TunnelOpen{TunnelId: t.ID, Kind: t.Kind, Port: uint32(t.Port), AsRoot: t.AsRoot,
		Rows: queryUint(r, "rows"), Cols: queryUint(r, "cols"), Term: r.URL.Query().Get("term")}
	if len(open.Term) > 64 {
		open.Term = ""
	}
	conn, gatewayID, err := s.cfg.Tunnels.OpenTunnel(ctx, t.NodeID, open)
	if err != nil {
		s.closeTunnel(ctx, p, t, addr, tunnel.Result{Reason: err.Error()}, "")
		code := apiv1.CodeUnavailable
		if errors.Is(err, tunnel.ErrUnsupported) {
			code = apiv1.CodeInvalidArgument
		}
		refuse(&Error{Code: code, Message: "open tunnel on node " + t.NodeID + ": " + err.Error()})
		return
	}
	defer conn.Close()
	// Every shell is recorded here, as it passes (docs/tunnels.md,
	// "Recorded shells").
	strict := s.cfg.Recording.OnFailure != config.RecordingOnFailureContinue
	var rec *recording.Recorder
	if t.Kind == tunnel.KindShell {
		rec, err = recording.Start(ctx, recording.Config{Secret: s.cfg.Secret, MaxBytes: s.cfg.Recording.MaxBytes}, s.store,
			recording.Params{TunnelID: t.ID, NodeID: t.NodeID, CreatedBy: t.CreatedBy, AsRoot: t.AsRoot})
		switch {
		case err != nil && strict:
			conn.Close()
			s.closeTunnel(ctx, p, t, addr, tunnel.Result{Reason: err.Error()}, "")
			refuse(&Error{Code: apiv1.CodeUnavailable, Message: "the shell is not opened: " + err.Error() +
				" (every shell is recorded; host.gateway.tunnels.recording.onFailure: close)"})
			return
		case err != nil:
			s.log.ErrorContext(ctx, "Shell not recorded (host.gateway.tunnels.recording.onFailure: continue)", "tunnel_id", t.ID, logkey.Err, err)
		case open.Rows > 0 && open.Cols > 0 && open.Rows <= tunnel.MaxWindow && open.Cols <= tunnel.MaxWindow:
			_ = rec.Resize(open.Rows, open.Cols)
		}
	}
	if err := s.store.TunnelOpened(ctx, t.ID, gatewayID, nil); err != nil {
		s.log.ErrorContext(ctx, "Tunnel opening not recorded", "tunnel_id", t.ID, logkey.Err, err)
	}
	details := map[string]any{}
	if rec != nil {
		details["recordingId"] = rec.ID()
	}
	if grant != nil {
		// The access rests on a reservation's grant: which one.
		details["reservationId"] = grant.ReservationID
	}
	if access != nil {
		// The access rests on an access request's grant: which one.
		details["accessRequestId"] = access.request
	}
	if len(details) == 0 {
		details = nil
	}
	s.auditTunnel(ctx, p, "tunnels.open", t, addr, details)
	s.feed.Notify()
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		if rec != nil {
			_ = rec.Close("websocket: " + err.Error())
		}
		s.closeTunnel(ctx, p, t, addr, tunnel.Result{Reason: "websocket: " + err.Error()}, rec.ID())
		return
	}
	ws.SetReadLimit(tunnel.MaxFrame)
	idle := s.cfg.TunnelIdleTimeout
	if idle == 0 {
		idle = DefaultTunnelIdleTimeout
	}
	// The tunnel outlives the request's context only until the server
	// stops.
	// It ends too when the token that opened it, or its node, is revoked
	// (checkLive).
	pctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	go func() {
		select {
		case <-s.stopping:
			cancel(nil)
		case <-pctx.Done():
		}
	}()
	// The WebSocket's own reads and writes outlive pctx until the close
	// below: a read cancelled by its context drops the connection without
	// a close frame, and the client would never learn why.
	wctx, stopWS := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWS()
	client := &wsHop{ctx: wctx, c: ws}
	live := &liveCall{tokenHash: tokenHash, addr: addr, tokenID: p.TokenID, nodeID: t.NodeID, cancel: cancel}
	if grant == nil {
		live.caller = p
	}
	if grant != nil {
		live.grant = &liveGrant{p: p, right: tunnelRight(t.Kind)}
		if t.Kind == tunnel.KindShell {
			// The notice goes to the terminal alone, as one line; a port
			// forward's bytes are the forwarded stream's, so it gets none.
			live.grant.notify = func(line string) { _ = client.Send(tunnel.Data([]byte("\r\n" + line + "\r\n"))) }
		}
	}
	if access != nil {
		live.access = access
		if t.Kind == tunnel.KindShell {
			access.notify = func(line string) { _ = client.Send(tunnel.Data([]byte("\r\n" + line + "\r\n"))) }
		}
	}
	defer s.live.add(live)()
	if grant != nil || access != nil {
		s.live.checkNow() // a grant ending within a minute is told at once
	}
	var clientHop, nodeHop tunnel.Hop = client, conn
	if rec != nil {
		clientHop, nodeHop = recording.Hops(rec, client, conn, strict)
		if strict {
			go func() {
				select {
				case <-rec.Failed():
					cancel(errRecordingFailed)
				case <-pctx.Done():
				}
			}()
		}
	}
	res := tunnel.Pipe(pctx, clientHop, nodeHop, idle)
	conn.Close()
	if err := rec.Err(); err != nil && strict {
		// The shell ended with its recording: say why, in one line.
		res.Reason = "recording failed: " + err.Error()
		_ = client.Send(tunnel.Error("the shell was closed: its recording failed (" + err.Error() +
			"); every shell is recorded (host.gateway.tunnels.recording.onFailure: close)"))
	}
	status := websocket.StatusNormalClosure
	if res.Reason != "exit" && res.Reason != "client closed" {
		status = websocket.StatusGoingAway
	}
	re := revokedCause(pctx)
	if re == nil && (res.Reason == "node closed" || strings.HasPrefix(res.Reason, "node: ")) {
		// The gateway may end a revoked or deleted node's tunnels before
		// this process's next check: say why all the same.
		if why := s.nodeEnded(context.WithoutCancel(ctx), t.NodeID); why != "" {
			re = &RevokedError{Reason: why}
		}
	}
	if re != nil {
		// The client reads this close status as "credential revoked"
		// (client.ErrRevoked) and shows the reason as its one line.
		status, res.Reason = websocket.StatusCode(tunnel.CloseRevoked), re.Reason
	}
	_ = ws.Close(status, truncate(res.Reason, 120))
	s.closeTunnel(ctx, p, t, addr, res, rec.ID())
	// The shell is over: store the rest of its recording and its end
	// after the tunnel's own end, which the client waits on.
	if rec != nil {
		if err := rec.Close(res.Reason); err != nil {
			s.log.ErrorContext(ctx, "Shell recording failed", "tunnel_id", t.ID, "recording_id", rec.ID(), logkey.Err, err)
		}
	}
}

// errRecordingFailed ends a shell whose recording failed, when
// host.gateway.tunnels.recording.onFailure is close.
var errRecordingFailed = errors.New("recording failed")

// auditTunnel writes an audit row of tunnel t with details.
func (s *Server) auditTunnel(ctx context.Context, p *iam.Principal, action string, t *store.Tunnel, addr any, details map[string]any) {
	var b []byte
	if details != nil {
		b, _ = json.Marshal(details)
	}
	e := &store.AuditEntry{Actor: "token:" + p.TokenID, Action: action, Resource: t.ID, Outcome: "ok", TenantID: p.TenantID, SourceIP: fmt.Sprint(addr), Details: b}
	if _, err := s.store.AuditInsert(context.WithoutCancel(ctx), e); err != nil {
		s.log.ErrorContext(ctx, "Audit write failed", "action", action, logkey.Err, err)
	}
}

// closeTunnel records the end of tunnel t: the row, tunnel.closed and an
// audit row tunnels.close with the bytes each way, the exit status and
// the shell's recording (recordingID, "" for none).
func (s *Server) closeTunnel(ctx context.Context, p *iam.Principal, t *store.Tunnel, addr any, res tunnel.Result, recordingID string) {
	ctx = context.WithoutCancel(ctx)
	var code *int32
	var signal string
	if res.Exit != nil {
		c := res.Exit.GetExitCode()
		code, signal = &c, res.Exit.GetSignal()
	}
	if err := s.store.TunnelClose(ctx, &store.TunnelCloseParams{ID: t.ID, BytesIn: res.BytesIn, BytesOut: res.BytesOut, ExitCode: code,
		Signal: signal, Reason: truncate(res.Reason, 500)}); err != nil {
		s.log.ErrorContext(ctx, "Tunnel end not recorded", "tunnel_id", t.ID, logkey.Err, err)
	}
	details := map[string]any{"nodeId": t.NodeID, "kind": t.Kind, "port": t.Port, "asRoot": t.AsRoot,
		"bytesIn": res.BytesIn, "bytesOut": res.BytesOut, "exitCode": code, "signal": signal, "reason": truncate(res.Reason, 500)}
	if recordingID != "" {
		details["recordingId"] = recordingID
	}
	s.auditTunnel(ctx, p, "tunnels.close", t, addr, details)
	s.feed.Notify()
	s.log.InfoContext(ctx, "Tunnel closed", "tunnel_id", t.ID, logkey.NodeID, t.NodeID, "kind", t.Kind, "bytes_in", res.BytesIn,
		"bytes_out", res.BytesOut, "reason", res.Reason)
}

// wsHop is the client's WebSocket as a tunnel hop: one binary message per
// frame.
type wsHop struct {
	ctx context.Context
	c   *websocket.Conn
}

func (h *wsHop) Send(f *sessionv1.TunnelFrame) error {
	return h.c.Write(h.ctx, websocket.MessageBinary, tunnel.Encode(f))
}

func (h *wsHop) Recv() (*sessionv1.TunnelFrame, error) {
	typ, b, err := h.c.Read(h.ctx)
	if err != nil {
		if s := websocket.CloseStatus(err); s == websocket.StatusNormalClosure || s == websocket.StatusGoingAway {
			return nil, io.EOF
		}
		return nil, err
	}
	if typ != websocket.MessageBinary {
		return nil, fmt.Errorf("%w: a text message", tunnel.ErrFrame)
	}
	return tunnel.Parse(b)
}

// queryUint reads a small unsigned query parameter; 0 when absent or bad.
func queryUint(r *http.Request, name string) uint32 {
	n, err := strconv.ParseUint(r.URL.Query().Get(name), 10, 16)
	if err != nil {
		return 0
	}
	return uint32(n)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
