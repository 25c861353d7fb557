package watch

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// caseRow is an open remediation case in the queue.
type caseRow struct {
	ID, NodeID, Node, Pool, State, Action, Finding, Resolution, Mnemonic, GPU, Reason string
	XID, Attempts                                                                     int
	Paused                                                                            bool
	Since                                                                             time.Time
}

// breakerRow is a pool's remediation circuit breaker.
type breakerRow struct {
	Pool, Site string
	Tripped    bool
	Since      *time.Time // tripped at
	ResetAt    *time.Time
	ResetBy    string
}

// capacityRow is one pool's GPUs by what they can be used for now.
type capacityRow struct {
	Pool, Site                   string
	Total, Free, Reserved, OutOf int
}

// reservationBar is one open reservation on the time line; X and W are
// its start and length in percent of the line (SVG attributes, not
// styles: the CSP allows no inline style).
type reservationBar struct {
	ID, Pool, Owner, State, Note string
	GPUs, Nodes                  int
	Start, End                   time.Time
	X, W                         string
	Y, TextY                     int
}

// maxQueue bounds the cases the queue lists.
const maxQueue = 100

// maxBars bounds the reservations on the time line.
const maxBars = 50

// queue reads the open cases (oldest first, at most maxQueue) and every
// pool's breaker.
func (h *Handler) queue(ctx context.Context, sc *scope, s *snapshot) ([]caseRow, []breakerRow, int, error) {
	host := map[string]string{}
	for _, n := range s.Nodes {
		host[n.ID] = n.Hostname
	}
	poolName := map[string]string{}
	for _, p := range s.Pools {
		poolName[p.ID] = p.Name
	}
	var rows []caseRow
	open := 0
	for lp := (store.RemediationListParams{OpenOnly: true, ListParams: store.ListParams{Limit: store.MaxListLimit}}); ; {
		list, err := h.store.RemediationList(ctx, &lp)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("list open cases: %w", err)
		}
		for _, c := range list {
			if !sc.pool(c.PoolID) {
				continue
			}
			open++
			rows = append(rows, caseRow{ID: c.ID, NodeID: c.NodeID, Node: cmp.Or(host[c.NodeID], c.NodeID), Pool: cmp.Or(poolName[c.PoolID], c.PoolID),
				State: c.State, Action: c.Action, Finding: c.Finding, Resolution: c.Resolution, Mnemonic: c.XIDMnemonic, GPU: c.GPUUUID,
				Reason: c.Reason, XID: c.XID, Attempts: c.Attempts, Paused: c.Paused, Since: c.StateSince})
		}
		if len(list) < lp.Limit {
			break
		}
		lp.Cursor = list[len(list)-1].ID
	}
	slices.SortFunc(rows, func(a, b caseRow) int { return a.Since.Compare(b.Since) })
	if len(rows) > maxQueue {
		rows = rows[:maxQueue]
	}
	brs, err := h.store.RemediationBreakers(ctx)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("read breakers: %w", err)
	}
	byPool := map[string]*store.RemediationBreaker{}
	for _, b := range brs {
		byPool[b.PoolID] = b
	}
	var breakers []breakerRow
	for _, p := range s.Pools {
		row := breakerRow{Pool: p.Name, Site: p.Site}
		if b := byPool[p.ID]; b != nil {
			row.Tripped, row.Since, row.ResetAt, row.ResetBy = b.TrippedAt != nil, b.TrippedAt, b.ResetAt, b.ResetBy
		}
		breakers = append(breakers, row)
	}
	return rows, breakers, open, nil
}

// capacity counts each pool's GPUs: free (ok on a node in service),
// reserved (held now), and out of service (every other: unknown, failed,
// degraded, under a case, or on a node cordoned, draining or otherwise
// out).
func capacity(s *snapshot) []capacityRow {
	byPool := map[string]*capacityRow{}
	for _, p := range s.Pools {
		byPool[p.ID] = &capacityRow{Pool: p.Name, Site: p.Site}
	}
	for _, n := range s.Nodes {
		r := byPool[n.PoolID]
		if r == nil {
			r = &capacityRow{Pool: n.Pool, Site: n.Site}
			byPool[n.PoolID] = r
		}
		for _, g := range n.GPUs {
			r.Total++
			switch {
			case g.State == GPUReserved:
				r.Reserved++
			case g.State == GPUOK && n.InService:
				r.Free++
			default:
				r.OutOf++
			}
		}
	}
	out := make([]capacityRow, 0, len(byPool))
	for _, r := range byPool {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b capacityRow) int { return cmp.Compare(a.Pool, b.Pool) })
	return out
}

// reservations reads the open reservations (at most maxBars, soonest
// first) and lays them on one time line from now to the latest end (at
// least a day).
func (h *Handler) reservations(ctx context.Context, s *snapshot) ([]reservationBar, time.Time, time.Time, error) {
	ids := make([]string, 0, len(s.Pools))
	name := map[string]string{}
	for _, p := range s.Pools {
		ids = append(ids, p.ID)
		name[p.ID] = p.Name
	}
	now := h.now().UTC()
	from, to := now, now.Add(24*time.Hour)
	if len(ids) == 0 {
		return nil, from, to, nil
	}
	rs, err := h.store.ReservationsOpen(ctx, ids)
	if err != nil {
		return nil, from, to, fmt.Errorf("open reservations: %w", err)
	}
	slices.SortFunc(rs, func(a, b *store.Reservation) int { return a.Start.Compare(b.Start) })
	if len(rs) > maxBars {
		rs = rs[:maxBars]
	}
	for _, r := range rs {
		if r.End.After(to) {
			to = r.End
		}
	}
	span := to.Sub(from).Seconds()
	var bars []reservationBar
	for i, r := range rs {
		start, end := r.Start, r.End
		if start.Before(from) {
			start = from
		}
		x := start.Sub(from).Seconds() / span * 100
		w := max(end.Sub(start).Seconds()/span*100, 0.5)
		bars = append(bars, reservationBar{ID: r.ID, Pool: cmp.Or(name[r.PoolID], r.PoolID), Owner: r.Owner, State: r.State, Note: r.Note,
			GPUs: r.GPUs, Nodes: r.Nodes, Start: r.Start, End: r.End,
			X: fmt.Sprintf("%.2f%%", x), W: fmt.Sprintf("%.2f%%", w), Y: i*22 + 4, TextY: i*22 + 18})
	}
	return bars, from, to, nil
}
