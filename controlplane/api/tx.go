package api

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// The small interfaces the API's transactions receive (store.InTx): each
// names what its transaction touches, never the whole store.

// cordonTx is what cordoning or uncordoning a node touches.
type cordonTx interface {
	NodeSetCordoned(ctx context.Context, id string, cordoned bool) error
	DisruptionRelease(ctx context.Context, nodeID, owner string) error
	NodeSetState(ctx context.Context, id, state string) error
}

// drainTx is what draining a node touches.
type drainTx interface {
	NodeReservedNow(ctx context.Context, nodeID string, now *time.Time) (*store.Reservation, error)
	DisruptionAdmit(ctx context.Context, p *store.DisruptionAdmitParams) (*store.DisruptionAdmission, error)
	NodeSetCordoned(ctx context.Context, id string, cordoned bool) error
	NodeSetState(ctx context.Context, id, state string) error
}

// deleteTx is what deleting a node touches.
type deleteTx interface {
	NodeReservedNow(ctx context.Context, nodeID string, now *time.Time) (*store.Reservation, error)
	RevocationInsert(ctx context.Context, r *store.Revocation) error
	NodeDelete(ctx context.Context, id string) error
}

// admitTx is what taking an ordered repair's disruption hold touches (admitOrdered).
type admitTx interface {
	DisruptionAdmit(ctx context.Context, p *store.DisruptionAdmitParams) (*store.DisruptionAdmission, error)
}

// orderTx is what ordering a repair touches: the case, its hold and the cordon.
type orderTx interface {
	admitTx
	RemediationOpenFor(ctx context.Context, nodeID string) (*store.Remediation, error)
	RemediationCreate(ctx context.Context, r *store.Remediation, actor string) (*store.Remediation, error)
	NodeSetCordoned(ctx context.Context, id string, cordoned bool) error
}

// returnTx is what returning a remediation case touches: the case, its node's command, cordon and hold.
type returnTx interface {
	RemediationGet(ctx context.Context, id string) (*store.Remediation, error)
	NodeGet(ctx context.Context, id string) (*store.Node, error)
	CommandRequestCancel(ctx context.Context, id string) (*store.Command, error)
	NodeSetCordoned(ctx context.Context, id string, cordoned bool) error
	DisruptionAdmit(ctx context.Context, p *store.DisruptionAdmitParams) (*store.DisruptionAdmission, error)
	DisruptionRelease(ctx context.Context, nodeID, owner string) error
	RemediationMove(ctx context.Context, p *store.RemediationMoveParams) (*store.Remediation, error)
}

// rolloutStopTx is what changing a rollout's state touches: the rollout and its nodes' holds.
type rolloutStopTx interface {
	RolloutUpdate(ctx context.Context, p *store.RolloutUpdateParams) (*store.Rollout, error)
	RolloutNodes(ctx context.Context, rolloutID string) ([]*store.RolloutNode, error)
	DisruptionRelease(ctx context.Context, nodeID, owner string) error
}

// replayTx is what marking dead letters for replay touches.
type replayTx interface {
	DeadLetterReplay(ctx context.Context, sink string, ids []int64) (int64, error)
}
