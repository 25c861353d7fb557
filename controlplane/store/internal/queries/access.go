package queries

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

// accessColumns are an access request's columns (migration
// 0034_access_requests) but its state, which accessState reads.
const accessColumns = `id, tenant_id, requester, requester_name, requester_role, policy, scope_kind, scope_id, scope_name,
	duration_us, reason, created_at, decided_at, decided_by, decided_by_name, starts_at, ends_at, note`

// accessState is the SQL of a request's state as of the time parameter
// $n: a pending request older than store.AccessPendingTTL, or an approved
// one whose end is not after it, is expired.
func accessState(n int) string {
	return fmt.Sprintf(`CASE WHEN state = 'pending' AND created_at <= coalesce($%[1]d, now()) - bc_micros(%[2]d) THEN 'expired'
		WHEN state = 'approved' AND ends_at <= coalesce($%[1]d, now()) THEN 'expired' ELSE state END`,
		n, store.AccessPendingTTL.Microseconds())
}

// accessSelect selects a request's columns and its state as of $n.
func accessSelect(n int) string {
	return `SELECT ` + accessColumns + `, ` + accessState(n) + ` FROM access_requests`
}

func scanAccessRequest(r Row) (*store.AccessRequest, error) {
	x := &store.AccessRequest{}
	var us int64
	err := r.Scan(&x.ID, &x.TenantID, &x.Requester, &x.RequesterName, &x.RequesterRole, &x.Policy, &x.ScopeKind, &x.ScopeID,
		&x.ScopeName, &us, &x.Reason, &x.CreatedAt, &x.DecidedAt, &x.DecidedBy, &x.DecidedByName, &x.Start, &x.End, &x.Note, &x.State)
	x.Duration = time.Duration(us) * time.Microsecond
	return x, err
}

// accessEvent is the event of a request's step.
func accessEvent(typ string, r *store.AccessRequest, previous string) event {
	d := events.AccessData{RequestID: r.ID, TenantID: r.TenantID, Requester: r.Requester, RequesterName: r.RequesterName,
		Policy: r.Policy, State: r.State, PreviousState: previous, DurationSeconds: int64(r.Duration / time.Second),
		Reason: r.Reason, Start: r.Start, End: r.End, DecidedBy: r.DecidedBy, Note: r.Note}
	if r.ScopeKind != "" {
		d.Resource = r.ScopeKind + ":" + r.ScopeID
	}
	return event{typ: typ, subject: r.ID, data: d}
}

// AccessRequestCreate inserts a pending request, counting the requester's
// pending ones first: on PostgreSQL under a transaction lock on the
// requester, on SQLite under the one writer.
func (s *Store) AccessRequestCreate(ctx context.Context, p *store.AccessRequestCreateParams) (*store.AccessRequest, error) {
	id := p.ID
	if id == "" {
		id = store.NewID("acr")
	}
	op := "create access request"
	var out *store.AccessRequest
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		now := q.clock(p.Now)
		if q.d.Name == store.DialectPostgres {
			if _, err := q.db.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('access_requests ' || $1, 0))`, p.Requester); err != nil {
				return q.wrap(op, err)
			}
		}
		var pending int
		if err := q.db.QueryRow(ctx, `SELECT count(*) FROM access_requests WHERE requester = $1 AND state = 'pending'
			AND created_at > coalesce($2, now()) - bc_micros($3)`, p.Requester, now, store.AccessPendingTTL.Microseconds()).Scan(&pending); err != nil {
			return q.wrap(op, err)
		}
		if pending >= store.MaxPendingAccessRequests {
			return fmt.Errorf("%s: %s has %d pending: %w", op, p.Requester, pending, store.ErrAccessPendingLimit)
		}
		if _, err := q.db.Exec(ctx, `INSERT INTO access_requests (id, tenant_id, requester, requester_name, requester_role, policy,
				scope_kind, scope_id, scope_name, duration_us, reason, state, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'pending', coalesce($12, now()))`,
			id, p.TenantID, p.Requester, p.RequesterName, p.RequesterRole, p.Policy, p.ScopeKind, p.ScopeID, p.ScopeName,
			p.Duration.Microseconds(), p.Reason, now); err != nil {
			return q.wrap(op, err)
		}
		var err error
		if out, err = q.AccessRequestGet(ctx, id, now); err != nil {
			return err
		}
		return q.emit(ctx, now, accessEvent(events.AccessRequested, out, ""))
	})
	return out, err
}

// AccessRequestGet returns a request with its state as of now.
func (s *Store) AccessRequestGet(ctx context.Context, id string, now *time.Time) (*store.AccessRequest, error) {
	r, err := scanAccessRequest(s.db.QueryRow(ctx, accessSelect(2)+` WHERE id = $1`, id, s.clock(now)))
	if err != nil {
		return nil, s.wrap("get access request "+id, err)
	}
	return r, nil
}

// AccessRequestList pages requests by id.
func (s *Store) AccessRequestList(ctx context.Context, p *store.AccessRequestListParams) ([]*store.AccessRequest, error) {
	rows, err := s.db.Query(ctx, accessSelect(7)+`
		WHERE id > $1 AND ($3 = '' OR tenant_id = $3) AND ($5 = '' OR requester = $5)
		AND ($4 = '' OR `+accessState(7)+` = $4) AND `+withinTenant("tenant_id", 6)+`
		ORDER BY id LIMIT $2`, p.Cursor, limit(p.Limit), p.TenantID, p.State, p.Requester, p.Within, s.clock(p.Now))
	if err != nil {
		return nil, s.wrap("list access requests", err)
	}
	out, err := collect(rows, scanAccessRequest)
	return out, s.wrap("list access requests", err)
}

// accessConflict is the conflict of a step a request's state does not
// allow, or ErrNotFound: the request is read again (as of now) to say
// which.
func (s *Store) accessConflict(ctx context.Context, op, id string, now *time.Time) error {
	r, err := s.AccessRequestGet(ctx, id, now)
	if err != nil {
		return err
	}
	by := ""
	if r.DecidedBy != "" {
		by = " by " + r.DecidedBy
	}
	return fmt.Errorf("%s: access request %s is %s%s: %w", op, id, r.State, by, store.ErrConflict)
}

// AccessRequestDecide approves or denies a pending request in one
// conditional update: of two deciders, the second finds it decided.
func (s *Store) AccessRequestDecide(ctx context.Context, p *store.AccessRequestDecideParams) (*store.AccessRequest, error) {
	op, state, typ := "deny access request", store.AccessDenied, events.AccessDenied
	if p.Approve {
		op, state, typ = "approve access request", store.AccessApproved, events.AccessApproved
	}
	var out *store.AccessRequest
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		now := q.clock(p.Now)
		n, err := q.db.Exec(ctx, `UPDATE access_requests SET state = $2, decided_at = coalesce($3, now()), decided_by = $4,
				decided_by_name = $5, note = $6,
				starts_at = CASE WHEN $7 THEN coalesce($3, now()) END,
				ends_at = CASE WHEN $7 THEN coalesce($3, now()) + bc_micros(duration_us) END
			WHERE id = $1 AND state = 'pending' AND created_at > coalesce($3, now()) - bc_micros($8)`,
			p.ID, state, now, p.DecidedBy, p.DecidedByName, p.Note, p.Approve, store.AccessPendingTTL.Microseconds())
		if err != nil {
			return q.wrap(op, err)
		}
		if n == 0 {
			return q.accessConflict(ctx, op, p.ID, now)
		}
		if out, err = q.AccessRequestGet(ctx, p.ID, now); err != nil {
			return err
		}
		return q.emit(ctx, now, accessEvent(typ, out, store.AccessPending))
	})
	return out, err
}

// AccessRequestRevoke revokes a pending request, or an approved one
// before its end.
func (s *Store) AccessRequestRevoke(ctx context.Context, p *store.AccessRequestRevokeParams) (*store.AccessRequest, error) {
	op := "revoke access request"
	var out *store.AccessRequest
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		now := q.clock(p.Now)
		before, err := scanAccessRequest(q.db.QueryRow(ctx, accessSelect(2)+` WHERE id = $1`+q.d.ForUpdate, p.ID, now))
		if err != nil {
			return q.wrap(op, err)
		}
		if before.State != store.AccessPending && before.State != store.AccessApproved {
			return q.accessConflict(ctx, op, p.ID, now)
		}
		// The access ends at the revocation: an approved request keeps its
		// start, and its end becomes now.
		n, err := q.db.Exec(ctx, `UPDATE access_requests SET state = 'revoked', decided_at = coalesce($2, now()), decided_by = $3,
				decided_by_name = $4, note = $5,
				ends_at = CASE WHEN state = 'approved' THEN coalesce($2, now()) END
			WHERE id = $1 AND state = $6`, p.ID, now, p.RevokedBy, p.RevokedByName, p.Note, before.State)
		if err != nil {
			return q.wrap(op, err)
		}
		if n == 0 {
			return q.accessConflict(ctx, op, p.ID, now)
		}
		if out, err = q.AccessRequestGet(ctx, p.ID, now); err != nil {
			return err
		}
		return q.emit(ctx, now, accessEvent(events.AccessRevoked, out, before.State))
	})
	return out, err
}

// AccessGrantsActive returns the approved requests whose end is after
// now, by the index on (state, ends_at).
func (s *Store) AccessGrantsActive(ctx context.Context, now *time.Time) ([]*store.AccessRequest, error) {
	rows, err := s.db.Query(ctx, accessSelect(1)+` WHERE state = 'approved' AND ends_at > coalesce($1, now()) ORDER BY id`, s.clock(now))
	if err != nil {
		return nil, s.wrap("list active access grants", err)
	}
	out, err := collect(rows, scanAccessRequest)
	return out, s.wrap("list active access grants", err)
}

// AccessRequestSweep stores the requests that have expired by now, each
// with access.ended and an audit row, in one transaction; a request is
// swept by the update that changes its state, so once.
func (s *Store) AccessRequestSweep(ctx context.Context, now *time.Time) ([]*store.AccessRequest, error) {
	op := "sweep access requests"
	var out []*store.AccessRequest
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		at := q.clock(now)
		rows, err := q.db.Query(ctx, accessSelect(1)+` WHERE (state = 'pending' AND created_at <= coalesce($1, now()) - bc_micros($2))
			OR (state = 'approved' AND ends_at <= coalesce($1, now())) ORDER BY id LIMIT 1000`+q.d.ForUpdate,
			at, store.AccessPendingTTL.Microseconds())
		if err != nil {
			return q.wrap(op, err)
		}
		due, err := collect(rows, scanAccessRequest)
		if err != nil {
			return q.wrap(op, err)
		}
		var evs []event
		for _, r := range due {
			previous := store.AccessPending
			if r.Start != nil {
				previous = store.AccessApproved
			}
			n, err := q.db.Exec(ctx, `UPDATE access_requests SET state = 'expired' WHERE id = $1 AND state = $2`, r.ID, previous)
			if err != nil {
				return q.wrap(op, err)
			}
			if n == 0 {
				continue // another sweep, or a revocation, took it
			}
			r.State = store.AccessExpired
			details := fmt.Sprintf(`{"previousState":%q,"policy":%q,"requester":%q}`, previous, r.Policy, r.Requester)
			t := time.Now()
			if at != nil {
				t = *at
			}
			// The audit action is named like the event's topic.
			if _, err := q.AuditInsert(ctx, &store.AuditEntry{Time: t, Actor: "access", Action: strings.TrimPrefix(events.AccessEnded, events.TypePrefix), Resource: r.ID,
				Outcome: "ok", TenantID: r.TenantID, Details: []byte(details)}); err != nil {
				return err
			}
			evs = append(evs, accessEvent(events.AccessEnded, r, previous))
			out = append(out, r)
		}
		return q.emit(ctx, at, evs...)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
