package queries

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

// nodeLastSeen is a node's last heartbeat, for statements on nodes (not
// aliased): its current session's, which the gateways' heartbeat batches
// write, else the one its last session ended with (SessionClose), else
// NULL. Heartbeats thus write one row each, the session's, and no nodes row.
const nodeLastSeen = `coalesce((SELECT x.last_heartbeat_at FROM sessions x WHERE x.node_id = nodes.id), nodes.last_seen_at)`

// nodeColumns are a node's columns, for SELECT ... FROM nodes; the
// inventory and its digest are kept apart, in node_inventories (migration
// 0005), and the last heartbeat is nodeLastSeen.
const nodeColumns = `id, pool_id, hostname, machine_id, state, cordoned, labels, shard,
	(SELECT i.inventory FROM node_inventories i WHERE i.node_id = nodes.id),
	coalesce((SELECT i.digest FROM node_inventories i WHERE i.node_id = nodes.id), ''),
	bcd_version, os, arch, boot_id, cert_serial, cert_not_after, key_sha256, join_token_id, clock_skew_ms, clock_skew_at,
	disruption, disruption_owner, disruption_since, created_at, updated_at, ` + nodeLastSeen

func scanNode(r Row) (*store.Node, error) {
	n := &store.Node{}
	var labels []byte
	var skewMS *int64
	err := r.Scan(&n.ID, &n.PoolID, &n.Hostname, &n.MachineID, &n.State, &n.Cordoned, &labels, &n.Shard, &n.Inventory,
		&n.InventoryDigest, &n.BCDVersion, &n.OS, &n.Arch, &n.BootID, &n.CertSerial, &n.CertNotAfter,
		&n.KeySHA256, &n.JoinTokenID, &skewMS, &n.ClockSkewAt,
		&n.Disruption, &n.DisruptionOwner, &n.DisruptionSince, &n.CreatedAt, &n.UpdatedAt, &n.LastSeenAt)
	if err != nil {
		return nil, err
	}
	if skewMS != nil {
		d := time.Duration(*skewMS) * time.Millisecond
		n.ClockSkew = &d
	}
	if len(labels) > 0 {
		if err := json.Unmarshal(labels, &n.Labels); err != nil {
			return nil, fmt.Errorf("decode labels of node %s: %w", n.ID, err)
		}
	}
	return n, nil
}

func labelsJSON(m map[string]string) (JSON, error) {
	if m == nil {
		m = map[string]string{}
	}
	b, err := json.Marshal(m)
	return JSON(b), err
}

// NodeUpsert inserts a node or refreshes an existing node's identity.
func (s *Store) NodeUpsert(ctx context.Context, p *store.NodeUpsertParams) (*store.Node, error) {
	labels, err := labelsJSON(p.Labels)
	if err != nil {
		return nil, fmt.Errorf("upsert node %s: encode labels: %w", p.ID, err)
	}
	if p.JoinTokenID != "" {
		// A join: the upsert and its node.joined or node.rejoined event in
		// one transaction.
		var out *store.Node
		err := s.Tx(ctx, func(tx store.Store) error {
			q := tx.(*Store)
			typ := events.NodeRejoined
			prev, err := q.lockNode(ctx, p.ID)
			switch {
			case isNotFound(err):
				typ, prev = events.NodeJoined, &nodeRow{}
			case err != nil:
				return err
			}
			if out, err = q.nodeUpsert(ctx, p, labels); err != nil {
				return err
			}
			return q.emit(ctx, p.Now, nodeEvent(typ, &nodeRow{id: out.ID, poolID: out.PoolID, hostname: out.Hostname,
				state: out.State, previous: prev.state, cordoned: out.Cordoned, joinTokenID: out.JoinTokenID}))
		})
		return out, err
	}
	return s.nodeUpsert(ctx, p, labels)
}

// nodeUpsert is NodeUpsert's statement.
func (s *Store) nodeUpsert(ctx context.Context, p *store.NodeUpsertParams, labels JSON) (*store.Node, error) {
	var id string
	err := s.db.QueryRow(ctx, `
		INSERT INTO nodes AS n (id, pool_id, hostname, machine_id, state, labels, bcd_version, os, arch,
			cert_serial, cert_not_after, created_at, updated_at, shard, key_sha256, join_token_id, cert_ca_id)
		VALUES ($1, $2, $3, $4, 'joined', $5, $6, $7, $8, $9, $10, coalesce($11, now()), coalesce($11, now()), $12, $13, $14, $15)
		ON CONFLICT (id) DO UPDATE SET
			pool_id = excluded.pool_id, hostname = excluded.hostname, machine_id = excluded.machine_id,
			bcd_version = excluded.bcd_version, os = excluded.os, arch = excluded.arch,
			cert_serial = excluded.cert_serial, cert_not_after = excluded.cert_not_after,
			key_sha256 = CASE WHEN excluded.key_sha256 = '' THEN n.key_sha256 ELSE excluded.key_sha256 END,
			join_token_id = CASE WHEN excluded.join_token_id = '' THEN n.join_token_id ELSE excluded.join_token_id END,
			cert_ca_id = CASE WHEN excluded.cert_ca_id = '' THEN n.cert_ca_id ELSE excluded.cert_ca_id END,
			updated_at = excluded.updated_at
		RETURNING id`,
		p.ID, p.PoolID, p.Hostname, p.MachineID, labels, p.BCDVersion, p.OS, p.Arch, p.CertSerial, p.CertNotAfter, s.clock(p.Now), store.ShardOf(p.ID),
		p.KeySHA256, p.JoinTokenID, p.CertCAID).Scan(&id)
	if err != nil {
		return nil, s.wrap("upsert node "+p.ID, err)
	}
	return s.NodeGet(ctx, id)
}

// NodeGet returns a node.
func (s *Store) NodeGet(ctx context.Context, id string) (*store.Node, error) {
	n, err := scanNode(s.db.QueryRow(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE id = $1`, id))
	if err != nil {
		return nil, s.wrap("get node "+id, err)
	}
	return n, nil
}

// NodeFindByHostname finds a pool's oldest node with hostname (index
// nodes_pool_hostname_idx).
func (s *Store) NodeFindByHostname(ctx context.Context, poolID, hostname string) (*store.Node, error) {
	n, err := scanNode(s.db.QueryRow(ctx, `SELECT `+nodeColumns+` FROM nodes
		WHERE pool_id = $1 AND hostname = $2 ORDER BY created_at, id LIMIT 1`, poolID, hostname))
	if err != nil {
		return nil, s.wrap("find node by hostname", err)
	}
	return n, nil
}

// NodeFindByJoinKey finds the node a token admitted for a key (index
// nodes_join_key_idx).
func (s *Store) NodeFindByJoinKey(ctx context.Context, tokenID, keySHA256 string) (*store.Node, error) {
	if tokenID == "" || keySHA256 == "" {
		return nil, fmt.Errorf("find node by join key: %w", store.ErrNotFound)
	}
	n, err := scanNode(s.db.QueryRow(ctx, `SELECT `+nodeColumns+` FROM nodes
		WHERE join_token_id = $1 AND key_sha256 = $2 ORDER BY created_at, id LIMIT 1`, tokenID, keySHA256))
	if err != nil {
		return nil, s.wrap("find node by join key", err)
	}
	return n, nil
}

// NodeSetCertificate records a node's new certificate, and with
// p.Reattested its node.reattested event in the same transaction.
func (s *Store) NodeSetCertificate(ctx context.Context, p *store.NodeSetCertificateParams) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		err := q.exec1(ctx, "set certificate of node "+p.ID, `UPDATE nodes SET cert_serial = $2, cert_not_after = $3,
			key_sha256 = CASE WHEN $4 = '' THEN key_sha256 ELSE $4 END, updated_at = coalesce($5, now()),
			cert_ca_id = CASE WHEN $6 = '' THEN cert_ca_id ELSE $6 END WHERE id = $1`,
			p.ID, p.Serial, p.NotAfter, p.KeySHA256, q.clock(p.Now), p.CAID)
		if err != nil || !p.Reattested {
			return err
		}
		return q.emit(ctx, p.Now, event{events.NodeReattested, p.ID,
			events.NodeCertificateData{NodeID: p.ID, Serial: p.Serial, NotAfter: p.NotAfter.UTC()}})
	})
}

// NodeSetClockSkew records a node's clock skew in whole milliseconds.
func (s *Store) NodeSetClockSkew(ctx context.Context, id string, skew time.Duration, now *time.Time) error {
	return s.exec1(ctx, "set clock skew of node "+id,
		`UPDATE nodes SET clock_skew_ms = $2, clock_skew_at = coalesce($3, now()) WHERE id = $1`,
		id, skew.Milliseconds(), s.clock(now))
}

// NodeHostnameDuplicates lists hostnames shared by several nodes.
func (s *Store) NodeHostnameDuplicates(ctx context.Context, limit int) ([]*store.HostnameDuplicate, error) {
	rows, err := s.db.Query(ctx, `SELECT n.hostname, n.id FROM nodes n
		WHERE n.hostname IN (SELECT hostname FROM nodes GROUP BY hostname HAVING count(*) > 1 ORDER BY hostname LIMIT $1)
		ORDER BY n.hostname, n.created_at, n.id`, limit)
	if err != nil {
		return nil, s.wrap("list duplicate hostnames", err)
	}
	defer rows.Close()
	var out []*store.HostnameDuplicate
	for rows.Next() {
		var host, id string
		if err := rows.Scan(&host, &id); err != nil {
			return nil, s.wrap("list duplicate hostnames", err)
		}
		if len(out) == 0 || out[len(out)-1].Hostname != host {
			out = append(out, &store.HostnameDuplicate{Hostname: host})
		}
		out[len(out)-1].NodeIDs = append(out[len(out)-1].NodeIDs, id)
	}
	return out, s.wrap("list duplicate hostnames", rows.Err())
}

// NodeList pages nodes by id, filtered by pool and state.
func (s *Store) NodeList(ctx context.Context, p *store.NodeListParams) ([]*store.Node, error) {
	rows, err := s.db.Query(ctx, `SELECT `+nodeColumns+` FROM nodes
		WHERE id > $1 AND ($2 = '' OR pool_id = $2) AND ($3 = '' OR state = $3)
			AND ($5 = '' OR pool_id IN (SELECT id FROM pools WHERE `+withinTenant("tenant_id", 5)+`))
		ORDER BY id LIMIT $4`, p.Cursor, p.PoolID, p.State, limit(p.Limit), p.Within)
	if err != nil {
		return nil, s.wrap("list nodes", err)
	}
	out, err := collect(rows, scanNode)
	return out, s.wrap("list nodes", err)
}

// NodeSummaries pages nodes by id without their inventories (digest set).
func (s *Store) NodeSummaries(ctx context.Context, p *store.ListParams) ([]*store.Node, error) {
	rows, err := s.db.Query(ctx, `SELECT id, pool_id, hostname, state, cordoned, disruption, labels, bcd_version,
		coalesce((SELECT i.digest FROM node_inventories i WHERE i.node_id = nodes.id), '')
		FROM nodes WHERE id > $1 ORDER BY id LIMIT $2`, p.Cursor, limit(p.Limit))
	if err != nil {
		return nil, s.wrap("list node summaries", err)
	}
	out, err := collect(rows, func(r Row) (*store.Node, error) {
		n := &store.Node{}
		var labels []byte
		if err := r.Scan(&n.ID, &n.PoolID, &n.Hostname, &n.State, &n.Cordoned, &n.Disruption, &labels, &n.BCDVersion, &n.InventoryDigest); err != nil {
			return nil, err
		}
		if len(labels) > 2 {
			if err := json.Unmarshal(labels, &n.Labels); err != nil {
				return nil, fmt.Errorf("decode labels of node %s: %w", n.ID, err)
			}
		}
		return n, nil
	})
	return out, s.wrap("list node summaries", err)
}

// exec1 runs a statement that must touch exactly one row; none is
// store.ErrNotFound.
func (s *Store) exec1(ctx context.Context, op, sql string, args ...any) error {
	n, err := s.db.Exec(ctx, sql, args...)
	if err != nil {
		return s.wrap(op, err)
	}
	if n == 0 {
		return fmt.Errorf("%s: %w", op, store.ErrNotFound)
	}
	return nil
}

// NodeSetState moves a node to state and, when that changed it, writes the
// state's event (nodeStateEvents) in the same transaction.
func (s *Store) NodeSetState(ctx context.Context, id, state string) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		n, err := q.lockNode(ctx, id)
		if err != nil {
			return fmt.Errorf("set state of node %s: %w", id, err)
		}
		if err := q.exec1(ctx, "set state of node "+id,
			`UPDATE nodes SET state = $2, updated_at = now() WHERE id = $1`, id, state); err != nil {
			return err
		}
		typ, ok := nodeStateEvents[state]
		if !ok || n.state == state {
			return nil
		}
		n.previous, n.state = n.state, state
		return q.emit(ctx, nil, nodeEvent(typ, n))
	})
}

// NodeSetCordoned sets the cordon flag and, when that changed it, writes
// node.cordoned or node.uncordoned in the same transaction.
func (s *Store) NodeSetCordoned(ctx context.Context, id string, cordoned bool) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		n, err := q.lockNode(ctx, id)
		if err != nil {
			return fmt.Errorf("cordon node %s: %w", id, err)
		}
		if err := q.exec1(ctx, "cordon node "+id,
			`UPDATE nodes SET cordoned = $2, updated_at = now() WHERE id = $1`, id, cordoned); err != nil {
			return err
		}
		if n.cordoned == cordoned {
			return nil
		}
		n.cordoned = cordoned
		typ := events.NodeUncordoned
		if cordoned {
			typ = events.NodeCordoned
		}
		return q.emit(ctx, nil, nodeEvent(typ, n))
	})
}

// NodeSetLabel sets one label of a node (an empty value removes it), under
// the node's row lock so that two writers do not lose each other's labels.
func (s *Store) NodeSetLabel(ctx context.Context, id, key, value string) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		if _, err := q.lockNode(ctx, id); err != nil {
			return fmt.Errorf("set label of node %s: %w", id, err)
		}
		var raw []byte
		if err := q.db.QueryRow(ctx, `SELECT labels FROM nodes WHERE id = $1`, id).Scan(&raw); err != nil {
			return q.wrap("set label of node "+id, err)
		}
		labels := map[string]string{}
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &labels); err != nil {
				return fmt.Errorf("set label of node %s: decode labels: %w", id, err)
			}
		}
		if value == "" {
			delete(labels, key)
		} else {
			labels[key] = value
		}
		doc, err := labelsJSON(labels)
		if err != nil {
			return fmt.Errorf("set label of node %s: %w", id, err)
		}
		return q.exec1(ctx, "set label of node "+id, `UPDATE nodes SET labels = $2, updated_at = now() WHERE id = $1`, id, doc)
	})
}

// NodeRolledBackLocally writes node.rolled-back-locally for a node (read
// under its row's lock, so the event carries its pool and hostname).
func (s *Store) NodeRolledBackLocally(ctx context.Context, p *store.NodeRolledBackLocallyParams) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		n, err := q.lockNode(ctx, p.NodeID)
		if err != nil {
			return fmt.Errorf("record the local rollback of node %s: %w", p.NodeID, err)
		}
		return q.emit(ctx, p.Now, event{events.NodeRolledBackLocally, n.id, events.NodeRolledBackLocallyData{
			NodeID: n.id, PoolID: n.poolID, Hostname: n.hostname, FromVersion: p.FromVersion, ToVersion: p.ToVersion,
			Reason: p.Reason, Starts: p.Starts, RolledBackAt: p.RolledBackAt.UTC()}})
	})
}

// NodeSetInventory stores a node's inventory and its digest (in
// node_inventories: no lock on the node's row). A node that does not exist
// is store.ErrNotFound, without an SQL error, so a transaction storing
// several goes on.
func (s *Store) NodeSetInventory(ctx context.Context, id string, inventory []byte, digest string) error {
	var doc any
	if inventory != nil {
		doc = JSON(inventory)
	}
	return s.exec1(ctx, "set inventory of node "+id,
		`INSERT INTO node_inventories (node_id, inventory, digest)
		SELECT id, $2, $3 FROM nodes WHERE id = $1
		ON CONFLICT (node_id) DO UPDATE SET inventory = excluded.inventory, digest = excluded.digest`,
		id, doc, digest)
}

// NodeDelete removes a node and what hangs off it, and writes node.deleted
// in the same transaction.
func (s *Store) NodeDelete(ctx context.Context, id string) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		n, err := q.lockNode(ctx, id)
		if err != nil {
			return fmt.Errorf("delete node %s: %w", id, err)
		}
		if err := q.exec1(ctx, "delete node "+id, `DELETE FROM nodes WHERE id = $1`, id); err != nil {
			return err
		}
		n.previous, n.state = n.state, ""
		return q.emit(ctx, nil, nodeEvent(events.NodeDeleted, n))
	})
}

// Liveness transitions, as SQL conditions on nodes (not aliased) with the
// time to judge by at $now, the stale age in microseconds at $stale and the
// powered-off grace in microseconds at $grace (placeholders substituted by
// livenessSQL).
const (
	// livenessStale: a ready (or clock-skewed) node not heard from for
	// StaleAfter (its join time counts when it never connected) becomes
	// unreachable. A node a draining gateway told to reconnect later
	// counts as heard from until it is due back (reconnect_by,
	// SessionDrain).
	livenessStale = `(state IN ('ready', 'clock-skewed') AND coalesce(` + nodeLastSeen + `, created_at) < coalesce($now, now()) - bc_micros($stale)
		AND (reconnect_by IS NULL OR reconnect_by < coalesce($now, now()) - bc_micros($stale)))`
	// livenessBack: an unreachable node heard from since becomes ready, and
	// so does a powered-off one heard from, recently, more than the grace
	// after it was marked off.
	livenessBack = `((state = 'unreachable' AND ` + nodeLastSeen + ` >= coalesce($now, now()) - bc_micros($stale))
		OR (state = 'powered-off' AND ` + nodeLastSeen + ` >= coalesce($now, now()) - bc_micros($stale)
			AND ` + nodeLastSeen + ` > updated_at + bc_micros($grace)))`
)

// livenessSQL substitutes the placeholders of the liveness conditions in
// sql with now, stale and grace.
func livenessSQL(sql, now, stale, grace string) string {
	return strings.NewReplacer("$now", now, "$stale", stale, "$grace", grace).Replace(sql)
}

// NodeLivenessDue returns those of p.Shards in which NodeLivenessReconcile
// would move a node, in one read (the shards bound as one JSON array).
func (s *Store) NodeLivenessDue(ctx context.Context, p *store.NodeLivenessDueParams) ([]int, error) {
	if len(p.Shards) == 0 {
		return nil, nil
	}
	in, set := s.intSet("$3", p.Shards)
	rows, err := s.db.Query(ctx, livenessSQL(`SELECT DISTINCT shard FROM nodes
		WHERE shard IN (`+in+`) AND (`+livenessStale+` OR `+livenessBack+`)
		ORDER BY shard`, "$1", "$2", "$4"),
		s.clock(p.Now), p.StaleAfter.Microseconds(), set, p.PoweredOffGrace.Microseconds())
	if err != nil {
		return nil, s.wrap("check liveness", err)
	}
	defer rows.Close()
	var shards []int
	for rows.Next() {
		var n int
		if err := rows.Scan(&n); err != nil {
			return nil, s.wrap("check liveness", err)
		}
		shards = append(shards, n)
	}
	return shards, s.wrap("check liveness", rows.Err())
}

// NodeLivenessReconcile moves a shard's nodes between ready and unreachable
// by the age of their last heartbeat, and powered-off nodes heard from
// again to ready.
// Each move writes its event (node.unreachable, node.unresponsive when the
// node's session is still open, node.ready) in the same transaction.
func (s *Store) NodeLivenessReconcile(ctx context.Context, p *store.NodeLivenessParams) (unreachable, ready []string, err error) {
	err = s.Tx(ctx, func(tx store.Store) error {
		var err error
		unreachable, ready, err = tx.(*Store).nodeLivenessReconcile(ctx, p)
		return err
	})
	return unreachable, ready, err
}

func (s *Store) nodeLivenessReconcile(ctx context.Context, p *store.NodeLivenessParams) (unreachable, ready []string, err error) {
	args := []any{p.Shard, s.clock(p.Now), p.StaleAfter.Microseconds(), p.PoweredOffGrace.Microseconds()}
	// ids runs sql with the placeholders it uses, $1 to $3 or $1 to $4.
	ids := func(sql string) ([]string, error) {
		sql = livenessSQL(sql, "$2", "$3", "$4")
		a := args
		if !strings.Contains(sql, "$4") {
			a = args[:3]
		}
		rows, err := s.db.Query(ctx, sql, a...)
		if err != nil {
			return nil, s.wrap("reconcile liveness", err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return nil, s.wrap("reconcile liveness", err)
			}
			out = append(out, id)
		}
		return out, s.wrap("reconcile liveness", rows.Err())
	}
	// Lock the rows to move in id order first, where rows are locked at
	// all: a gateway's flush closing many sessions locks their nodes in id
	// order too (gateway.flush), so the two cannot deadlock; the updates
	// below would lock in scan order, one set after the other.
	if s.d.ForUpdate != "" {
		if _, err := ids(`SELECT id FROM nodes WHERE shard = $1 AND (` + livenessStale + ` OR ` + livenessBack + `)
			ORDER BY id` + s.d.ForUpdate); err != nil {
			return nil, nil, err
		}
	}
	// Each id comes back with its event's fields: "<id> <pool> <session
	// open: 1|0> <cordoned: 1|0> <previous state> <hostname>" (ids and
	// states hold no spaces; a hostname may).
	const fields = ` || ' ' || pool_id || ' ' || CASE WHEN EXISTS (SELECT 1 FROM sessions x WHERE x.node_id = nodes.id) THEN '1' ELSE '0' END
		|| ' ' || CASE WHEN cordoned THEN '1' ELSE '0' END || ' ' || `
	var evs []event
	rowsOf := func(typ string, lines []string, previous func(string) string) []string {
		out := make([]string, 0, len(lines))
		for _, l := range lines {
			f := strings.SplitN(l, " ", 6)
			if len(f) < 6 {
				continue
			}
			n := &nodeRow{id: f[0], poolID: f[1], cordoned: f[3] == "1", previous: previous(f[4]), hostname: f[5]}
			n.state = store.NodeReady
			t := typ
			if typ == events.NodeUnreachable {
				n.state = store.NodeUnreachable
				if f[2] == "1" {
					t = events.NodeUnresponsive
				}
			}
			evs = append(evs, nodeEvent(t, n))
			out = append(out, f[0])
		}
		return out
	}
	// The previous state is read before the update sets it: a column in
	// RETURNING is the new value, so the CASE restates the old one.
	lines, err := ids(`UPDATE nodes SET state = 'unreachable', updated_at = coalesce($2, now())
		WHERE shard = $1 AND ` + livenessStale + `
		RETURNING id` + fields + `'ready' || ' ' || hostname`)
	if err != nil {
		return nil, nil, err
	}
	unreachable = rowsOf(events.NodeUnreachable, lines, func(s string) string { return s })
	lines, err = ids(`UPDATE nodes SET state = 'ready', updated_at = coalesce($2, now())
		WHERE shard = $1 AND ` + livenessBack + `
		RETURNING id` + fields + `'-' || ' ' || hostname`)
	if err != nil {
		return nil, nil, err
	}
	ready = rowsOf(events.NodeReady, lines, func(string) string { return "" })
	return unreachable, ready, s.emit(ctx, p.Now, evs...)
}

// NodesMissing returns the ids that name no node.
func (s *Store) NodesMissing(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	in, set := s.textSet("$1", ids)
	rows, err := s.db.Query(ctx, `SELECT id FROM nodes WHERE id IN (`+in+`)`, set)
	if err != nil {
		return nil, s.wrap("look up nodes", err)
	}
	found, err := collect(rows, scanText)
	if err != nil {
		return nil, s.wrap("look up nodes", err)
	}
	known := make(map[string]bool, len(found))
	for _, id := range found {
		known[*id] = true
	}
	var missing []string
	for _, id := range ids {
		if !known[id] {
			missing = append(missing, id)
		}
	}
	return missing, nil
}
