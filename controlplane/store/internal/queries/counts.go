package queries

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// NodeCounts counts nodes by their pool's site and by state in one grouped
// query (a node whose pool row is gone counts under site "").
func (s *Store) NodeCounts(ctx context.Context) ([]*store.NodeCount, error) {
	rows, err := s.db.Query(ctx, `SELECT coalesce(p.site_id, ''), n.state, count(*),
		coalesce(sum(CASE WHEN n.cordoned THEN 1 ELSE 0 END), 0)
		FROM nodes n LEFT JOIN pools p ON p.id = n.pool_id
		GROUP BY coalesce(p.site_id, ''), n.state ORDER BY 1, 2`)
	if err != nil {
		return nil, s.wrap("count nodes", err)
	}
	out, err := collect(rows, func(r Row) (*store.NodeCount, error) {
		c := &store.NodeCount{}
		return c, r.Scan(&c.SiteID, &c.State, &c.Nodes, &c.Cordoned)
	})
	return out, s.wrap("count nodes", err)
}

// CommandCountOpen counts the commands not yet terminal by state, in one
// grouped query over the (state, deadline_at) index.
func (s *Store) CommandCountOpen(ctx context.Context) (map[string]int, error) {
	rows, err := s.db.Query(ctx, `SELECT state, count(*) FROM commands
		WHERE state IN ('queued', 'dispatched', 'accepted', 'running') GROUP BY state`)
	if err != nil {
		return nil, s.wrap("count open commands", err)
	}
	type stateCount struct {
		state string
		n     int
	}
	counts, err := collect(rows, func(r Row) (*stateCount, error) {
		c := &stateCount{}
		return c, r.Scan(&c.state, &c.n)
	})
	if err != nil {
		return nil, s.wrap("count open commands", err)
	}
	out := make(map[string]int, len(counts))
	for _, c := range counts {
		out[c.state] = c.n
	}
	return out, nil
}

// NodeCertEarliest returns the earliest cert_not_after among the nodes in
// states (all nodes when states is empty).
func (s *Store) NodeCertEarliest(ctx context.Context, states []string) (*time.Time, error) {
	q := `SELECT min(cert_not_after) FROM nodes WHERE cert_not_after IS NOT NULL`
	args := make([]any, 0, len(states))
	if len(states) > 0 {
		marks := make([]string, len(states))
		for i, st := range states {
			marks[i] = "$" + strconv.Itoa(i+1)
			args = append(args, st)
		}
		q += ` AND state IN (` + strings.Join(marks, ", ") + `)`
	}
	var earliest *time.Time
	if err := s.db.QueryRow(ctx, q, args...).Scan(&earliest); err != nil {
		return nil, s.wrap("earliest node certificate", err)
	}
	return earliest, nil
}
