package api

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/feed"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// MaxReplayIDs bounds the ids of one sinks.replay call.
const MaxReplayIDs = 1000

// errReplayMissing rolls back a sinks.replay whose ids are not all dead
// letters.
var errReplayMissing = errors.New("ids that are not dead letters")

// sinksDeadLetters pages through the sinks' dead letters, oldest first
// (docs/api.md, "sinks.deadLetters"): the cursor is the id of the last
// dead letter of the previous page; sink keeps one sink's. A tenant's
// caller names a sink of its subtree (sinkSeen), and sees the dead
// letters that were for a tenant of its subtree (their TenantID, the
// sink's tenant when they were made) only: a page may hold fewer than its
// limit, its cursor follows the page read (sealed, cursor.go).
func (s *Server) sinksDeadLetters(ctx context.Context, p *iam.Principal, r *apiv1.ListDeadLettersRequest) (*apiv1.ListDeadLettersResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	if r.GetSink() != "" {
		if err := name("sink", r.GetSink()); err != nil {
			return nil, err
		}
		if ok, err := s.sinkSeen(ctx, p, r.GetSink()); err != nil {
			return nil, err
		} else if !ok {
			return nil, &Error{Code: apiv1.CodeNotFound, Field: "sink", Message: fmt.Sprintf("no sink %q is configured (sinks.webhooks, sinks.files)", r.GetSink())}
		}
	}
	q := store.DeadLetterListParams{Sink: r.GetSink(), Limit: lp.Limit}
	if q.AfterID, err = idCursor(lp.Cursor); err != nil {
		return nil, err
	}
	dls, err := s.store.DeadLetterList(ctx, &q)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListDeadLettersResponse{NextCursor: next(dls, lp, func(d *store.DeadLetter) string { return idString(d.ID) })}
	seen := map[string]bool{}
	for _, d := range dls {
		ok, cached := seen[d.TenantID]
		if !cached {
			if ok, err = s.tenantIDSeen(ctx, p, d.TenantID); err != nil {
				return nil, err
			}
			seen[d.TenantID] = ok
		}
		if ok {
			out.DeadLetters = append(out.DeadLetters, deadLetterOut(d))
		}
	}
	return out, nil
}

// sinkSeen reports whether p sees the sink named sink: a root caller sees
// every sink; a tenant's caller the sinks whose tenant (sinks.*.tenant)
// lies within its subtree, never a deployment-wide sink, which takes
// every tenant's events (docs/tenants.md, "Sinks").
func (s *Server) sinkSeen(ctx context.Context, p *iam.Principal, sink string) (bool, error) {
	return s.tenantIDSeen(ctx, p, s.cfg.SinkTenants[sink])
}

// tenantIDSeen reports whether the live tenant of id tenantID (a sink's or
// a dead letter's tenant; never a name) lies within p's subtree; a root
// caller sees every one, "" (deployment-wide) included, a tenant's caller
// neither "" nor a tenant merely named tenantID.
func (s *Server) tenantIDSeen(ctx context.Context, p *iam.Principal, tenantID string) (bool, error) {
	if within(p) == "" {
		return true, nil
	}
	if tenantID == "" {
		return false, nil
	}
	t, err := s.store.TenantGet(ctx, tenantID)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return t.ID == tenantID && t.DeletedAt == nil && p.Sees(t.Path), nil
}

// deadLetterOut is a dead letter in the API's form.
func deadLetterOut(d *store.DeadLetter) *apiv1.DeadLetter {
	e := &d.Entry
	return &apiv1.DeadLetter{
		Id:   strconv.FormatInt(d.ID, 10),
		Sink: d.Sink,
		Event: eventOut(&feed.Event{ID: e.ID, Type: e.Topic, Subject: e.Key, Time: e.CreatedAt,
			JSON: events.FromOutbox(e.ID, e.Topic, e.Key, e.Payload, e.CreatedAt)}),
		Attempts:  int32(d.Attempts),
		LastError: d.LastError,
		Replay:    d.Replay,
		FailTime:  ts(d.FailedAt),
	}
}

// sinksReplay marks dead letters for redelivery (docs/api.md,
// "sinks.replay"): the ids given (all of them dead letters, of sink when
// it is set, or NOT_FOUND naming those that are not, with nothing marked),
// or with all every dead letter of sink. The sink's dispatcher delivers
// them before the outbox. A tenant's caller names a sink of its subtree
// (sinkSeen; another is NOT_FOUND, as one not configured).
func (s *Server) sinksReplay(ctx context.Context, p *iam.Principal, r *apiv1.ReplayDeadLettersRequest) (*apiv1.ReplayDeadLettersResponse, error) {
	sink := r.GetSink()
	if sink == "" && within(p) != "" {
		return nil, invalid("sink", "is required of a token of a tenant other than the root: the sink whose dead letters to replay")
	}
	if sink != "" {
		if err := name("sink", sink); err != nil {
			return nil, err
		}
		seen, err := s.sinkSeen(ctx, p, sink)
		if err != nil {
			return nil, err
		}
		// A sink that is not configured has no dispatcher to deliver what
		// would be marked: NOT_FOUND, not a silent success (issue 29).
		if !seen || !slices.Contains(s.cfg.Sinks, sink) {
			return nil, &Error{Code: apiv1.CodeNotFound, Field: "sink", Message: fmt.Sprintf("no sink %q is configured (sinks.webhooks, sinks.files); nothing was replayed", sink)}
		}
	}
	switch {
	case r.GetAll() && len(r.GetIds()) > 0:
		return nil, invalid("ids", "give ids or all, not both")
	case r.GetAll() && sink == "":
		return nil, invalid("sink", "is required with all: the sink whose dead letters to replay")
	case r.GetAll() && within(p) != "":
		// A tenant's caller replays the letters that were for its subtree.
		own, err := s.deadLettersSeen(ctx, p, sink)
		if err != nil {
			return nil, err
		}
		var n int64
		for chunk := range slices.Chunk(slices.Sorted(maps.Keys(own)), MaxReplayIDs) {
			m, err := s.store.DeadLetterReplay(ctx, sink, chunk)
			if err != nil {
				return nil, err
			}
			n += m
		}
		return &apiv1.ReplayDeadLettersResponse{Replayed: n}, nil
	case r.GetAll():
		n, err := s.store.DeadLetterReplay(ctx, sink, nil)
		if err != nil {
			return nil, err
		}
		return &apiv1.ReplayDeadLettersResponse{Replayed: n}, nil
	case len(r.GetIds()) == 0:
		return nil, invalid("ids", "give the ids of dead letters to replay (sinks.deadLetters lists them), or all with sink")
	case len(r.GetIds()) > MaxReplayIDs:
		return nil, invalid("ids", "at most %d ids in one call", MaxReplayIDs)
	}
	ids := make([]int64, 0, len(r.GetIds()))
	for _, v := range r.GetIds() {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id <= 0 {
			return nil, invalid("ids", "%q is not a dead letter id (a positive decimal integer)", v)
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	var n int64
	var missing []string
	if within(p) != "" {
		// Another tenant's dead letter is answered as one that does not
		// exist.
		own, err := s.deadLettersSeen(ctx, p, sink)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			if !own[id] {
				missing = append(missing, strconv.FormatInt(id, 10))
			}
		}
		if len(missing) > 0 {
			return nil, &Error{Code: apiv1.CodeNotFound, Field: "ids", Message: fmt.Sprintf("no dead letter of sink %s with id %s; nothing was replayed",
				sink, strings.Join(missing, ", "))}
		}
	}
	err := store.InTx(ctx, s.store, func(tx replayTx) error {
		var err error
		if n, err = tx.DeadLetterReplay(ctx, sink, ids); err != nil || n == int64(len(ids)) {
			return err
		}
		// Some are not dead letters (of sink): name them, and mark none.
		for _, id := range ids {
			one, err := tx.DeadLetterReplay(ctx, sink, []int64{id})
			if err != nil {
				return err
			}
			if one == 0 {
				missing = append(missing, strconv.FormatInt(id, 10))
			}
		}
		return errReplayMissing
	})
	if errors.Is(err, errReplayMissing) {
		of := ""
		if sink != "" {
			of = " of sink " + sink
		}
		return nil, &Error{Code: apiv1.CodeNotFound, Field: "ids", Message: fmt.Sprintf("no dead letter%s with id %s; nothing was replayed",
			of, strings.Join(missing, ", "))}
	}
	if err != nil {
		return nil, err
	}
	return &apiv1.ReplayDeadLettersResponse{Replayed: n}, nil
}

// deadLettersSeen returns the ids of sink's dead letters that were for a
// tenant within p's subtree (their TenantID).
func (s *Server) deadLettersSeen(ctx context.Context, p *iam.Principal, sink string) (map[int64]bool, error) {
	own, seen := map[int64]bool{}, map[string]bool{}
	for after := int64(0); ; {
		dls, err := s.store.DeadLetterList(ctx, &store.DeadLetterListParams{Sink: sink, AfterID: after, Limit: store.MaxListLimit})
		if err != nil {
			return nil, err
		}
		for _, d := range dls {
			ok, cached := seen[d.TenantID]
			if !cached {
				if ok, err = s.tenantIDSeen(ctx, p, d.TenantID); err != nil {
					return nil, err
				}
				seen[d.TenantID] = ok
			}
			if ok {
				own[d.ID] = true
			}
		}
		if len(dls) < store.MaxListLimit {
			return own, nil
		}
		after = dls[len(dls)-1].ID
	}
}
