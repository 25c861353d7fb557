package store

import (
	"context"
	"errors"
	"time"
)

// Access request states (migration 0034_access_requests, docs/access.md).
// A request is pending until an approver approves or denies it; an
// approved request grants its policy from its start to its end. The
// requester or an approver may revoke a pending or approved one. A
// pending request not decided within AccessPendingTTL, and an approved one
// whose end passed, are expired: reads say so at once, and the sweep
// (AccessRequestSweep) stores it and writes access.ended.
const (
	AccessPending  = "pending"
	AccessApproved = "approved"
	AccessDenied   = "denied"
	AccessRevoked  = "revoked"
	AccessExpired  = "expired"
)

// AccessStates are the states, in the order a request may pass them.
var AccessStates = []string{AccessPending, AccessApproved, AccessDenied, AccessRevoked, AccessExpired}

// AccessPendingTTL is how long a request waits for a decision before it
// expires: 24 hours.
const AccessPendingTTL = 24 * time.Hour

// MaxPendingAccessRequests bounds the pending requests of one identity
// (AccessRequestCreate): 20.
const MaxPendingAccessRequests = 20

// ErrAccessPendingLimit is AccessRequestCreate's refusal of a request by
// an identity that has MaxPendingAccessRequests pending already.
var ErrAccessPendingLimit = errors.New("too many pending access requests")

// Kinds of an access request's resource scope.
const (
	AccessScopePool   = "pool"
	AccessScopeSite   = "site"
	AccessScopeNode   = "node"
	AccessScopeTenant = "tenant"
)

// AccessRequest is a person's or a token's request for a requestable
// policy of its tenant, for a time, with a reason (docs/access.md).
type AccessRequest struct {
	// ID is "acr_" and 26 base32 characters (NewID).
	ID string
	// TenantID is the requester's tenant: the request lives there, and
	// the policy is that tenant's.
	TenantID string
	// Requester is the requester's identity (iam.Principal.Identity:
	// "user:<subject>" or "token:<id>"), RequesterName how it is shown
	// and RequesterRole its built-in role when it asked.
	Requester, RequesterName, RequesterRole string
	// Policy names the requested policy.
	Policy string
	// ScopeKind, when set, is one of AccessScopePool, AccessScopeSite,
	// AccessScopeNode or AccessScopeTenant: the grant allows on that
	// resource only, ScopeID (its id) and ScopeName (its name as asked).
	ScopeKind, ScopeID, ScopeName string
	// Duration is how long the access lasts once approved.
	Duration time.Duration
	// Reason is the requester's, at most 1 KiB.
	Reason string
	// State is one of AccessStates, as of the read: a pending request
	// older than AccessPendingTTL, or an approved one whose End passed,
	// reads AccessExpired.
	State     string
	CreatedAt time.Time
	// DecidedAt and DecidedBy (an identity) and DecidedByName say who
	// approved, denied or revoked it, and when; nil and "" while pending
	// or expired undecided.
	DecidedAt     *time.Time
	DecidedBy     string
	DecidedByName string
	// Start and End bound the access of an approved request (from the
	// approval for Duration); nil before.
	Start, End *time.Time
	// Note is the denial's or revocation's reason.
	Note string
}

// Active reports whether r grants its policy at now: approved, and now
// within [Start, End).
func (r *AccessRequest) Active(now time.Time) bool {
	return r.State == AccessApproved && r.Start != nil && r.End != nil && !now.Before(*r.Start) && now.Before(*r.End)
}

// AccessRequestCreateParams is a new pending request.
type AccessRequestCreateParams struct {
	// ID, when empty, is a NewID("acr").
	ID                                      string
	TenantID                                string
	Requester, RequesterName, RequesterRole string
	Policy                                  string
	ScopeKind, ScopeID, ScopeName           string
	Duration                                time.Duration
	Reason                                  string
	// Now is the request's time; nil means the database's clock.
	Now *time.Time
}

// AccessRequestListParams filter AccessRequestList. Every filter is
// optional.
type AccessRequestListParams struct {
	ListParams
	// TenantID, when set, lists that tenant's requests only (ListParams.
	// Within lists a subtree's).
	TenantID string
	// State, when set, lists requests in that state as of Now (expired
	// ones included, however stored).
	State string
	// Requester, when set, lists that identity's requests only.
	Requester string
	// Now is the time states are read at; nil means the database's clock.
	Now *time.Time
}

// AccessRequestDecideParams approve or deny a pending request.
type AccessRequestDecideParams struct {
	ID string
	// Approve approves the request (State approved, Start now, End now
	// plus its Duration); otherwise it is denied with Note.
	Approve bool
	// DecidedBy is the approver's identity, DecidedByName how it is shown.
	DecidedBy, DecidedByName string
	Note                     string
	Now                      *time.Time
}

// AccessRequestRevokeParams end a pending or approved request.
type AccessRequestRevokeParams struct {
	ID                       string
	RevokedBy, RevokedByName string
	Note                     string
	Now                      *time.Time
}

// AccessStore keeps access requests (docs/access.md).
type AccessStore interface {
	// AccessRequestCreate inserts a pending request and its
	// access.requested event. It is ErrAccessPendingLimit when the
	// requester has MaxPendingAccessRequests pending already (counted
	// under a lock on PostgreSQL, so two at once cannot pass it).
	AccessRequestCreate(ctx context.Context, p *AccessRequestCreateParams) (*AccessRequest, error)
	// AccessRequestGet returns a request, its state as of now (nil: the
	// database's clock): ErrNotFound when none has the id.
	AccessRequestGet(ctx context.Context, id string, now *time.Time) (*AccessRequest, error)
	// AccessRequestList pages requests in id order (the ids after
	// p.Cursor; ids are random, so this is not the order of time: the CLI
	// sorts what it read newest first), filtered by p.
	AccessRequestList(ctx context.Context, p *AccessRequestListParams) ([]*AccessRequest, error)
	// AccessRequestDecide approves or denies a pending request, in one
	// conditional write, with its access.approved or access.denied event:
	// of two deciders at once one wins and the other gets ErrConflict, as
	// does a request that is not pending (decided, revoked, expired) at
	// p.Now. ErrNotFound when none has the id.
	AccessRequestDecide(ctx context.Context, p *AccessRequestDecideParams) (*AccessRequest, error)
	// AccessRequestRevoke revokes a pending request, or an approved one
	// before its end, with access.revoked; ErrConflict otherwise,
	// ErrNotFound when none has the id.
	AccessRequestRevoke(ctx context.Context, p *AccessRequestRevokeParams) (*AccessRequest, error)
	// AccessGrantsActive returns the approved requests of every tenant
	// whose end is after now (nil: the database's clock), in one read of
	// an index: what every api process decides by.
	AccessGrantsActive(ctx context.Context, now *time.Time) ([]*AccessRequest, error)
	// AccessRequestSweep stores as expired the pending requests older
	// than AccessPendingTTL and the approved ones whose end is at or
	// before now, each with its access.ended event and an audit row
	// (actor "access", action access.ended), and returns them. Each is
	// swept once, however many processes sweep.
	AccessRequestSweep(ctx context.Context, now *time.Time) ([]*AccessRequest, error)
}
