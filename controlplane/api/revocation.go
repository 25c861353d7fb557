package api

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
)

// DefaultRevocationCheck is how often an api process checks the calls it
// holds open (event streams, tunnels) against the database
// (Config.RevocationCheck): a revocation made by any process ends them
// within this, plus one read, which is well within the 5 s issue 27 asks
// for. A revocation made through this process is checked at once.
const DefaultRevocationCheck = time.Second

// RevokedError is the cause a long-lived call's context ends with when
// the credential it was opened with, or the node it reaches, no longer
// holds: the API token was revoked, deleted or expired, or the node was
// revoked or deleted. Its text is the one line the client is shown.
type RevokedError struct{ Reason string }

func (e *RevokedError) Error() string { return e.Reason }

// revokedCause returns the RevokedError that ended ctx, or nil.
func revokedCause(ctx context.Context) *RevokedError {
	var re *RevokedError
	if errors.As(context.Cause(ctx), &re) {
		return re
	}
	return nil
}

// liveCall is one call an api process holds open: the token and address
// that authenticated it and, for a tunnel, the node it reaches.
type liveCall struct {
	// tokenHash is the SHA-256 of the caller's token (iam.Hash): a bearer
	// token's, or the one a fleet page session was opened with.
	tokenHash [32]byte
	addr      netip.Addr
	tokenID   string
	nodeID    string
	// grant is set when the call is a tunnel to a node outside the
	// caller's subtree that a reservation's grant opened: it ends when no
	// grant gives it any more.
	grant *liveGrant
	// caller is set for a tunnel a token of a tenant other than the root
	// opened on a node of its subtree: it ends when the node (or its pool)
	// moves out of that subtree (subtreeLeft).
	caller *iam.Principal
	// access is set for a tunnel an access request's grant allowed: it
	// ends when its actions are refused again (accessEnded).
	access *liveAccess
	cancel context.CancelCauseFunc
}

// liveCalls are the calls of this process that outlive one request
// (issue 27, "Revoking ends what was opened"). Server.checkLiveLoop checks
// them against the store, so a revocation made by another api process (or
// by the CLI on the database) ends them too: the database is the only
// source of truth, and no process is told anything.
type liveCalls struct {
	mu    sync.Mutex
	next  uint64
	calls map[uint64]*liveCall
	// now asks the loop to check at once (a revocation in this process).
	now chan struct{}
}

func newLiveCalls() *liveCalls {
	return &liveCalls{calls: map[uint64]*liveCall{}, now: make(chan struct{}, 1)}
}

// add registers c until the returned function is called.
func (l *liveCalls) add(c *liveCall) (remove func()) {
	l.mu.Lock()
	l.next++
	id := l.next
	l.calls[id] = c
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		delete(l.calls, id)
		l.mu.Unlock()
	}
}

func (l *liveCalls) snapshot() []*liveCall {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*liveCall, 0, len(l.calls))
	for _, c := range l.calls {
		out = append(out, c)
	}
	return out
}

// checkNow wakes the loop (coalesced).
func (l *liveCalls) checkNow() {
	select {
	case l.now <- struct{}{}:
	default:
	}
}

// checkLiveLoop checks the live calls every Config.RevocationCheck and
// when checkNow asks, and sweeps the expired access requests
// (sweepAccess), until ctx ends.
func (s *Server) checkLiveLoop(ctx context.Context) {
	t := time.NewTicker(cmpDuration(s.cfg.RevocationCheck, DefaultRevocationCheck))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.live.now:
		}
		s.checkLive(ctx)
		s.sweepAccess(ctx, s.now())
	}
}

// checkLive ends each live call whose token or node no longer holds, or
// whose reservation grant or access request's grant ended (and tells a
// granted shell a minute before its end). Each token, node and node's
// grants are read once a round, and only while a call holds them; a
// tunnel an access request allowed is decided again each round. A store
// that fails leaves the calls open until the next round.
func (s *Server) checkLive(ctx context.Context) {
	calls := s.live.snapshot()
	type tokenKey struct {
		token [32]byte
		addr  netip.Addr
	}
	tokens := map[tokenKey]string{} // "" holds
	nodes := map[string]string{}
	grants := map[string][]*store.ReservationGrant{}
	left := map[string]string{} // by caller's subtree and node
	now := s.now()
	for _, c := range calls {
		k := tokenKey{c.tokenHash, c.addr}
		reason, seen := tokens[k]
		if !seen {
			reason = s.tokenEnded(ctx, c)
			tokens[k] = reason
		}
		if reason == "" && c.nodeID != "" {
			if reason, seen = nodes[c.nodeID]; !seen {
				reason = s.nodeEnded(ctx, c.nodeID)
				nodes[c.nodeID] = reason
			}
		}
		if reason == "" && c.grant == nil && c.caller != nil && within(c.caller) != "" && c.nodeID != "" {
			k := within(c.caller) + " " + c.nodeID
			if reason, seen = left[k]; !seen {
				reason = s.subtreeLeft(ctx, c)
				left[k] = reason
			}
		}
		if reason == "" && c.grant != nil {
			gs, seen := grants[c.nodeID]
			if !seen {
				var err error
				if gs, err = s.store.ReservationGrantsOn(ctx, c.nodeID, &now); err != nil {
					if ctx.Err() == nil {
						s.log.WarnContext(ctx, "Cannot check the grants of open tunnels now", logkey.NodeID, c.nodeID, logkey.Err, err)
					}
					continue
				}
				grants[c.nodeID] = gs
			}
			reason = s.grantEnded(ctx, c, gs, now)
		}
		if reason == "" && c.access != nil {
			reason = s.accessEnded(ctx, c, now)
		}
		if reason != "" {
			c.cancel(&RevokedError{Reason: reason})
		}
	}
}

// subtreeLeft is why c, a tunnel of a tenant's token (not the root's) on a
// node of its subtree, no longer holds: the node or its pool was moved to
// a tenant outside that subtree (nodes move, pools move; docs/tenants.md).
// "" while it holds, and when the node cannot be read now (the next round
// tries again).
func (s *Server) subtreeLeft(ctx context.Context, c *liveCall) string {
	_, err := s.node(ctx, c.caller, c.nodeID)
	if err != nil && isNotFound(err) {
		return fmt.Sprintf("access ended: node %s is no longer in tenant %s's subtree (it was moved)", c.nodeID, c.caller.TenantID)
	}
	return ""
}

// tokenEnded is why c's token no longer holds, or "".
func (s *Server) tokenEnded(ctx context.Context, c *liveCall) string {
	_, err := s.auth.RecheckHash(ctx, c.tokenHash, c.addr)
	var session *iam.SessionTokenExpired
	switch {
	case err == nil:
		return ""
	case errors.As(err, &session):
		return s.sessionEnded(ctx, session)
	case errors.Is(err, iam.ErrTokenExpired):
		return fmt.Sprintf("credential expired: API token %s expired", c.tokenID)
	case errors.Is(err, iam.ErrTenantStopped):
		return fmt.Sprintf("credential revoked: the tenant of API token %s is suspended or deleted", c.tokenID)
	case errors.Is(err, iam.ErrAddressDenied):
		return fmt.Sprintf("credential revoked: API token %s is not allowed from %s", c.tokenID, c.addr)
	case iam.IsRefusal(err): // revoked, or deleted
		return fmt.Sprintf("credential revoked: API token %s was revoked", c.tokenID)
	}
	if ctx.Err() == nil {
		s.log.WarnContext(ctx, "Cannot check the token of open calls now", "token", c.tokenID, logkey.Err, err)
	}
	return ""
}

// sessionEnded is why a call opened with a single sign-on session's token,
// expired since (the client refreshes it), may no longer stay open: its
// session ended (signed out, refused at a refresh, its rights changed) or
// its sessionTTL passed. "" while the session lives (docs/sso.md).
func (s *Server) sessionEnded(ctx context.Context, e *iam.SessionTokenExpired) string {
	sess, err := s.store.OIDCSessionGet(ctx, e.SessionID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Sprintf("credential revoked: the sign-in of token %s ended", e.TokenID)
	case err != nil:
		if ctx.Err() == nil {
			s.log.WarnContext(ctx, "Cannot check the session of open calls now", "session_id", e.SessionID, logkey.Err, err)
		}
		return ""
	case sess.EndedAt != nil:
		return fmt.Sprintf("credential revoked: signed out (%s)", sess.EndReason)
	case !sess.Live(s.now()):
		return "credential expired: the sign-in's time ended (iam.oidc.sessionTTL): run login again"
	}
	stopped, err := s.store.TenantsStopped(ctx)
	if err != nil {
		return "" // the next round tries again
	}
	if slices.Contains(stopped, sess.TenantID) {
		return fmt.Sprintf("credential revoked: tenant %s is suspended or deleted", sess.TenantID)
	}
	if s.cfg.SSO == nil {
		return "credential expired: single sign-on is no longer configured (iam.oidc)"
	}
	// The client does not refresh while it sits in a shell: the control
	// plane asks the provider itself, once a tokenTTL.
	reason, err := s.cfg.SSO.Revalidate(ctx, sess.ID)
	if err != nil {
		if ctx.Err() == nil {
			s.log.WarnContext(ctx, "Cannot revalidate the session of open calls now", "session_id", sess.ID, logkey.Err, err)
		}
		return ""
	}
	if reason != "" {
		return "credential revoked: " + reason
	}
	return ""
}

// nodeEnded is why a tunnel to node may no longer stay open (the node was
// deleted, or its current certificate revoked), or "".
func (s *Server) nodeEnded(ctx context.Context, nodeID string) string {
	n, err := s.store.NodeGet(ctx, nodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return fmt.Sprintf("credential revoked: node %s was deleted", nodeID)
	case err != nil:
		if ctx.Err() == nil {
			s.log.WarnContext(ctx, "Cannot check the node of open tunnels now", logkey.NodeID, nodeID, logkey.Err, err)
		}
		return ""
	case n.CertSerial == "":
		return ""
	}
	revoked, err := s.store.RevocationCheck(ctx, n.CertSerial)
	if err != nil {
		if ctx.Err() == nil {
			s.log.WarnContext(ctx, "Cannot check the node of open tunnels now", logkey.NodeID, nodeID, logkey.Err, err)
		}
		return ""
	}
	if revoked {
		return fmt.Sprintf("credential revoked: node %s was revoked", nodeID)
	}
	return ""
}
