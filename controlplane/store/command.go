package store

import (
	"context"
	"time"
)

// Command states. Terminal ones end a command; exactly one is reached.
const (
	CommandQueued     = "queued"
	CommandDispatched = "dispatched"
	CommandAccepted   = "accepted"
	CommandRunning    = "running"
	CommandSucceeded  = "succeeded"
	CommandFailed     = "failed"
	CommandCancelled  = "cancelled"
	CommandExpired    = "expired"
	CommandLost       = "lost"
)

// IsTerminal reports whether state ends a command.
func IsTerminal(state string) bool {
	switch state {
	case CommandSucceeded, CommandFailed, CommandCancelled, CommandExpired, CommandLost:
		return true
	}
	return false
}

// Command is one unit of work for one node. Its spec is kept in the
// session-protocol form the gateway sends (SessionSpec, migration
// 0008_command_session_spec); rows an older build wrote in the API's form
// are converted on read.
type Command struct {
	ID              string
	NodeID          string
	Kind            string
	SessionSpec     []byte // session-protocol form: protojson of a session.v1 Command with only its spec set (sessionv1.MarshalSpec)
	State           string
	IdempotencyKey  string
	BatchID         string
	CreatedBy       string
	Attempt         int
	GatewayID       string
	ExitCode        *int
	Error           string
	OutputTruncated bool
	OutputBytes     int64
	Result          []byte // JSON, kind-specific
	CancelRequested bool
	CreatedAt       time.Time
	DeadlineAt      time.Time
	DispatchedAt    *time.Time
	StartedAt       *time.Time
	FinishedAt      *time.Time
}

// CommandStore keeps commands and their output.
type CommandStore interface {
	// CommandEnqueue writes one command per node and one outbox row for the
	// batch in one transaction. With an idempotency key already used for a
	// node, that node's existing command is returned instead of a new one.
	CommandEnqueue(ctx context.Context, p *CommandEnqueueParams) ([]*Command, error)
	CommandGet(ctx context.Context, id string) (*Command, error)
	CommandList(ctx context.Context, p *CommandListParams) ([]*Command, error)
	// CommandSetState moves a non-terminal command to a non-terminal state
	// (dispatched, accepted, running); a terminal command is left alone and
	// ok is false.
	CommandSetState(ctx context.Context, p *CommandSetStateParams) (ok bool, err error)
	// CommandFinish records a terminal result. The first terminal result
	// wins: later ones leave the command as it is and return ok false.
	CommandFinish(ctx context.Context, p *CommandFinishParams) (ok bool, err error)
	// CommandAppendOutput stores a chunk of output at its sequence number
	// and returns how many of its bytes were kept. A chunk already stored
	// (a redelivery) is ignored. Nothing is kept for a command that is
	// terminal (its result is in: issue 28) or that is not NodeID's; data
	// past the command's output limit (its exec spec's outputLimitBytes,
	// else sessionv1.DefaultOutputLimitBytes) or past MaxOutputChunk in one
	// chunk is cut, and the command is marked output_truncated. A missing
	// command keeps nothing and is no error.
	CommandAppendOutput(ctx context.Context, p *CommandOutputChunk) (kept int, err error)
	// CommandOutputPage returns a command's output chunks after AfterSeq,
	// in order, at most MaxBytes of data together (always at least one
	// chunk when any follows): no more than a page is read into memory.
	CommandOutputPage(ctx context.Context, p *CommandOutputPageParams) (*CommandOutputPage, error)
	// CommandPrune deletes terminal commands finished before before.
	CommandPrune(ctx context.Context, before time.Time) (int64, error)
	// CommandRequestCancel cancels a command: a queued one ends cancelled
	// at once; a dispatched or running one is marked cancel_requested for
	// its gateway to send Cancel. A terminal command is returned unchanged.
	CommandRequestCancel(ctx context.Context, id string) (*Command, error)
	// CommandSweep drives overdue and orphaned commands to a terminal state:
	// every non-terminal command past its deadline ends expired; a
	// dispatched, accepted or running command whose node has had no session
	// for LostAfter ends lost, or goes back to queued when it was created
	// with an idempotency key. Run it under the command-sweeper lease.
	CommandSweep(ctx context.Context, p *CommandSweepParams) (*CommandSweepResult, error)
	// CommandClaim moves up to Limit queued commands, oldest first, whose
	// node's current session is on GatewayID and whose deadline has not
	// passed, to dispatched on that gateway, and returns them. Concurrent
	// claimers never get the same command (FOR UPDATE SKIP LOCKED on
	// PostgreSQL; the write lock on SQLite).
	CommandClaim(ctx context.Context, p *CommandClaimParams) ([]*Command, error)
	// CommandInFlight returns nodeID's commands that a node may hold:
	// dispatched, accepted or running.
	CommandInFlight(ctx context.Context, nodeID string) ([]*Command, error)
	// CommandCancelsPending returns the live commands of gatewayID whose
	// cancellation was requested.
	CommandCancelsPending(ctx context.Context, gatewayID string) ([]*Command, error)
	// CommandCountOpen counts the commands not yet terminal (queued,
	// dispatched, accepted, running) by state, in one grouped query; states
	// with none are absent.
	CommandCountOpen(ctx context.Context) (map[string]int, error)
}

// CommandClaimParams are CommandClaim's inputs.
type CommandClaimParams struct {
	GatewayID string
	Limit     int
	Now       *time.Time
}

// CommandSweepParams are CommandSweep's inputs.
type CommandSweepParams struct {
	// LostAfter is how long a node may be without a session before its
	// in-flight commands are lost.
	LostAfter time.Duration
	Now       *time.Time
}

// CommandSweepResult counts what a sweep changed.
type CommandSweepResult struct {
	Expired  []*Command
	Lost     []*Command
	Requeued []*Command
}

// CommandEnqueueParams are CommandEnqueue's inputs.
type CommandEnqueueParams struct {
	NodeIDs        []string
	Kind           string
	SessionSpec    []byte // as Command.SessionSpec; nil stores {}
	IdempotencyKey string
	// KeyOfCreator makes IdempotencyKey the creator's own retry handle:
	// a command under the same key on one of the nodes made by another
	// CreatedBy refuses the whole enqueue with ErrConflict, so that a key
	// never hands one caller another's command (the API sets it; the
	// reconcilers' keys are theirs alone and keep the plain lookup).
	KeyOfCreator bool
	BatchID      string
	CreatedBy    string
	Timeout      time.Duration
	Now          *time.Time
}

// CommandListParams filter and page CommandList.
type CommandListParams struct {
	ListParams
	NodeID  string
	BatchID string
	State   string
}

// CommandSetStateParams are CommandSetState's inputs.
type CommandSetStateParams struct {
	ID        string
	State     string
	GatewayID string
	// NodeID, when set, changes the command only if it is that node's.
	NodeID string
	Now    *time.Time
}

// CommandFinishParams are CommandFinish's inputs.
type CommandFinishParams struct {
	ID string
	// NodeID, when set, finishes the command only if it is that node's.
	NodeID          string
	State           string
	ExitCode        *int
	Error           string
	OutputTruncated bool
	Result          []byte
	Now             *time.Time
}

// Output streams.
const (
	StreamStdout = 1
	StreamStderr = 2
)

// MaxOutputChunk is the most data one stored output chunk keeps (bytes):
// bcd sends chunks of at most 32 KiB, so a larger one is a hostile node's,
// and cutting it keeps every chunk within one page (MaxOutputPage).
const MaxOutputChunk = 1 << 20

// MaxOutputPage is the most output data CommandOutputPage reads at once
// (bytes; issue 28: reading output back never loads more than a page).
const MaxOutputPage = 1 << 20

// CommandOutputPageParams are CommandOutputPage's inputs.
type CommandOutputPageParams struct {
	CommandID string
	// AfterSeq is the sequence number of the last chunk already read; 0
	// starts at the first.
	AfterSeq int64
	// MaxBytes bounds the page's data. Defaults to, and is at most,
	// MaxOutputPage.
	MaxBytes int64
}

// CommandOutputPage is one page of a command's output.
type CommandOutputPage struct {
	Chunks []*CommandOutputChunk
	// More reports chunks after the page's last: read on with AfterSeq
	// set to its Seq.
	More bool
}

// CommandOutputChunk is a piece of a command's output.
type CommandOutputChunk struct {
	CommandID string
	Seq       int64
	Stream    int
	Data      []byte
	// NodeID, when set on a write, stores the chunk only if the command is
	// that node's. It is not read back.
	NodeID string
}
