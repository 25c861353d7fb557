package api

import (
	"context"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// maxGPUModel bounds gpus.list's model.
const maxGPUModel = 128

// gpusList lists the GPUs current in some node (store.GPUList), paged by
// a cursor "UUID/node".
func (s *Server) gpusList(ctx context.Context, p *iam.Principal, r *apiv1.ListGPUsRequest) (*apiv1.ListGPUsResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	q := &store.GPUListParams{Unhealthy: r.GetUnhealthy(), Model: r.GetModel(), Limit: lp.Limit}
	if len(q.Model) > maxGPUModel || strings.ContainsAny(q.Model, "\x00\r\n") {
		return nil, invalid("model", "must be a GPU model of at most %d characters on one line", maxGPUModel)
	}
	if lp.Cursor != "" {
		i := strings.LastIndexByte(lp.Cursor, '/')
		if i <= 0 || i == len(lp.Cursor)-1 {
			return nil, invalid("page.cursor", "is not a cursor this API returned")
		}
		q.After, q.AfterNode = lp.Cursor[:i], lp.Cursor[i+1:]
	}
	if r.GetPool() != "" {
		pool, err := s.pool(ctx, p, "pool", r.GetPool())
		if err != nil {
			return nil, err
		}
		q.PoolID = pool.ID
	}
	gs, err := s.store.GPUList(ctx, q)
	if err != nil {
		return nil, err
	}
	// A tenant's caller sees its subtree's pools' GPUs: a page may hold
	// fewer than the limit; the cursor follows the page read.
	out := &apiv1.ListGPUsResponse{NextCursor: next(gs, lp, func(g *store.GPUPlacement) string { return g.GPUUUID + "/" + g.NodeID })}
	seen := s.poolsSeen(p)
	for _, g := range gs {
		if ok, err := seen(ctx, g.PoolID); err != nil {
			return nil, err
		} else if ok {
			out.Gpus = append(out.Gpus, placementOut(g))
		}
	}
	return out, nil
}

// gpusGet gives one GPU: its current stays, every stay in order and its
// history under its UUID, whichever node it was on. A tenant's caller sees
// its stays on nodes of its subtree's pools and their history only; a GPU
// with none there is NOT_FOUND, as one no node listed.
func (s *Server) gpusGet(ctx context.Context, p *iam.Principal, r *apiv1.GetGPURequest) (*apiv1.GPUDetail, error) {
	if err := gpuUUID("uuid", r.GetUuid()); err != nil {
		return nil, err
	}
	if r.GetLimit() < 0 || r.GetLimit() > store.MaxListLimit {
		return nil, invalid("limit", "must be 0 to %d", store.MaxListLimit)
	}
	ps, err := s.store.GPUPlacements(ctx, r.GetUuid())
	if err == nil && within(p) != "" {
		seen, kept := s.poolsSeen(p), ps[:0:0]
		for _, g := range ps {
			ok, err := seen(ctx, g.PoolID)
			if err != nil {
				return nil, err
			}
			if ok {
				kept = append(kept, g)
			}
		}
		if ps = kept; len(ps) == 0 {
			err = store.ErrNotFound
		}
	}
	if err != nil {
		return nil, fieldNotFound(err, "uuid", "no GPU "+r.GetUuid()+": no node's inventory has listed it")
	}
	h, err := s.store.RemediationHistory(ctx, &store.RemediationHistoryParams{GPUUUID: r.GetUuid(), Limit: int(r.GetLimit())})
	if err != nil {
		return nil, err
	}
	if h, err = s.historySeen(ctx, p, h); err != nil {
		return nil, err
	}
	out := &apiv1.GPUDetail{Uuid: r.GetUuid(), History: historyOut(h)}
	for _, g := range ps {
		o := placementOut(g)
		out.Placements = append(out.Placements, o)
		if g.Current {
			out.Current = append(out.Current, o)
		}
	}
	return out, nil
}

// placementOut is a store.GPUPlacement as the API gives it.
func placementOut(g *store.GPUPlacement) *apiv1.GPUPlacement {
	return &apiv1.GPUPlacement{GpuUuid: g.GPUUUID, NodeId: g.NodeID, Hostname: g.Hostname, PoolId: g.PoolID,
		BoardSerial: g.BoardSerial, Model: g.Model, Health: g.Health, ConflictNodeId: g.Conflict, Current: g.Current,
		FirstSeenTime: timestamppb.New(g.FirstSeen), LastSeenTime: timestamppb.New(g.LastSeen)}
}
