package queries

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/healthgate"
	"github.com/better-compute/better-compute/controlplane/store"
)

const rolloutColumns = `id, pool_id, version, base_url, canary, wave, max_unavailable, soak_us, timeout_us, drain,
	state, current_wave, reason, failed_node_id, created_by, created_at, updated_at, finished_at,
	bake_us, bake_started_at, bake_elapsed_us, bake_resumed_at, require_evidence, health_gates`

// activeRolloutStates is the SQL list of store.RolloutActive's states.
const activeRolloutStates = `('pending', 'running', 'paused', 'rolling-back')`

// openRolloutStates adds halted: at most one such rollout per pool
// (rollouts_pool_open_idx).
const openRolloutStates = `('pending', 'running', 'paused', 'rolling-back', 'halted')`

func scanRollout(r Row) (*store.Rollout, error) {
	ro := &store.Rollout{}
	var soak, timeout, bake, baked int64
	var gates string
	err := r.Scan(&ro.ID, &ro.PoolID, &ro.Version, &ro.BaseURL, &ro.Canary, &ro.Wave, &ro.MaxUnavailable, &soak, &timeout,
		&ro.Drain, &ro.State, &ro.CurrentWave, &ro.Reason, &ro.FailedNodeID, &ro.CreatedBy, &ro.CreatedAt, &ro.UpdatedAt,
		&ro.FinishedAt, &bake, &ro.BakeStartedAt, &baked, &ro.BakeResumedAt, &ro.RequireEvidence, &gates)
	if err == nil && gates != "" {
		if jerr := json.Unmarshal([]byte(gates), &ro.Gates); jerr != nil {
			err = fmt.Errorf("rollout %s: health gates: %w", ro.ID, jerr)
		}
	}
	ro.Soak, ro.Timeout = time.Duration(soak)*time.Microsecond, time.Duration(timeout)*time.Microsecond
	ro.Bake, ro.BakeElapsed = time.Duration(bake)*time.Microsecond, time.Duration(baked)*time.Microsecond
	return ro, err
}

// rolloutStateEvents maps a rollout state to the event a move into it
// writes (running: rollout.started from pending, rollout.resumed else).
var rolloutStateEvents = map[string]string{
	store.RolloutPending:     events.RolloutCreated,
	store.RolloutPaused:      events.RolloutPaused,
	store.RolloutRollingBack: events.RolloutRollingBack,
	store.RolloutHalted:      events.RolloutHalted,
	store.RolloutCompleted:   events.RolloutCompleted,
	store.RolloutAborted:     events.RolloutAborted,
	store.RolloutFailed:      events.RolloutFailed,
}

// rolloutNodeEvents maps a rollout node state to the event a move into it
// writes (none for pending).
var rolloutNodeEvents = map[string]string{
	store.RolloutNodeDraining:    events.RolloutNodeDraining,
	store.RolloutNodeUpgrading:   events.RolloutNodeUpgrading,
	store.RolloutNodeSoaking:     events.RolloutNodeSoaking,
	store.RolloutNodeUpgraded:    events.RolloutNodeUpgraded,
	store.RolloutNodeSkipped:     events.RolloutNodeSkipped,
	store.RolloutNodeFailed:      events.RolloutNodeFailed,
	store.RolloutNodeRollingBack: events.RolloutNodeRollingBack,
	store.RolloutNodeRolledBack:  events.RolloutNodeRolledBack,
}

func rolloutEvent(typ string, ro *store.Rollout, previous, actor string, halted ...store.RolloutHaltedNode) event {
	d := events.RolloutData{RolloutID: ro.ID, PoolID: ro.PoolID, Version: ro.Version, State: ro.State,
		PreviousState: previous, Wave: ro.CurrentWave, Reason: ro.Reason, FailedNodeID: ro.FailedNodeID, Actor: actor}
	for _, n := range halted {
		d.Nodes = append(d.Nodes, events.RolloutHaltedNodeData{NodeID: n.NodeID, Hostname: n.Hostname, Wave: n.Wave, State: n.State, Reason: n.Reason})
	}
	return event{typ, ro.ID, d}
}

func rolloutTerminal(state string) bool {
	return state == store.RolloutCompleted || state == store.RolloutAborted || state == store.RolloutFailed
}

// RolloutCreate inserts a rollout and one pending row per node of its pool.
func (s *Store) RolloutCreate(ctx context.Context, p *store.RolloutCreateParams) (*store.Rollout, error) {
	id := p.ID
	if id == "" {
		id = store.NewID("roll")
	}
	now := s.clock(p.Now)
	var out *store.Rollout
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		if _, err := q.PoolGet(ctx, p.PoolID); err != nil {
			return err
		}
		ro, err := scanRollout(q.db.QueryRow(ctx, `INSERT INTO rollouts (id, pool_id, version, base_url, canary, wave,
			max_unavailable, soak_us, timeout_us, drain, state, created_by, created_at, updated_at, bake_us, require_evidence)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'pending', $11, coalesce($12, now()), coalesce($12, now()), $13, $14)
			RETURNING `+rolloutColumns, id, p.PoolID, p.Version, p.BaseURL, p.Canary, p.Wave, p.MaxUnavailable,
			p.Soak.Microseconds(), p.Timeout.Microseconds(), p.Drain, p.CreatedBy, now, p.Bake.Microseconds(), p.RequireEvidence))
		if err != nil {
			return q.wrap("create rollout of pool "+p.PoolID, err)
		}
		if _, err := q.db.Exec(ctx, `INSERT INTO rollout_nodes (rollout_id, node_id, previous_version, state, state_since)
			SELECT $1, id, bcd_version, 'pending', coalesce($3, now()) FROM nodes WHERE pool_id = $2`, id, p.PoolID, now); err != nil {
			return q.wrap("create rollout of pool "+p.PoolID, err)
		}
		out = ro
		return q.emit(ctx, now, rolloutEvent(events.RolloutCreated, ro, "", p.CreatedBy))
	})
	return out, err
}

// RolloutGet returns a rollout.
func (s *Store) RolloutGet(ctx context.Context, id string) (*store.Rollout, error) {
	ro, err := scanRollout(s.db.QueryRow(ctx, `SELECT `+rolloutColumns+` FROM rollouts WHERE id = $1`, id))
	if err != nil {
		return nil, s.wrap("get rollout "+id, err)
	}
	return ro, nil
}

// RolloutList pages rollouts by id.
func (s *Store) RolloutList(ctx context.Context, p *store.RolloutListParams) ([]*store.Rollout, error) {
	rows, err := s.db.Query(ctx, `SELECT `+rolloutColumns+` FROM rollouts
		WHERE id > $1 AND ($2 = '' OR pool_id = $2) AND (NOT $3 OR state IN `+openRolloutStates+`)
		ORDER BY id LIMIT $4`, p.Cursor, p.PoolID, p.Active, limit(p.Limit))
	if err != nil {
		return nil, s.wrap("list rollouts", err)
	}
	out, err := collect(rows, scanRollout)
	return out, s.wrap("list rollouts", err)
}

// RolloutsActive returns the active rollouts (index rollouts_active_idx).
func (s *Store) RolloutsActive(ctx context.Context) ([]*store.Rollout, error) {
	rows, err := s.db.Query(ctx, `SELECT `+rolloutColumns+` FROM rollouts WHERE state IN `+activeRolloutStates+` ORDER BY id`)
	if err != nil {
		return nil, s.wrap("list active rollouts", err)
	}
	out, err := collect(rows, scanRollout)
	return out, s.wrap("list active rollouts", err)
}

// RolloutNodes returns a rollout's nodes with their live state, in one
// read: the node, whether it has a session, and its commands' states.
func (s *Store) RolloutNodes(ctx context.Context, rolloutID string) ([]*store.RolloutNode, error) {
	rows, err := s.db.Query(ctx, `SELECT rn.rollout_id, rn.node_id, rn.previous_version, rn.state, rn.wave,
		rn.upgrade_command_id, rn.rollback_command_id, rn.reason, rn.state_since, rn.watch_starts, rn.session_since, rn.drops, rn.soak_started_at,
		n.hostname, n.state, n.bcd_version, CASE WHEN se.node_id IS NULL THEN 0 ELSE 1 END, se.connected_at, n.bcd_starts,
		n.reconnect_by, n.disruption, n.disruption_owner,
		coalesce(cu.state, ''), coalesce(cu.error, ''), coalesce(cr.state, ''), coalesce(cr.error, '')
		FROM rollout_nodes rn
		JOIN nodes n ON n.id = rn.node_id
		LEFT JOIN sessions se ON se.node_id = rn.node_id
		LEFT JOIN commands cu ON cu.id = rn.upgrade_command_id AND rn.upgrade_command_id <> ''
		LEFT JOIN commands cr ON cr.id = rn.rollback_command_id AND rn.rollback_command_id <> ''
		WHERE rn.rollout_id = $1 ORDER BY rn.wave, rn.node_id`, rolloutID)
	if err != nil {
		return nil, s.wrap("list nodes of rollout "+rolloutID, err)
	}
	out, err := collect(rows, func(r Row) (*store.RolloutNode, error) {
		n := &store.RolloutNode{}
		var connected int
		err := r.Scan(&n.RolloutID, &n.NodeID, &n.PreviousVersion, &n.State, &n.Wave, &n.UpgradeCommandID,
			&n.RollbackCommandID, &n.Reason, &n.StateSince, &n.WatchStarts, &n.SeenSessionSince, &n.Drops, &n.SoakStartedAt,
			&n.Hostname, &n.NodeState, &n.BCDVersion, &connected, &n.SessionSince, &n.BCDStarts, &n.ReconnectBy,
			&n.Disruption, &n.DisruptionOwner, &n.UpgradeState, &n.UpgradeError, &n.RollbackState, &n.RollbackError)
		n.Connected = connected != 0
		return n, err
	})
	return out, s.wrap("list nodes of rollout "+rolloutID, err)
}

// RolloutUpdate changes a rollout under its row lock and writes the
// events of the change.
func (s *Store) RolloutUpdate(ctx context.Context, p *store.RolloutUpdateParams) (*store.Rollout, error) {
	now := s.clock(p.Now)
	var out *store.Rollout
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		ro, err := scanRollout(q.db.QueryRow(ctx, `SELECT `+rolloutColumns+` FROM rollouts WHERE id = $1`+q.d.ForUpdate, p.ID))
		if err != nil {
			return q.wrap("update rollout "+p.ID, err)
		}
		if len(p.From) > 0 && !slices.Contains(p.From, ro.State) {
			return fmt.Errorf("rollout %s is %s: %w", p.ID, ro.State, store.ErrConflict)
		}
		prev, prevWave := *ro, ro.CurrentWave
		if p.State != "" {
			ro.State = p.State
		}
		if p.Wave != nil {
			ro.CurrentWave = *p.Wave
		}
		if p.Reason != "" {
			ro.Reason = p.Reason
		}
		if p.FailedNodeID != "" {
			ro.FailedNodeID = p.FailedNodeID
		}
		finished := rolloutTerminal(ro.State) && !rolloutTerminal(prev.State)
		// The bake's clock: started by StartBake, stopped by a pause,
		// started again by a resume.
		at := time.Now()
		if now != nil {
			at = *now // the caller's clock (the reconciler's), else this process's
		}
		switch {
		case p.StartBake && ro.BakeStartedAt == nil:
			ro.BakeStartedAt, ro.BakeResumedAt, ro.BakeElapsed = &at, &at, 0
			if ro.State == store.RolloutPaused {
				ro.BakeResumedAt = nil
			}
		case ro.BakeStartedAt != nil && ro.State != store.RolloutRunning && ro.BakeResumedAt != nil:
			ro.BakeElapsed, ro.BakeResumedAt = ro.BakeDone(at), nil
		case ro.BakeStartedAt != nil && ro.State == store.RolloutRunning && ro.BakeResumedAt == nil:
			ro.BakeResumedAt = &at
		}
		if g := p.Gate; g != nil {
			i := slices.IndexFunc(ro.Gates, func(x healthgate.Report) bool { return x.Wave == g.Wave })
			if i < 0 {
				ro.Gates = append(ro.Gates, *g)
			} else {
				ro.Gates[i] = *g
			}
		}
		if ro.Gates == nil {
			ro.Gates = []healthgate.Report{} // "[]", not "null"
		}
		gates, err := json.Marshal(ro.Gates)
		if err != nil {
			return fmt.Errorf("update rollout %s: health gates: %w", p.ID, err)
		}
		ro2, err := scanRollout(q.db.QueryRow(ctx, `UPDATE rollouts SET state = $2, current_wave = $3, reason = $4,
			failed_node_id = $5, updated_at = coalesce($6, now()),
			finished_at = CASE WHEN $7 THEN coalesce($6, now()) ELSE finished_at END,
			bake_started_at = $8, bake_elapsed_us = $9, bake_resumed_at = $10, health_gates = $11
			WHERE id = $1 RETURNING `+rolloutColumns, p.ID, ro.State, ro.CurrentWave, ro.Reason, ro.FailedNodeID, now, finished,
			ro.BakeStartedAt, ro.BakeElapsed.Microseconds(), ro.BakeResumedAt, string(gates)))
		if err != nil {
			return q.wrap("update rollout "+p.ID, err)
		}
		ro = ro2
		var evs []event
		waveEvent := func(typ string, wave int) error {
			ids, err := texts(rowsOrErr(q.db.Query(ctx, `SELECT node_id FROM rollout_nodes WHERE rollout_id = $1 AND wave = $2 ORDER BY node_id`, ro.ID, wave)))
			if err != nil {
				return q.wrap("read wave of rollout "+ro.ID, err)
			}
			if ids == nil {
				ids = []string{}
			}
			d := events.RolloutWaveData{RolloutID: ro.ID, PoolID: ro.PoolID, Version: ro.Version,
				Wave: wave, Canary: wave == 1, NodeIDs: ids}
			if typ == events.RolloutWaveCompleted {
				if i := slices.IndexFunc(ro.Gates, func(x healthgate.Report) bool { return x.Wave == wave }); i >= 0 {
					d.HealthGate = &ro.Gates[i]
				}
			}
			evs = append(evs, event{typ, ro.ID, d})
			return nil
		}
		if p.Wave != nil && *p.Wave != prevWave {
			if prevWave > 0 {
				if err := waveEvent(events.RolloutWaveCompleted, prevWave); err != nil {
					return err
				}
			}
			if len(p.WaveNodes) > 0 {
				in, set := q.textSet("$4", p.WaveNodes)
				if _, err := q.db.Exec(ctx, `UPDATE rollout_nodes SET wave = $2, state_since = coalesce($3, now()),
					previous_version = (SELECT bcd_version FROM nodes WHERE nodes.id = rollout_nodes.node_id)
					WHERE rollout_id = $1 AND node_id IN (`+in+`)`, ro.ID, *p.Wave, now, set); err != nil {
					return q.wrap("start wave of rollout "+ro.ID, err)
				}
			}
			if *p.Wave > 0 {
				if err := waveEvent(events.RolloutWaveStarted, *p.Wave); err != nil {
					return err
				}
			}
		} else if ro.State == store.RolloutCompleted && prev.State != store.RolloutCompleted && ro.CurrentWave > 0 {
			if err := waveEvent(events.RolloutWaveCompleted, ro.CurrentWave); err != nil {
				return err
			}
		}
		if ro.State != prev.State {
			typ := rolloutStateEvents[ro.State]
			if ro.State == store.RolloutRunning {
				typ = events.RolloutResumed
				if prev.State == store.RolloutPending {
					typ = events.RolloutStarted
				}
			}
			if typ != "" {
				evs = append(evs, rolloutEvent(typ, ro, prev.State, p.Actor, p.Halted...))
			}
		}
		out = ro
		return q.emit(ctx, now, evs...)
	})
	return out, err
}

// rowsOrErr passes a query's rows on, or an empty result with its error, to
// texts.
func rowsOrErr(rows Rows, err error) Rows {
	if err != nil {
		return errRows{err}
	}
	return rows
}

// errRows is a result set that failed before its first row.
type errRows struct{ err error }

func (e errRows) Next() bool        { return false }
func (e errRows) Scan(...any) error { return e.err }
func (e errRows) Err() error        { return e.err }
func (e errRows) Close()            {}

// RolloutNodeUpdate changes one node of a rollout and writes its event.
func (s *Store) RolloutNodeUpdate(ctx context.Context, p *store.RolloutNodeUpdateParams) error {
	now := s.clock(p.Now)
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		var n store.RolloutNode
		var version string
		err := q.db.QueryRow(ctx, `SELECT rn.previous_version, rn.state, rn.wave, rn.upgrade_command_id, rn.rollback_command_id,
			rn.reason, r.version FROM rollout_nodes rn JOIN rollouts r ON r.id = rn.rollout_id
			WHERE rn.rollout_id = $1 AND rn.node_id = $2`+q.d.ForUpdate, p.RolloutID, p.NodeID).
			Scan(&n.PreviousVersion, &n.State, &n.Wave, &n.UpgradeCommandID, &n.RollbackCommandID, &n.Reason, &version)
		if err != nil {
			return q.wrap(fmt.Sprintf("update node %s of rollout %s", p.NodeID, p.RolloutID), err)
		}
		prev := n.State
		if p.State != "" {
			n.State = p.State
		}
		if p.Wave != nil {
			n.Wave = *p.Wave
		}
		if p.UpgradeCommandID != "" {
			n.UpgradeCommandID = p.UpgradeCommandID
		}
		if p.RollbackCommandID != "" {
			n.RollbackCommandID = p.RollbackCommandID
		}
		if p.ClearReason {
			n.Reason = ""
		}
		if p.Reason != "" {
			n.Reason = p.Reason
		}
		changed := n.State != prev
		if _, err := q.db.Exec(ctx, `UPDATE rollout_nodes SET state = $3, wave = $4, upgrade_command_id = $5,
			rollback_command_id = $6, reason = $7, state_since = CASE WHEN $8 THEN coalesce($9, now()) ELSE state_since END,
			soak_started_at = CASE WHEN $8 AND $3 = 'soaking' THEN coalesce($9, now()) ELSE soak_started_at END
			WHERE rollout_id = $1 AND node_id = $2`, p.RolloutID, p.NodeID, n.State, n.Wave, n.UpgradeCommandID,
			n.RollbackCommandID, n.Reason, changed, now); err != nil {
			return q.wrap(fmt.Sprintf("update node %s of rollout %s", p.NodeID, p.RolloutID), err)
		}
		if w := p.Watch; w != nil {
			if _, err := q.db.Exec(ctx, `UPDATE rollout_nodes SET watch_starts = $3, session_since = $4, drops = $5
				WHERE rollout_id = $1 AND node_id = $2`, p.RolloutID, p.NodeID, w.Starts, w.SessionSince, w.Drops); err != nil {
				return q.wrap(fmt.Sprintf("watch node %s of rollout %s", p.NodeID, p.RolloutID), err)
			}
		}
		typ := rolloutNodeEvents[n.State]
		if !changed || typ == "" {
			return nil
		}
		cmd := n.UpgradeCommandID
		if n.State == store.RolloutNodeRollingBack || n.State == store.RolloutNodeRolledBack {
			cmd = n.RollbackCommandID
		}
		return q.emit(ctx, now, event{typ, p.RolloutID, events.RolloutNodeData{RolloutID: p.RolloutID, NodeID: p.NodeID,
			Version: version, PreviousVersion: n.PreviousVersion, State: n.State, Wave: n.Wave, CommandID: cmd, Reason: n.Reason}})
	})
}

// RolloutHealthCounts counts a health gate's events over spans, one
// query per distinct window.
func (s *Store) RolloutHealthCounts(ctx context.Context, spans []store.HealthSpan, excludeCreatedBy string) (*store.HealthCounts, error) {
	type window struct{ from, to time.Time }
	by := map[window][]string{}
	var order []window
	for _, sp := range spans {
		w := window{sp.From.UTC(), sp.To.UTC()}
		if !w.to.After(w.from) {
			continue
		}
		if _, ok := by[w]; !ok {
			order = append(order, w)
		}
		by[w] = append(by[w], sp.NodeID)
	}
	out := &store.HealthCounts{}
	for _, w := range order {
		in, set := s.textSet("$1", by[w])
		var c store.HealthCounts
		err := s.db.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM session_starts WHERE node_id IN (`+in+`) AND at >= $2 AND at < $3 AND kind = $4),
			(SELECT count(*) FROM session_starts WHERE node_id IN (`+in+`) AND at >= $2 AND at < $3 AND kind = $5),
			(SELECT count(*) FROM events WHERE node_id IN (`+in+`) AND time >= $2 AND time < $3 AND kind LIKE 'gpu.%'
				AND severity NOT IN ('', 'info')),
			(SELECT count(*) FROM commands WHERE node_id IN (`+in+`) AND finished_at >= $2 AND finished_at < $3
				AND created_by <> $6 AND state <> 'cancelled'),
			(SELECT count(*) FROM commands WHERE node_id IN (`+in+`) AND finished_at >= $2 AND finished_at < $3
				AND created_by <> $6 AND state IN ('failed', 'expired', 'lost'))`,
			set, w.from, w.to, store.SessionStartBCD, store.SessionStartDrop, excludeCreatedBy).
			Scan(&c.Restarts, &c.Drops, &c.Findings, &c.Commands, &c.FailedCommands)
		if err != nil {
			return nil, s.wrap("count health events", err)
		}
		out.Restarts += c.Restarts
		out.Drops += c.Drops
		out.Findings += c.Findings
		out.Commands += c.Commands
		out.FailedCommands += c.FailedCommands
	}
	return out, nil
}

// RolloutPrune deletes finished rollouts that finished before before.
func (s *Store) RolloutPrune(ctx context.Context, before time.Time) (int64, error) {
	n, err := s.db.Exec(ctx, `DELETE FROM rollouts WHERE state IN ($1, $2, $3) AND finished_at < $4`,
		store.RolloutCompleted, store.RolloutAborted, store.RolloutFailed, before)
	return n, s.wrap("prune rollouts", err)
}
