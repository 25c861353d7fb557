package api

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/remediationstats"
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

func (s *Server) remediationList(ctx context.Context, p *iam.Principal, r *apiv1.ListRemediationsRequest) (*apiv1.ListRemediationsResponse, error) {
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
		pool, err := s.pool(ctx, p, "pool", r.GetPool())
		if err != nil {
			return nil, err
		}
		q.PoolID = pool.ID
	}
	cs, err := s.store.RemediationList(ctx, &q)
	if err != nil {
		return nil, err
	}
	// A tenant's caller sees its subtree's pools' cases: a page may hold
	// fewer than the limit; the cursor follows the page read.
	out := &apiv1.ListRemediationsResponse{NextCursor: next(cs, lp, func(c *store.Remediation) string { return c.ID })}
	seen := s.poolsSeen(p)
	for _, c := range cs {
		if ok, err := seen(ctx, c.PoolID); err != nil {
			return nil, err
		} else if ok {
			out.Remediations = append(out.Remediations, remediationOut(c))
		}
	}
	return out, nil
}

func (s *Server) remediationGet(ctx context.Context, p *iam.Principal, r *apiv1.RemediationRequest) (*apiv1.Remediation, error) {
	if err := id("id", r.GetId()); err != nil {
		return nil, err
	}
	c, err := s.store.RemediationGet(ctx, r.GetId())
	if err == nil {
		err = s.poolSeen(ctx, p, c.PoolID) // another tenant's: as one that does not exist
	}
	if err != nil {
		return nil, fieldNotFound(err, "id", "no remediation "+r.GetId())
	}
	return remediationOut(c), nil
}

// remediationSeen answers NOT_FOUND for a case of a pool outside p's
// subtree (its pool, as remediation.get decides) or of a node whose pool
// now is (a change acts on the node: its return reboots it), as for one
// that does not exist, before a change is tried; a root caller's calls go
// on unchecked. nodes.move refuses a node with an open case, so the two
// pools differ only for a closed case, or a case opened while its node
// moved.
func (s *Server) remediationSeen(ctx context.Context, p *iam.Principal, id string) error {
	if within(p) == "" {
		return nil
	}
	c, err := s.store.RemediationGet(ctx, id)
	if err == nil {
		err = s.poolSeen(ctx, p, c.PoolID)
	}
	if err == nil {
		var n *store.Node
		if n, err = s.store.NodeGet(ctx, c.NodeID); err == nil && n.PoolID != c.PoolID {
			err = s.poolSeen(ctx, p, n.PoolID)
		}
	}
	return remediationNotFound(err, id)
}

// remediationPause returns the method that pauses (or resumes) a case.
func (s *Server) remediationPause(paused bool) func(context.Context, *iam.Principal, *apiv1.RemediationRequest) (*apiv1.Remediation, error) {
	return func(ctx context.Context, p *iam.Principal, r *apiv1.RemediationRequest) (*apiv1.Remediation, error) {
		if err := id("id", r.GetId()); err != nil {
			return nil, err
		}
		if err := s.remediationSeen(ctx, p, r.GetId()); err != nil {
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
	ways := 0
	for _, b := range []bool{r.GetResetGpu(), r.GetReboot(), r.GetForce()} {
		if b {
			ways++
		}
	}
	if ways > 1 {
		return nil, invalid("resetGpu", "give at most one of resetGpu (--reset-gpu), reboot (--reboot) and force (--force)")
	}
	if err := s.remediationSeen(ctx, p, r.GetId()); err != nil {
		return nil, err
	}
	var out *store.Remediation
	err := store.InTx(ctx, s.store, func(tx returnTx) error {
		c, err := tx.RemediationGet(ctx, r.GetId())
		if err != nil {
			return remediationNotFound(err, r.GetId())
		}
		if c.ClosedAt != nil {
			return &Error{Code: apiv1.CodeConflict, Field: "id", Message: "remediation " + c.ID + " is closed already"}
		}
		node, err := tx.NodeGet(ctx, c.NodeID)
		if err != nil {
			return err
		}
		actor := "token:" + p.TokenID
		bad, health := unhealthyGPU(node, c.GPUUUID)
		if r.GetResetGpu() || r.GetReboot() {
			return s.returnWithRepair(ctx, tx, c, r, bad, actor, &out)
		}
		if bad != "" && !r.GetForce() {
			return &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf("GPU %s of node %s still reads %s: "+
				"return refused; repair it first with --reset-gpu (reset the GPU, verify, then return) or --reboot "+
				"(reboot the node, verify, then return), or return it as it is with --force (recorded)", bad, c.NodeID, health)}
		}
		if c.CommandID != "" {
			if _, err := tx.CommandRequestCancel(ctx, c.CommandID); err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
		if err := tx.NodeSetCordoned(ctx, c.NodeID, false); err != nil {
			return err
		}
		if err := tx.DisruptionRelease(ctx, c.NodeID, store.RemediationOwner(c.ID)); err != nil {
			return err
		}
		reason := "returned by an operator"
		if bad != "" {
			reason = fmt.Sprintf("returned by an operator with --force while GPU %s read %s", bad, health)
		}
		if r.GetNote() != "" {
			reason += ": " + r.GetNote()
		}
		out, err = tx.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationReturned,
			ClearCommand: true, Reason: reason, Actor: actor})
		return remediationNotFound(err, r.GetId())
	})
	if err != nil {
		return nil, err
	}
	return remediationOut(out), nil
}

// returnWithRepair returns case c by way of a repair: the case goes back to
// draining with the operator's action (gpu.reset of its GPU, or of the
// one that reads failed or degraded, or reboot), its hold moved to
// draining, and the reconciler carries it out, verifies it and returns the
// node (docs/remediation.md, "A return that checks").
func (s *Server) returnWithRepair(ctx context.Context, tx returnTx, c *store.Remediation, r *apiv1.ReturnRemediationRequest,
	bad, actor string, out **store.Remediation) error {
	switch c.State {
	case store.RemediationDraining, store.RemediationRemediating, store.RemediationVerifying:
		return &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf("remediation %s is %s already: wait for it, "+
			"or pause it first (better-compute remediation pause %s)", c.ID, c.State, c.ID)}
	}
	action, what := config.ActionReboot, config.ActionReboot
	if r.GetResetGpu() {
		action = config.ActionGPUReset
		if c.GPUUUID == "" {
			c.GPUUUID = bad
		}
		if c.GPUUUID == "" {
			return &Error{Code: apiv1.CodeConflict, Field: "resetGpu", Message: fmt.Sprintf("remediation %s names no GPU and none of "+
				"node %s reads failed or degraded: nothing to reset (--reboot, or return it as it is)", c.ID, c.NodeID)}
		}
		what = "reset of GPU " + c.GPUUUID
	}
	a, err := tx.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: c.NodeID, Reason: store.DisruptionDraining,
		Owner: store.RemediationOwner(c.ID)})
	if err != nil {
		return err
	}
	if !a.Admitted {
		return &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf("node %s cannot be held for the %s: %s (held by %s)",
			c.NodeID, what, a.Refusal, a.Holder)}
	}
	if err := tx.NodeSetCordoned(ctx, c.NodeID, true); err != nil {
		return err
	}
	reason := fmt.Sprintf("return ordered by an operator after a %s: verified, then returned", what)
	if r.GetNote() != "" {
		reason += ": " + r.GetNote()
	}
	var err2 error
	*out, err2 = tx.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, From: []string{c.State}, To: store.RemediationDraining,
		Action: action, GPUUUID: c.GPUUUID, Attempts: new(int), ClearCommand: true, Reason: reason, Actor: actor})
	return remediationNotFound(err2, c.ID)
}

func (s *Server) remediationResetBreaker(ctx context.Context, p *iam.Principal, r *apiv1.ResetBreakerRequest) (*apiv1.RemediationBreaker, error) {
	pool, err := s.pool(ctx, p, "pool", r.GetPool())
	if err != nil {
		return nil, err
	}
	b, err := s.store.RemediationBreakerReset(ctx, pool.ID, "token:"+p.TokenID, nil)
	if err != nil {
		return nil, fieldNotFound(err, "pool", "no pool "+r.GetPool())
	}
	return breakerOut(b), nil
}

// remediationBreakers lists the breakers of the caller's subtree's pools.
func (s *Server) remediationBreakers(ctx context.Context, p *iam.Principal, _ *apiv1.ListBreakersRequest) (*apiv1.ListBreakersResponse, error) {
	bs, err := s.breakerStates(ctx)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListBreakersResponse{}
	seen := s.poolsSeen(p)
	for _, b := range bs {
		if ok, err := seen(ctx, b.PoolId); err != nil {
			return nil, err
		} else if ok {
			out.Breakers = append(out.Breakers, b)
		}
	}
	return out, nil
}

// breakerStates returns every pool's breaker as the API shows it, with
// its limit from the configuration (remediation.breaker).
func (s *Server) breakerStates(ctx context.Context) ([]*apiv1.RemediationBreaker, error) {
	b := s.cfg.Remediation.Breaker.WithDefaults()
	window := b.Window.Duration
	now := time.Now()
	bs, err := s.store.RemediationBreakerStates(ctx, window, &now)
	if err != nil {
		return nil, err
	}
	var out []*apiv1.RemediationBreaker
	for _, st := range bs {
		o := breakerOut(&st.RemediationBreaker)
		o.Acted, o.Limit, o.GpuNodes, o.Held = int32(st.Acted), int32(b.Limit(st.GPUNodes)), int32(st.GPUNodes), int32(st.Held)
		o.WindowSeconds = int64(window / time.Second)
		if st.TrippedAt != nil {
			o.CloseTime = timestamppb.New(st.TrippedAt.Add(window))
		}
		out = append(out, o)
	}
	return out, nil
}

// remediationStats gives each pool's figures (remediationstats.Stats) over the
// cases kept.
// A tenant's caller gets its subtree's pools' figures.
func (s *Server) remediationStats(ctx context.Context, p *iam.Principal, r *apiv1.RemediationStatsRequest) (*apiv1.RemediationStatsResponse, error) {
	var pools []string
	q := store.RemediationListParams{}
	if r.GetPool() != "" {
		pool, err := s.pool(ctx, p, "pool", r.GetPool())
		if err != nil {
			return nil, err
		}
		pools, q.PoolID = []string{pool.ID}, pool.ID
	} else {
		ps, err := s.store.PoolList(ctx, &store.ListParams{Limit: 100000, Within: within(p)})
		if err != nil {
			return nil, err
		}
		for _, p := range ps {
			pools = append(pools, p.ID)
		}
	}
	cases, err := remediationstats.AllCases(ctx, s.store, q)
	if err != nil {
		return nil, err
	}
	stats := remediationstats.Stats(pools, cases)
	out := &apiv1.RemediationStatsResponse{}
	for _, id := range pools {
		ps := stats[id]
		out.Pools = append(out.Pools, &apiv1.PoolRemediationStats{PoolId: id, Cases: int32(ps.Cases), Open: int32(ps.Open),
			Returned: int32(ps.Returned), Escalated: int32(ps.Escalated), TimeToQuarantine: durationStats(ps.ToQuarantine),
			TimeToReturn: durationStats(ps.ToReturn), TimeBetweenIncidentsNode: durationStats(ps.BetweenNode),
			TimeBetweenIncidentsGpu: durationStats(ps.BetweenGPU)})
	}
	return out, nil
}

func durationStats(xs []float64) *apiv1.DurationStats {
	out := &apiv1.DurationStats{Count: int32(len(xs))}
	if len(xs) == 0 {
		return out
	}
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	out.MeanSeconds = sum / float64(len(xs))
	out.P50Seconds, out.P90Seconds = remediationstats.Quantile(xs, 0.5), remediationstats.Quantile(xs, 0.9)
	out.P99Seconds, out.MaxSeconds = remediationstats.Quantile(xs, 0.99), remediationstats.Quantile(xs, 1)
	return out
}
