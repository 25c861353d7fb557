package queries

import (
	"context"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

const gatewayColumns = `id, region, address, version, sessions, max_streams, draining, started_at, heartbeat_at`

func scanGateway(r Row) (*store.Gateway, error) {
	g := &store.Gateway{}
	return g, r.Scan(&g.ID, &g.Region, &g.Address, &g.Version, &g.Sessions, &g.MaxStreams, &g.Draining,
		&g.StartedAt, &g.HeartbeatAt)
}

// GatewayUpsert registers or refreshes a gateway.
func (s *Store) GatewayUpsert(ctx context.Context, p *store.GatewayUpsertParams) (*store.Gateway, error) {
	g, err := scanGateway(s.db.QueryRow(ctx, `INSERT INTO gateways AS g
		(id, region, address, version, sessions, max_streams, draining, started_at, heartbeat_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, coalesce($8, now()), coalesce($8, now()))
		ON CONFLICT (id) DO UPDATE SET region = excluded.region, address = excluded.address,
			version = excluded.version, sessions = excluded.sessions, max_streams = excluded.max_streams,
			draining = excluded.draining, heartbeat_at = excluded.heartbeat_at
		RETURNING `+gatewayColumns,
		p.ID, p.Region, p.Address, p.Version, p.Sessions, p.MaxStreams, p.Draining, s.clock(p.Now)))
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

// GatewayDelete removes a gateway row.
func (s *Store) GatewayDelete(ctx context.Context, id string) error {
	_, err := s.db.Exec(ctx, `DELETE FROM gateways WHERE id = $1`, id)
	return s.wrap("delete gateway "+id, err)
}

const sessionColumns = `node_id, session_id, gateway_id, epoch, remote_addr, connected_at, last_heartbeat_at`

func scanSession(r Row) (*store.Session, error) {
	x := &store.Session{}
	return x, r.Scan(&x.NodeID, &x.SessionID, &x.GatewayID, &x.Epoch, &x.RemoteAddr, &x.ConnectedAt, &x.LastHeartbeatAt)
}

// SessionOpen records a node's new session, superseding the older one.
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
		_, err = q.db.Exec(ctx, `UPDATE nodes SET last_seen_at = coalesce($2, now()) WHERE id = $1`, p.NodeID, p.Now)
		return q.wrap("open session for node "+p.NodeID, err)
	})
	return session, previous, err
}

// SessionClose removes a session if it is still current.
func (s *Store) SessionClose(ctx context.Context, nodeID, sessionID string) error {
	_, err := s.db.Exec(ctx, `DELETE FROM sessions WHERE node_id = $1 AND session_id = $2`, nodeID, sessionID)
	return s.wrap("close session of node "+nodeID, err)
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

// SessionHeartbeatBatch marks many sessions alive in two statements.
func (s *Store) SessionHeartbeatBatch(ctx context.Context, gatewayID string, sessionIDs []string, now *time.Time) (int, error) {
	if len(sessionIDs) == 0 {
		return 0, nil
	}
	var n int64
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		in, args := inList(3, sessionIDs)
		var err error
		n, err = q.db.Exec(ctx, `UPDATE sessions SET last_heartbeat_at = coalesce($2, now())
			WHERE gateway_id = $1 AND session_id IN (`+in+`)`, append([]any{gatewayID, now}, args...)...)
		if err != nil {
			return q.wrap("record heartbeats", err)
		}
		_, err = q.db.Exec(ctx, `UPDATE nodes SET last_seen_at = coalesce($2, now())
			WHERE id IN (SELECT node_id FROM sessions WHERE gateway_id = $1 AND session_id IN (`+in+`))`,
			append([]any{gatewayID, now}, args...)...)
		return q.wrap("record heartbeats", err)
	})
	return int(n), err
}

// inList returns "$first, $first+1, ..." for values and the values as args.
func inList(first int, values []string) (string, []any) {
	var b strings.Builder
	args := make([]any, len(values))
	for i, v := range values {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("$")
		b.WriteString(itoa(first + i))
		args[i] = v
	}
	return b.String(), args
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
