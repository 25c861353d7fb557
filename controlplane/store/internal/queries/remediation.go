package queries

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// remediationEvents maps a case's state to the event a move into it writes.
var remediationEvents = map[string]string{
	store.RemediationDetected:    events.RemediationDetected,
	store.RemediationHeld:        events.RemediationHeld,
	store.RemediationQuarantined: events.RemediationQuarantined,
	store.RemediationDraining:    events.RemediationDraining,
	store.RemediationRemediating: events.RemediationRemediating,
	store.RemediationVerifying:   events.RemediationVerifying,
	store.RemediationReturned:    events.RemediationReturned,
	store.RemediationEscalated:   events.RemediationEscalated,
}

const remediationColumns = `id, node_id, pool_id, shard, state, finding, kind, resolution, xid, xid_mnemonic, gpu_uuid,
	message, action, attempts, command_id, command_ids, boot_id, paused, reason, next_at, state_since, quarantined_at,
	created_at, updated_at, closed_at`

func scanRemediation(r Row) (*store.Remediation, error) {
	m := &store.Remediation{}
	var ids string
	err := r.Scan(&m.ID, &m.NodeID, &m.PoolID, &m.Shard, &m.State, &m.Finding, &m.Kind, &m.Resolution, &m.XID,
		&m.XIDMnemonic, &m.GPUUUID, &m.Message, &m.Action, &m.Attempts, &m.CommandID, &ids, &m.BootID, &m.Paused, &m.Reason,
		&m.NextAt, &m.StateSince, &m.QuarantinedAt, &m.CreatedAt, &m.UpdatedAt, &m.ClosedAt)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(ids), &m.CommandIDs); err != nil {
		return nil, fmt.Errorf("remediation %s: command ids: %w", m.ID, err)
	}
	return m, nil
}

// remediationEvent is the event of a move of m from previous; history, the
// prior cases a repeat rule counted, goes into its data.
func remediationEvent(typ, previous string, m *store.Remediation, history ...*store.Remediation) event {
	d := events.RemediationData{RemediationID: m.ID, NodeID: m.NodeID, PoolID: m.PoolID,
		State: m.State, PreviousState: previous, Finding: m.Finding, Resolution: m.Resolution, XID: m.XID,
		XIDMnemonic: m.XIDMnemonic, GPUUUID: m.GPUUUID, Action: m.Action, Attempts: m.Attempts,
		CommandID: m.CommandID, Reason: m.Reason, Paused: m.Paused}
	for _, h := range history {
		d.History = append(d.History, events.RemediationPrior{RemediationID: h.ID, State: h.State, Finding: h.Finding,
			Resolution: h.Resolution, XID: h.XID, GPUUUID: h.GPUUUID, Action: h.Action, Actions: len(h.CommandIDs),
			CreatedAt: h.CreatedAt.UTC(), ClosedAt: h.ClosedAt})
	}
	return event{typ, m.NodeID, d}
}

// remediationAudit writes the audit row of a change to m.
func (s *Store) remediationAudit(ctx context.Context, action, actor string, m *store.Remediation, now time.Time, extra map[string]any) error {
	d := map[string]any{"nodeId": m.NodeID, "state": m.State, "action": m.Action, "attempts": m.Attempts}
	if m.CommandID != "" {
		d["commandId"] = m.CommandID
	}
	if m.Reason != "" {
		d["reason"] = m.Reason
	}
	for k, v := range extra {
		d[k] = v
	}
	details, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("remediation audit details: %w", err)
	}
	_, err = s.AuditInsert(ctx, &store.AuditEntry{Time: now, Actor: actor, Action: action,
		Resource: "remediation/" + m.ID, Outcome: "success", Details: details})
	return err
}

// remediationFinding records the finding an event carries, in its
// transaction: a node's GPU finding that names a resolution. The row's
// columns repeat the finding's GPU, XID and resolution; the finding itself
// stays in the event's payload, which RemediationFindingsTake reads back.
func (s *Store) remediationFinding(ctx context.Context, eventID int64, e *store.Event, at time.Time) error {
	f := e.GPUFinding
	if f.GetResolution() == "" || e.NodeID == "" {
		return nil
	}
	_, err := s.db.Exec(ctx, `INSERT INTO remediation_findings (node_id, shard, kind, severity, resolution, xid,
			xid_mnemonic, gpu_uuid, message, event_id, created_at)
		SELECT id, shard, $2, $3, $4, $5, $6, $7, $8, $9, $10 FROM nodes WHERE id = $1`,
		e.NodeID, e.Kind, e.Severity, f.GetResolution(), int(f.GetXid().GetCode()), f.GetXid().GetMnemonic(),
		f.GetGpuUuid(), e.Message, eventID, at.UTC())
	return s.wrap("record remediation finding", err)
}

// findingOf is the typed finding of an inbox row: the event's payload
// (gpufinding.Decode, either stored shape), or, when the event is gone
// (pruned) or its payload unreadable, one made of the row's columns.
func findingOf(f *store.RemediationFinding, payload []byte) *sessionv1.GPUFinding {
	if len(payload) > 0 {
		if g, err := gpufinding.Decode(f.Kind, payload); err == nil {
			return g
		}
	}
	l := gpufinding.Legacy{Kind: f.Kind, GPUUUID: f.GPUUUID, XID: uint32(max(f.XID, 0)), XIDMnemonic: f.XIDMnemonic,
		Resolution: f.Resolution, Message: f.Message}
	return l.Finding()
}

// RemediationFindingsTake returns and deletes up to limit findings of shard.
func (s *Store) RemediationFindingsTake(ctx context.Context, shard, n int) ([]*store.RemediationFinding, error) {
	var out []*store.RemediationFinding
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		rows, err := q.db.Query(ctx, `SELECT f.id, f.node_id, f.shard, f.kind, f.severity, f.resolution, f.xid,
				f.xid_mnemonic, f.gpu_uuid, f.message, f.event_id, f.created_at,
				(SELECT e.payload FROM events e WHERE e.id = f.event_id)
			FROM remediation_findings f WHERE f.shard = $1 ORDER BY f.id LIMIT $2`+q.d.ForUpdate,
			shard, limit(n))
		if err != nil {
			return q.wrap("take remediation findings", err)
		}
		out, err = collect(rows, func(r Row) (*store.RemediationFinding, error) {
			f := &store.RemediationFinding{}
			var payload []byte
			if err := r.Scan(&f.ID, &f.NodeID, &f.Shard, &f.Kind, &f.Severity, &f.Resolution, &f.XID, &f.XIDMnemonic,
				&f.GPUUUID, &f.Message, &f.EventID, &f.CreatedAt, &payload); err != nil {
				return nil, err
			}
			f.GPUFinding = findingOf(f, payload)
			return f, nil
		})
		if err != nil || len(out) == 0 {
			return q.wrap("take remediation findings", err)
		}
		ids := make([]int, len(out))
		for i, f := range out {
			ids[i] = int(f.ID)
		}
		set, arg := q.intSet("$1", ids)
		_, err = q.db.Exec(ctx, `DELETE FROM remediation_findings WHERE id IN (`+set+`)`, arg)
		return q.wrap("take remediation findings", err)
	})
	return out, err
}

// RemediationDue returns the shards with work for the reconciler.
func (s *Store) RemediationDue(ctx context.Context, shards []int, now *time.Time) ([]int, error) {
	if len(shards) == 0 {
		return nil, nil
	}
	set, arg := s.intSet("$1", shards)
	rows, err := s.db.Query(ctx, `SELECT DISTINCT shard FROM remediation_findings WHERE shard IN (`+set+`)
		UNION SELECT DISTINCT shard FROM remediations WHERE closed_at IS NULL AND NOT paused
			AND next_at <= coalesce($2, now()) AND shard IN (`+set+`)
		ORDER BY 1`, arg, s.clock(now))
	if err != nil {
		return nil, s.wrap("remediation due shards", err)
	}
	ps, err := collect(rows, func(r Row) (*int, error) {
		var n int
		return &n, r.Scan(&n)
	})
	if err != nil {
		return nil, s.wrap("remediation due shards", err)
	}
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = *p
	}
	return out, nil
}

// RemediationCreate opens a case.
func (s *Store) RemediationCreate(ctx context.Context, r *store.Remediation, actor string) (*store.Remediation, error) {
	var out *store.Remediation
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		now := time.Now().UTC()
		if !r.CreatedAt.IsZero() {
			now = r.CreatedAt.UTC()
		}
		id := r.ID
		if id == "" {
			id = store.NewID("rem")
		}
		next := r.NextAt
		if next.IsZero() {
			next = now
		}
		ids, _ := json.Marshal(append([]string{}, r.CommandIDs...))
		var err error
		out, err = scanRemediation(q.db.QueryRow(ctx, `INSERT INTO remediations (id, node_id, pool_id, shard, state, finding,
				kind, resolution, xid, xid_mnemonic, gpu_uuid, message, action, attempts, command_id, command_ids, boot_id, paused,
				reason, next_at, state_since, quarantined_at, created_at, updated_at)
			SELECT $1, n.id, n.pool_id, n.shard, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $20, $15, $16, $17, $18,
				$19, $18, $18 FROM nodes n WHERE n.id = $2
			RETURNING `+remediationColumns,
			id, r.NodeID, r.State, r.Finding, r.Kind, r.Resolution, r.XID, r.XIDMnemonic, r.GPUUUID, r.Message, r.Action,
			r.Attempts, r.CommandID, string(ids), r.Paused, r.Reason, next.UTC(), now, r.QuarantinedAt, r.BootID))
		if err != nil {
			return q.wrap("open remediation for node "+r.NodeID, err)
		}
		if err := q.emit(ctx, &now, remediationEvent(remediationEvents[out.State], "", out)); err != nil {
			return err
		}
		return q.remediationAudit(ctx, "remediation."+out.State, actor, out, now, map[string]any{"finding": out.Finding,
			"resolution": out.Resolution, "xid": out.XID})
	})
	return out, err
}

// RemediationGet returns a case.
func (s *Store) RemediationGet(ctx context.Context, id string) (*store.Remediation, error) {
	m, err := scanRemediation(s.db.QueryRow(ctx, `SELECT `+remediationColumns+` FROM remediations WHERE id = $1`, id))
	return m, s.wrap("get remediation "+id, err)
}

// RemediationOpenFor returns a node's open case.
func (s *Store) RemediationOpenFor(ctx context.Context, nodeID string) (*store.Remediation, error) {
	m, err := scanRemediation(s.db.QueryRow(ctx, `SELECT `+remediationColumns+` FROM remediations
		WHERE node_id = $1 AND closed_at IS NULL`, nodeID))
	return m, s.wrap("get open remediation of node "+nodeID, err)
}

// RemediationRecent returns a node's cases created at or after since,
// newest first, at most limit.
func (s *Store) RemediationRecent(ctx context.Context, nodeID string, since time.Time, n int) ([]*store.Remediation, error) {
	rows, err := s.db.Query(ctx, `SELECT `+remediationColumns+` FROM remediations
		WHERE node_id = $1 AND created_at >= $2
		ORDER BY created_at DESC, id DESC LIMIT $3`, nodeID, since.UTC(), limit(n))
	if err != nil {
		return nil, s.wrap("list recent remediations of node "+nodeID, err)
	}
	out, err := collect(rows, scanRemediation)
	return out, s.wrap("list recent remediations of node "+nodeID, err)
}

// RemediationOpenInShard returns the due open cases of a shard.
func (s *Store) RemediationOpenInShard(ctx context.Context, shard int, now *time.Time, withPaused bool) ([]*store.Remediation, error) {
	rows, err := s.db.Query(ctx, `SELECT `+remediationColumns+` FROM remediations
		WHERE shard = $1 AND closed_at IS NULL AND next_at <= coalesce($2, now()) AND ($3 OR NOT paused)
		ORDER BY created_at, id`, shard, s.clock(now), withPaused)
	if err != nil {
		return nil, s.wrap("list open remediations", err)
	}
	out, err := collect(rows, scanRemediation)
	return out, s.wrap("list open remediations", err)
}

// RemediationList returns cases by id, paged by the last id.
func (s *Store) RemediationList(ctx context.Context, p *store.RemediationListParams) ([]*store.Remediation, error) {
	rows, err := s.db.Query(ctx, `SELECT `+remediationColumns+` FROM remediations
		WHERE id > $1 AND ($2 = '' OR node_id = $2) AND ($3 = '' OR pool_id = $3) AND ($4 = '' OR state = $4)
			AND (NOT $5 OR closed_at IS NULL)
		ORDER BY id LIMIT $6`, p.Cursor, p.NodeID, p.PoolID, p.State, p.OpenOnly, limit(p.Limit))
	if err != nil {
		return nil, s.wrap("list remediations", err)
	}
	out, err := collect(rows, scanRemediation)
	return out, s.wrap("list remediations", err)
}

// RemediationMove moves a case.
func (s *Store) RemediationMove(ctx context.Context, p *store.RemediationMoveParams) (*store.Remediation, error) {
	if _, ok := remediationEvents[p.To]; !ok {
		return nil, fmt.Errorf("move remediation %s: unknown state %q", p.ID, p.To)
	}
	var out *store.Remediation
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		cur, err := scanRemediation(q.db.QueryRow(ctx, `SELECT `+remediationColumns+` FROM remediations
			WHERE id = $1 AND closed_at IS NULL`+q.d.ForUpdate, p.ID))
		if err != nil {
			return q.wrap("move remediation "+p.ID, err)
		}
		if len(p.From) > 0 && !slices.Contains(p.From, cur.State) {
			return fmt.Errorf("move remediation %s from %s to %s: %w", p.ID, cur.State, p.To, store.ErrNotFound)
		}
		now := time.Now().UTC()
		if p.Now != nil {
			now = p.Now.UTC()
		}
		m := *cur
		previous := cur.State
		if p.To != cur.State {
			m.StateSince = now
		}
		m.State = p.To
		if p.Action != "" {
			m.Action = p.Action
		}
		if p.GPUUUID != "" {
			m.GPUUUID = p.GPUUUID
		}
		if p.Finding != "" {
			m.Finding = p.Finding
		}
		if p.Attempts != nil {
			m.Attempts = *p.Attempts
		}
		if p.ClearCommand {
			m.CommandID = ""
		}
		if p.CommandID != "" {
			m.CommandID = p.CommandID
			if !p.Check {
				m.CommandIDs = append(slices.Clone(m.CommandIDs), p.CommandID)
			}
		}
		if p.Reason != "" {
			m.Reason = p.Reason
		}
		if p.BootID != "" {
			m.BootID = p.BootID
		}
		if p.Paused != nil {
			m.Paused = *p.Paused
		}
		m.NextAt = now
		if p.NextAt != nil {
			m.NextAt = p.NextAt.UTC()
		}
		if p.To == store.RemediationQuarantined && m.QuarantinedAt == nil {
			m.QuarantinedAt = &now
		}
		m.UpdatedAt = now
		if p.To == store.RemediationReturned {
			m.ClosedAt = &now
		}
		ids, _ := json.Marshal(append([]string{}, m.CommandIDs...))
		out, err = scanRemediation(q.db.QueryRow(ctx, `UPDATE remediations SET state = $2, action = $3, attempts = $4,
				command_id = $5, command_ids = $6, reason = $7, paused = $8, next_at = $9, state_since = $10,
				quarantined_at = $11, updated_at = $12, closed_at = $13, boot_id = $14, finding = $15, gpu_uuid = $16
			WHERE id = $1 RETURNING `+remediationColumns,
			m.ID, m.State, m.Action, m.Attempts, m.CommandID, string(ids), m.Reason, m.Paused, m.NextAt, m.StateSince,
			m.QuarantinedAt, m.UpdatedAt, m.ClosedAt, m.BootID, m.Finding, m.GPUUUID))
		if err != nil {
			return q.wrap("move remediation "+p.ID, err)
		}
		if previous == out.State {
			return nil // a retry or new next time, not a move: no event
		}
		if err := q.emit(ctx, &now, remediationEvent(remediationEvents[out.State], previous, out, p.History...)); err != nil {
			return err
		}
		extra := map[string]any{"previousState": previous}
		if len(p.History) > 0 {
			ids := make([]string, len(p.History))
			for i, h := range p.History {
				ids[i] = h.ID
			}
			extra["history"] = ids
		}
		return q.remediationAudit(ctx, "remediation."+out.State, p.Actor, out, now, extra)
	})
	return out, err
}

// RemediationSetPaused pauses or resumes an open case.
func (s *Store) RemediationSetPaused(ctx context.Context, id string, paused bool, actor string) (*store.Remediation, error) {
	var out *store.Remediation
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		now := time.Now().UTC()
		var err error
		out, err = scanRemediation(q.db.QueryRow(ctx, `UPDATE remediations SET paused = $2, updated_at = $3, next_at = $3
			WHERE id = $1 AND closed_at IS NULL RETURNING `+remediationColumns, id, paused, now))
		if err != nil {
			return q.wrap("pause remediation "+id, err)
		}
		typ, action := events.RemediationPaused, "remediation.pause"
		if !paused {
			typ, action = events.RemediationResumed, "remediation.resume"
		}
		if err := q.emit(ctx, &now, remediationEvent(typ, out.State, out)); err != nil {
			return err
		}
		return q.remediationAudit(ctx, action, actor, out, now, nil)
	})
	return out, err
}

// lockBreaker locks the pool's row and returns its breaker (a zero one
// when the pool has none yet); ErrNotFound for an unknown pool.
func (s *Store) lockBreaker(ctx context.Context, poolID string) (*store.RemediationBreaker, error) {
	var one int
	if err := s.db.QueryRow(ctx, `SELECT 1 FROM pools WHERE id = $1`+s.d.LockParent, poolID).Scan(&one); err != nil {
		return nil, s.wrap("lock pool "+poolID, err)
	}
	b := &store.RemediationBreaker{PoolID: poolID}
	err := s.db.QueryRow(ctx, `SELECT tripped_at, reset_at, reset_by FROM remediation_breakers WHERE pool_id = $1`, poolID).
		Scan(&b.TrippedAt, &b.ResetAt, &b.ResetBy)
	if err != nil && !isNotFound(s.d.Translate(err)) {
		return nil, s.wrap("read breaker of pool "+poolID, err)
	}
	return b, nil
}

// RemediationBreakerAdmit admits one more node acted on in a pool, or
// trips its breaker.
func (s *Store) RemediationBreakerAdmit(ctx context.Context, p *store.RemediationBreakerAdmitParams) (admitted, tripped bool, err error) {
	if p.Limit < 1 && p.LimitFor == nil {
		return false, false, fmt.Errorf("breaker of pool %s: limit %d is below 1", p.PoolID, p.Limit)
	}
	err = s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		b, err := q.lockBreaker(ctx, p.PoolID)
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		if p.Now != nil {
			now = p.Now.UTC()
		}
		if b.TrippedAt != nil {
			if p.Window <= 0 || now.Before(b.TrippedAt.Add(p.Window)) {
				return nil
			}
			// Its window has passed since it tripped: it closes by itself.
			if err := q.breakerClose(ctx, p.PoolID, "window", now); err != nil {
				return err
			}
			b.ResetAt = &now
		}
		since := now.Add(-p.Window)
		if b.ResetAt != nil && b.ResetAt.After(since) {
			since = *b.ResetAt
		}
		if p.NodeID != "" {
			var again int
			if err := q.db.QueryRow(ctx, `SELECT count(*) FROM remediations WHERE pool_id = $1 AND node_id = $2 AND quarantined_at >= $3`,
				p.PoolID, p.NodeID, since).Scan(&again); err != nil {
				return q.wrap("count quarantines of node "+p.NodeID, err)
			}
			if again > 0 {
				admitted = true
				return nil
			}
		}
		var n int
		if err := q.db.QueryRow(ctx, `SELECT count(DISTINCT node_id) FROM remediations WHERE pool_id = $1 AND quarantined_at >= $2`,
			p.PoolID, since).Scan(&n); err != nil {
			return q.wrap("count quarantines of pool "+p.PoolID, err)
		}
		limit := p.Limit
		if p.LimitFor != nil {
			gpus, err := q.PoolGPUNodes(ctx, p.PoolID)
			if err != nil {
				return err
			}
			limit = max(p.LimitFor(gpus), 1)
		}
		older := 0
		if p.CaseID != "" {
			if err := q.db.QueryRow(ctx, `SELECT count(*) FROM remediations WHERE pool_id = $1 AND state = 'held'
				AND closed_at IS NULL AND (created_at < $2 OR created_at = $2 AND id < $3)`,
				p.PoolID, p.CreatedAt.UTC(), p.CaseID).Scan(&older); err != nil {
				return q.wrap("count held cases of pool "+p.PoolID, err)
			}
		}
		if n+older < limit {
			admitted = true
			return nil
		}
		if n < limit {
			return nil // older held cases go first
		}
		tripped = true
		if _, err := q.db.Exec(ctx, `INSERT INTO remediation_breakers (pool_id, tripped_at) VALUES ($1, $2)
			ON CONFLICT (pool_id) DO UPDATE SET tripped_at = excluded.tripped_at`, p.PoolID, now); err != nil {
			return q.wrap("trip breaker of pool "+p.PoolID, err)
		}
		data := events.RemediationBreakerData{PoolID: p.PoolID, Quarantines: n, Limit: limit,
			WindowSeconds: int64(p.Window / time.Second)}
		if err := q.emit(ctx, &now, event{events.RemediationBreakerTripped, p.PoolID, data}); err != nil {
			return err
		}
		details, _ := json.Marshal(data)
		_, err = q.AuditInsert(ctx, &store.AuditEntry{Time: now, Actor: "remediation", Action: "remediation.breaker-tripped",
			Resource: "pool/" + p.PoolID, Outcome: "success", Details: details})
		return err
	})
	return admitted, tripped, err
}

// PoolGPUNodes counts the pool's nodes whose inventory lists a GPU.
func (s *Store) PoolGPUNodes(ctx context.Context, poolID string) (int, error) {
	var n int
	err := s.db.QueryRow(ctx, `SELECT count(*) FROM nodes n JOIN node_inventories i ON i.node_id = n.id
		WHERE n.pool_id = $1 AND `+fmt.Sprintf(s.d.HasGPUs, "i.inventory"), poolID).Scan(&n)
	return n, s.wrap("count GPU nodes of pool "+poolID, err)
}

// breakerClose closes a tripped breaker whose window has passed, evented
// remediation.breaker-reset with ResetBy by.
func (s *Store) breakerClose(ctx context.Context, poolID, by string, now time.Time) error {
	if _, err := s.db.Exec(ctx, `UPDATE remediation_breakers SET tripped_at = NULL, reset_at = $2, reset_by = $3 WHERE pool_id = $1`,
		poolID, now, by); err != nil {
		return s.wrap("close breaker of pool "+poolID, err)
	}
	return s.emit(ctx, &now, event{events.RemediationBreakerReset, poolID, events.RemediationBreakerData{PoolID: poolID, ResetBy: by}})
}

// RemediationBreakerStates returns every pool's breaker as it stands.
func (s *Store) RemediationBreakerStates(ctx context.Context, window time.Duration, now *time.Time) ([]*store.RemediationBreakerState, error) {
	t := time.Now().UTC()
	if now != nil {
		t = now.UTC()
	}
	since := t.Add(-window)
	rows, err := s.db.Query(ctx, `SELECT p.id, b.tripped_at, b.reset_at, COALESCE(b.reset_by, ''),
		(SELECT count(DISTINCT r.node_id) FROM remediations r WHERE r.pool_id = p.id AND r.quarantined_at >= $1
			AND (b.reset_at IS NULL OR r.quarantined_at >= b.reset_at)),
		(SELECT count(*) FROM remediations r WHERE r.pool_id = p.id AND r.state = 'held' AND r.closed_at IS NULL),
		(SELECT count(*) FROM nodes n JOIN node_inventories i ON i.node_id = n.id WHERE n.pool_id = p.id AND `+
		fmt.Sprintf(s.d.HasGPUs, "i.inventory")+`)
		FROM pools p LEFT JOIN remediation_breakers b ON b.pool_id = p.id ORDER BY p.id`, since)
	if err != nil {
		return nil, s.wrap("read breakers", err)
	}
	out, err := collect(rows, func(r Row) (*store.RemediationBreakerState, error) {
		b := &store.RemediationBreakerState{}
		return b, r.Scan(&b.PoolID, &b.TrippedAt, &b.ResetAt, &b.ResetBy, &b.Acted, &b.Held, &b.GPUNodes)
	})
	return out, s.wrap("read breakers", err)
}

// RemediationBreakerReset resets a pool's breaker.
func (s *Store) RemediationBreakerReset(ctx context.Context, poolID, actor string, now *time.Time) (*store.RemediationBreaker, error) {
	var out *store.RemediationBreaker
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		if _, err := q.lockBreaker(ctx, poolID); err != nil {
			return err
		}
		t := time.Now().UTC()
		if now != nil {
			t = now.UTC()
		}
		if _, err := q.db.Exec(ctx, `INSERT INTO remediation_breakers (pool_id, tripped_at, reset_at, reset_by) VALUES ($1, NULL, $2, $3)
			ON CONFLICT (pool_id) DO UPDATE SET tripped_at = NULL, reset_at = excluded.reset_at, reset_by = excluded.reset_by`,
			poolID, t, actor); err != nil {
			return q.wrap("reset breaker of pool "+poolID, err)
		}
		out = &store.RemediationBreaker{PoolID: poolID, ResetAt: &t, ResetBy: actor}
		data := events.RemediationBreakerData{PoolID: poolID, ResetBy: actor}
		if err := q.emit(ctx, &t, event{events.RemediationBreakerReset, poolID, data}); err != nil {
			return err
		}
		details, _ := json.Marshal(data)
		_, err := q.AuditInsert(ctx, &store.AuditEntry{Time: t, Actor: actor, Action: "remediation.resetBreaker",
			Resource: "pool/" + poolID, Outcome: "success", Details: details})
		return err
	})
	return out, err
}

// RemediationBreakers returns the pools' breakers.
func (s *Store) RemediationBreakers(ctx context.Context) ([]*store.RemediationBreaker, error) {
	rows, err := s.db.Query(ctx, `SELECT pool_id, tripped_at, reset_at, reset_by FROM remediation_breakers ORDER BY pool_id`)
	if err != nil {
		return nil, s.wrap("list breakers", err)
	}
	out, err := collect(rows, func(r Row) (*store.RemediationBreaker, error) {
		b := &store.RemediationBreaker{}
		return b, r.Scan(&b.PoolID, &b.TrippedAt, &b.ResetAt, &b.ResetBy)
	})
	return out, s.wrap("list breakers", err)
}

// silentNodes selects the nodes RemediationSilentDue counts.
const silentNodes = `FROM nodes n WHERE n.state = 'unreachable'
	AND EXISTS (SELECT 1 FROM secrets x WHERE x.name = 'bmc/' || n.id)
	AND NOT EXISTS (SELECT 1 FROM remediations r WHERE r.node_id = n.id AND r.closed_at IS NULL)`

// RemediationSilentDue returns the shards holding a silent node to ask the
// BMC of.
func (s *Store) RemediationSilentDue(ctx context.Context, shards []int) ([]int, error) {
	if len(shards) == 0 {
		return nil, nil
	}
	set, arg := s.intSet("$1", shards)
	rows, err := s.db.Query(ctx, `SELECT DISTINCT n.shard `+silentNodes+` AND n.shard IN (`+set+`) ORDER BY 1`, arg)
	if err != nil {
		return nil, s.wrap("silent nodes' shards", err)
	}
	ps, err := collect(rows, func(r Row) (*int, error) {
		var n int
		return &n, r.Scan(&n)
	})
	if err != nil {
		return nil, s.wrap("silent nodes' shards", err)
	}
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = *p
	}
	return out, nil
}

// RemediationSilentNodes returns a shard's silent nodes with BMC
// credentials and no open case.
func (s *Store) RemediationSilentNodes(ctx context.Context, shard int) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT n.id `+silentNodes+` AND n.shard = $1 ORDER BY n.id`, shard)
	if err != nil {
		return nil, s.wrap("silent nodes", err)
	}
	out, err := texts(rows)
	return out, s.wrap("silent nodes", err)
}

// SecretGrant grants a node one use of a secret for a command.
func (s *Store) SecretGrant(ctx context.Context, p *store.SecretGrantParams) error {
	_, err := s.db.Exec(ctx, `INSERT INTO secret_grants (name, node_id, command_id, expires_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (name, node_id, command_id) DO UPDATE SET expires_at = excluded.expires_at`,
		p.Name, p.NodeID, p.CommandID, p.ExpiresAt.UTC())
	return s.wrap("grant secret "+p.Name, err)
}

// SecretGrantTake uses up one unexpired grant.
func (s *Store) SecretGrantTake(ctx context.Context, name, nodeID string, now *time.Time) (bool, error) {
	var ok bool
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		var cmd string
		err := q.db.QueryRow(ctx, `SELECT command_id FROM secret_grants WHERE name = $1 AND node_id = $2
			AND expires_at > coalesce($3, now()) ORDER BY expires_at LIMIT 1`+q.d.ForUpdate, name, nodeID, q.clock(now)).Scan(&cmd)
		if isNotFound(q.d.Translate(err)) {
			return nil
		}
		if err != nil {
			return q.wrap("take secret grant "+name, err)
		}
		ok = true
		_, err = q.db.Exec(ctx, `DELETE FROM secret_grants WHERE name = $1 AND node_id = $2 AND command_id = $3`, name, nodeID, cmd)
		return q.wrap("take secret grant "+name, err)
	})
	return ok, err
}

// RemediationPrune deletes the cases closed before before and the kept
// findings taken before it.
func (s *Store) RemediationPrune(ctx context.Context, before time.Time) (int64, error) {
	n, err := s.db.Exec(ctx, `DELETE FROM remediations WHERE closed_at IS NOT NULL AND closed_at < $1`, before)
	if err != nil {
		return 0, s.wrap("prune remediation cases", err)
	}
	// The kept findings (migration 0020) age out with them.
	kept, err := s.pruneFindings(ctx, before)
	return n + kept, err
}
