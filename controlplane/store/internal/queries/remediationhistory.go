package queries

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

const gpuFindingColumns = `id, node_id, gpu_uuid, board_serial, kind, severity, resolution, investigatory, xid, xid_mnemonic,
	message, event_id, outcome, remediation_id, created_at, taken_at`

func scanGPUFinding(r Row) (*store.GPUFindingRecord, error) {
	f := &store.GPUFindingRecord{}
	err := r.Scan(&f.ID, &f.NodeID, &f.GPUUUID, &f.BoardSerial, &f.Kind, &f.Severity, &f.Resolution, &f.Investigatory,
		&f.XID, &f.XIDMnemonic, &f.Message, &f.EventID, &f.Outcome, &f.RemediationID, &f.CreatedAt, &f.TakenAt)
	return f, err
}

// RemediationFindingKeep keeps a taken finding in gpu_findings.
func (s *Store) RemediationFindingKeep(ctx context.Context, r *store.GPUFindingRecord) error {
	err := s.db.QueryRow(ctx, `INSERT INTO gpu_findings (node_id, gpu_uuid, board_serial, kind, severity, resolution,
			investigatory, xid, xid_mnemonic, message, event_id, outcome, remediation_id, created_at, taken_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) RETURNING id`,
		r.NodeID, r.GPUUUID, r.BoardSerial, r.Kind, r.Severity, r.Resolution, r.Investigatory, r.XID, r.XIDMnemonic,
		r.Message, r.EventID, r.Outcome, r.RemediationID, r.CreatedAt.UTC(), r.TakenAt.UTC()).Scan(&r.ID)
	return s.wrap("keep finding of node "+r.NodeID, err)
}

// RemediationFindingCount counts a GPU's kept findings of one code taken
// after since.
func (s *Store) RemediationFindingCount(ctx context.Context, nodeID, gpuUUID, kind string, xid int, since time.Time) (int, error) {
	var n int
	err := s.db.QueryRow(ctx, `SELECT count(*) FROM gpu_findings
		WHERE node_id = $1 AND gpu_uuid = $2 AND kind = $3 AND xid = $4 AND taken_at > $5`,
		nodeID, gpuUUID, kind, xid, since.UTC()).Scan(&n)
	return n, s.wrap("count findings of GPU "+gpuUUID, err)
}

// RemediationHistory returns a node's or a GPU's findings, cases, actions
// and counts.
func (s *Store) RemediationHistory(ctx context.Context, p *store.RemediationHistoryParams) (*store.RemediationHistory, error) {
	if p.NodeID == "" && p.GPUUUID == "" {
		return nil, errors.New("remediation history: name a node or a GPU")
	}
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if p.NodeID != "" {
		where = append(where, "node_id = "+arg(p.NodeID))
	}
	if p.GPUUUID != "" {
		where = append(where, "gpu_uuid = "+arg(p.GPUUUID))
	}
	since := "created_at >= " + arg(p.Since.UTC())
	taken := "taken_at >= $" + strconv.Itoa(len(args))
	cond := strings.Join(where, " AND ")
	n := limit(p.Limit)
	out := &store.RemediationHistory{}
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		rows, err := q.db.Query(ctx, `SELECT `+gpuFindingColumns+` FROM gpu_findings WHERE `+cond+` AND `+taken+`
			ORDER BY taken_at DESC, id DESC LIMIT `+strconv.Itoa(n), args...)
		if err != nil {
			return q.wrap("list findings", err)
		}
		if out.Findings, err = collect(rows, scanGPUFinding); err != nil {
			return q.wrap("list findings", err)
		}
		rows, err = q.db.Query(ctx, `SELECT `+remediationColumns+` FROM remediations WHERE `+cond+` AND `+since+`
			ORDER BY created_at DESC, id DESC LIMIT `+strconv.Itoa(n), args...)
		if err != nil {
			return q.wrap("list cases", err)
		}
		if out.Cases, err = collect(rows, scanRemediation); err != nil {
			return q.wrap("list cases", err)
		}
		for _, c := range out.Cases {
			for _, id := range slices.Backward(c.CommandIDs) {
				a := &store.RemediationAction{RemediationID: c.ID, CommandID: id, NodeID: c.NodeID, GPUUUID: c.GPUUUID,
					CreatedAt: c.CreatedAt}
				switch cmd, err := q.CommandGet(ctx, id); {
				case err == nil:
					a.Kind, a.State, a.CreatedAt, a.FinishedAt = cmd.Kind, cmd.State, cmd.CreatedAt, cmd.FinishedAt
				case !errors.Is(err, store.ErrNotFound):
					return err
				}
				out.Actions = append(out.Actions, a)
			}
		}
		slices.SortStableFunc(out.Actions, func(a, b *store.RemediationAction) int { return b.CreatedAt.Compare(a.CreatedAt) })
		if len(out.Actions) > n {
			out.Actions = out.Actions[:n]
		}
		rows, err = q.db.Query(ctx, `SELECT node_id, gpu_uuid, kind, xid, max(xid_mnemonic), max(resolution), count(*),
				min(taken_at), max(taken_at)
			FROM gpu_findings WHERE `+cond+` AND `+taken+`
			GROUP BY node_id, gpu_uuid, kind, xid ORDER BY count(*) DESC, max(taken_at) DESC LIMIT `+strconv.Itoa(n), args...)
		if err != nil {
			return q.wrap("count findings", err)
		}
		out.Counts, err = collect(rows, func(r Row) (*store.GPUFindingCount, error) {
			c := &store.GPUFindingCount{}
			err := r.Scan(&c.NodeID, &c.GPUUUID, &c.Kind, &c.XID, &c.XIDMnemonic, &c.Resolution, &c.Count, &c.First, &c.Last)
			return c, err
		})
		return q.wrap("count findings", err)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// pruneFindings deletes the kept findings taken before before.
func (s *Store) pruneFindings(ctx context.Context, before time.Time) (int64, error) {
	n, err := s.db.Exec(ctx, `DELETE FROM gpu_findings WHERE taken_at < $1`, before.UTC())
	return n, s.wrap("prune kept findings", err)
}
