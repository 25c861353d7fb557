package store

import (
	"context"
	"time"
)

// GPU health as a placement keeps it (the node's judgement in the
// inventory, GPUHealthState without its prefix, lower case).
const (
	GPUHealthOK       = "ok"
	GPUHealthDegraded = "degraded"
	GPUHealthFailed   = "failed"
)

// GPUStore keeps where each GPU has been (migration 0022_gpu_placements;
// issue 44, docs/remediation.md, "A history that follows the board"): a
// GPU is known by its UUID, and its board serial where NVML gives one, so
// the findings, cases and actions kept under that UUID (RemediationHistory)
// follow it from node to node.
type GPUStore interface {
	// GPUPlacementsSet records the GPUs a node's inventory lists, in the
	// transaction that stores the inventory (only when its digest changed).
	// A GPU new in the node starts a stay (first_seen); one still listed
	// moves its last_seen on; one no longer listed ends its stay (current
	// unset). A UUID current in another node that has a session open is a
	// conflict: both stays are kept, both marked with the other node, and
	// gpu.uuid-conflict is written for each node (never merged, never
	// remediated). One current in a node without a session ends there: the
	// board moved. A node that does not exist is ErrNotFound.
	GPUPlacementsSet(ctx context.Context, p *GPUPlacementsSetParams) error
	// GPUList lists the GPUs current in some node, by UUID then node,
	// after p.After; see GPUListParams for the filters.
	GPUList(ctx context.Context, p *GPUListParams) ([]*GPUPlacement, error)
	// GPUPlacements returns every stay of a GPU, in the order it began
	// (first_seen, then id); ErrNotFound when no inventory ever listed it.
	GPUPlacements(ctx context.Context, uuid string) ([]*GPUPlacement, error)
	// GPUIncidentsByModel counts the remediation cases kept that name a
	// GPU, by the model of that GPU on the case's node (its stays), cases
	// whose finding is excludeFinding left out (an operator's repairs).
	// Cases of a GPU no stay names are not counted. Models by name.
	GPUIncidentsByModel(ctx context.Context, excludeFinding string) ([]*GPUModelCount, error)
	// GPUServiceByModel sums, by GPU model, the time GPUs were seen in
	// service: each stay from its first inventory to its last, or to now
	// while current. Models by name.
	GPUServiceByModel(ctx context.Context, now time.Time) ([]*GPUModelService, error)
}

// GPUModelService is the time one GPU model was seen in service.
type GPUModelService struct {
	Model string // "" when the inventory gave none
	// GPUs counts the distinct GPUs (UUIDs) of the model ever seen.
	GPUs int
	// Seconds sums the GPUs' stays, in seconds (GPU-seconds).
	Seconds float64
}

// GPUModelCount is a count of one GPU model.
type GPUModelCount struct {
	Model string // "" when the inventory gave none
	Count int
}

// GPUSeen is one GPU of an inventory.
type GPUSeen struct {
	UUID   string
	Serial string // NVML's board serial; "" when it gives none
	Model  string // the product name, such as "NVIDIA A100-SXM4-40GB"
	Health string // GPUHealthOK, GPUHealthDegraded, GPUHealthFailed, or "" when not judged
}

// GPUPlacementsSetParams are GPUPlacementsSet's inputs.
type GPUPlacementsSetParams struct {
	NodeID string
	// GPUs are the inventory's GPUs; a UUID listed twice counts once (the
	// first).
	GPUs []GPUSeen
	// Now is the time of the inventory; nil means the process's clock.
	Now *time.Time
}

// GPUListParams select GPUList's GPUs; each filter set narrows.
type GPUListParams struct {
	PoolID string
	Model  string
	// Unhealthy keeps the GPUs whose health is degraded or failed, and
	// those in a UUID conflict.
	Unhealthy bool
	// After and AfterNode are the UUID and node of the previous page's
	// last GPU ("" for the first page).
	After, AfterNode string
	Limit            int // 1 to MaxListLimit; 0 means 100
}

// GPUPlacement is one stay of a GPU in a node.
type GPUPlacement struct {
	ID          int64
	GPUUUID     string
	NodeID      string
	Hostname    string // the node's, read with the row
	PoolID      string // the node's pool
	BoardSerial string
	Model       string
	Health      string
	// Conflict names the other live node that reported the same UUID
	// while this stay was current; "" when none did.
	Conflict string
	// Current is set while the node's latest inventory lists the GPU.
	Current   bool
	FirstSeen time.Time
	LastSeen  time.Time
}
