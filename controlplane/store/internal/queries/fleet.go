package queries

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

const gatewayColumns = `id, region, address, version, sessions, max_streams, draining, started_at, heartbeat_at, internal_address, drain_requested`

func scanGateway(r Row) (*store.Gateway, error) {
	g := &store.Gateway{}
	return g, r.Scan(&g.ID, &g.Region, &g.Address, &g.Version, &g.Sessions, &g.MaxStreams, &g.Draining,
		&g.StartedAt, &g.HeartbeatAt, &g.InternalAddress, &g.DrainRequested)
}

// GatewayUpsert registers or refreshes a gateway.
// A new row (a gateway starting, or one the reaper pruned coming back)
// writes gateway.up in the same transaction.
func (s *Store) GatewayUpsert(ctx context.Context, p *store.GatewayUpsertParams) (*store.Gateway, error) {
	var g *store.Gateway
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		var one int
		err := q.db.QueryRow(ctx, `SELECT 1 FROM gateways WHERE id = $1`, p.ID).Scan(&one)
		isNew := isNotFound(q.d.Translate(err))
		if err != nil && !isNew {
			return q.wrap("upsert gateway "+p.ID, err)
		}
		if g, err = q.gatewayUpsert(ctx, p); err != nil || !isNew {
			return err
		}
		return q.emit(ctx, p.Now, gatewayEvent(events.GatewayUp, g, ""))
	})
	return g, err
}

// gatewayEvent is a gateway's event.
func gatewayEvent(typ string, g *store.Gateway, reason string) event {
	return event{typ, g.ID, events.GatewayData{GatewayID: g.ID, Region: g.Region, Address: g.Address, Version: g.Version, Reason: reason}}
}

func (s *Store) gatewayUpsert(ctx context.Context, p *store.GatewayUpsertParams) (*store.Gateway, error) {
	g, err := scanGateway(s.db.QueryRow(ctx, `INSERT INTO gateways AS g
		(id, region, address, version, sessions, max_streams, draining, started_at, heartbeat_at, internal_address)
		VALUES ($1, $2, $3, $4, $5, $6, $7, coalesce($8, now()), coalesce($8, now()), $9)
		ON CONFLICT (id) DO UPDATE SET region = excluded.region, address = excluded.address,
			version = excluded.version, sessions = excluded.sessions, max_streams = excluded.max_streams,
			draining = excluded.draining, heartbeat_at = excluded.heartbeat_at, internal_address = excluded.internal_address
		RETURNING `+gatewayColumns,
		p.ID, p.Region, p.Address, p.Version, p.Sessions, p.MaxStreams, p.Draining, s.clock(p.Now), p.InternalAddress))
	if err != nil {
		return nil, s.wrap("upsert gateway "+p.ID, err)
	}
	return g, nil
}

// GatewayGet returns a gateway.
func (s *Store) GatewayGet(ctx context.Context, id string) (*store.Gateway, error) {
	g, err := scanGateway(s.db.QueryRow(ctx, `SELECT `+gatewayColumns+` FROM gateways WHERE id = $1`, id))
	if err != nil {
		return nil, s.wrap("get gateway "+id, err)
	}
	return g, nil
}

// GatewayList returns every gateway row by id.
func (s *Store) GatewayList(ctx context.Context) ([]*store.Gateway, error) {
	rows, err := s.db.Query(ctx, `SELECT `+gatewayColumns+` FROM gateways ORDER BY id`)
	if err != nil {
		return nil, s.wrap("list gateways", err)
	}
	out, err := collect(rows, scanGateway)
	return out, s.wrap("list gateways", err)
}

// GatewayDrainSet records an operator's drain (or undrain) of a gateway.
func (s *Store) GatewayDrainSet(ctx context.Context, id string, drain bool) (*store.Gateway, error) {
	g, err := scanGateway(s.db.QueryRow(ctx, `UPDATE gateways SET drain_requested = $2 WHERE id = $1 RETURNING `+gatewayColumns, id, drain))
	if err != nil {
		return nil, s.wrap("set drain of gateway "+id, err)
	}
	return g, nil
}

// GatewayDelete removes a gateway row.
// Deleting a row writes gateway.down (reason "deregistered") in the same
// transaction.
func (s *Store) GatewayDelete(ctx context.Context, id string) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		rows, err := q.db.Query(ctx, `DELETE FROM gateways WHERE id = $1 RETURNING `+gatewayColumns, id)
		if err != nil {
			return q.wrap("delete gateway "+id, err)
		}
		gs, err := collect(rows, scanGateway)
		if err != nil || len(gs) == 0 {
			return q.wrap("delete gateway "+id, err)
		}
		return q.emit(ctx, nil, gatewayEvent(events.GatewayDown, gs[0], "deregistered"))
	})
}

// GatewayReap closes dead gateways' sessions and prunes their rows.
func (s *Store) GatewayReap(ctx context.Context, p *store.GatewayReapParams) (*store.GatewayReapResult, error) {
	now := s.clock(p.Now)
	// A gateway is alive while its lease is held and unexpired.
	live := `EXISTS (SELECT 1 FROM leases l WHERE l.name = $2 || %s AND l.holder <> '' AND l.expires_at > coalesce($1, now()))`
	res := &store.GatewayReapResult{}
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		rows, err := q.db.Query(ctx, `SELECT DISTINCT x.gateway_id FROM sessions x
			WHERE NOT `+fmt.Sprintf(live, "x.gateway_id")+` ORDER BY x.gateway_id`, now, p.LeasePrefix)
		if err != nil {
			return q.wrap("find dead gateways", err)
		}
		if res.Dead, err = texts(rows); err != nil {
			return q.wrap("find dead gateways", err)
		}
		for _, id := range res.Dead {
			if _, err := q.db.Exec(ctx, `UPDATE nodes SET last_seen_at = (SELECT x.last_heartbeat_at FROM sessions x WHERE x.node_id = nodes.id)
				WHERE id IN (SELECT x.node_id FROM sessions x WHERE x.gateway_id = $1)`, id); err != nil {
				return q.wrap("close sessions of gateway "+id, err)
			}
			n, err := q.db.Exec(ctx, `DELETE FROM sessions WHERE gateway_id = $1`, id)
			if err != nil {
				return q.wrap("close sessions of gateway "+id, err)
			}
			res.Sessions += int(n)
		}
		rows, err = q.db.Query(ctx, `DELETE FROM gateways WHERE heartbeat_at <= coalesce($1, now()) - bc_micros($3)
			AND NOT `+fmt.Sprintf(live, "gateways.id")+` RETURNING id`, now, p.LeasePrefix, p.PruneAfter.Microseconds())
		if err != nil {
			return q.wrap("prune dead gateways", err)
		}
		if res.Pruned, err = texts(rows); err != nil {
			return q.wrap("prune dead gateways", err)
		}
		_, err = q.db.Exec(ctx, `DELETE FROM leases WHERE name LIKE $2 || '%' AND expires_at <= coalesce($1, now()) - bc_micros($3)`,
			now, p.LeasePrefix, p.PruneAfter.Microseconds())
		if err != nil {
			return q.wrap("prune dead gateway leases", err)
		}
		// gateway.down for each gateway found dead: its row, if still
		// there, says what it was.
		evs := make([]event, 0, len(res.Dead))
		for _, id := range res.Dead {
			g, err := q.GatewayGet(ctx, id)
			if isNotFound(err) {
				g, err = &store.Gateway{ID: id}, nil
			}
			if err != nil {
				return err
			}
			evs = append(evs, gatewayEvent(events.GatewayDown, g, "lease expired"))
		}
		return q.emit(ctx, now, evs...)
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(res.Pruned)
	return res, nil
}

const sessionColumns = `node_id, session_id, gateway_id, epoch, remote_addr, connected_at, last_heartbeat_at`

func scanSession(r Row) (*store.Session, error) {
	x := &store.Session{}
	return x, r.Scan(&x.NodeID, &x.SessionID, &x.GatewayID, &x.Epoch, &x.RemoteAddr, &x.ConnectedAt, &x.LastHeartbeatAt)
}

// SessionOpen records a node's new session, superseding the older one,
// and the node's boot id.
func (s *Store) SessionOpen(ctx context.Context, p *store.SessionOpenParams) (session, previous *store.Session, err error) {
	err = s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		prev, err := q.SessionGet(ctx, p.NodeID)
		switch {
		case err == nil:
			previous = prev
		case !isNotFound(err):
			return err
		}
		session, err = scanSession(q.db.QueryRow(ctx, `INSERT INTO sessions AS x
			(node_id, session_id, gateway_id, epoch, remote_addr, connected_at, last_heartbeat_at)
			VALUES ($1, $2, $3, 1, $4, coalesce($5, now()), coalesce($5, now()))
			ON CONFLICT (node_id) DO UPDATE SET session_id = excluded.session_id, gateway_id = excluded.gateway_id,
				epoch = x.epoch + 1, remote_addr = excluded.remote_addr, connected_at = excluded.connected_at,
				last_heartbeat_at = excluded.last_heartbeat_at
			RETURNING `+sessionColumns, p.NodeID, p.SessionID, p.GatewayID, p.RemoteAddr, q.clock(p.Now)))
		if err != nil {
			return q.wrap("open session for node "+p.NodeID, err)
		}
		var reconnectBy *time.Time
		err = q.db.QueryRow(ctx, `UPDATE nodes SET last_seen_at = coalesce($2, now()), boot_id = $3,
			bcd_starts = bcd_starts + CASE WHEN $4 THEN 1 ELSE 0 END WHERE id = $1 RETURNING reconnect_by`,
			p.NodeID, p.Now, p.BootID, p.Fresh).Scan(&reconnectBy)
		if err != nil {
			return q.wrap("open session for node "+p.NodeID, err)
		}
		// The session's start, which rollouts' health gates count
		// (RolloutHealthCounts): a new bcd, a drop, or the reconnect a
		// gateway's drain asked for.
		kind := store.SessionStartBCD
		if !p.Fresh {
			kind = store.SessionStartDrop
			if reconnectBy != nil && !session.ConnectedAt.After(reconnectBy.Add(store.DrainReconnectSlack)) {
				kind = store.SessionStartDrain
			}
		}
		_, err = q.db.Exec(ctx, `INSERT INTO session_starts (node_id, kind, at) VALUES ($1, $2, $3)`, p.NodeID, kind, session.ConnectedAt)
		return q.wrap("open session for node "+p.NodeID, err)
	})
	return session, previous, err
}

// SessionClose removes a session if it is still current, and keeps its
// last heartbeat as the node's last_seen_at. The session row goes first, as
// in SessionOpen, so the two take their row locks in one order.
func (s *Store) SessionClose(ctx context.Context, nodeID, sessionID string) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		var last time.Time
		err := q.db.QueryRow(ctx, `DELETE FROM sessions WHERE node_id = $1 AND session_id = $2 RETURNING last_heartbeat_at`,
			nodeID, sessionID).Scan(&last)
		if err = q.wrap("close session of node "+nodeID, err); err != nil {
			if isNotFound(err) {
				return nil // superseded or closed already
			}
			return err
		}
		_, err = q.db.Exec(ctx, `UPDATE nodes SET last_seen_at = $2 WHERE id = $1`, nodeID, last)
		return q.wrap("close session of node "+nodeID, err)
	})
}

// SessionGet returns a node's current session.
func (s *Store) SessionGet(ctx context.Context, nodeID string) (*store.Session, error) {
	x, err := scanSession(s.db.QueryRow(ctx, `SELECT `+sessionColumns+` FROM sessions WHERE node_id = $1`, nodeID))
	if err != nil {
		return nil, s.wrap("get session of node "+nodeID, err)
	}
	return x, nil
}

// SessionList returns a gateway's sessions (every session when gatewayID is
// empty), by node id.
func (s *Store) SessionList(ctx context.Context, gatewayID string) ([]*store.Session, error) {
	rows, err := s.db.Query(ctx, `SELECT `+sessionColumns+` FROM sessions
		WHERE $1 = '' OR gateway_id = $1 ORDER BY node_id`, gatewayID)
	if err != nil {
		return nil, s.wrap("list sessions", err)
	}
	out, err := collect(rows, scanSession)
	return out, s.wrap("list sessions", err)
}

// SessionIDs returns the ids of a gateway's sessions, in no order.
func (s *Store) SessionIDs(ctx context.Context, gatewayID string) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT session_id FROM sessions WHERE gateway_id = $1`, gatewayID)
	if err != nil {
		return nil, s.wrap("list session ids", err)
	}
	ids, err := texts(rows)
	return ids, s.wrap("list session ids", err)
}

// SessionHeartbeatBatch marks many sessions alive in one statement. It
// writes no nodes row: a node's last_seen_at reads its current session's
// last heartbeat (nodeLastSeen).
func (s *Store) SessionHeartbeatBatch(ctx context.Context, gatewayID string, sessionIDs []string, now *time.Time) (int, error) {
	if len(sessionIDs) == 0 {
		return 0, nil
	}
	in, ids := s.textSet("$3", sessionIDs)
	n, err := s.db.Exec(ctx, `UPDATE sessions SET last_heartbeat_at = coalesce($2, now())
		WHERE gateway_id = $1 AND session_id IN (`+in+`)`, gatewayID, now, ids)
	return int(n), s.wrap("record heartbeats", err)
}

// SessionDrain records that a gateway's nodes are due back by Now +
// Within (nodes.reconnect_by, which liveness counts as heard from).
func (s *Store) SessionDrain(ctx context.Context, p *store.SessionDrainParams) (int, error) {
	n, err := s.db.Exec(ctx, `UPDATE nodes SET reconnect_by = coalesce($2, now()) + bc_micros($3)
		WHERE id IN (SELECT node_id FROM sessions WHERE gateway_id = $1)`,
		p.GatewayID, s.clock(p.Now), p.Within.Microseconds())
	return int(n), s.wrap("record drained sessions of gateway "+p.GatewayID, err)
}

// textSet returns the dialect's subquery over the strings of values, bound
// as one JSON array at placeholder, and that argument.
func (s *Store) textSet(placeholder string, values []string) (string, any) {
	if values == nil {
		values = []string{} // "[]", not "null", which PostgreSQL refuses to expand
	}
	js, err := json.Marshal(values)
	if err != nil {
		panic(fmt.Sprintf("marshal strings: %v", err)) // []string always marshals
	}
	return fmt.Sprintf(s.d.TextSet, placeholder), JSON(js)
}

// intSet is textSet for integers.
func (s *Store) intSet(placeholder string, values []int) (string, any) {
	if values == nil {
		values = []int{}
	}
	js, err := json.Marshal(values)
	if err != nil {
		panic(fmt.Sprintf("marshal ints: %v", err)) // []int always marshals
	}
	return fmt.Sprintf(s.d.IntSet, placeholder), JSON(js)
}

const workerColumns = `id, roles, hostname, pid, version, started_at, heartbeat_at`

func scanWorker(r Row) (*store.Worker, error) {
	w := &store.Worker{}
	var roles string
	err := r.Scan(&w.ID, &roles, &w.Hostname, &w.PID, &w.Version, &w.StartedAt, &w.HeartbeatAt)
	if roles != "" {
		w.Roles = strings.Split(roles, ",")
	}
	return w, err
}

// WorkerHeartbeat registers or refreshes a worker.
func (s *Store) WorkerHeartbeat(ctx context.Context, p *store.WorkerHeartbeatParams) (*store.Worker, error) {
	w, err := scanWorker(s.db.QueryRow(ctx, `INSERT INTO workers AS w (id, roles, hostname, pid, version, started_at, heartbeat_at)
		VALUES ($1, $2, $3, $4, $5, coalesce($6, now()), coalesce($6, now()))
		ON CONFLICT (id) DO UPDATE SET roles = excluded.roles, heartbeat_at = excluded.heartbeat_at
		RETURNING `+workerColumns, p.ID, strings.Join(p.Roles, ","), p.Hostname, p.PID, p.Version, s.clock(p.Now)))
	if err != nil {
		return nil, s.wrap("heartbeat worker "+p.ID, err)
	}
	return w, nil
}

// WorkerList returns live workers by id.
func (s *Store) WorkerList(ctx context.Context, liveWithin time.Duration, now *time.Time) ([]*store.Worker, error) {
	rows, err := s.db.Query(ctx, `SELECT `+workerColumns+` FROM workers
		WHERE $1 = 0 OR heartbeat_at > coalesce($2, now()) - bc_micros($1) ORDER BY id`,
		liveWithin.Microseconds(), now)
	if err != nil {
		return nil, s.wrap("list workers", err)
	}
	out, err := collect(rows, scanWorker)
	return out, s.wrap("list workers", err)
}

// WorkerDelete removes a worker from membership.
func (s *Store) WorkerDelete(ctx context.Context, id string) error {
	_, err := s.db.Exec(ctx, `DELETE FROM workers WHERE id = $1`, id)
	return s.wrap("delete worker "+id, err)
}

const processColumns = `id, roles, hostname, pid, version, schema, started_at, heartbeat_at, internal_ca_ids, internal_cert_ca`

func scanProcess(r Row) (*store.Process, error) {
	p := &store.Process{}
	var roles, cas string
	err := r.Scan(&p.ID, &roles, &p.Hostname, &p.PID, &p.Version, &p.Schema, &p.StartedAt, &p.HeartbeatAt, &cas, &p.InternalCertCA)
	if roles != "" {
		p.Roles = strings.Split(roles, ",")
	}
	if cas != "" {
		p.InternalCAs = strings.Split(cas, ",")
	}
	return p, err
}

// ProcessHeartbeat registers or refreshes a process, recording the newest
// migration this build embeds as its schema.
func (s *Store) ProcessHeartbeat(ctx context.Context, p *store.ProcessHeartbeatParams) (*store.Process, error) {
	known, err := s.migrations()
	if err != nil {
		return nil, err
	}
	var schema string
	if len(known) > 0 {
		schema = known[len(known)-1].name
	}
	out, err := scanProcess(s.db.QueryRow(ctx, `INSERT INTO processes AS p (id, roles, hostname, pid, version, schema, started_at, heartbeat_at,
			internal_ca_ids, internal_cert_ca)
		VALUES ($1, $2, $3, $4, $5, $6, coalesce($7, now()), coalesce($7, now()), $8, $9)
		ON CONFLICT (id) DO UPDATE SET roles = excluded.roles, version = excluded.version, schema = excluded.schema,
			heartbeat_at = excluded.heartbeat_at, internal_ca_ids = excluded.internal_ca_ids, internal_cert_ca = excluded.internal_cert_ca
		RETURNING `+processColumns, p.ID, strings.Join(p.Roles, ","), p.Hostname, p.PID, p.Version, schema, s.clock(p.Now),
		strings.Join(p.InternalCAs, ","), p.InternalCertCA))
	if err != nil {
		return nil, s.wrap("heartbeat process "+p.ID, err)
	}
	return out, nil
}

// ProcessList returns every registered process by id.
func (s *Store) ProcessList(ctx context.Context) ([]*store.Process, error) {
	rows, err := s.db.Query(ctx, `SELECT `+processColumns+` FROM processes ORDER BY id`)
	if err != nil {
		return nil, s.wrap("list processes", err)
	}
	out, err := collect(rows, scanProcess)
	return out, s.wrap("list processes", err)
}

// ProcessDelete removes a process's row.
func (s *Store) ProcessDelete(ctx context.Context, id string) error {
	_, err := s.db.Exec(ctx, `DELETE FROM processes WHERE id = $1`, id)
	return s.wrap("delete process "+id, err)
}

// ProcessPrune deletes the rows of processes silent for longer than olderThan.
func (s *Store) ProcessPrune(ctx context.Context, olderThan time.Duration, now *time.Time) ([]string, error) {
	rows, err := s.db.Query(ctx, `DELETE FROM processes WHERE heartbeat_at <= coalesce($1, now()) - bc_micros($2) RETURNING id`,
		s.clock(now), olderThan.Microseconds())
	if err != nil {
		return nil, s.wrap("prune processes", err)
	}
	ids, err := texts(rows)
	slices.Sort(ids)
	return ids, s.wrap("prune processes", err)
}
