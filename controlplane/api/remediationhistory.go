package api

import (
	"context"
	"errors"
	"time"
	"unicode"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// MaxGPUUUID bounds remediation.history's gpuUuid.
const MaxGPUUUID = 128

// maxHistoryWindow bounds remediation.history's window.
const maxHistoryWindow = 365 * 24 * time.Hour

// gpuUUID checks a GPU UUID a caller gives: 1 to MaxGPUUUID printable
// characters without spaces.
func gpuUUID(field, v string) error {
	if v == "" || len(v) > MaxGPUUUID {
		return invalid(field, "must be a GPU UUID of 1 to %d characters", MaxGPUUUID)
	}
	for _, r := range v {
		if r > unicode.MaxASCII || !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return invalid(field, "must be a GPU UUID (printable ASCII, no spaces)")
		}
	}
	return nil
}

// remediationHistory returns a node's or a GPU's memory (store.RemediationHistory).
// A tenant's caller names a node of its subtree (else NOT_FOUND) and sees
// the rows of its subtree's nodes only (historySeen).
func (s *Server) remediationHistory(ctx context.Context, p *iam.Principal, r *apiv1.RemediationHistoryRequest) (*apiv1.RemediationHistory, error) {
	if r.GetNodeId() == "" && r.GetGpuUuid() == "" {
		return nil, invalid("nodeId", "name a node (nodeId) or a GPU (gpuUuid)")
	}
	q := &store.RemediationHistoryParams{NodeID: r.GetNodeId(), GPUUUID: r.GetGpuUuid()}
	if q.NodeID != "" {
		if err := id("nodeId", q.NodeID); err != nil {
			return nil, err
		}
		if within(p) != "" {
			n, err := s.store.NodeGet(ctx, q.NodeID)
			if err == nil {
				err = s.poolSeen(ctx, p, n.PoolID)
			}
			if err != nil {
				return nil, fieldNotFound(err, "nodeId", "no node "+q.NodeID)
			}
		}
	}
	if q.GPUUUID != "" {
		if err := gpuUUID("gpuUuid", q.GPUUUID); err != nil {
			return nil, err
		}
	}
	if r.GetLimit() < 0 || r.GetLimit() > store.MaxListLimit {
		return nil, invalid("limit", "must be 0 to %d", store.MaxListLimit)
	}
	q.Limit = int(r.GetLimit())
	if r.GetWindow() != nil {
		w, err := durationIn("window", r.GetWindow(), 0, time.Second, maxHistoryWindow)
		if err != nil {
			return nil, err
		}
		q.Since = s.now().Add(-w)
	}
	h, err := s.store.RemediationHistory(ctx, q)
	if err != nil {
		return nil, err
	}
	if h, err = s.historySeen(ctx, p, h); err != nil {
		return nil, err
	}
	return historyOut(h), nil
}

// historySeen keeps the rows of h about nodes whose pool lies within p's
// subtree (a node's history follows it when it moves): a GPU's memory
// spans nodes, and a tenant sees its own nodes' part of it. A root caller
// gets h as it is.
func (s *Server) historySeen(ctx context.Context, p *iam.Principal, h *store.RemediationHistory) (*store.RemediationHistory, error) {
	if within(p) == "" {
		return h, nil
	}
	seen, nodes := s.poolsSeen(p), map[string]bool{}
	var err error
	node := func(id string) bool {
		if ok, cached := nodes[id]; cached || err != nil {
			return ok
		}
		n, e := s.store.NodeGet(ctx, id)
		switch {
		case errors.Is(e, store.ErrNotFound):
			nodes[id] = false
		case e != nil:
			err = e
		default:
			nodes[id], err = seen(ctx, n.PoolID)
		}
		return nodes[id]
	}
	out := &store.RemediationHistory{}
	for _, f := range h.Findings {
		if node(f.NodeID) {
			out.Findings = append(out.Findings, f)
		}
	}
	for _, c := range h.Cases {
		if ok, e := seen(ctx, c.PoolID); e != nil {
			return nil, e
		} else if ok {
			out.Cases = append(out.Cases, c)
		}
	}
	for _, a := range h.Actions {
		if node(a.NodeID) {
			out.Actions = append(out.Actions, a)
		}
	}
	for _, c := range h.Counts {
		if node(c.NodeID) {
			out.Counts = append(out.Counts, c)
		}
	}
	return out, err
}

// historyOut is a store.RemediationHistory as the API gives it.
func historyOut(h *store.RemediationHistory) *apiv1.RemediationHistory {
	out := &apiv1.RemediationHistory{}
	for _, f := range h.Findings {
		out.Findings = append(out.Findings, &apiv1.RemediationFinding{Id: f.ID, NodeId: f.NodeID, GpuUuid: f.GPUUUID,
			BoardSerial: f.BoardSerial, Kind: f.Kind, Severity: f.Severity, Resolution: f.Resolution,
			Investigatory: f.Investigatory, Xid: int32(f.XID), XidMnemonic: f.XIDMnemonic, Message: f.Message,
			EventId: f.EventID, Outcome: f.Outcome, RemediationId: f.RemediationID,
			CreateTime: timestamppb.New(f.CreatedAt), TakeTime: timestamppb.New(f.TakenAt)})
	}
	for _, c := range h.Cases {
		out.Cases = append(out.Cases, remediationOut(c))
	}
	for _, a := range h.Actions {
		o := &apiv1.RemediationAction{RemediationId: a.RemediationID, CommandId: a.CommandID, NodeId: a.NodeID,
			GpuUuid: a.GPUUUID, Kind: a.Kind, State: a.State, CreateTime: timestamppb.New(a.CreatedAt)}
		if a.FinishedAt != nil {
			o.FinishTime = timestamppb.New(*a.FinishedAt)
		}
		out.Actions = append(out.Actions, o)
	}
	for _, c := range h.Counts {
		out.Counts = append(out.Counts, &apiv1.GPUFindingCount{NodeId: c.NodeID, GpuUuid: c.GPUUUID, Kind: c.Kind,
			Xid: int32(c.XID), XidMnemonic: c.XIDMnemonic, Resolution: c.Resolution, Count: int32(c.Count),
			FirstTime: timestamppb.New(c.First), LastTime: timestamppb.New(c.Last)})
	}
	return out
}
