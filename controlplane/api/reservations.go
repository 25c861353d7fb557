package api

import (
	"cmp"
	"context"
	"errors"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/reconcilers/placer"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// Limits of reservations.create (docs/reservations.md).
const (
	MaxReservationGPUs   = 4096
	MaxReservationNodes  = 512
	MaxReservationWindow = 366 * 24 * time.Hour
	// MaxReservationLead is how far ahead a window may start.
	MaxReservationLead = 2 * 365 * 24 * time.Hour
	MaxReservationNote = 1024
	MaxOwnerLen        = 128
	MaxGPUModelLen     = 128
	// MaxGPUMemoryMiB bounds min_gpu_memory_mib (16 TiB).
	MaxGPUMemoryMiB = 16 << 20
	// MaxSummaryWindow bounds a capacity.summary window.
	MaxSummaryWindow = 366 * 24 * time.Hour
	// SummaryNodesMaxAge is how old the node states (ready, cordoned, out
	// of service, GPU health) a capacity.summary counts may be: each api
	// process reads the fleet's nodes at most once per this; reservations
	// are read on every call.
	SummaryNodesMaxAge = 2 * time.Second
)

// reservationStates are the states reservations.list filters on.
var reservationStates = []string{store.ReservationPending, store.ReservationPlaced, store.ReservationActive,
	store.ReservationEnded, store.ReservationCancelled, store.ReservationFailed}

// when checks an optional timestamp field: nil stays nil.
func when(field string, t *timestamppb.Timestamp) (*time.Time, error) {
	if t == nil {
		return nil, nil
	}
	if err := t.CheckValid(); err != nil {
		return nil, invalid(field, "is not a valid time")
	}
	v := t.AsTime()
	return &v, nil
}

// resolvePool finds a pool by id or name for field.
func (s *Server) resolvePool(ctx context.Context, field, v string) (*store.Pool, error) {
	if err := id(field, v); err != nil {
		return nil, err
	}
	pool, err := s.store.PoolGet(ctx, v)
	if errors.Is(err, store.ErrNotFound) {
		return nil, &Error{Code: apiv1.CodeNotFound, Field: field, Message: "no pool " + v}
	}
	return pool, err
}

// reservationsCreate validates a request and writes a pending
// reservation; the placer places it (docs/reservations.md).
func (s *Server) reservationsCreate(ctx context.Context, p *iam.Principal, r *apiv1.CreateReservationRequest) (*apiv1.Reservation, error) {
	switch {
	case r.GetGpus() < 0:
		return nil, invalid("gpus", "must not be negative")
	case r.GetNodes() < 0:
		return nil, invalid("nodes", "must not be negative")
	case r.GetGpus() > 0 && r.GetNodes() > 0:
		return nil, invalid("gpus", "give gpus or nodes, not both")
	case r.GetGpus() == 0 && r.GetNodes() == 0:
		return nil, invalid("gpus", "give gpus (GPUs) or nodes (whole nodes), one above zero")
	case r.GetGpus() > MaxReservationGPUs:
		return nil, invalid("gpus", "must be at most %d", MaxReservationGPUs)
	case r.GetNodes() > MaxReservationNodes:
		return nil, invalid("nodes", "must be at most %d", MaxReservationNodes)
	case len(r.GetGpuModel()) > MaxGPUModelLen:
		return nil, invalid("gpuModel", "must be at most %d characters", MaxGPUModelLen)
	case r.GetMinGpuMemoryMib() < 0 || r.GetMinGpuMemoryMib() > MaxGPUMemoryMiB:
		return nil, invalid("minGpuMemoryMib", "must be 0 to %d (MiB)", MaxGPUMemoryMiB)
	case strings.TrimSpace(r.GetOwner()) == "" || len(r.GetOwner()) > MaxOwnerLen:
		return nil, invalid("owner", "must be 1 to %d characters: who the capacity is for", MaxOwnerLen)
	case len(r.GetNote()) > MaxReservationNote:
		return nil, invalid("note", "must be at most %d characters", MaxReservationNote)
	case len(r.GetLabels()) > 64:
		return nil, invalid("labels", "at most 64 labels")
	}
	for k := range r.GetLabels() {
		if k == "" || len(k) > 253 {
			return nil, invalid("labels", "a label key must be 1 to 253 characters")
		}
	}
	now := time.Now()
	start, err := when("start", r.GetStart())
	if err != nil {
		return nil, err
	}
	if start == nil || start.Before(now) {
		// A window that began already holds GPUs from now on: the past
		// is not booked (it could clash with what was released since).
		start = &now
	}
	end, err := when("end", r.GetEnd())
	switch {
	case err != nil:
		return nil, err
	case end == nil:
		return nil, invalid("end", "is required")
	case !end.After(*start):
		return nil, invalid("end", "must be after start")
	case !end.After(now):
		return nil, invalid("end", "is in the past")
	case end.Sub(*start) > MaxReservationWindow:
		return nil, invalid("end", "the window is longer than %v", MaxReservationWindow)
	case start.Sub(now) > MaxReservationLead:
		return nil, invalid("start", "is more than %v ahead", MaxReservationLead)
	}
	grants, err := checkGrants(r.GetGrants())
	if err != nil {
		return nil, err
	}
	// The holder: the tenant the grants are for (docs/reservations.md,
	// "Access from reservations"), in the caller's subtree.
	holder, err := s.tenant(ctx, p, "tenant", cmp.Or(r.GetTenant(), p.TenantID, store.RootTenant))
	if err != nil {
		return nil, err
	}
	pool, err := s.pool(ctx, p, "pool", r.GetPool()) // within the caller's subtree (docs/tenants.md)
	if err != nil {
		return nil, err
	}
	res, err := s.store.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: pool.ID, GPUs: int(r.GetGpus()),
		Nodes: int(r.GetNodes()), GPUModel: r.GetGpuModel(), MinGPUMemoryMiB: r.GetMinGpuMemoryMib(), Selector: r.GetLabels(),
		Start: start.UTC(), End: end.UTC(), Owner: r.GetOwner(), Note: r.GetNote(), TenantID: holder.ID, Grants: grants,
		CreatedBy: "token:" + p.TokenID})
	if err != nil {
		return nil, err
	}
	return reservationOut(res), nil
}

func (s *Server) reservationsGet(ctx context.Context, p *iam.Principal, r *apiv1.GetReservationRequest) (*apiv1.Reservation, error) {
	if err := id("id", r.GetId()); err != nil {
		return nil, err
	}
	res, err := s.store.ReservationGet(ctx, r.GetId())
	if err == nil {
		err = s.poolSeen(ctx, p, res.PoolID) // another tenant's: as one that does not exist
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, &Error{Code: apiv1.CodeNotFound, Field: "id", Message: "no reservation " + r.GetId()}
	}
	if err != nil {
		return nil, err
	}
	return reservationOut(res), nil
}

func (s *Server) reservationsList(ctx context.Context, p *iam.Principal, r *apiv1.ListReservationsRequest) (*apiv1.ListReservationsResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	q := store.ReservationListParams{ListParams: lp, State: r.GetState(), Owner: r.GetOwner()}
	if q.State != "" && !contains(reservationStates, q.State) {
		return nil, invalid("state", "must be one of %s", strings.Join(reservationStates, ", "))
	}
	if len(q.Owner) > MaxOwnerLen {
		return nil, invalid("owner", "must be at most %d characters", MaxOwnerLen)
	}
	if r.GetPool() != "" {
		pool, err := s.pool(ctx, p, "pool", r.GetPool())
		if err != nil {
			return nil, err
		}
		q.PoolID = pool.ID
	}
	rs, err := s.store.ReservationList(ctx, &q)
	if err != nil {
		return nil, err
	}
	// A tenant's caller sees its subtree's pools' reservations: a page may
	// hold fewer than the limit; the cursor follows the page read.
	out := &apiv1.ListReservationsResponse{NextCursor: next(rs, lp, func(x *store.Reservation) string { return x.ID })}
	seen := map[string]error{}
	for _, x := range rs {
		err, ok := seen[x.PoolID]
		if !ok {
			err = s.poolSeen(ctx, p, x.PoolID)
			seen[x.PoolID] = err
		}
		switch {
		case err == nil:
			out.Reservations = append(out.Reservations, reservationOut(x))
		case !errors.Is(err, store.ErrNotFound):
			return nil, err
		}
	}
	return out, nil
}

func (s *Server) reservationsCancel(ctx context.Context, p *iam.Principal, r *apiv1.CancelReservationRequest) (*apiv1.Reservation, error) {
	if err := id("id", r.GetId()); err != nil {
		return nil, err
	}
	if len(r.GetReason()) > MaxReservationNote {
		return nil, invalid("reason", "must be at most %d characters", MaxReservationNote)
	}
	if _, err := s.reservationsGet(ctx, p, &apiv1.GetReservationRequest{Id: r.GetId()}); err != nil {
		return nil, err // another tenant's is NOT_FOUND
	}
	res, err := s.store.ReservationCancel(ctx, &store.ReservationCancelParams{ID: r.GetId(), Reason: r.GetReason()})
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, &Error{Code: apiv1.CodeNotFound, Field: "id", Message: "no reservation " + r.GetId()}
	case errors.Is(err, store.ErrConflict) && res != nil:
		return nil, &Error{Code: apiv1.CodeConflict, Field: "id", Message: "reservation " + res.ID + " is " + res.State + ": only a pending, placed or active one can be cancelled"}
	case err != nil:
		return nil, err
	}
	return reservationOut(res), nil
}

func (s *Server) reservationsExtend(ctx context.Context, p *iam.Principal, r *apiv1.ExtendReservationRequest) (*apiv1.Reservation, error) {
	if err := id("id", r.GetId()); err != nil {
		return nil, err
	}
	end, err := when("end", r.GetEnd())
	switch {
	case err != nil:
		return nil, err
	case end == nil:
		return nil, invalid("end", "is required")
	}
	cur, err := s.store.ReservationGet(ctx, r.GetId())
	if err == nil {
		err = s.poolSeen(ctx, p, cur.PoolID) // another tenant's: as one that does not exist
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, &Error{Code: apiv1.CodeNotFound, Field: "id", Message: "no reservation " + r.GetId()}
	}
	if err != nil {
		return nil, err
	}
	switch {
	case !store.ReservationOpen(cur.State):
		return nil, &Error{Code: apiv1.CodeConflict, Field: "id", Message: "reservation " + cur.ID + " is " + cur.State + ": only a pending, placed or active one can be extended"}
	case !end.After(cur.End):
		return nil, invalid("end", "must be after the reservation's end, %s", cur.End.UTC().Format(time.RFC3339))
	case end.Sub(cur.Start) > MaxReservationWindow:
		return nil, invalid("end", "the window would be longer than %v", MaxReservationWindow)
	}
	res, err := s.store.ReservationExtend(ctx, &store.ReservationExtendParams{ID: cur.ID, End: end.UTC()})
	if errors.Is(err, store.ErrConflict) {
		return nil, &Error{Code: apiv1.CodeConflict, Field: "end", Message: "cannot extend: " + strings.TrimSuffix(err.Error(), ": "+store.ErrConflict.Error())}
	}
	if err != nil {
		return nil, err
	}
	return reservationOut(res), nil
}

// capacitySummary counts a pool's GPUs at a time or over a window by
// model (docs/reservations.md, "Capacity").
// A tenant's caller names a pool of its subtree: the summary without one
// counts every pool of the deployment.
func (s *Server) capacitySummary(ctx context.Context, p *iam.Principal, r *apiv1.CapacitySummaryRequest) (*apiv1.CapacitySummaryResponse, error) {
	at, err := when("at", r.GetAt())
	if err != nil {
		return nil, err
	}
	from, err := when("from", r.GetFrom())
	if err != nil {
		return nil, err
	}
	to, err := when("to", r.GetTo())
	if err != nil {
		return nil, err
	}
	var lo, hi time.Time
	switch {
	case at != nil && (from != nil || to != nil):
		return nil, invalid("at", "give at, or from and to, not both")
	case (from == nil) != (to == nil):
		return nil, invalid("from", "give both from and to")
	case from != nil && !to.After(*from):
		return nil, invalid("to", "must be after from")
	case from != nil && to.Sub(*from) > MaxSummaryWindow:
		return nil, invalid("to", "the window is longer than %v", MaxSummaryWindow)
	case from != nil:
		lo, hi = *from, *to
	default:
		lo = time.Now()
		if at != nil {
			lo = *at
		}
		hi = lo.Add(time.Microsecond)
	}
	out := &apiv1.CapacitySummaryResponse{From: ts(lo), To: ts(hi)}
	if r.GetPool() == "" && within(p) != "" {
		return nil, invalid("pool", "is required of a token of a tenant other than the root: the summary of every pool is deployment-wide")
	}
	if r.GetPool() != "" {
		pool, err := s.pool(ctx, p, "pool", r.GetPool())
		if err != nil {
			return nil, err
		}
		out.PoolId = pool.ID
	}
	sum, err := placer.Summarize(ctx, s.store, s.capacity, out.PoolId, lo.UTC(), hi.UTC(), SummaryNodesMaxAge)
	if err != nil {
		return nil, err
	}
	out.Nodes = int32(sum.Nodes)
	for _, m := range sum.Models {
		out.Models = append(out.Models, &apiv1.CapacityModel{Model: m.Model, Total: int32(m.Total), Free: int32(m.Free),
			Reserved: int32(m.Reserved), Unavailable: int32(m.Unavailable)})
	}
	return out, nil
}

// reservationOut is a reservation in the API's form.
func reservationOut(r *store.Reservation) *apiv1.Reservation {
	out := &apiv1.Reservation{Id: r.ID, PoolId: r.PoolID, Gpus: int32(r.GPUs), Nodes: int32(r.Nodes), GpuModel: r.GPUModel,
		MinGpuMemoryMib: r.MinGPUMemoryMiB, Labels: r.Selector, Start: ts(r.Start), End: ts(r.End), Owner: r.Owner, Note: r.Note,
		State: r.State, Reason: r.Reason, CreatedBy: r.CreatedBy, NodeIds: r.NodeIDs(), FailedNodeIds: r.FailedNodes,
		CreateTime: ts(r.CreatedAt), UpdateTime: ts(r.UpdatedAt), TenantId: r.TenantID, Grants: r.Grants}
	for _, sl := range r.Slots {
		out.Slots = append(out.Slots, &apiv1.ReservationSlot{NodeId: sl.NodeID, Gpu: int32(sl.GPU), GpuUuid: sl.GPUUUID,
			Start: ts(sl.Start), End: ts(sl.End)})
	}
	return out
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
