package store

import (
	"context"
	"time"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Reservation states (docs/reservations.md). A reservation moves pending →
// placed → active → ended, or ends cancelled (an operator) or failed (it
// could not be placed, with a reason); each move writes an event.
const (
	ReservationPending   = "pending"   // waiting for the placer
	ReservationPlaced    = "placed"    // holds slots; its window has not begun
	ReservationActive    = "active"    // its window runs; its nodes carry its labels
	ReservationEnded     = "ended"     // its window passed
	ReservationCancelled = "cancelled" // an operator cancelled it
	ReservationFailed    = "failed"    // the placer could not place (or re-place) it; Reason says why
)

// ReservationOpen reports whether a reservation in state may still change
// (pending, placed or active).
func ReservationOpen(state string) bool {
	return state == ReservationPending || state == ReservationPlaced || state == ReservationActive
}

// Node labels an active reservation sets on its nodes, in a namespace a
// node's own facts can never set (admission refuses it at join): commands'
// selectors can target them (--selector bc.reservation/owner=team-a). A
// node shared by several active GPU reservations carries each value,
// sorted and joined with ",".
const (
	ReservationLabelPrefix = "bc.reservation/"
	ReservationLabelID     = ReservationLabelPrefix + "id"
	ReservationLabelOwner  = ReservationLabelPrefix + "owner"
)

// Reservation is capacity held for a window [Start, End): GPUs GPUs (on
// one node, or whole nodes: docs/reservations.md, "Placement") or Nodes
// whole nodes of a pool, with GPUs of GPUModel (a substring of the NVML
// product name, case-insensitive; "" any), at least MinGPUMemoryMiB each,
// on nodes whose labels hold every Selector entry.
type Reservation struct {
	ID              string
	PoolID          string
	GPUs            int
	Nodes           int
	GPUModel        string
	MinGPUMemoryMiB int64
	Selector        map[string]string
	Start, End      time.Time
	Owner           string
	Note            string
	// TenantID is the reservation's holder: the tenant whose operators
	// Grants give rights on its nodes during its window (migration
	// 0027_reservation_grants; "root" for reservations made before).
	TenantID string
	// Grants are the rights the reservation gives its holder's operators
	// on exactly its nodes while it holds them (GrantShell,
	// GrantPortForward, GrantExec), sorted; empty for none.
	Grants []string
	State  string
	// Reason says why a reservation failed or was cancelled, or what the
	// placer last found (a node swapped, a node that failed while active).
	Reason    string
	CreatedBy string
	// FailedNodes are the nodes that failed while the reservation was
	// active (reservation.node-failed was sent for each).
	FailedNodes []string
	// Slots are the GPUs it holds now (placed or active): one per GPU,
	// by node id then GPU index. Empty for other states.
	Slots     []*ReservationSlot
	CreatedAt time.Time
	UpdatedAt time.Time
}

// NodeIDs returns the distinct nodes of r's slots, sorted.
func (r *Reservation) NodeIDs() []string {
	var out []string
	for _, s := range r.Slots {
		if len(out) == 0 || out[len(out)-1] != s.NodeID {
			out = append(out, s.NodeID)
		}
	}
	return out
}

// ReservationSlot is one GPU of one node held by a reservation for
// [Start, End). Released slots keep what was held (an empty range when
// nothing was); no two slots of one GPU ever overlap.
type ReservationSlot struct {
	ReservationID string
	NodeID        string
	// GPU is the GPU's NVML index on the node; GPUUUID its UUID as the
	// inventory reported it at placement.
	GPU     int
	GPUUUID string
	Start   time.Time
	End     time.Time
}

// ReservationStore keeps reservations and their slots (migration
// 0015_reservations). No GPU is booked twice for overlapping time: on
// PostgreSQL an exclusion constraint (btree_gist) refuses it, on SQLite
// the write transaction checks it; either way the write fails with
// ErrConflict and changes nothing.
type ReservationStore interface {
	// ReservationCreate inserts a pending reservation and writes
	// reservation.created. ErrNotFound for an unknown pool.
	ReservationCreate(ctx context.Context, p *ReservationCreateParams) (*Reservation, error)
	// ReservationGet returns a reservation with its held slots.
	ReservationGet(ctx context.Context, id string) (*Reservation, error)
	// ReservationList pages reservations by id, with their held slots.
	ReservationList(ctx context.Context, p *ReservationListParams) ([]*Reservation, error)
	// ReservationsOpen returns every pending, placed or active reservation
	// of the pools, by id, with held slots: the placer's one read a round.
	ReservationsOpen(ctx context.Context, poolIDs []string) ([]*Reservation, error)
	// ReservationPoolsOpen returns those of poolIDs that have a pending,
	// placed or active reservation, in one grouped query: the placer's
	// first read of a round.
	ReservationPoolsOpen(ctx context.Context, poolIDs []string) ([]string, error)
	// ReservationPoolsDue returns those of poolIDs where a reservation is
	// due to move at now: one pending, one placed whose start has come, or
	// one active whose end has. The placer runs a full round only for
	// those, and for pools whose nodes changed.
	ReservationPoolsDue(ctx context.Context, poolIDs []string, now time.Time) ([]string, error)
	// ReservationSlots returns the held slots (non-empty ranges) of
	// PoolID (every pool when empty) that overlap [From, To), by node and
	// GPU.
	ReservationSlots(ctx context.Context, p *ReservationSlotsParams) ([]*ReservationSlot, error)
	// ReservationPlace gives a pending or placed reservation the slots
	// (all for its window) and moves it to placed, releasing the slots it
	// held before (a swap before the start), and writes reservation.placed.
	// ErrConflict when a slot overlaps another reservation's, or when the
	// reservation is no longer pending or placed; nothing changes then.
	ReservationPlace(ctx context.Context, p *ReservationPlaceParams) (*Reservation, error)
	// ReservationTransition moves a reservation from p.From to p.To
	// (placed → active, active → ended, pending or placed → failed),
	// releases its slots when To ends it, sets or clears its nodes'
	// bc.reservation/ labels, and writes the move's event. ErrConflict when
	// it is not in p.From.
	ReservationTransition(ctx context.Context, p *ReservationTransitionParams) (*Reservation, error)
	// ReservationCancel cancels an open reservation: its slots end at Now
	// (a slot not begun is released whole), labels are cleared, and
	// reservation.cancelled is written. A closed one is returned unchanged
	// with ErrConflict.
	ReservationCancel(ctx context.Context, p *ReservationCancelParams) (*Reservation, error)
	// ReservationExtend moves the end of an open reservation to p.End
	// (later than its end), with its held slots, and writes
	// reservation.extended. ErrConflict when a slot would overlap
	// another's or the reservation is closed.
	ReservationExtend(ctx context.Context, p *ReservationExtendParams) (*Reservation, error)
	// ReservationNodeFailed records that node failed while the active
	// reservation held it and writes reservation.node-failed (naming the
	// owner), once per node: reported is false when it was recorded
	// before.
	ReservationNodeFailed(ctx context.Context, p *ReservationNodeFailedParams) (reported bool, err error)
	// ReservationNodes returns the nodes of poolID (every pool when
	// empty), by id, without their inventories (InventoryDigest is set):
	// the placer's and capacity.summary's read of the fleet, which decode
	// an inventory only when its digest changed (NodeInventories).
	ReservationNodes(ctx context.Context, poolID string) ([]*Node, error)
	// NodeInventories returns the stored inventories of ids (missing ones
	// absent), by node id.
	NodeInventories(ctx context.Context, ids []string) (map[string][]byte, error)
	// ReservationGuard reports what keeps a GPU from being booked twice:
	// on PostgreSQL whether the btree_gist extension is installed (its
	// version, "" when it is not) and whether the exclusion constraint
	// reservation_slots_no_double_booking is in place; on SQLite the
	// write transaction's check (ok). doctor's database.btree-gist check.
	ReservationGuard(ctx context.Context) (ok bool, detail string, err error)
	// NodeReservedNow returns the placed or active reservation that holds
	// a GPU of nodeID at now (nil: the database's clock), or nil and a nil
	// error when none does. Rollouts and operator drains wait while it
	// returns one (docs/reservations.md, "Disruptions").
	NodeReservedNow(ctx context.Context, nodeID string, now *time.Time) (*Reservation, error)
	// ReservationGrantsOn returns the rights that reservations with
	// grants give on nodeID at now (nil: the database's clock): one per
	// placed or active reservation with grants holding a slot of the node
	// whose range covers now, by reservation id. A cancelled reservation's
	// slots end at its cancel, an extended one's move with it, so this is
	// the database's answer alone (docs/reservations.md, "Access from
	// reservations").
	ReservationGrantsOn(ctx context.Context, nodeID string, now *time.Time) ([]*ReservationGrant, error)
	// ReservationPrune deletes the ended, cancelled and failed
	// reservations (with their slots) last changed before before, and
	// returns how many: retention.history.
	ReservationPrune(ctx context.Context, before time.Time) (int64, error)
}

// Rights a reservation may grant its holder on its nodes
// (docs/reservations.md, "Access from reservations").
const (
	GrantShell       = "shell"            // nodes shell, tunnels of kind shell, the page's shell
	GrantPortForward = "port-forward"     // tunnels of kind port
	GrantExec        = sessionv1.KindExec // commands of kind exec (the right is named as the kind)
)

// Grants are the rights a reservation may grant, sorted.
var Grants = []string{GrantExec, GrantPortForward, GrantShell}

// ReservationGrant is what one reservation grants on one node now: its
// holder TenantID, the Grants, and End, when the node's slots of it end
// (the rights end then).
type ReservationGrant struct {
	ReservationID string
	TenantID      string
	Owner         string
	Grants        []string
	End           time.Time
}

// ReservationCreateParams are ReservationCreate's inputs. ID defaults to
// a new res_ id.
type ReservationCreateParams struct {
	ID              string
	PoolID          string
	GPUs            int
	Nodes           int
	GPUModel        string
	MinGPUMemoryMiB int64
	Selector        map[string]string
	Start, End      time.Time
	Owner           string
	Note            string
	// TenantID is the holder (required); Grants its rights, sorted and
	// distinct (the API checks them).
	TenantID  string
	Grants    []string
	CreatedBy string
	Now       *time.Time
}

// ReservationListParams filter and page ReservationList; every filter is
// optional.
type ReservationListParams struct {
	ListParams
	PoolID string
	State  string
	Owner  string
}

// ReservationSlotsParams are ReservationSlots' inputs.
type ReservationSlotsParams struct {
	PoolID   string
	From, To time.Time
}

// ReservationPlaceParams are ReservationPlace's inputs.
type ReservationPlaceParams struct {
	ID string
	// Slots are the GPUs to hold, each with the reservation's window
	// (Start and End are set from it).
	Slots []*ReservationSlot
	// Reason, when set, is recorded (such as why it moved).
	Reason string
	Now    *time.Time
}

// ReservationTransitionParams are ReservationTransition's inputs.
type ReservationTransitionParams struct {
	ID       string
	From, To string
	Reason   string
	Now      *time.Time
}

// ReservationCancelParams are ReservationCancel's inputs.
type ReservationCancelParams struct {
	ID     string
	Reason string
	Now    *time.Time
}

// ReservationExtendParams are ReservationExtend's inputs.
type ReservationExtendParams struct {
	ID  string
	End time.Time
	Now *time.Time
}

// ReservationNodeFailedParams are ReservationNodeFailed's inputs.
type ReservationNodeFailedParams struct {
	ID     string
	NodeID string
	Reason string
	Now    *time.Time
}
