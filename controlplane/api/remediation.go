package api

import (
	"context"
	"errors"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// MaxRemediationNote bounds remediation.return's note.
const MaxRemediationNote = 512

// remediationStates are the states remediation.list filters on.
var remediationStates = append(slices.Clone(store.RemediationOpenStates), store.RemediationReturned)

func remediationOut(c *store.Remediation) *apiv1.Remediation {
	out := &apiv1.Remediation{Id: c.ID, NodeId: c.NodeID, PoolId: c.PoolID, State: c.State, Finding: c.Finding, Kind: c.Kind,
		Resolution: c.Resolution, Xid: int32(c.XID), XidMnemonic: c.XIDMnemonic, GpuUuid: c.GPUUUID, Message: c.Message,
		Action: c.Action, Attempts: int32(c.Attempts), CommandId: c.CommandID, CommandIds: c.CommandIDs, Paused: c.Paused,
		Reason: c.Reason, StateTime: timestamppb.New(c.StateSince), CreateTime: timestamppb.New(c.CreatedAt),
		UpdateTime: timestamppb.New(c.UpdatedAt)}
	if c.ClosedAt != nil {
		out.CloseTime = timestamppb.New(*c.ClosedAt)
	}
	return out
}

func breakerOut(b *store.RemediationBreaker) *apiv1.RemediationBreaker {
	out := &apiv1.RemediationBreaker{PoolId: b.PoolID, Tripped: b.TrippedAt != nil, ResetBy: b.ResetBy}
	if b.TrippedAt != nil {
		out.TripTime = timestamppb.New(*b.TrippedAt)
	}
	if b.ResetAt != nil {
		out.ResetTime = timestamppb.New(*b.ResetAt)
	}
	return out
}

// remediationNotFound names the id field for a missing case.
func remediationNotFound(err error, caseID string) error {
	return fieldNotFound(err, "id", "no open remediation "+caseID)
}

func (s *Server) remediationList(ctx context.Context, _ *iam.Principal, r *apiv1.ListRemediationsRequest) (*apiv1.ListRemediationsResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	q := store.RemediationListParams{ListParams: lp, NodeID: r.GetNodeId(), State: r.GetState(), OpenOnly: r.GetOpenOnly()}
	if q.State != "" && !slices.Contains(remediationStates, q.State) {
		return nil, invalid("state", "must be one of %s", strings.Join(remediationStates, ", "))
	}
	if q.NodeID != "" {
		if err := id("nodeId", q.NodeID); err != nil {
			return nil, err
		}
	}
	if r.GetPool() != "" {
		pool, err := s.resolvePool(ctx, "pool", r.GetPool())
		if err != nil {
			return nil, err
		}
		q.PoolID = pool.ID
	}
	cs, err := s.store.RemediationList(ctx, &q)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListRemediationsResponse{NextCursor: next(cs, lp, func(c *store.Remediation) string { return c.ID })}
	for _, c := range cs {
		out.Remediations = append(out.Remediations, remediationOut(c))
	}
	return out, nil
}

func (s *Server) remediationGet(ctx context.Context, _ *iam.Principal, r *apiv1.RemediationRequest) (*apiv1.Remediation, error) {
	if err := id("id", r.GetId()); err != nil {
		return nil, err
	}
	c, err := s.store.RemediationGet(ctx, r.GetId())
	if err != nil {
		return nil, fieldNotFound(err, "id", "no remediation "+r.GetId())
	}
	return remediationOut(c), nil
}

// remediationPause returns the method that pauses (or resumes) a case.
func (s *Server) remediationPause(paused bool) func(context.Context, *iam.Principal, *apiv1.RemediationRequest) (*apiv1.Remediation, error) {
	return func(ctx context.Context, p *iam.Principal, r *apiv1.RemediationRequest) (*apiv1.Remediation, error) {
		if err := id("id", r.GetId()); err != nil {
			return nil, err
		}
		c, err := s.store.RemediationSetPaused(ctx, r.GetId(), paused, "token:"+p.TokenID)
		if err != nil {
			return nil, remediationNotFound(err, r.GetId())
		}
		return remediationOut(c), nil
	}
}

// remediationReturn puts the node back in service and closes the case:
// its current command cancelled, the node uncordoned and its hold
// released, in one transaction.
func (s *Server) remediationReturn(ctx context.Context, p *iam.Principal, r *apiv1.ReturnRemediationRequest) (*apiv1.Remediation, error) {
	if err := id("id", r.GetId()); err != nil {
		return nil, err
	}
	if len(r.GetNote()) > MaxRemediationNote || !utf8.ValidString(r.GetNote()) {
		return nil, invalid("note", "must be at most %d characters of UTF-8", MaxRemediationNote)
	}
	var out *store.Remediation
	err := s.store.Tx(ctx, func(tx store.Store) error {
		c, err := tx.RemediationGet(ctx, r.GetId())
		if err != nil {
			return remediationNotFound(err, r.GetId())
		}
		if c.ClosedAt != nil {
			return &Error{Code: apiv1.CodeConflict, Field: "id", Message: "remediation " + c.ID + " is closed already"}
		}
		if c.CommandID != "" {
			if _, err := tx.CommandRequestCancel(ctx, c.CommandID); err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
		if err := tx.NodeSetCordoned(ctx, c.NodeID, false); err != nil {
			return err
		}
		if err := tx.DisruptionRelease(ctx, c.NodeID, "remediation:"+c.ID); err != nil {
			return err
		}
		reason := "returned by an operator"
		if r.GetNote() != "" {
			reason += ": " + r.GetNote()
		}
		out, err = tx.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationReturned,
			ClearCommand: true, Reason: reason, Actor: "token:" + p.TokenID})
		return remediationNotFound(err, r.GetId())
	})
	if err != nil {
		return nil, err
	}
	return remediationOut(out), nil
}

func (s *Server) remediationResetBreaker(ctx context.Context, p *iam.Principal, r *apiv1.ResetBreakerRequest) (*apiv1.RemediationBreaker, error) {
	pool, err := s.resolvePool(ctx, "pool", r.GetPool())
	if err != nil {
		return nil, err
	}
	b, err := s.store.RemediationBreakerReset(ctx, pool.ID, "token:"+p.TokenID, nil)
	if err != nil {
		return nil, fieldNotFound(err, "pool", "no pool "+r.GetPool())
	}
	return breakerOut(b), nil
}

func (s *Server) remediationBreakers(ctx context.Context, _ *iam.Principal, _ *apiv1.ListBreakersRequest) (*apiv1.ListBreakersResponse, error) {
	bs, err := s.store.RemediationBreakers(ctx)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListBreakersResponse{}
	for _, b := range bs {
		out.Breakers = append(out.Breakers, breakerOut(b))
	}
	return out, nil
}
