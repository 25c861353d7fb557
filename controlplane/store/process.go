package store

import (
	"context"
	"time"
)

// Process is one registered control-plane process, whatever its roles
// (migration 0019): what `processes list` shows and doctor checks.
type Process struct {
	ID       string
	Roles    []string
	Hostname string
	PID      int
	Version  string
	// Schema is the newest migration the process's build knows (a
	// migration name such as 0019_processes_gateway_drain).
	Schema      string
	StartedAt   time.Time
	HeartbeatAt time.Time
	// InternalCAs are the ids (pki.NodeCAID) of the internal CAs the
	// process accepts peers of the internal control API from, the one in
	// force first (migration 0031); [NoInternalAPI] from a process without
	// the internal control API; empty from a build before 0031, which
	// reports nothing. InternalCertCA is the id of the internal CA whose
	// certificate it presents. An internal-CA rotation advances on them.
	InternalCAs    []string
	InternalCertCA string
}

// NoInternalAPI is Process.InternalCAs' one element for a process that
// runs without the internal control API (it trusts no internal CA): told
// apart from a build too old to report.
const NoInternalAPI = "-"

// ProcessStore keeps the processes table.
type ProcessStore interface {
	// ProcessHeartbeat registers a process or refreshes its row
	// (heartbeat_at is Now, or the database clock). Schema is filled
	// by the store with the newest migration it embeds.
	ProcessHeartbeat(ctx context.Context, p *ProcessHeartbeatParams) (*Process, error)
	// ProcessList returns every registered process, by id.
	ProcessList(ctx context.Context) ([]*Process, error)
	// ProcessDelete removes a process's row (a clean stop).
	ProcessDelete(ctx context.Context, id string) error
	// ProcessPrune deletes the rows not heard from for longer than
	// olderThan at now (nil: the database clock) and returns their ids.
	ProcessPrune(ctx context.Context, olderThan time.Duration, now *time.Time) ([]string, error)
}

// ProcessHeartbeatParams are ProcessHeartbeat's inputs.
type ProcessHeartbeatParams struct {
	ID       string
	Roles    []string
	Hostname string
	PID      int
	Version  string
	// InternalCAs and InternalCertCA are what the process trusts and
	// presents on the internal control API (Process).
	InternalCAs    []string
	InternalCertCA string
	Now            *time.Time
}

// Worker is a process running worker roles.
type Worker struct {
	ID          string
	Roles       []string
	Hostname    string
	PID         int
	Version     string
	StartedAt   time.Time
	HeartbeatAt time.Time
}

// WorkerStore keeps worker membership.
type WorkerStore interface {
	// WorkerHeartbeat registers a worker or refreshes its heartbeat.
	WorkerHeartbeat(ctx context.Context, p *WorkerHeartbeatParams) (*Worker, error)
	// WorkerList returns workers whose heartbeat is newer than liveWithin
	// by the database clock (all workers when liveWithin is 0), by id.
	WorkerList(ctx context.Context, liveWithin time.Duration, now *time.Time) ([]*Worker, error)
	WorkerDelete(ctx context.Context, id string) error
}

// WorkerHeartbeatParams are WorkerHeartbeat's inputs.
type WorkerHeartbeatParams struct {
	ID       string
	Roles    []string
	Hostname string
	PID      int
	Version  string
	Now      *time.Time
}
