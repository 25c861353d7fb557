package api

import (
	"context"
	"strconv"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// maxAuditFilter bounds each text filter of audit.list (bytes).
const maxAuditFilter = 256

// auditList pages through the audit log, newest first (docs/api.md,
// "audit.list"): the cursor is the id of the last entry of the previous
// page, and the next page holds the older entries. since and until bound
// the time (since inclusive, until exclusive); actor, resource and outcome
// match exactly; actionPrefix matches the start of the action.
func (s *Server) auditList(ctx context.Context, p *iam.Principal, r *apiv1.ListAuditRequest) (*apiv1.ListAuditResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	q := store.AuditQueryParams{Limit: lp.Limit, Actor: r.GetActor(), ActionPrefix: r.GetActionPrefix(),
		Resource: r.GetResource(), Outcome: r.GetOutcome(), Within: within(p)}
	if q.BeforeID, err = idCursor(lp.Cursor); err != nil {
		return nil, err
	}
	if err := checkLengths(maxAuditFilter, map[string]string{"actor": q.Actor, "actionPrefix": q.ActionPrefix,
		"resource": q.Resource, "outcome": q.Outcome}); err != nil {
		return nil, err
	}
	if q.Since, q.Until, err = timeWindow(r.GetSince(), r.GetUntil()); err != nil {
		return nil, err
	}
	entries, err := s.store.AuditQuery(ctx, &q)
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListAuditResponse{NextCursor: next(entries, lp, func(e *store.AuditEntry) string { return idString(e.ID) })}
	for _, e := range entries {
		out.Entries = append(out.Entries, auditOut(e))
	}
	return out, nil
}

// auditOut is an audit row in the API's form; details that are not a JSON
// object are left out.
func auditOut(e *store.AuditEntry) *apiv1.AuditEntry {
	a := &apiv1.AuditEntry{Id: strconv.FormatInt(e.ID, 10), Time: ts(e.Time), Actor: e.Actor, Action: e.Action,
		Resource: e.Resource, Outcome: e.Outcome, SourceIp: e.SourceIP}
	if len(e.Details) > 0 {
		d := &structpb.Struct{}
		if protojson.Unmarshal(e.Details, d) == nil {
			a.Details = d
		}
	}
	return a
}
