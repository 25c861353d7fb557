package api

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// RefusalCounter counts calls refused before a caller was known (package
// metrics implements it as bettercompute_api_unauthenticated_total).
type RefusalCounter interface {
	APIUnauthenticated(reason string)
}

// UnauthenticatedSummaryEvery is the most often an audit row summarising
// refused unauthenticated calls is written: anyone on the network can send
// calls without a valid token, so they are counted, not audited one by
// one, and the audit log cannot be flooded (docs/api.md).
const UnauthenticatedSummaryEvery = time.Minute

// ActionUnauthenticated is the audit action of the summary rows.
const ActionUnauthenticated = "api.unauthenticated"

// unauthSummary batches unauthenticated refusals into at most one audit
// row per UnauthenticatedSummaryEvery. A refusal that finds the window
// passed writes a row counting every refusal since the previous row
// (itself included); later refusals wait for the next window.
type unauthSummary struct {
	mu      sync.Mutex
	now     func() time.Time
	last    time.Time // when the previous row was written
	pending int       // refusals since that row
	since   time.Time // the first of them
}

// refused counts one refusal and returns the row to write, or nil.
func (u *unauthSummary) refused(reason, method, source string) *store.AuditEntry {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := u.now()
	if u.pending == 0 {
		u.since = now
	}
	u.pending++
	if !u.last.IsZero() && now.Sub(u.last) < UnauthenticatedSummaryEvery {
		return nil
	}
	details, _ := json.Marshal(map[string]any{
		"refusals": u.pending, "since": u.since.UTC().Format(time.RFC3339Nano),
		"lastReason": reason, "lastMethod": method,
	})
	u.last, u.pending = now, 0
	return &store.AuditEntry{Actor: "anonymous", Action: ActionUnauthenticated, Resource: method,
		Outcome: apiv1.CodeUnauthenticated, SourceIP: source, Details: details}
}

// refuseUnauthenticated counts a call refused for its token and, at most
// once a window, audits a summary of such refusals.
func (s *Server) refuseUnauthenticated(ctx context.Context, reason, method string, addr any) {
	if s.cfg.Refusals != nil {
		s.cfg.Refusals.APIUnauthenticated(reason)
	}
	if e := s.unauth.refused(reason, method, fmt.Sprint(addr)); e != nil {
		if _, err := s.store.AuditInsert(context.WithoutCancel(ctx), e); err != nil {
			s.log.ErrorContext(ctx, "Audit write failed", "action", e.Action, logkey.Err, err)
		}
	}
}
