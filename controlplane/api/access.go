package api

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/policy"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// Access requests (docs/access.md): a caller asks for a requestable policy
// of its tenant for a time; a caller the policy's approvers bind, never the
// requester, approves; the grant ends by itself. Who may ask, approve and
// revoke is the policy's request block's to say: every access.* method is
// a viewer's.

// MaxAccessReason bounds an access request's reason, and a denial's or
// revocation's, in bytes: 1 KiB.
const MaxAccessReason = 1 << 10

// AccessSweepEvery is how often each api process stores the access
// requests that expired (an approved one's end passed, a pending one 24 h
// undecided), writing access.ended (store.AccessStore.AccessRequestSweep).
const AccessSweepEvery = PolicyRefresh

// accessRequest asks for a requestable policy of the caller's tenant.
func (s *Server) accessRequest(ctx context.Context, p *iam.Principal, r *apiv1.RequestAccessRequest) (*apiv1.AccessRequest, error) {
	if r.GetPolicy() == "" {
		return nil, invalid("policy", "is required: the name of a requestable policy of your tenant (policy get shows them)")
	}
	rule, err := s.requestable(ctx, p.TenantID, r.GetPolicy(), "policy")
	if err != nil {
		return nil, err
	}
	if !rule.Requester(principalOf(p)) {
		return nil, &Error{Code: apiv1.CodePermissionDenied, Field: "policy", Message: fmt.Sprintf(
			"policy %q's request.requesters do not bind you (%s, role %s): only those it names may ask for it", r.GetPolicy(), p.Identity(), p.Role)}
	}
	d := r.GetDuration()
	switch {
	case d == nil:
		return nil, invalid("duration", "is required: how long the access lasts once approved (%v to %v for policy %q)",
			policy.MinRequestDuration, rule.MaxDuration(), r.GetPolicy())
	case d.CheckValid() != nil || d.AsDuration() < policy.MinRequestDuration:
		return nil, invalid("duration", "must be at least %v", policy.MinRequestDuration)
	case d.AsDuration() > rule.MaxDuration():
		return nil, invalid("duration", "%v is more than policy %q's request.maxDuration, %v", d.AsDuration(), r.GetPolicy(), rule.MaxDuration())
	}
	reason := strings.TrimSpace(r.GetReason())
	switch {
	case reason == "":
		return nil, invalid("reason", "is required: say why, for the approver and the audit log")
	case len(reason) > MaxAccessReason:
		return nil, invalid("reason", "is %d bytes, at most %d", len(reason), MaxAccessReason)
	}
	if e := checkPrintable("reason", reason); e != nil {
		return nil, e
	}
	scope, err := s.accessScope(ctx, p, r.GetResource())
	if err != nil {
		return nil, err
	}
	now := s.now()
	req, err := s.store.AccessRequestCreate(ctx, &store.AccessRequestCreateParams{TenantID: p.TenantID, Requester: p.Identity(),
		RequesterName: p.Name, RequesterRole: p.Role, Policy: r.GetPolicy(), ScopeKind: scope.kind, ScopeID: scope.id,
		ScopeName: scope.name, Duration: d.AsDuration(), Reason: reason, Now: &now})
	if errors.Is(err, store.ErrAccessPendingLimit) {
		return nil, exhausted(time.Minute, "%s has %d access requests pending, the most one may: wait for a decision, or revoke one (access revoke ID)",
			p.Identity(), store.MaxPendingAccessRequests)
	}
	if err != nil {
		return nil, err
	}
	noteAudit(ctx, "requestId", req.ID)
	noteAudit(ctx, "policy", req.Policy)
	return accessOut(req), nil
}

// accessList pages the requests of the caller's subtree.
func (s *Server) accessList(ctx context.Context, p *iam.Principal, r *apiv1.ListAccessRequestsRequest) (*apiv1.ListAccessRequestsResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	if st := r.GetState(); st != "" && !slices.Contains(store.AccessStates, st) {
		return nil, invalid("state", "%q: want one of %s", truncate(st, 64), strings.Join(store.AccessStates, ", "))
	}
	lp.Within = within(p)
	now := s.now()
	q := &store.AccessRequestListParams{ListParams: lp, State: r.GetState(), Now: &now}
	if r.GetMine() {
		q.Requester = p.Identity()
	}
	rs, err := s.store.AccessRequestList(ctx, q)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListAccessRequestsResponse{NextCursor: next(rs, lp, func(x *store.AccessRequest) string { return x.ID })}
	for _, x := range rs {
		out.Requests = append(out.Requests, accessOut(x))
	}
	return out, nil
}

// accessApprove approves a pending request.
func (s *Server) accessApprove(ctx context.Context, p *iam.Principal, r *apiv1.ApproveAccessRequest) (*apiv1.AccessRequest, error) {
	return s.accessDecide(ctx, p, r.GetId(), true, "")
}

// accessDeny denies a pending request.
func (s *Server) accessDeny(ctx context.Context, p *iam.Principal, r *apiv1.DenyAccessRequest) (*apiv1.AccessRequest, error) {
	return s.accessDecide(ctx, p, r.GetId(), false, r.GetReason())
}

// accessDecide approves or denies request id for p: one of its tenant that
// the policy's approvers bind, never its requester.
func (s *Server) accessDecide(ctx context.Context, p *iam.Principal, reqID string, approve bool, note string) (*apiv1.AccessRequest, error) {
	verb := map[bool]string{true: "approve", false: "deny"}[approve]
	note = strings.TrimSpace(note)
	if len(note) > MaxAccessReason {
		return nil, invalid("reason", "is %d bytes, at most %d", len(note), MaxAccessReason)
	}
	if e := checkPrintable("reason", note); e != nil {
		return nil, e
	}
	req, err := s.accessGet(ctx, p, reqID)
	if err != nil {
		return nil, err
	}
	if req.Requester == p.Identity() {
		return nil, &Error{Code: apiv1.CodePermissionDenied, Field: "id", Message: fmt.Sprintf(
			"you (%s) asked for access request %s: a requester may not %s its own request; an approver that policy %q names must",
			p.Identity(), reqID, verb, req.Policy)}
	}
	if err := s.approver(ctx, p, req, verb); err != nil {
		return nil, err
	}
	now := s.now()
	out, err := s.store.AccessRequestDecide(ctx, &store.AccessRequestDecideParams{ID: reqID, Approve: approve, DecidedBy: p.Identity(),
		DecidedByName: p.Name, Note: note, Now: &now})
	if errors.Is(err, store.ErrConflict) {
		return nil, &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf("cannot %s: %s", verb, conflictOf(err))}
	}
	if err != nil {
		return nil, err
	}
	noteAudit(ctx, "requestId", out.ID)
	noteAudit(ctx, "requester", out.Requester)
	if approve {
		s.policies.grantsChanged() // this process decides by it at once; the others within PolicyRefresh
	}
	return accessOut(out), nil
}

// accessRevoke ends a pending or approved request: its requester gives it
// up, or an approver takes it away. The shells and tunnels it allowed
// close at this process's next check (now) and at the others' within
// PolicyRefresh.
func (s *Server) accessRevoke(ctx context.Context, p *iam.Principal, r *apiv1.RevokeAccessRequest) (*apiv1.AccessRequest, error) {
	note := strings.TrimSpace(r.GetReason())
	if len(note) > MaxAccessReason {
		return nil, invalid("reason", "is %d bytes, at most %d", len(note), MaxAccessReason)
	}
	if e := checkPrintable("reason", note); e != nil {
		return nil, e
	}
	req, err := s.accessGet(ctx, p, r.GetId())
	if err != nil {
		return nil, err
	}
	if req.Requester != p.Identity() {
		if err := s.approver(ctx, p, req, "revoke"); err != nil {
			if e, ok := err.(*Error); ok && e.Code == apiv1.CodePermissionDenied {
				e.Message = "only its requester or an approver may revoke an access request: " + e.Message
			}
			return nil, err
		}
	}
	now := s.now()
	out, err := s.store.AccessRequestRevoke(ctx, &store.AccessRequestRevokeParams{ID: req.ID, RevokedBy: p.Identity(), RevokedByName: p.Name,
		Note: note, Now: &now})
	if errors.Is(err, store.ErrConflict) {
		return nil, &Error{Code: apiv1.CodeConflict, Field: "id", Message: "cannot revoke: " + conflictOf(err)}
	}
	if err != nil {
		return nil, err
	}
	noteAudit(ctx, "requestId", out.ID)
	noteAudit(ctx, "requester", out.Requester)
	s.policies.grantsChanged()
	s.live.checkNow() // the tunnels it allowed close now
	return accessOut(out), nil
}

// conflictOf is the store's conflict message without its operation and
// sentinel: "access request acr_… is approved by token:…".
func conflictOf(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, "access request "); i >= 0 {
		msg = msg[i:]
	}
	return strings.TrimSuffix(msg, ": "+store.ErrConflict.Error())
}

// accessGet reads request id within p's subtree: another tenant's, like
// one that does not exist, is NOT_FOUND.
func (s *Server) accessGet(ctx context.Context, p *iam.Principal, reqID string) (*store.AccessRequest, error) {
	if err := id("id", reqID); err != nil {
		return nil, err
	}
	now := s.now()
	r, err := s.store.AccessRequestGet(ctx, reqID, &now)
	if err == nil {
		var ok bool
		if ok, err = s.sees(ctx, p, r.TenantID); err == nil && !ok {
			err = store.ErrNotFound
		}
	}
	return r, fieldNotFound(err, "id", "no access request "+reqID)
}

// approver refuses (PERMISSION_DENIED) p unless it may approve, deny or
// revoke (verb) req: a caller of the request's tenant that the policy's
// approvers bind (a tenant's policies bind its own tokens only). A policy
// no longer requestable has no approvers: CONFLICT.
func (s *Server) approver(ctx context.Context, p *iam.Principal, req *store.AccessRequest, verb string) error {
	rule, err := s.requestable(ctx, req.TenantID, req.Policy, "id")
	if e, ok := err.(*Error); ok && e.Code == apiv1.CodeInvalidArgument {
		return &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf(
			"policy %q of tenant %s is no longer requestable (it was removed or lost its request block), so it has no approvers: the request can only be revoked by its requester, or expire",
			req.Policy, req.TenantID)}
	}
	if err != nil {
		return err
	}
	if p.TenantID != req.TenantID || !rule.Approver(principalOf(p)) {
		return &Error{Code: apiv1.CodePermissionDenied, Field: "id", Message: fmt.Sprintf(
			"policy %q's request.approvers do not bind you (%s, role %s, tenant %s): only a caller of tenant %s that they name may %s access request %s",
			req.Policy, p.Identity(), p.Role, p.TenantID, req.TenantID, verb, req.ID)}
	}
	if verb == "approve" && req.Duration > rule.MaxDuration() {
		// The policy's maxDuration shrank since the request: an approval
		// never grants more than the policy allows now.
		return &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf(
			"access request %s asks for %v, more than policy %q's request.maxDuration now (%v): deny it and ask again",
			req.ID, req.Duration, req.Policy, rule.MaxDuration())}
	}
	return nil
}

// checkPrintable refuses control characters (but newline and tab) in a reason
// or note: they are shown in other people's terminals (access list).
func checkPrintable(field, s string) *Error {
	if i := strings.IndexFunc(s, func(r rune) bool {
		return (r < 0x20 && r != '\n' && r != '\t') || (r >= 0x7f && r <= 0x9f)
	}); i >= 0 {
		return invalid(field, "holds a control character at byte %d: only printable text, newlines and tabs", i)
	}
	return nil
}

// requestable returns tenant's requestable policy name, as the policies
// in force have it: INVALID_ARGUMENT on field when there is none.
func (s *Server) requestable(ctx context.Context, tenant, name, field string) (*policy.Requestable, error) {
	v, err := s.policies.current(ctx)
	if err != nil {
		return nil, &Error{Code: apiv1.CodeUnavailable, Message: err.Error()}
	}
	if err := v.broken[tenant]; err != nil {
		return nil, &Error{Code: apiv1.CodeConflict, Field: field, Message: fmt.Sprintf(
			"tenant %s's policies no longer compile (%v): an admin must apply them again (policy apply)", tenant, err)}
	}
	rule := v.Requestable(tenant, name)
	if rule == nil {
		return nil, invalid(field, "tenant %s has no requestable policy %q: no policy of that name has a request block (docs/access.md; policy get shows them)",
			tenant, truncate(name, 64))
	}
	return rule, nil
}

// scope is an access request's resource scope.
type scope struct{ kind, id, name string }

// accessScope resolves a request's resource ("pool:NAME_OR_ID",
// "site:NAME_OR_ID", "node:ID", "tenant:NAME_OR_ID") within p's subtree:
// one outside it, like one that does not exist, is NOT_FOUND. "" is no
// scope.
func (s *Server) accessScope(ctx context.Context, p *iam.Principal, v string) (scope, error) {
	if v == "" {
		return scope{}, nil
	}
	kind, name, ok := strings.Cut(v, ":")
	if !ok || name == "" {
		return scope{}, invalid("resource", "%q: want KIND:NAME_OR_ID, KIND one of pool, site, node, tenant (pool:gpu-a)", truncate(v, 64))
	}
	if err := id("resource", name); err != nil {
		return scope{}, err
	}
	missing := &Error{Code: apiv1.CodeNotFound, Field: "resource", Message: "no " + kind + " " + name}
	switch kind {
	case store.AccessScopePool:
		pool, err := s.store.PoolGet(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			return scope{}, missing
		}
		if err != nil {
			return scope{}, err
		}
		if ok, err := s.sees(ctx, p, pool.TenantID); err != nil || !ok {
			return scope{}, cmpErr(err, missing)
		}
		return scope{kind, pool.ID, name}, nil
	case store.AccessScopeSite:
		site, err := s.store.SiteGet(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			return scope{}, missing
		}
		if err != nil {
			return scope{}, err
		}
		if ok, err := s.sees(ctx, p, site.TenantID); err != nil || !ok {
			return scope{}, cmpErr(err, missing)
		}
		return scope{kind, site.ID, name}, nil
	case store.AccessScopeNode:
		n, err := s.node(ctx, p, name)
		if isNotFound(err) {
			return scope{}, missing
		}
		if err != nil {
			return scope{}, err
		}
		return scope{kind, n.ID, name}, nil
	case store.AccessScopeTenant:
		t, err := s.tenant(ctx, p, "resource", name)
		if isNotFound(err) {
			return scope{}, missing
		}
		if err != nil {
			return scope{}, err
		}
		return scope{kind, t.ID, name}, nil
	}
	return scope{}, invalid("resource", "kind %q: want pool, site, node or tenant", truncate(kind, 32))
}

// cmpErr is err when set, else missing.
func cmpErr(err error, missing *Error) error {
	if err != nil {
		return err
	}
	return missing
}

// accessOut is an access request as the API answers it.
func accessOut(r *store.AccessRequest) *apiv1.AccessRequest {
	out := &apiv1.AccessRequest{Id: r.ID, TenantId: r.TenantID, Requester: r.Requester, RequesterName: r.RequesterName,
		RequesterRole: r.RequesterRole, Policy: r.Policy, ResourceName: r.ScopeName, Duration: durationpb.New(r.Duration),
		Reason: r.Reason, State: r.State, CreateTime: timestamppb.New(r.CreatedAt), DecidedBy: r.DecidedBy,
		DecidedByName: r.DecidedByName, Note: r.Note}
	if r.ScopeKind != "" {
		out.Resource = r.ScopeKind + ":" + r.ScopeID
	}
	if r.DecidedAt != nil {
		out.DecideTime = timestamppb.New(*r.DecidedAt)
	}
	if r.Start != nil {
		out.Start = timestamppb.New(*r.Start)
	}
	if r.End != nil {
		out.End = timestamppb.New(*r.End)
	}
	return out
}

// sweepAccess stores the access requests that expired by now, writing
// access.ended for each (once, whichever process sweeps first), at most
// every AccessSweepEvery; checkLiveLoop calls it every round.
func (s *Server) sweepAccess(ctx context.Context, now time.Time) {
	if !s.accessSwept.IsZero() && now.Sub(s.accessSwept) < AccessSweepEvery {
		return
	}
	s.accessSwept = now
	swept, err := s.store.AccessRequestSweep(ctx, &now)
	if err != nil {
		if ctx.Err() == nil {
			s.log.WarnContext(ctx, "Cannot sweep expired access requests now", logkey.Err, err)
		}
		return
	}
	if len(swept) > 0 {
		s.feed.Notify()
		for _, r := range swept {
			s.log.InfoContext(ctx, "Access request ended", "request_id", r.ID, "policy", r.Policy, "requester", r.Requester)
		}
	}
}

// liveAccess is what a live tunnel opened on an access request's grant is
// checked against every round of checkLive: its actions are decided again
// for the principal it was opened with (a single sign-on person's token
// may be replaced since; the identity stays), and it closes when they are
// refused: the grant ended, was revoked, or no longer allows it.
type liveAccess struct {
	p      *iam.Principal
	kind   string
	asRoot bool
	// request and end are the grant that allowed it at the last check.
	request string
	end     time.Time
	// notify sends a shell's client one line (nil for a port forward,
	// whose bytes are the forwarded stream's).
	notify func(line string)
	// noticed is the end the client was told of; checkLive's goroutine
	// alone reads and writes it and the two above.
	noticed time.Time
}

// holdsGrants reports whether p holds grants, as the policies in force
// read them (their ends not compared); false when they cannot be read.
func (s *Server) holdsGrants(ctx context.Context, p *iam.Principal) bool {
	v, err := s.policies.current(ctx)
	return err == nil && len(v.grantsOf(p)) > 0
}

// grantsEnd is the earliest end of the grants p holds now (ok false when
// it holds none): a root command created while p holds grants runs no
// longer than the first of them (commandsCreate).
func (s *Server) grantsEnd(ctx context.Context, p *iam.Principal) (end time.Time, ok bool) {
	v, err := s.policies.current(ctx)
	if err != nil {
		return time.Time{}, false
	}
	now := s.now()
	for _, g := range v.grantsOf(p) {
		if now.Before(g.End) && (!ok || g.End.Before(end)) {
			end, ok = g.End, true
		}
	}
	return end, ok
}

// tunnelGrant decides a tunnel's actions (tunnelActions) for p from addr
// on nodeID at now, as opening it does, without the cache: the access
// request whose grant allowed one of them and its end ("" when none did:
// the tunnel rests on the caller's own rights), or the refusal.
func (s *Server) tunnelGrant(ctx context.Context, p *iam.Principal, addr netip.Addr, nodeID, kind string, asRoot bool) (string, time.Time, error) {
	v, err := s.policies.current(ctx)
	if err != nil {
		return "", time.Time{}, &Error{Code: apiv1.CodeUnavailable, Message: err.Error()}
	}
	grants := v.grantsOf(p)
	if len(grants) == 0 {
		return "", time.Time{}, s.decideOnNodes(context.WithValue(ctx, addrKey{}, addr), p, []string{nodeID}, tunnelActions(kind, asRoot)...)
	}
	if err := v.broken[p.TenantID]; err != nil {
		return "", time.Time{}, &Error{Code: apiv1.CodePermissionDenied, Message: fmt.Sprintf("tenant %s's policies no longer compile (%v)", p.TenantID, err)}
	}
	res, err := s.nodeResource(ctx, p, nodeID, nil)
	if err != nil {
		return "", time.Time{}, err
	}
	var grant string
	var end time.Time
	for _, a := range tunnelActions(kind, asRoot) {
		dec := v.Decide(policy.Input{Principal: principalOf(p), Action: a, Resource: res, SourceIP: addr, Time: s.now(), Grants: grants})
		if !dec.Allow {
			return "", time.Time{}, &Error{Code: apiv1.CodePermissionDenied, Message: fmt.Sprintf("%s on node %s refused now: %s", a, nodeID, dec.Reason)}
		}
		if dec.Grant != "" {
			for _, g := range grants {
				if g.ID == dec.Grant {
					grant, end = g.ID, g.End
				}
			}
		}
	}
	return grant, end, nil
}

// accessEnded checks a live tunnel opened on an access request's grant at
// now: why it may no longer stay open ("" while its actions are still
// allowed), and, within GrantNoticeBefore of the grant's end, tells a
// shell once per end.
func (s *Server) accessEnded(ctx context.Context, c *liveCall, now time.Time) string {
	a := c.access
	grant, end, err := s.tunnelGrant(ctx, a.p, c.addr, c.nodeID, a.kind, a.asRoot)
	if err == nil {
		if grant != "" {
			a.request, a.end = grant, end
			if a.notify != nil && end.Sub(now) <= GrantNoticeBefore && !end.Equal(a.noticed) {
				a.noticed = end
				a.notify(fmt.Sprintf("better-compute: access request %s ends at %s; this shell closes then",
					grant, end.UTC().Format(time.RFC3339)))
			}
		}
		return ""
	}
	var e *Error
	if !errors.As(err, &e) || e.Code != apiv1.CodePermissionDenied {
		return "" // the store failed: the next round tries again
	}
	r, gerr := s.store.AccessRequestGet(ctx, a.request, &now)
	switch {
	case gerr != nil:
	case r.State == store.AccessRevoked:
		return fmt.Sprintf("access ended: access request %s was revoked by %s at %s", r.ID, r.DecidedBy, r.DecidedAt.UTC().Format(time.RFC3339))
	case r.End != nil && !now.Before(*r.End):
		return fmt.Sprintf("access ended: access request %s ended at %s", r.ID, r.End.UTC().Format(time.RFC3339))
	}
	return "access ended: " + e.Message
}
