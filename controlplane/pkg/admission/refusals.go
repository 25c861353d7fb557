package admission

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
)

// RefusalSummaryEvery is the most often a join refusal of one reason from
// one source address writes an audit row (and a log line). Anyone who can
// reach a gateway can send Joins with made-up tokens, so such refusals are
// counted and summarised, as the API's unauthenticated calls are
// (api.UnauthenticatedSummaryEvery): the first of a window is written at
// once with the count of those before it, the rest wait for the next
// window (issue 28).
const RefusalSummaryEvery = time.Minute

// maxRefusalKeys bounds the (source, reason) pairs counted at once; the
// refusals of sources beyond it are counted under one source,
// OverflowSource.
const maxRefusalKeys = 10000

// OverflowSource is the source address of the summary rows of refusals
// from sources beyond what the summary counts one by one.
const OverflowSource = "other"

// ErrRateLimited reports a Join refused because its source address made
// too many (the gateway's per-source rate); it wraps ErrRefused.
var ErrRateLimited = errors.New("too many join attempts from this address")

// Reasons of the summarised refusals, in the audit details' "refusal".
const (
	RefusalTokenMalformed = "token_malformed"
	RefusalTokenUnknown   = "token_unknown"
	RefusalTokenExpired   = "token_expired"
	RefusalTokenRevoked   = "token_revoked"
	RefusalTokenExhausted = "token_exhausted"
	RefusalInvalidRequest = "invalid_request"
	RefusalRateLimited    = "rate_limited"
)

// refusalReason is the summary reason of err, "" for a refusal that is
// audited one by one (past the token: a revoked node, a bad proof).
func refusalReason(err error) string {
	switch {
	case errors.Is(err, ErrRateLimited):
		return RefusalRateLimited
	case errors.Is(err, ErrTokenMalformed):
		return RefusalTokenMalformed
	case errors.Is(err, store.ErrTokenInvalid):
		return RefusalTokenUnknown
	case errors.Is(err, store.ErrTokenExpired):
		return RefusalTokenExpired
	case errors.Is(err, store.ErrTokenRevoked):
		return RefusalTokenRevoked
	case errors.Is(err, store.ErrTokenExhausted):
		return RefusalTokenExhausted
	case errors.Is(err, ErrInvalidRequest):
		return RefusalInvalidRequest
	}
	return ""
}

type refusalKey struct{ source, reason string }

// refusalCount is one (source, reason)'s refusals since its last row.
type refusalCount struct {
	last    time.Time // when its last row was written
	pending int       // refusals since
	since   time.Time // the first of them
	entry   store.AuditEntry
	details auditDetails // of the last of them
}

// refusalSummary batches join refusals into at most one audit row per
// (source, reason) and RefusalSummaryEvery. Its memory is bounded: a sweep
// once a window writes the pending counts of pairs with no row for a
// window and forgets the pairs with nothing pending, and at most
// maxRefusalKeys pairs are kept.
type refusalSummary struct {
	mu        sync.Mutex
	every     time.Duration
	max       int
	counts    map[refusalKey]*refusalCount
	lastSweep time.Time
}

func newRefusalSummary() *refusalSummary {
	return &refusalSummary{every: RefusalSummaryEvery, max: maxRefusalKeys, counts: map[refusalKey]*refusalCount{}}
}

// summaryRow is an audit row to write and the count it stands for.
type summaryRow struct {
	entry   store.AuditEntry
	details auditDetails
}

// refused counts one refusal of reason from entry's source at now. It
// returns the rows to write: this refusal's when its window has passed
// (counting every refusal since the previous row), and those of quiet
// pairs the sweep forgets.
func (s *refusalSummary) refused(now time.Time, reason string, entry *store.AuditEntry, d *auditDetails) (out []summaryRow) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// After this refusal is counted: a pair quiet for a window is swept,
	// and this one, written now or counted in its window, is not.
	defer func() { out = append(out, s.sweep(now)...) }()
	k := refusalKey{entry.SourceIP, reason}
	c := s.counts[k]
	if c == nil {
		if len(s.counts) >= s.max {
			k.source = OverflowSource
			c = s.counts[k]
		}
		if c == nil {
			c = &refusalCount{}
			s.counts[k] = c
		}
	}
	if c.pending == 0 {
		c.since = now
	}
	c.pending++
	c.entry, c.details = *entry, *d
	c.entry.SourceIP = k.source
	if !c.last.IsZero() && now.Sub(c.last) < s.every {
		return out
	}
	out = append(out, c.row(reason))
	c.last, c.pending = now, 0
	return out
}

// row is the summary row of c's pending refusals.
func (c *refusalCount) row(reason string) summaryRow {
	r := summaryRow{entry: c.entry, details: c.details}
	r.details.Refusal, r.details.Refusals = reason, c.pending
	r.details.Since = c.since.UTC().Format(time.RFC3339Nano)
	return r
}

// sweep, once a window, writes the pending refusals of the pairs with no
// row for a window (restarting their window, so that the next refusal of
// the pair waits for it) and forgets the pairs with none pending.
func (s *refusalSummary) sweep(now time.Time) []summaryRow {
	if now.Sub(s.lastSweep) < s.every {
		return nil
	}
	s.lastSweep = now
	var out []summaryRow
	for k, c := range s.counts {
		switch {
		case now.Sub(c.last) < s.every:
		case c.pending > 0:
			out = append(out, c.row(k.reason))
			c.last, c.pending = now, 0
		default:
			delete(s.counts, k)
		}
	}
	return out
}

// flush returns the rows of every pair's pending refusals and forgets
// them all, for a gateway that stops.
func (s *refusalSummary) flush() []summaryRow {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []summaryRow
	for k, c := range s.counts {
		if c.pending > 0 {
			out = append(out, c.row(k.reason))
		}
	}
	clear(s.counts)
	return out
}

// SweepRefusals writes the summary rows of the join refusals that have
// waited a window with no refusal after them to carry them; the gateway
// calls it on a timer (its flush interval), so that a burst's count is
// written within two windows even when nothing follows it. It does
// nothing more often than once per RefusalSummaryEvery.
func (a *Admitter) SweepRefusals(ctx context.Context) {
	a.refusals.mu.Lock()
	rows := a.refusals.sweep(a.cfg.Now())
	a.refusals.mu.Unlock()
	a.writeRefusals(ctx, rows)
}

// FlushRefusals writes the summary rows of every join refusal still
// counted, whatever its window; the gateway calls it as it stops.
func (a *Admitter) FlushRefusals(ctx context.Context) {
	a.writeRefusals(ctx, a.refusals.flush())
}

// writeRefusals writes the audit row and log line of each summary row.
func (a *Admitter) writeRefusals(ctx context.Context, rows []summaryRow) {
	for _, r := range rows {
		a.audit(ctx, &r.entry, &r.details, OutcomeRefused, nil)
		a.log.InfoContext(ctx, "Join refused", "source", r.entry.SourceIP, "token_id", r.details.TokenID,
			"refusal", r.details.Refusal, "refusals", r.details.Refusals, "since", r.details.Since, logkey.Err, r.details.Reason)
	}
}

// refuse writes the audit row and log line of a refused join, summarised
// per source and reason (refusalSummary) when the refusal happened before
// the token was known good, and returns err.
func (a *Admitter) refuse(ctx context.Context, entry *store.AuditEntry, d *auditDetails, err error) error {
	reason := refusalReason(err)
	if reason == "" {
		a.audit(ctx, entry, d, OutcomeRefused, err)
		a.log.InfoContext(ctx, "Join refused", "source", entry.SourceIP, "token_id", d.TokenID, logkey.Err, err)
		return err
	}
	d.Reason = err.Error()
	a.writeRefusals(ctx, a.refusals.refused(a.cfg.Now(), reason, entry, d))
	return err
}

// RefuseRateLimited records a Join the gateway refused for its source's
// rate (summarised as refuse does) and returns the error, wrapping
// ErrRefused and ErrRateLimited.
func (a *Admitter) RefuseRateLimited(ctx context.Context, source, via string, retryAfter time.Duration) error {
	err := fmt.Errorf("%w: %w: retry in %s", ErrRefused, ErrRateLimited, retryAfter.Round(time.Millisecond))
	return a.refuse(ctx, &store.AuditEntry{Actor: "join-token", Action: ActionJoin, Resource: "join-token", SourceIP: source},
		&auditDetails{Via: via}, err)
}
