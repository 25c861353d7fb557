package api

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// GrantNoticeBefore is how long before a granted access ends the shells
// it allowed are told so, in one line (docs/reservations.md, "Access
// from reservations").
const GrantNoticeBefore = time.Minute

// checkGrants checks reservations.create's grants: a subset of
// store.Grants, each at most once; the answer is sorted.
func checkGrants(grants []string) ([]string, error) {
	if len(grants) > len(store.Grants) {
		return nil, invalid("grants", "at most %d: %s", len(store.Grants), strings.Join(store.Grants, ", "))
	}
	out := make([]string, 0, len(grants))
	for _, g := range grants {
		switch {
		case !slices.Contains(store.Grants, g):
			return nil, invalid("grants", "unknown right %q: want some of %s", truncate(g, 64), strings.Join(store.Grants, ", "))
		case slices.Contains(out, g):
			return nil, invalid("grants", "%s is named twice", g)
		}
		out = append(out, g)
	}
	slices.Sort(out)
	return out, nil
}

// tunnelRight is the right a tunnel of kind needs on a node when it
// rests on a reservation's grant.
func tunnelRight(kind string) string {
	if kind == tunnel.KindPort {
		return store.GrantPortForward
	}
	return store.GrantShell
}

// grantFor picks, of the grants on a node now (store
// ReservationGrantsOn), the one that gives p right: p must hold an
// operator's role at least (a viewer gets nothing from a grant), the
// grant must name right, and its holder tenant must be p's own or in p's
// subtree (sees). nil when none does.
func grantFor(ctx context.Context, p *iam.Principal, grants []*store.ReservationGrant, right string,
	sees func(ctx context.Context, p *iam.Principal, tenantID string) (bool, error)) (*store.ReservationGrant, error) {
	if !iam.Allows(p.Role, store.RoleOperator) {
		return nil, nil
	}
	for _, g := range grants {
		if !slices.Contains(g.Grants, right) {
			continue
		}
		ok, err := sees(ctx, p, g.TenantID)
		if err != nil {
			return nil, err
		}
		if ok {
			return g, nil
		}
	}
	return nil, nil
}

// granted returns the reservation's grant that gives p right on nodeID
// at now, or nil: the database's answer (ReservationGrantsOn), read on
// every call.
func (s *Server) granted(ctx context.Context, p *iam.Principal, nodeID, right string, now time.Time) (*store.ReservationGrant, error) {
	if !iam.Allows(p.Role, store.RoleOperator) {
		return nil, nil
	}
	gs, err := s.store.ReservationGrantsOn(ctx, nodeID, &now)
	if err != nil {
		return nil, fmt.Errorf("read the grants on node %s: %w", nodeID, err)
	}
	return grantFor(ctx, p, gs, right, s.sees)
}

// nodeFor resolves nodeID for p to act on with right: a node of p's
// subtree (s.node), or else one that an open reservation grants p right
// on now; grant is that reservation's grant (nil when the node is p's
// own). A node neither is NOT_FOUND, as for s.node.
func (s *Server) nodeFor(ctx context.Context, p *iam.Principal, nodeID, right string) (n *store.Node, grant *store.ReservationGrant, err error) {
	n, err = s.node(ctx, p, nodeID)
	if err == nil || !isNotFound(err) || within(p) == "" {
		return n, nil, err
	}
	g, gerr := s.granted(ctx, p, nodeID, right, s.now())
	if gerr != nil {
		return nil, nil, gerr
	}
	if g == nil {
		return nil, nil, err
	}
	n, nerr := s.store.NodeGet(ctx, nodeID)
	if nerr != nil {
		return nil, nil, err
	}
	return n, g, nil
}

// liveGrant is what a live tunnel opened on a reservation's grant is
// checked against every round of checkLive: the caller, the right, and
// how to tell the client its end is near.
type liveGrant struct {
	p     *iam.Principal
	right string
	// notify sends the client one line (nil: the client cannot be told,
	// as through a port forward, whose bytes are the forwarded stream's).
	notify func(line string)
	// noticed is the end the client was told of (zero: none yet); only
	// checkLive's goroutine reads and writes it.
	noticed time.Time
}

// grantEnded checks a live call opened on a grant at now, with the
// node's grants gs: why it may no longer stay open ("" while a grant
// still gives it), and, within GrantNoticeBefore of the end, tells the
// client once per end.
func (s *Server) grantEnded(ctx context.Context, c *liveCall, gs []*store.ReservationGrant, now time.Time) string {
	g, err := grantFor(ctx, c.grant.p, gs, c.grant.right, s.sees)
	if err != nil {
		return "" // the next round tries again
	}
	if g == nil {
		return fmt.Sprintf("access ended: no reservation grants %s on node %s now (it ended, was cancelled, or its holder changed)",
			c.grant.right, c.nodeID)
	}
	if c.grant.notify != nil && g.End.Sub(now) <= GrantNoticeBefore && !g.End.Equal(c.grant.noticed) {
		c.grant.noticed = g.End
		c.grant.notify(fmt.Sprintf("better-compute: reservation %s ends at %s; this %s closes then (unless the reservation is extended: reservations extend %s, by its pool's owner)",
			g.ReservationID, g.End.UTC().Format(time.RFC3339), c.grant.right, g.ReservationID))
	}
	return ""
}

// grantRefusal is the refusal of a tunnel whose ticket rested on a grant
// that no longer holds when the ticket is used.
func grantRefusal(right, nodeID string) *Error {
	return &Error{Code: apiv1.CodePermissionDenied, Field: "node", Message: "no reservation grants " + right + " on node " + nodeID +
		" now: the access it gave ended (its window is over, it was cancelled, or the pool changed hands)"}
}

// nodeForAnyGrant is nodeFor for reading the node (nodes.get): a node of
// p's subtree, or one an open reservation grants p any right on now, so
// that the holder's CLI finds the node it opens a shell or a port forward
// on. A viewer reads only its subtree's nodes, as before.
func (s *Server) nodeForAnyGrant(ctx context.Context, p *iam.Principal, nodeID string) (*store.Node, error) {
	n, err := s.node(ctx, p, nodeID)
	if err == nil || !isNotFound(err) || within(p) == "" || !iam.Allows(p.Role, store.RoleOperator) {
		return n, err
	}
	now := s.now()
	gs, gerr := s.store.ReservationGrantsOn(ctx, nodeID, &now)
	if gerr != nil {
		return nil, fmt.Errorf("read the grants on node %s: %w", nodeID, gerr)
	}
	for _, right := range store.Grants {
		g, gerr := grantFor(ctx, p, gs, right, s.sees)
		if gerr != nil {
			return nil, gerr
		}
		if g != nil {
			if n, nerr := s.store.NodeGet(ctx, nodeID); nerr == nil {
				return n, nil
			}
			break
		}
	}
	return nil, err
}
