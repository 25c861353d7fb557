package api

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// MaxBodyBytes is the largest request body accepted (1 MiB); larger bodies
// are INVALID_ARGUMENT.
const MaxBodyBytes = 1 << 20

// HeaderCSRF must be "1" on every API call: a browser cannot send it across
// origins without a CORS preflight, so it guards against cross-site requests.
const HeaderCSRF = "X-Better-Compute"

// method is one registered API method: its access as api.proto declares
// it (apiv1.Methods) and its handler.
type method struct {
	role     string // least role allowed
	mutating bool   // audited
	newReq   func() proto.Message
	// page and next are the request's page and the response's
	// next_cursor of a paged list (pagedFields), else nil: their cursors
	// are sealed to a tenant's caller (cursor.go).
	page, next protoreflect.FieldDescriptor
	call       func(context.Context, *iam.Principal, proto.Message) (proto.Message, error)
}

// handle registers fn as the handler of the API method name
// ("group.method"); its role and audit flag come from api.proto's services
// (apiv1.Methods). A name api.proto does not declare, a second handler for
// one name, or request and response types other than the rpc's are
// recorded and make checkMethods fail.
func handle[Req, Resp proto.Message](s *Server, name string, fn func(context.Context, *iam.Principal, Req) (Resp, error)) {
	var zero Req
	var zeroResp Resp
	spec, ok := s.table[name]
	switch {
	case !ok:
		s.bindErrs = append(s.bindErrs, fmt.Errorf("handler %s: no rpc in api.proto's services", name))
		return
	case s.methods[name] != nil:
		s.bindErrs = append(s.bindErrs, fmt.Errorf("handler %s: registered twice", name))
		return
	case reflect.TypeOf(zero) != reflect.TypeOf(spec.Request) || reflect.TypeOf(zeroResp) != reflect.TypeOf(spec.Response):
		s.bindErrs = append(s.bindErrs, fmt.Errorf("handler %s: takes %T and returns %T, api.proto says %T and %T",
			name, zero, zeroResp, spec.Request, spec.Response))
		return
	}
	page, next := pagedFields(spec.Request, spec.Response)
	s.methods[name] = &method{
		role:     spec.Role,
		mutating: spec.Mutating,
		newReq:   func() proto.Message { return zero.ProtoReflect().New().Interface() },
		page:     page,
		next:     next,
		call: func(ctx context.Context, p *iam.Principal, m proto.Message) (proto.Message, error) {
			return fn(ctx, p, m.(Req))
		},
	}
}

// checkMethods reports every mismatch between the handlers registered and
// the table they were registered by: a handler refused by handle, or a
// method of the table without a handler.
func (s *Server) checkMethods() error {
	errs := slices.Clone(s.bindErrs)
	for _, name := range slices.Sorted(maps.Keys(s.table)) {
		if s.methods[name] == nil {
			errs = append(errs, fmt.Errorf("rpc %s of api.proto has no handler", name))
		}
	}
	return errors.Join(errs...)
}

var unmarshal = protojson.UnmarshalOptions{DiscardUnknown: false}
var marshal = protojson.MarshalOptions{EmitUnpopulated: false, UseProtoNames: false}

var unknownFieldRE = regexp.MustCompile(`unknown field "([^"]+)"`)

// serveRPC handles POST {basePath}/{group}/{method}.
func (s *Server) serveRPC(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("group") + "." + r.PathValue("method")
	start := time.Now()
	m, ok := s.methods[name]
	if !ok {
		s.writeError(w, r, notFound("no API method %s", name))
		return
	}
	addr := CallerAddr(r.Context())
	p, err := s.auth.Authenticate(r.Context(), bearerToken(r), addr)
	if err != nil {
		if reason := unauthenticatedReason(err); reason != "" {
			s.refuseUnauthenticated(r.Context(), reason, name, addr)
			s.writeError(w, r, &Error{Code: apiv1.CodeUnauthenticated, Message: err.Error()})
			return
		}
		s.writeError(w, r, err)
		return
	}
	// From here the caller is known: every refusal of a mutating call is
	// audited under its token, with the code the caller got.
	refuse := func(e *Error) {
		if m.mutating {
			s.audit(r.Context(), p, name, "", auditOutcome(e), addr, nil)
		}
		s.writeError(w, r, e)
	}
	if !s.inFlight.acquire(p.TokenID) {
		refuse(exhausted(inFlightRetryAfter, "this token has %d API calls in flight, the most it may (host.limits.inFlightPerToken); wait for one to end",
			s.inFlight.max))
		return
	}
	defer s.inFlight.release(p.TokenID)
	if r.Header.Get(HeaderCSRF) != "1" {
		refuse(&Error{Code: apiv1.CodePermissionDenied, Message: "missing header " + HeaderCSRF + ": 1 (required on every API call)"})
		return
	}
	resp, err := s.invoke(r.Context(), p, addr, name, func(req proto.Message) error { return s.decode(w, r, req) })
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	b, err := marshal.Marshal(resp)
	if err != nil {
		s.writeError(w, r, fmt.Errorf("encode response: %w", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
	s.log.DebugContext(r.Context(), "API call", "method", name, "token", p.TokenID, "ms", time.Since(start).Milliseconds())
}

// invoke calls API method name for the authenticated caller p from addr,
// its request filled by decode: the method's role check, the request's
// checks, its handler and, for a mutating method, its audit row (a refusal
// too, with the code the caller got) and a nudge to the event feed. It is
// the one path of every API call: serveRPC after reading the bearer token,
// the fleet page's actions (pageActions) after reading its session.
func (s *Server) invoke(ctx context.Context, p *iam.Principal, addr netip.Addr, name string, decode func(proto.Message) error) (proto.Message, error) {
	m, ok := s.methods[name]
	if !ok {
		return nil, notFound("no API method %s", name)
	}
	ctx = context.WithValue(ctx, addrKey{}, addr) // the handler's decisions on nodes (decideOnNodes)
	refuse := func(e *Error) (proto.Message, error) {
		if m.mutating {
			s.audit(ctx, p, name, "", auditOutcome(e), addr, nil)
		}
		return nil, e
	}
	// A caller no tenant policy binds is decided by its built-in role
	// alone, before its request is read; one that a policy binds, once the
	// request says what the call acts on (authorize.go).
	bound, err := s.bound(ctx, p)
	if err != nil {
		return nil, err
	}
	if !bound {
		if err := s.decide(ctx, decision{p: p, addr: addr, action: name}); err != nil {
			if e, ok := err.(*Error); ok && e.Code == apiv1.CodePermissionDenied {
				return refuse(&Error{Code: apiv1.CodePermissionDenied, Message: fmt.Sprintf("role %s may not call %s (needs %s)", p.Role, name, m.role)})
			}
			return nil, err
		}
	}
	if tenantDenied(p, name) {
		return refuse(&Error{Code: apiv1.CodePermissionDenied, Message: fmt.Sprintf(
			"%s is deployment-wide: only a token of the root tenant may call it (docs/tenants.md)", name)})
	}
	req := m.newReq()
	if err := decode(req); err != nil {
		e, _ := toAPIError(err)
		return refuse(e)
	}
	if e := checkText(req.ProtoReflect()); e != nil {
		return refuse(e)
	}
	if e := s.openRequestCursor(m, name, p, req); e != nil {
		return refuse(e)
	}
	if bound && !(name == "commands.create" && nodeField(name, req) == "" && req.(*apiv1.CreateCommandsRequest).GetPool() == "") {
		resources, err := s.requestResources(ctx, p, name, req)
		if err != nil {
			return nil, err
		}
		for _, res := range resources {
			if err := s.decide(ctx, decision{p: p, addr: addr, action: name, res: res, req: req, read: !m.mutating}); err != nil {
				if e, ok := err.(*Error); ok {
					return refuse(e)
				}
				return nil, err
			}
		}
	}
	if m.mutating {
		ctx = withAuditNotes(ctx)
	}
	resp, err := m.call(ctx, p, req)
	if m.mutating {
		outcome := "ok"
		if err != nil {
			e, _ := toAPIError(err)
			outcome = e.Code
		}
		s.audit(ctx, p, name, resourceOf(req), outcome, addr, req)
	}
	if err != nil {
		return nil, err
	}
	if m.mutating {
		s.feed.Notify() // it may have written events: the stream reads now
	}
	s.sealResponseCursor(m, name, p, resp)
	return resp, nil
}

// allows reports whether role may call API method name (its least role in
// api.proto's table).
func (s *Server) allows(role, name string) bool {
	m := s.methods[name]
	return m != nil && iam.Allows(role, m.role)
}

// unauthenticatedReason names why Authenticate refused a caller, as the
// reason label of bettercompute_api_unauthenticated_total; "" when err is
// not about the caller's token (the store failed).
func unauthenticatedReason(err error) string {
	switch {
	case errors.Is(err, iam.ErrNoToken):
		return "no_token"
	case errors.Is(err, iam.ErrUnknownToken):
		return "unknown_token"
	case errors.Is(err, iam.ErrTokenExpired):
		return "expired"
	case errors.Is(err, iam.ErrTokenRevoked):
		return "revoked"
	case errors.Is(err, iam.ErrAddressDenied):
		return "address_denied"
	case errors.Is(err, iam.ErrTenantStopped):
		return "tenant_stopped"
	}
	return ""
}

// auditOutcome is the audit row's outcome for a refusal: "denied" for a
// role or header refusal (as before), else the error's code.
func auditOutcome(e *Error) string {
	if e.Code == apiv1.CodePermissionDenied {
		return "denied"
	}
	return e.Code
}

// bearerToken returns the token of an "Authorization: Bearer <token>"
// header (the scheme is case-insensitive, RFC 9110 §11.1); any other form
// gives "".
func bearerToken(r *http.Request) string {
	scheme, token, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// decode reads a protojson body; an empty body is an empty request.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, req proto.Message) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return invalid("", "request body over %d bytes", MaxBodyBytes)
		case isTimeout(err):
			return invalid("", "the request body did not arrive within %s (host.limits.bodyReadTimeout)", s.cfg.BodyReadTimeout)
		}
		return invalid("", "read body: %v", err)
	}
	// The whole body is in: the call itself may take longer than the
	// body's deadline (bodyDeadline).
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	if err := unmarshal.Unmarshal(body, req); err != nil {
		msg := strings.TrimPrefix(err.Error(), "proto: ")
		if m := unknownFieldRE.FindStringSubmatch(msg); m != nil {
			return invalid(m[1], "unknown field %q", m[1])
		}
		return invalid(fieldOf(msg), "malformed JSON body: %s", msg)
	}
	return nil
}

// fieldOf finds a field name in a protojson error ("invalid value for
// string field name: ...").
var fieldRE = regexp.MustCompile(`field (\w+)`)

func fieldOf(msg string) string {
	if m := fieldRE.FindStringSubmatch(msg); m != nil {
		return m[1]
	}
	return ""
}

// writeError writes the JSON error body with its status.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e, known := toAPIError(err)
	if !known {
		s.log.ErrorContext(r.Context(), "API call failed", "path", r.URL.Path, logkey.Err, err)
	}
	w.Header().Set("Content-Type", "application/json")
	if e.Code == apiv1.CodeResourceExhausted {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterSeconds(e.RetryAfter)))
	}
	w.WriteHeader(e.status())
	_ = json.NewEncoder(w).Encode(struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field,omitempty"`
	}{e.Code, e.Message, e.Field})
}

// retryAfterSeconds is d in whole seconds for Retry-After (RFC 9110
// §10.2.3), rounded up, at least 1.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}

// resourceOf names the object a request addresses, for the audit log.
func resourceOf(req proto.Message) string {
	fields := req.ProtoReflect().Descriptor().Fields()
	for _, name := range []string{"id", "node_id", "node", "name", "pool", "sink"} {
		if f := fields.ByName(protoreflect.Name(name)); f != nil {
			if v := req.ProtoReflect().Get(f); v.IsValid() {
				if s := v.String(); s != "" && !strings.HasPrefix(s, "<") {
					return s
				}
			}
		}
	}
	return ""
}

// audit records a call. Secrets never reach the log: bodies are recorded
// by digest only, and that digest is taken with every password field
// cleared (bmc.setCredentials), so it cannot confirm a guessed password.
func (s *Server) audit(ctx context.Context, p *iam.Principal, action, resource, outcome string, addr any, req proto.Message) {
	var details []byte
	if req != nil {
		b, _ := marshal.Marshal(withoutSecrets(req))
		sum := sha256.Sum256(b)
		d := auditNotesOf(ctx)
		d["request_sha256"] = fmt.Sprintf("%x", sum)
		details, _ = json.Marshal(d)
	}
	e := &store.AuditEntry{Actor: p.Identity(), Action: action, Resource: resource, Outcome: outcome, TenantID: p.TenantID,
		SourceIP: fmt.Sprint(addr), Details: details}
	if _, err := s.store.AuditInsert(context.WithoutCancel(ctx), e); err != nil {
		s.log.ErrorContext(ctx, "Audit write failed", "action", action, logkey.Err, err)
	}
}

type auditNotesKey struct{}

// withAuditNotes gives a mutating call's handler a place for what its
// audit row should say besides the request's digest (noteAudit).
func withAuditNotes(ctx context.Context) context.Context {
	return context.WithValue(ctx, auditNotesKey{}, map[string]string{})
}

// noteAudit adds key: value to the details of the call's audit row (a
// policy apply's diff); outside a mutating call it does nothing.
func noteAudit(ctx context.Context, key, value string) {
	if m, ok := ctx.Value(auditNotesKey{}).(map[string]string); ok {
		m[key] = value
	}
}

// auditNotesOf is a copy of the call's notes.
func auditNotesOf(ctx context.Context) map[string]string {
	m, _ := ctx.Value(auditNotesKey{}).(map[string]string)
	if m == nil {
		return map[string]string{}
	}
	return maps.Clone(m)
}

// logger returns a logger that never is nil.
func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
