package queries

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

// reservationColumns are a reservation's columns (migration
// 0015_reservations), for SELECT ... FROM reservations.
const reservationColumns = `id, pool_id, gpus, nodes, gpu_model, min_gpu_memory_mib, selector, starts_at, ends_at,
	owner, note, state, reason, created_by, failed_nodes, created_at, updated_at, tenant_id, grants`

// slotColumns are a slot's columns.
const slotColumns = `reservation_id, node_id, gpu, gpu_uuid, starts_at, ends_at`

// slotChunk bounds the rows of one multi-row slot insert (7 arguments
// each).
const slotChunk = 500

func scanReservation(r Row) (*store.Reservation, error) {
	x := &store.Reservation{}
	var sel, failed []byte
	var grants string
	err := r.Scan(&x.ID, &x.PoolID, &x.GPUs, &x.Nodes, &x.GPUModel, &x.MinGPUMemoryMiB, &sel, &x.Start, &x.End,
		&x.Owner, &x.Note, &x.State, &x.Reason, &x.CreatedBy, &failed, &x.CreatedAt, &x.UpdatedAt, &x.TenantID, &grants)
	if err != nil {
		return nil, err
	}
	x.Grants = splitGrants(grants)
	if len(sel) > 0 {
		if err := json.Unmarshal(sel, &x.Selector); err != nil {
			return nil, fmt.Errorf("decode selector of reservation %s: %w", x.ID, err)
		}
	}
	if len(failed) > 0 {
		if err := json.Unmarshal(failed, &x.FailedNodes); err != nil {
			return nil, fmt.Errorf("decode failed nodes of reservation %s: %w", x.ID, err)
		}
	}
	return x, nil
}

func scanSlot(r Row) (*store.ReservationSlot, error) {
	s := &store.ReservationSlot{}
	return s, r.Scan(&s.ReservationID, &s.NodeID, &s.GPU, &s.GPUUUID, &s.Start, &s.End)
}

// withSlots fills the held slots (non-empty ranges) of rs, read in one
// query.
func (s *Store) withSlots(ctx context.Context, rs []*store.Reservation) ([]*store.Reservation, error) {
	if len(rs) == 0 {
		return rs, nil
	}
	if len(rs) == 1 {
		// One reservation (a get, every change): by its index, where the
		// set form leaves the planner guessing the set's size.
		rows, err := s.db.Query(ctx, `SELECT `+slotColumns+` FROM reservation_slots
			WHERE reservation_id = $1 AND starts_at < ends_at ORDER BY node_id, gpu`, rs[0].ID)
		if err != nil {
			return nil, s.wrap("read reservation slots", err)
		}
		slots, err := collect(rows, scanSlot)
		if err != nil {
			return nil, s.wrap("read reservation slots", err)
		}
		rs[0].Slots = slots
		return rs, nil
	}
	ids := make([]string, len(rs))
	byID := make(map[string]*store.Reservation, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
		byID[r.ID] = r
	}
	arr, err := json.Marshal(ids)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, `SELECT `+slotColumns+` FROM reservation_slots
		WHERE reservation_id IN (`+fmt.Sprintf(s.d.TextSet, "$1")+`) AND starts_at < ends_at
		ORDER BY reservation_id, node_id, gpu`, JSON(arr))
	if err != nil {
		return nil, s.wrap("read reservation slots", err)
	}
	slots, err := collect(rows, scanSlot)
	if err != nil {
		return nil, s.wrap("read reservation slots", err)
	}
	for _, sl := range slots {
		if r := byID[sl.ReservationID]; r != nil {
			r.Slots = append(r.Slots, sl)
		}
	}
	return rs, nil
}

// ReservationCreate inserts a pending reservation and its
// reservation.created event.
func (s *Store) ReservationCreate(ctx context.Context, p *store.ReservationCreateParams) (*store.Reservation, error) {
	id := p.ID
	if id == "" {
		id = store.NewID("res")
	}
	sel, err := labelsJSON(p.Selector)
	if err != nil {
		return nil, fmt.Errorf("create reservation: encode selector: %w", err)
	}
	var out *store.Reservation
	err = s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		now := q.clock(p.Now)
		if _, err := q.db.Exec(ctx, `INSERT INTO reservations (id, pool_id, gpus, nodes, gpu_model, min_gpu_memory_mib,
				selector, starts_at, ends_at, owner, note, state, created_by, created_at, updated_at, tenant_id, grants)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, 'pending', $12, coalesce($13, now()), coalesce($13, now()), $14, $15)`,
			id, p.PoolID, p.GPUs, p.Nodes, p.GPUModel, p.MinGPUMemoryMiB, sel, p.Start, p.End, p.Owner, p.Note,
			p.CreatedBy, now, cmp.Or(p.TenantID, store.RootTenant), strings.Join(p.Grants, ",")); err != nil {
			return q.wrap("create reservation", err)
		}
		var err error
		if out, err = q.ReservationGet(ctx, id); err != nil {
			return err
		}
		return q.emit(ctx, p.Now, reservationEvent(events.ReservationCreated, out, "", nil))
	})
	return out, err
}

// ReservationGet returns a reservation with its slots.
func (s *Store) ReservationGet(ctx context.Context, id string) (*store.Reservation, error) {
	r, err := scanReservation(s.db.QueryRow(ctx, `SELECT `+reservationColumns+` FROM reservations WHERE id = $1`, id))
	if err != nil {
		return nil, s.wrap("get reservation "+id, err)
	}
	rs, err := s.withSlots(ctx, []*store.Reservation{r})
	if err != nil {
		return nil, err
	}
	return rs[0], nil
}

// lockReservation reads a reservation (without slots), locking its row
// for the change that follows.
func (s *Store) lockReservation(ctx context.Context, id string) (*store.Reservation, error) {
	r, err := scanReservation(s.db.QueryRow(ctx, `SELECT `+reservationColumns+` FROM reservations WHERE id = $1`+s.d.ForUpdate, id))
	if err != nil {
		return nil, s.wrap("get reservation "+id, err)
	}
	return r, nil
}

// ReservationList pages reservations by id.
func (s *Store) ReservationList(ctx context.Context, p *store.ReservationListParams) ([]*store.Reservation, error) {
	rows, err := s.db.Query(ctx, `SELECT `+reservationColumns+` FROM reservations
		WHERE id > $1 AND ($2 = '' OR pool_id = $2) AND ($3 = '' OR state = $3) AND ($4 = '' OR owner = $4)
		ORDER BY id LIMIT $5`, p.Cursor, p.PoolID, p.State, p.Owner, limit(p.Limit))
	if err != nil {
		return nil, s.wrap("list reservations", err)
	}
	rs, err := collect(rows, scanReservation)
	if err != nil {
		return nil, s.wrap("list reservations", err)
	}
	return s.withSlots(ctx, rs)
}

// ReservationsOpen returns the open reservations of pools, with their
// slots, in two queries.
func (s *Store) ReservationsOpen(ctx context.Context, poolIDs []string) ([]*store.Reservation, error) {
	if len(poolIDs) == 0 {
		return nil, nil
	}
	arr, err := json.Marshal(poolIDs)
	if err != nil {
		return nil, err
	}
	set := fmt.Sprintf(s.d.TextSet, "$1")
	rows, err := s.db.Query(ctx, `SELECT `+reservationColumns+` FROM reservations
		WHERE pool_id IN (`+set+`) AND state IN ('pending', 'placed', 'active') ORDER BY id`, JSON(arr))
	if err != nil {
		return nil, s.wrap("list open reservations", err)
	}
	rs, err := collect(rows, scanReservation)
	if err != nil {
		return nil, s.wrap("list open reservations", err)
	}
	// The slots by the reservations' ids (their index), not by a join on
	// the pool, which reads the pool's whole booking history.
	return s.withSlots(ctx, rs)
}

// ReservationSlots returns the held slots overlapping a window.
func (s *Store) ReservationSlots(ctx context.Context, p *store.ReservationSlotsParams) ([]*store.ReservationSlot, error) {
	// Two texts rather than "$1 = '' OR pool_id = $1", which a generic
	// plan cannot serve from the pool's index.
	q, args := `SELECT `+slotColumns+` FROM reservation_slots
		WHERE ends_at > $1 AND starts_at < $2 AND starts_at < ends_at`, []any{p.From, p.To}
	switch {
	case p.PoolID != "":
		q, args = q+` AND pool_id = $3`, append(args, p.PoolID)
	case s.d.Name == store.DialectPostgres:
		// The same condition as a range overlap, which the GiST index
		// reservation_slots_during_idx serves (0015_reservations).
		q += ` AND tstzrange(starts_at, ends_at) && tstzrange($1, $2)`
	}
	rows, err := s.db.Query(ctx, q+` ORDER BY node_id, gpu, starts_at`, args...)
	if err != nil {
		return nil, s.wrap("list reservation slots", err)
	}
	out, err := collect(rows, scanSlot)
	return out, s.wrap("list reservation slots", err)
}

// errClosed is the conflict of a change to a reservation in the wrong
// state.
func errClosed(r *store.Reservation, want string) error {
	return fmt.Errorf("reservation %s is %s, not %s: %w", r.ID, r.State, want, store.ErrConflict)
}

// checkOverlap fails with store.ErrConflict when a slot of another
// reservation than id holds one of slots' GPUs for an overlapping time:
// SQLite's no-double-booking rule, and on PostgreSQL a clear error before
// the exclusion constraint's (which still catches a concurrent writer).
func (s *Store) checkOverlap(ctx context.Context, id string, slots []*store.ReservationSlot) error {
	type key struct {
		node       string
		start, end time.Time
	}
	groups := map[key][]int{}
	for _, sl := range slots {
		k := key{sl.NodeID, sl.Start, sl.End}
		groups[k] = append(groups[k], sl.GPU)
	}
	for k, gpus := range groups {
		arr, err := json.Marshal(gpus)
		if err != nil {
			return err
		}
		var other, node string
		var gpu int
		err = s.db.QueryRow(ctx, `SELECT reservation_id, node_id, gpu FROM reservation_slots
			WHERE node_id = $1 AND gpu IN (`+fmt.Sprintf(s.d.IntSet, "$2")+`) AND starts_at < $4 AND ends_at > $3
				AND starts_at < ends_at AND reservation_id <> $5 LIMIT 1`,
			k.node, JSON(arr), k.start, k.end, id).Scan(&other, &node, &gpu)
		switch {
		case err == nil:
			return fmt.Errorf("GPU %d of node %s is booked by reservation %s for an overlapping time: %w", gpu, node, other, store.ErrConflict)
		case !isNotFound(s.d.Translate(err)):
			return s.wrap("check slots of reservation "+id, err)
		}
	}
	return nil
}

// lockSlotNodes locks the rows of the nodes of slots, in id order, for
// the rest of the transaction: writers of slots on one node take turns, so
// that the second sees the first's slots in checkOverlap. Without it two
// PostgreSQL transactions inserting overlapping slots at once can each
// wait on the other's row in the exclusion constraint's check: a deadlock
// the server breaks by aborting one.
func (s *Store) lockSlotNodes(ctx context.Context, slots []*store.ReservationSlot) error {
	if s.d.ForUpdate == "" || len(slots) == 0 {
		return nil // one writer at a time anyway (SQLite)
	}
	var ids []string
	for _, sl := range slots {
		if !slices.Contains(ids, sl.NodeID) {
			ids = append(ids, sl.NodeID)
		}
	}
	slices.Sort(ids)
	arr, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	rows, err := s.db.Query(ctx, `SELECT id FROM nodes WHERE id IN (`+fmt.Sprintf(s.d.TextSet, "$1")+`) ORDER BY id`+s.d.ForUpdate, JSON(arr))
	if err != nil {
		return s.wrap("lock nodes of slots", err)
	}
	_, err = texts(rows)
	return s.wrap("lock nodes of slots", err)
}

// insertSlots writes slots in multi-row inserts.
func (s *Store) insertSlots(ctx context.Context, r *store.Reservation, slots []*store.ReservationSlot) error {
	for start := 0; start < len(slots); start += slotChunk {
		chunk := slots[start:min(start+slotChunk, len(slots))]
		args := make([]any, 0, 7*len(chunk))
		var values strings.Builder
		for i, sl := range chunk {
			if i > 0 {
				values.WriteString(", ")
			}
			n := len(args)
			fmt.Fprintf(&values, "($%d, $%d, $%d, $%d, $%d, $%d, $%d)", n+1, n+2, n+3, n+4, n+5, n+6, n+7)
			args = append(args, r.ID, r.PoolID, sl.NodeID, sl.GPU, sl.GPUUUID, sl.Start, sl.End)
		}
		if _, err := s.db.Exec(ctx, `INSERT INTO reservation_slots (reservation_id, pool_id, node_id, gpu, gpu_uuid, starts_at, ends_at)
			VALUES `+values.String(), args...); err != nil {
			return s.wrap("book slots of reservation "+r.ID, err)
		}
	}
	return nil
}

// releaseSlots ends r's slots at now: a slot not begun becomes empty, one
// running ends at now, one already over is left as it is.
func (s *Store) releaseSlots(ctx context.Context, id string, now *time.Time) error {
	_, err := s.db.Exec(ctx, `UPDATE reservation_slots
		SET ends_at = CASE WHEN starts_at >= coalesce($2, now()) THEN starts_at ELSE coalesce($2, now()) END
		WHERE reservation_id = $1 AND ends_at > coalesce($2, now())`, id, now)
	return s.wrap("release slots of reservation "+id, err)
}

// ReservationPlace books slots for a pending or placed reservation.
func (s *Store) ReservationPlace(ctx context.Context, p *store.ReservationPlaceParams) (*store.Reservation, error) {
	if len(p.Slots) == 0 {
		return nil, fmt.Errorf("place reservation %s: no slots", p.ID)
	}
	var out *store.Reservation
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		r, err := q.lockReservation(ctx, p.ID)
		if err != nil {
			return err
		}
		if r.State != store.ReservationPending && r.State != store.ReservationPlaced {
			return errClosed(r, "pending or placed")
		}
		var previous []string
		if r.State == store.ReservationPlaced {
			prev, err := q.withSlots(ctx, []*store.Reservation{r})
			if err != nil {
				return err
			}
			previous = prev[0].NodeIDs()
		}
		now := q.clock(p.Now)
		slots := make([]*store.ReservationSlot, len(p.Slots))
		for i, sl := range p.Slots {
			c := *sl
			c.ReservationID, c.Start, c.End = r.ID, r.Start, r.End
			slots[i] = &c
		}
		// Checked before any write: a caller inside a larger transaction
		// (the placer's round) may go on after an ErrConflict.
		if err := q.lockSlotNodes(ctx, slots); err != nil {
			return err
		}
		if err := q.checkOverlap(ctx, r.ID, slots); err != nil {
			return err
		}
		if r.State == store.ReservationPlaced {
			if err := q.releaseSlots(ctx, r.ID, now); err != nil {
				return err
			}
		}
		if err := q.insertSlots(ctx, r, slots); err != nil {
			return err
		}
		if err := q.db.QueryRow(ctx, `UPDATE reservations SET state = 'placed', reason = $2, updated_at = coalesce($3, now())
			WHERE id = $1 RETURNING updated_at`, r.ID, p.Reason, now).Scan(&r.UpdatedAt); err != nil {
			return q.wrap("place reservation "+r.ID, err)
		}
		previousState := r.State
		out = r
		out.State, out.Reason = store.ReservationPlaced, p.Reason
		// The slots as stored: by node, then GPU.
		slices.SortFunc(slots, func(a, b *store.ReservationSlot) int {
			return cmp.Or(strings.Compare(a.NodeID, b.NodeID), cmp.Compare(a.GPU, b.GPU))
		})
		out.Slots = slots
		return q.emit(ctx, p.Now, reservationEvent(events.ReservationPlaced, out, previousState, previous))
	})
	return out, err
}

// transitionEvents maps a target state to its event.
var transitionEvents = map[string]string{
	store.ReservationActive: events.ReservationActive,
	store.ReservationEnded:  events.ReservationEnded,
	store.ReservationFailed: events.ReservationFailed,
}

// ReservationTransition moves a reservation between states.
func (s *Store) ReservationTransition(ctx context.Context, p *store.ReservationTransitionParams) (*store.Reservation, error) {
	typ, ok := transitionEvents[p.To]
	if !ok {
		return nil, fmt.Errorf("move reservation %s to %q: not a state the placer moves to", p.ID, p.To)
	}
	var out *store.Reservation
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		r, err := q.lockReservation(ctx, p.ID)
		if err != nil {
			return err
		}
		if r.State != p.From {
			return errClosed(r, p.From)
		}
		held, err := q.withSlots(ctx, []*store.Reservation{r})
		if err != nil {
			return err
		}
		nodes := held[0].NodeIDs()
		now := q.clock(p.Now)
		if p.To != store.ReservationActive {
			if err := q.releaseSlots(ctx, r.ID, now); err != nil {
				return err
			}
		}
		reason := cmp.Or(p.Reason, r.Reason)
		if _, err := q.db.Exec(ctx, `UPDATE reservations SET state = $2, reason = $3, updated_at = coalesce($4, now()) WHERE id = $1`,
			r.ID, p.To, reason, now); err != nil {
			return q.wrap("move reservation "+r.ID, err)
		}
		if err := q.refreshReservationLabels(ctx, nodes); err != nil {
			return err
		}
		if out, err = q.ReservationGet(ctx, r.ID); err != nil {
			return err
		}
		ev := reservationEvent(typ, out, r.State, nil)
		if len(out.Slots) == 0 {
			// Released before it began (a failure): name the nodes it had.
			ev.data = withNodes(ev.data, nodes)
		}
		return q.emit(ctx, p.Now, ev)
	})
	return out, err
}

// ReservationCancel cancels an open reservation.
func (s *Store) ReservationCancel(ctx context.Context, p *store.ReservationCancelParams) (*store.Reservation, error) {
	var out *store.Reservation
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		r, err := q.lockReservation(ctx, p.ID)
		if err != nil {
			return err
		}
		if !store.ReservationOpen(r.State) {
			out = r
			return errClosed(r, "pending, placed or active")
		}
		held, err := q.withSlots(ctx, []*store.Reservation{r})
		if err != nil {
			return err
		}
		nodes := held[0].NodeIDs()
		now := q.clock(p.Now)
		if err := q.releaseSlots(ctx, r.ID, now); err != nil {
			return err
		}
		if _, err := q.db.Exec(ctx, `UPDATE reservations SET state = 'cancelled', reason = $2, updated_at = coalesce($3, now()) WHERE id = $1`,
			r.ID, p.Reason, now); err != nil {
			return q.wrap("cancel reservation "+r.ID, err)
		}
		if err := q.refreshReservationLabels(ctx, nodes); err != nil {
			return err
		}
		if out, err = q.ReservationGet(ctx, r.ID); err != nil {
			return err
		}
		ev := reservationEvent(events.ReservationCancelled, out, r.State, nil)
		ev.data = withNodes(ev.data, nodes)
		return q.emit(ctx, p.Now, ev)
	})
	return out, err
}

// ReservationExtend moves an open reservation's end later, with the
// slots it holds.
func (s *Store) ReservationExtend(ctx context.Context, p *store.ReservationExtendParams) (*store.Reservation, error) {
	var out *store.Reservation
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		r, err := q.lockReservation(ctx, p.ID)
		if err != nil {
			return err
		}
		if !store.ReservationOpen(r.State) {
			return errClosed(r, "pending, placed or active")
		}
		if !p.End.After(r.End) {
			return fmt.Errorf("extend reservation %s: the new end %s is not after its end %s: %w",
				r.ID, p.End.UTC().Format(time.RFC3339), r.End.UTC().Format(time.RFC3339), store.ErrConflict)
		}
		held, err := q.withSlots(ctx, []*store.Reservation{r})
		if err != nil {
			return err
		}
		var grow []*store.ReservationSlot
		for _, sl := range held[0].Slots {
			if sl.End.Equal(r.End) {
				grow = append(grow, &store.ReservationSlot{NodeID: sl.NodeID, GPU: sl.GPU, Start: r.End, End: p.End})
			}
		}
		if err := q.lockSlotNodes(ctx, grow); err != nil {
			return err
		}
		if err := q.checkOverlap(ctx, r.ID, grow); err != nil {
			return err
		}
		now := q.clock(p.Now)
		if _, err := q.db.Exec(ctx, `UPDATE reservation_slots SET ends_at = $3
			WHERE reservation_id = $1 AND ends_at = $2 AND starts_at < ends_at`, r.ID, r.End, p.End); err != nil {
			return q.wrap("extend slots of reservation "+r.ID, err)
		}
		if _, err := q.db.Exec(ctx, `UPDATE reservations SET ends_at = $2, updated_at = coalesce($3, now()) WHERE id = $1`,
			r.ID, p.End, now); err != nil {
			return q.wrap("extend reservation "+r.ID, err)
		}
		if out, err = q.ReservationGet(ctx, r.ID); err != nil {
			return err
		}
		return q.emit(ctx, p.Now, reservationEvent(events.ReservationExtended, out, r.State, nil))
	})
	return out, err
}

// ReservationNodeFailed records a failed node of an active reservation
// once.
func (s *Store) ReservationNodeFailed(ctx context.Context, p *store.ReservationNodeFailedParams) (bool, error) {
	reported := false
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		r, err := q.lockReservation(ctx, p.ID)
		if err != nil {
			return err
		}
		if slices.Contains(r.FailedNodes, p.NodeID) {
			return nil
		}
		failed, err := json.Marshal(append(r.FailedNodes, p.NodeID))
		if err != nil {
			return err
		}
		reason := "node " + p.NodeID + " failed: " + p.Reason
		if _, err := q.db.Exec(ctx, `UPDATE reservations SET failed_nodes = $2, reason = $3, updated_at = coalesce($4, now()) WHERE id = $1`,
			r.ID, JSON(failed), reason, q.clock(p.Now)); err != nil {
			return q.wrap("record failed node of reservation "+r.ID, err)
		}
		out, err := q.ReservationGet(ctx, r.ID)
		if err != nil {
			return err
		}
		ev := reservationEvent(events.ReservationNodeFailed, out, "", nil)
		d := ev.data.(events.ReservationData)
		d.NodeID, d.Reason = p.NodeID, p.Reason
		ev.data = d
		reported = true
		return q.emit(ctx, p.Now, ev)
	})
	return reported, err
}

// NodeReservedNow returns the reservation holding a GPU of a node now.
func (s *Store) NodeReservedNow(ctx context.Context, nodeID string, now *time.Time) (*store.Reservation, error) {
	r, err := scanReservation(s.db.QueryRow(ctx, `SELECT `+reservationColumns+` FROM reservations
		WHERE state IN ('placed', 'active') AND id IN (SELECT s.reservation_id FROM reservation_slots s
			WHERE s.node_id = $1 AND s.starts_at <= coalesce($2, now()) AND s.ends_at > coalesce($2, now()))
		ORDER BY ends_at DESC, id LIMIT 1`, nodeID, s.clock(now)))
	if err != nil {
		if isNotFound(s.d.Translate(err)) {
			return nil, nil
		}
		return nil, s.wrap("read reservation of node "+nodeID, err)
	}
	rs, err := s.withSlots(ctx, []*store.Reservation{r})
	if err != nil {
		return nil, err
	}
	return rs[0], nil
}

// splitGrants reads the grants column (” is none).
func splitGrants(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// ReservationGrantsOn returns what the reservations with grants holding
// a slot of a node at now give there. A grant flows only down from the
// pool's current owner: it counts while the node is still in the
// reservation's pool and the pool's tenant is the holder or above it, so
// a pool or node moved to another tenant carries no grant of the old
// owner's with it.
func (s *Store) ReservationGrantsOn(ctx context.Context, nodeID string, now *time.Time) ([]*store.ReservationGrant, error) {
	rows, err := s.db.Query(ctx, `SELECT r.id, r.tenant_id, r.owner, r.grants, max(x.ends_at) FROM reservations r
		JOIN reservation_slots x ON x.reservation_id = r.id
		JOIN nodes n ON n.id = x.node_id AND n.pool_id = r.pool_id
		JOIN pools p ON p.id = r.pool_id
		JOIN tenants pt ON pt.id = p.tenant_id
		JOIN tenants ht ON ht.id = r.tenant_id
		WHERE x.node_id = $1 AND r.grants <> '' AND r.state IN ('placed', 'active')
			AND x.starts_at <= coalesce($2, now()) AND x.ends_at > coalesce($2, now())
			AND substr(ht.path, 1, length(pt.path)) = pt.path
		GROUP BY r.id, r.tenant_id, r.owner, r.grants ORDER BY r.id`, nodeID, s.clock(now))
	if err != nil {
		return nil, s.wrap("read grants on node "+nodeID, err)
	}
	out, err := collect(rows, func(r Row) (*store.ReservationGrant, error) {
		g := &store.ReservationGrant{}
		var grants string
		err := r.Scan(&g.ReservationID, &g.TenantID, &g.Owner, &grants, &g.End)
		g.Grants = splitGrants(grants)
		return g, err
	})
	if err != nil {
		return nil, s.wrap("read grants on node "+nodeID, err)
	}
	return out, nil
}

// refreshReservationLabels sets each node's bc.reservation/ labels from
// the active reservations holding it (none: the labels are removed).
func (s *Store) refreshReservationLabels(ctx context.Context, nodeIDs []string) error {
	for _, id := range nodeIDs {
		var raw []byte
		err := s.db.QueryRow(ctx, `SELECT labels FROM nodes WHERE id = $1`+s.d.ForUpdate, id).Scan(&raw)
		if isNotFound(s.d.Translate(err)) {
			continue // deleted since
		}
		if err != nil {
			return s.wrap("read labels of node "+id, err)
		}
		labels := map[string]string{}
		if len(raw) > 0 {
			if err := json.Unmarshal(raw, &labels); err != nil {
				return fmt.Errorf("decode labels of node %s: %w", id, err)
			}
		}
		rows, err := s.db.Query(ctx, `SELECT DISTINCT r.id, r.owner FROM reservations r
			JOIN reservation_slots x ON x.reservation_id = r.id
			WHERE x.node_id = $1 AND r.state = 'active' AND x.starts_at < x.ends_at ORDER BY r.id`, id)
		if err != nil {
			return s.wrap("read reservations of node "+id, err)
		}
		var ids, owners []string
		for rows.Next() {
			var rid, owner string
			if err := rows.Scan(&rid, &owner); err != nil {
				rows.Close()
				return s.wrap("read reservations of node "+id, err)
			}
			ids = append(ids, rid)
			if !slices.Contains(owners, owner) {
				owners = append(owners, owner)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return s.wrap("read reservations of node "+id, err)
		}
		slices.Sort(owners)
		next := maps.Clone(labels)
		maps.DeleteFunc(next, func(k, _ string) bool { return strings.HasPrefix(k, store.ReservationLabelPrefix) })
		if len(ids) > 0 {
			next[store.ReservationLabelID] = strings.Join(ids, ",")
			next[store.ReservationLabelOwner] = strings.Join(owners, ",")
		}
		if maps.Equal(next, labels) {
			continue
		}
		b, err := labelsJSON(next)
		if err != nil {
			return err
		}
		if _, err := s.db.Exec(ctx, `UPDATE nodes SET labels = $2 WHERE id = $1`, id, b); err != nil {
			return s.wrap("set reservation labels of node "+id, err)
		}
	}
	return nil
}

// reservationEvent is a reservation's event as the change left it.
func reservationEvent(typ string, r *store.Reservation, previous string, previousNodes []string) event {
	return event{typ, r.ID, events.ReservationData{ReservationID: r.ID, PoolID: r.PoolID, Owner: r.Owner, State: r.State,
		PreviousState: previous, GPUs: r.GPUs, Nodes: r.Nodes, Start: r.Start.UTC(), End: r.End.UTC(),
		NodeIDs: r.NodeIDs(), PreviousNodeIDs: previousNodes, Reason: r.Reason, TenantID: r.TenantID, Grants: r.Grants}}
}

// withNodes sets the nodes of a reservation event's data.
func withNodes(data any, nodes []string) any {
	d := data.(events.ReservationData)
	d.NodeIDs = nodes
	return d
}

// ReservationNodes returns a pool's nodes without inventories.
func (s *Store) ReservationNodes(ctx context.Context, poolID string) ([]*store.Node, error) {
	q, args := `SELECT n.id, n.pool_id, n.state, n.cordoned, n.disruption, n.labels, coalesce(i.digest, '')
		FROM nodes n LEFT JOIN node_inventories i ON i.node_id = n.id`, []any(nil)
	if poolID != "" {
		q, args = q+` WHERE n.pool_id = $1`, []any{poolID}
	}
	rows, err := s.db.Query(ctx, q+` ORDER BY n.id`, args...)
	if err != nil {
		return nil, s.wrap("list nodes for placement", err)
	}
	out, err := collect(rows, func(r Row) (*store.Node, error) {
		n := &store.Node{}
		var labels []byte
		if err := r.Scan(&n.ID, &n.PoolID, &n.State, &n.Cordoned, &n.Disruption, &labels, &n.InventoryDigest); err != nil {
			return nil, err
		}
		if len(labels) > 2 {
			if err := json.Unmarshal(labels, &n.Labels); err != nil {
				return nil, fmt.Errorf("decode labels of node %s: %w", n.ID, err)
			}
		}
		return n, nil
	})
	return out, s.wrap("list nodes for placement", err)
}

// NodeInventories returns the inventories of ids.
func (s *Store) NodeInventories(ctx context.Context, ids []string) (map[string][]byte, error) {
	out := make(map[string][]byte, len(ids))
	for start := 0; start < len(ids); start += enqueueChunk {
		arr, err := json.Marshal(ids[start:min(start+enqueueChunk, len(ids))])
		if err != nil {
			return nil, err
		}
		rows, err := s.db.Query(ctx, `SELECT node_id, inventory FROM node_inventories
			WHERE node_id IN (`+fmt.Sprintf(s.d.TextSet, "$1")+`)`, JSON(arr))
		if err != nil {
			return nil, s.wrap("read inventories", err)
		}
		for rows.Next() {
			var id string
			var inv []byte
			if err := rows.Scan(&id, &inv); err != nil {
				rows.Close()
				return nil, s.wrap("read inventories", err)
			}
			out[id] = inv
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, s.wrap("read inventories", err)
		}
	}
	return out, nil
}

// ReservationGuard reports the database's no-double-booking guard.
func (s *Store) ReservationGuard(ctx context.Context) (bool, string, error) {
	if s.d.Name != store.DialectPostgres {
		return true, "SQLite checks for an overlapping slot in the write transaction", nil
	}
	var version string
	var constraint bool
	err := s.db.QueryRow(ctx, `SELECT coalesce((SELECT extversion FROM pg_extension WHERE extname = 'btree_gist'), ''),
		EXISTS (SELECT 1 FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
			WHERE c.conname = 'reservation_slots_no_double_booking' AND c.contype = 'x'
				AND t.relname = 'reservation_slots' AND t.relnamespace = current_schema()::regnamespace)`).Scan(&version, &constraint)
	if err != nil {
		return false, "", s.wrap("read the reservation guard", err)
	}
	switch {
	case version == "":
		return false, "the btree_gist extension is not installed", nil
	case !constraint:
		return false, "btree_gist " + version + " is installed but reservation_slots has no exclusion constraint", nil
	}
	return true, "btree_gist " + version + "; exclusion constraint reservation_slots_no_double_booking", nil
}

// ReservationPoolsOpen returns the pools of poolIDs with open
// reservations (index reservations_open_idx).
func (s *Store) ReservationPoolsOpen(ctx context.Context, poolIDs []string) ([]string, error) {
	if len(poolIDs) == 0 {
		return nil, nil
	}
	arr, err := json.Marshal(poolIDs)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, `SELECT DISTINCT pool_id FROM reservations
		WHERE pool_id IN (`+fmt.Sprintf(s.d.TextSet, "$1")+`) AND state IN ('pending', 'placed', 'active') ORDER BY pool_id`, JSON(arr))
	if err != nil {
		return nil, s.wrap("list pools with open reservations", err)
	}
	out, err := texts(rows)
	return out, s.wrap("list pools with open reservations", err)
}

// ReservationPoolsDue returns the pools of poolIDs with a reservation due
// to move at now.
func (s *Store) ReservationPoolsDue(ctx context.Context, poolIDs []string, now time.Time) ([]string, error) {
	if len(poolIDs) == 0 {
		return nil, nil
	}
	arr, err := json.Marshal(poolIDs)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, `SELECT DISTINCT pool_id FROM reservations
		WHERE pool_id IN (`+fmt.Sprintf(s.d.TextSet, "$1")+`) AND state IN ('pending', 'placed', 'active')
			AND (state = 'pending' OR (state = 'placed' AND starts_at <= $2) OR (state = 'active' AND ends_at <= $2))
		ORDER BY pool_id`, JSON(arr), now)
	if err != nil {
		return nil, s.wrap("list pools with reservations due", err)
	}
	out, err := texts(rows)
	return out, s.wrap("list pools with reservations due", err)
}

// ReservationPrune deletes closed reservations last changed before before.
func (s *Store) ReservationPrune(ctx context.Context, before time.Time) (int64, error) {
	n, err := s.db.Exec(ctx, `DELETE FROM reservations WHERE state IN ($1, $2, $3) AND updated_at < $4`,
		store.ReservationEnded, store.ReservationCancelled, store.ReservationFailed, before)
	return n, s.wrap("prune reservations", err)
}
