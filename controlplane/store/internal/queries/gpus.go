package queries

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

const gpuPlacementColumns = `p.id, p.gpu_uuid, p.node_id, n.hostname, n.pool_id, p.board_serial, p.model, p.health, p.conflict,
	p.current, p.first_seen, p.last_seen`

func scanGPUPlacement(r Row) (*store.GPUPlacement, error) {
	g := &store.GPUPlacement{}
	err := r.Scan(&g.ID, &g.GPUUUID, &g.NodeID, &g.Hostname, &g.PoolID, &g.BoardSerial, &g.Model, &g.Health, &g.Conflict,
		&g.Current, &g.FirstSeen, &g.LastSeen)
	return g, err
}

// otherStay is a current stay of a GPU in another node.
type otherStay struct {
	id             int64
	uuid           string
	nodeID, host   string
	poolID         string
	live           bool
	serial, health string
}

// GPUPlacementsSet records the GPUs of a node's inventory (store.GPUStore).
func (s *Store) GPUPlacementsSet(ctx context.Context, p *store.GPUPlacementsSetParams) error {
	now := time.Now()
	if p.Now != nil {
		now = *p.Now
	}
	now = now.UTC()
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		var poolID, host string
		if err := q.db.QueryRow(ctx, `SELECT pool_id, hostname FROM nodes WHERE id = $1`, p.NodeID).Scan(&poolID, &host); err != nil {
			return q.wrap("place GPUs of node "+p.NodeID, err)
		}
		rows, err := q.db.Query(ctx, `SELECT `+gpuPlacementColumns+` FROM gpu_placements p JOIN nodes n ON n.id = p.node_id
			WHERE p.node_id = $1 AND p.current = true`, p.NodeID)
		if err != nil {
			return q.wrap("read GPUs of node "+p.NodeID, err)
		}
		current, err := collect(rows, scanGPUPlacement)
		if err != nil {
			return q.wrap("read GPUs of node "+p.NodeID, err)
		}
		byUUID := map[string]*store.GPUPlacement{}
		for _, c := range current {
			byUUID[c.GPUUUID] = c
		}
		listed := map[string]bool{}
		var fresh []store.GPUSeen
		for _, g := range p.GPUs {
			if g.UUID == "" || listed[g.UUID] {
				continue
			}
			listed[g.UUID] = true
			c, ok := byUUID[g.UUID]
			if !ok {
				fresh = append(fresh, g)
				continue
			}
			if c.BoardSerial == g.Serial && c.Model == g.Model && c.Health == g.Health {
				continue // the stay goes on; last_seen moves with a change only
			}
			if err := q.exec1(ctx, "update GPU "+g.UUID, `UPDATE gpu_placements SET board_serial = $2, model = $3,
				health = $4, last_seen = $5 WHERE id = $1`, c.ID, g.Serial, g.Model, g.Health, now); err != nil {
				return err
			}
		}
		others, err := q.otherStays(ctx, p.NodeID, fresh)
		if err != nil {
			return err
		}
		for _, g := range fresh {
			conflict, err := q.placeNew(ctx, p.NodeID, poolID, host, g, others[g.UUID], now)
			if err != nil {
				return err
			}
			if _, err := q.db.Exec(ctx, `INSERT INTO gpu_placements (gpu_uuid, node_id, board_serial, model, health, conflict,
					current, first_seen, last_seen) VALUES ($1, $2, $3, $4, $5, $6, true, $7, $7)`,
				g.UUID, p.NodeID, g.Serial, g.Model, g.Health, conflict, now); err != nil {
				return q.wrap("place GPU "+g.UUID, err)
			}
		}
		for _, c := range current {
			if listed[c.GPUUUID] {
				continue
			}
			if err := q.exec1(ctx, "end stay of GPU "+c.GPUUUID, `UPDATE gpu_placements SET current = false, last_seen = $2
				WHERE id = $1`, c.ID, now); err != nil {
				return err
			}
			if _, err := q.db.Exec(ctx, `UPDATE gpu_placements SET conflict = '' WHERE gpu_uuid = $1 AND current = true
				AND conflict = $2`, c.GPUUUID, p.NodeID); err != nil {
				return q.wrap("clear conflict of GPU "+c.GPUUUID, err)
			}
		}
		return nil
	})
}

// otherStays reads, in one query, the current stays in other nodes than
// nodeID of the GPUs gpus, by UUID, each with whether its node has a
// session open.
func (s *Store) otherStays(ctx context.Context, nodeID string, gpus []store.GPUSeen) (map[string][]*otherStay, error) {
	if len(gpus) == 0 {
		return nil, nil
	}
	args := []any{nodeID}
	in := make([]string, 0, len(gpus))
	for _, g := range gpus {
		args = append(args, g.UUID)
		in = append(in, "$"+strconv.Itoa(len(args)))
	}
	rows, err := s.db.Query(ctx, `SELECT p.id, p.gpu_uuid, p.node_id, n.hostname, n.pool_id, p.board_serial, p.health,
			EXISTS (SELECT 1 FROM sessions s WHERE s.node_id = p.node_id)
		FROM gpu_placements p JOIN nodes n ON n.id = p.node_id
		WHERE p.current = true AND p.node_id <> $1 AND p.gpu_uuid IN (`+strings.Join(in, ", ")+`) ORDER BY p.id`, args...)
	if err != nil {
		return nil, s.wrap("read stays of new GPUs of node "+nodeID, err)
	}
	list, err := collect(rows, func(r Row) (*otherStay, error) {
		o := &otherStay{}
		err := r.Scan(&o.id, &o.uuid, &o.nodeID, &o.host, &o.poolID, &o.serial, &o.health, &o.live)
		return o, err
	})
	if err != nil {
		return nil, s.wrap("read stays of new GPUs of node "+nodeID, err)
	}
	out := map[string][]*otherStay{}
	for _, o := range list {
		out[o.uuid] = append(out[o.uuid], o)
	}
	return out, nil
}

// placeNew settles the other current stays (others) of a GPU new in node
// nodeID: one in a node without a session ends (the board moved), one in
// a live node is a conflict, marked on that stay and written as
// gpu.uuid-conflict for both nodes. It returns the node the new stay
// conflicts with.
func (s *Store) placeNew(ctx context.Context, nodeID, poolID, host string, g store.GPUSeen, others []*otherStay, now time.Time) (string, error) {
	conflict := ""
	for _, o := range others {
		if !o.live {
			if err := s.exec1(ctx, "end stay of GPU "+g.UUID, `UPDATE gpu_placements SET current = false WHERE id = $1`,
				o.id); err != nil {
				return "", err
			}
			continue
		}
		if conflict == "" {
			conflict = o.nodeID
		}
		if err := s.exec1(ctx, "mark conflict of GPU "+g.UUID, `UPDATE gpu_placements SET conflict = $2 WHERE id = $1`,
			o.id, nodeID); err != nil {
			return "", err
		}
		if err := s.emit(ctx, &now,
			event{events.GPUUUIDConflict, nodeID, events.GPUUUIDConflictData{NodeID: nodeID, PoolID: poolID, Hostname: host,
				GPUUUID: g.UUID, BoardSerial: g.Serial, OtherNodeID: o.nodeID, OtherHostname: o.host}},
			event{events.GPUUUIDConflict, o.nodeID, events.GPUUUIDConflictData{NodeID: o.nodeID, PoolID: o.poolID,
				Hostname: o.host, GPUUUID: g.UUID, BoardSerial: o.serial, OtherNodeID: nodeID, OtherHostname: host}},
		); err != nil {
			return "", err
		}
	}
	return conflict, nil
}

// GPUList lists the GPUs current in some node (store.GPUStore).
func (s *Store) GPUList(ctx context.Context, p *store.GPUListParams) ([]*store.GPUPlacement, error) {
	args := []any{}
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	where := "p.current = true"
	if p.PoolID != "" {
		where += " AND n.pool_id = " + arg(p.PoolID)
	}
	if p.Model != "" {
		where += " AND p.model = " + arg(p.Model)
	}
	if p.Unhealthy {
		where += " AND (p.health IN ('" + store.GPUHealthDegraded + "', '" + store.GPUHealthFailed + "') OR p.conflict <> '')"
	}
	if p.After != "" || p.AfterNode != "" {
		a, b := arg(p.After), arg(p.AfterNode)
		where += " AND (p.gpu_uuid > " + a + " OR (p.gpu_uuid = " + a + " AND p.node_id > " + b + "))"
	}
	rows, err := s.db.Query(ctx, `SELECT `+gpuPlacementColumns+` FROM gpu_placements p JOIN nodes n ON n.id = p.node_id
		WHERE `+where+` ORDER BY p.gpu_uuid, p.node_id LIMIT `+strconv.Itoa(limit(p.Limit)), args...)
	if err != nil {
		return nil, s.wrap("list GPUs", err)
	}
	out, err := collect(rows, scanGPUPlacement)
	return out, s.wrap("list GPUs", err)
}

// GPUPlacements returns every stay of a GPU (store.GPUStore).
func (s *Store) GPUPlacements(ctx context.Context, uuid string) ([]*store.GPUPlacement, error) {
	rows, err := s.db.Query(ctx, `SELECT `+gpuPlacementColumns+` FROM gpu_placements p JOIN nodes n ON n.id = p.node_id
		WHERE p.gpu_uuid = $1 ORDER BY p.first_seen, p.id`, uuid)
	if err != nil {
		return nil, s.wrap("read stays of GPU "+uuid, err)
	}
	out, err := collect(rows, scanGPUPlacement)
	if err != nil {
		return nil, s.wrap("read stays of GPU "+uuid, err)
	}
	if len(out) == 0 {
		return nil, store.ErrNotFound
	}
	return out, nil
}

// GPUIncidentsByModel counts the cases naming a GPU by its model
// (store.GPUStore).
func (s *Store) GPUIncidentsByModel(ctx context.Context, excludeFinding string) ([]*store.GPUModelCount, error) {
	rows, err := s.db.Query(ctx, `SELECT p.model, count(*) FROM remediations r
		JOIN (SELECT DISTINCT gpu_uuid, node_id, model FROM gpu_placements) p ON p.gpu_uuid = r.gpu_uuid AND p.node_id = r.node_id
		WHERE r.gpu_uuid <> '' AND r.finding <> $1 GROUP BY p.model ORDER BY p.model`, excludeFinding)
	if err != nil {
		return nil, s.wrap("count incidents by GPU model", err)
	}
	out, err := collect(rows, func(r Row) (*store.GPUModelCount, error) {
		c := &store.GPUModelCount{}
		err := r.Scan(&c.Model, &c.Count)
		return c, err
	})
	return out, s.wrap("count incidents by GPU model", err)
}

// GPUServiceByModel sums the stays by GPU model (store.GPUStore). Each stay
// is read and summed here, as the two backends keep times differently; the
// caller caches the result (metrics: GPUCacheTTL).
func (s *Store) GPUServiceByModel(ctx context.Context, now time.Time) ([]*store.GPUModelService, error) {
	rows, err := s.db.Query(ctx, `SELECT model, gpu_uuid, current, first_seen, last_seen FROM gpu_placements`)
	if err != nil {
		return nil, s.wrap("sum GPU service by model", err)
	}
	type stay struct {
		model, uuid string
		current     bool
		first, last time.Time
	}
	stays, err := collect(rows, func(r Row) (*stay, error) {
		x := &stay{}
		err := r.Scan(&x.model, &x.uuid, &x.current, &x.first, &x.last)
		return x, err
	})
	if err != nil {
		return nil, s.wrap("sum GPU service by model", err)
	}
	by := map[string]*store.GPUModelService{}
	seen := map[[2]string]bool{}
	for _, x := range stays {
		m := by[x.model]
		if m == nil {
			m = &store.GPUModelService{Model: x.model}
			by[x.model] = m
		}
		if k := [2]string{x.model, x.uuid}; !seen[k] {
			seen[k] = true
			m.GPUs++
		}
		end := x.last
		if x.current {
			end = now
		}
		if d := end.Sub(x.first); d > 0 {
			m.Seconds += d.Seconds()
		}
	}
	out := make([]*store.GPUModelService, 0, len(by))
	for _, m := range by {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b *store.GPUModelService) int { return strings.Compare(a.Model, b.Model) })
	return out, nil
}
