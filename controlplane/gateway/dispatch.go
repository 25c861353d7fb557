package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Command dispatch: the gateway holding a node's session sends it the node's
// queued commands and writes back what the node reports.
//
// A dispatch round claims queued commands of this gateway's sessions
// (store.CommandClaim: dispatched, attempt + 1) and sends each as a Command;
// a send that fails puts the command back in the queue. Rounds run every
// DispatchInterval and at once on a wake-up (the API's, after it commits
// commands, or a session opening). A session that opens is also sent again
// the commands its node may still hold (dispatched, accepted, running): the
// node runs a command id once and answers a repeat with its result, so
// delivery is at-least-once and execution at-most-once.
//
// Updates from nodes are queued and written in batches, one transaction per
// ResultFlushInterval, fenced on the gateway lease; the first terminal
// result wins.

// dispatchStore is what dispatch needs of the store.
type dispatchStore interface {
	CommandClaim(ctx context.Context, p *store.CommandClaimParams) ([]*store.Command, error)
	CommandInFlight(ctx context.Context, nodeID string) ([]*store.Command, error)
	CommandCancelsPending(ctx context.Context, gatewayID string) ([]*store.Command, error)
	CommandSetState(ctx context.Context, p *store.CommandSetStateParams) (bool, error)
}

// claimTx is what a dispatch round's claim touches.
type claimTx interface {
	CommandClaim(ctx context.Context, p *store.CommandClaimParams) ([]*store.Command, error)
	CommandSetState(ctx context.Context, p *store.CommandSetStateParams) (ok bool, err error)
}

// updateTx is what writing a batch of nodes' command updates touches.
type updateTx interface {
	CommandSetState(ctx context.Context, p *store.CommandSetStateParams) (ok bool, err error)
	CommandAppendOutput(ctx context.Context, p *store.CommandOutputChunk) (kept int, err error)
	CommandFinish(ctx context.Context, p *store.CommandFinishParams) (ok bool, err error)
	NodeSetState(ctx context.Context, id, state string) error
}

// nodeUpdate is a command update with the node that sent it.
type nodeUpdate struct {
	nodeID string
	update *sessionv1.CommandUpdate
	// held is the output data it holds of maxQueuedOutput, given back
	// once it is written.
	held int64
}

// maxQueuedOutput bounds the output data queued for the result writer
// (bytes), however many messages carry it: without it 4,096 queued
// updates of 4 MiB each (the gateway's largest message) could hold 16 GiB
// (issue 28). A session whose output finds it full waits, as it does for
// a full queue.
const maxQueuedOutput = 64 << 20

// maxBatchOutput writes a batch early once it holds this much output data
// (bytes).
const maxBatchOutput = 16 << 20

// dispatcher is the gateway's dispatch state.
type dispatcher struct {
	wake    chan struct{}
	updates chan nodeUpdate
	// output holds the output data queued and batched (maxQueuedOutput).
	output *semaphore.Weighted

	mu         sync.Mutex
	cancelSent map[string]bool   // command ids sent a Cancel
	kinds      map[string]string // kind of each command sent and not yet finished
}

// maxKinds bounds the kinds remembered for metrics.
const maxKinds = 100000

func newDispatcher() *dispatcher {
	return &dispatcher{wake: make(chan struct{}, 1), updates: make(chan nodeUpdate, 4096), cancelSent: map[string]bool{},
		output: semaphore.NewWeighted(maxQueuedOutput),
		kinds:  map[string]string{}}
}

// Wake asks for a dispatch round now.
func (g *Gateway) Wake() {
	select {
	case g.dispatch.wake <- struct{}{}:
	default:
	}
}

// dispatchLoop runs dispatch rounds until ctx ends.
func (g *Gateway) dispatchLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.cfg.Clock.After(g.cfg.DispatchInterval):
		case <-g.dispatch.wake:
		case <-g.cfg.Wakeups:
			g.cfg.Metrics.Wakeup(g.cfg.ID, WakeBus)
		}
		if err := g.dispatchRound(ctx); err != nil && ctx.Err() == nil {
			g.log.WarnContext(ctx, "Dispatch round failed", logkey.Err, err)
		}
	}
}

// dispatchRound claims and sends queued commands, then pending cancels.
// Commands are sent inside the claiming transaction, before it commits, so
// the time to the node does not include the commit's fsync; a command sent
// whose claim then fails to commit stays queued and is sent again, which the
// node answers from its memory of the command id.
func (g *Gateway) dispatchRound(ctx context.Context) error {
	if g.draining.Load() || g.sessions.len() == 0 {
		return nil
	}
	for {
		claimed := 0
		err := store.InFencedTx(ctx, g.store, *g.fence.Load(), func(tx claimTx) error {
			cmds, err := tx.CommandClaim(ctx, &store.CommandClaimParams{GatewayID: g.cfg.ID, Limit: g.cfg.DispatchBatch})
			if err != nil {
				return err
			}
			claimed = len(cmds)
			for _, c := range cmds {
				if g.sendCommand(ctx, c) {
					continue
				}
				if _, err := tx.CommandSetState(ctx, &store.CommandSetStateParams{ID: c.ID, State: store.CommandQueued}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if claimed < g.cfg.DispatchBatch {
			break
		}
	}
	cancels, err := g.store.CommandCancelsPending(ctx, g.cfg.ID)
	if err != nil {
		return err
	}
	for _, c := range cancels {
		g.dispatch.mu.Lock()
		sent := g.dispatch.cancelSent[c.ID]
		g.dispatch.mu.Unlock()
		if sent {
			continue
		}
		if err := g.Send(c.NodeID, &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Cancel{Cancel: &sessionv1.Cancel{
			CommandId: c.ID, Reason: "cancelled by an operator"}}}); err == nil {
			g.dispatch.mu.Lock()
			g.dispatch.cancelSent[c.ID] = true
			g.dispatch.mu.Unlock()
		}
	}
	return nil
}

// sendCommand sends one command and reports whether it went out.
func (g *Gateway) sendCommand(ctx context.Context, c *store.Command) bool {
	msg, err := commandMessage(c)
	if err != nil {
		g.log.ErrorContext(ctx, "Command not sendable", logkey.CommandID, c.ID, logkey.Err, err)
		return false
	}
	if err := g.Send(c.NodeID, msg); err != nil {
		return false
	}
	since := g.cfg.Clock.Now().Sub(c.CreatedAt)
	g.cfg.Metrics.DispatchLatency(since)
	g.dispatch.mu.Lock()
	if len(g.dispatch.kinds) < maxKinds {
		g.dispatch.kinds[c.ID] = c.Kind
	}
	g.dispatch.mu.Unlock()
	return true
}

// commandMessage builds the wire Command of a stored command. The API
// stored its spec in the session-protocol form (store.Command.SessionSpec,
// sessionv1.MarshalSpec), which is sent as it is: the gateway knows no
// kind's spec.
func commandMessage(c *store.Command) (*sessionv1.GatewayMessage, error) {
	cmd := &sessionv1.Command{Id: c.ID, Kind: c.Kind, Deadline: timestamppb.New(c.DeadlineAt), Attempt: uint32(c.Attempt)}
	if err := sessionv1.UnmarshalSpec(c.SessionSpec, cmd); err != nil {
		return nil, fmt.Errorf("command %s: %w", c.ID, err)
	}
	return &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: cmd}}, nil
}

// sessionOpened redelivers what the node may hold, takes the results it
// kept while disconnected and asks for a dispatch round.
func (g *Gateway) sessionOpened(ctx context.Context, s *session, hello *sessionv1.Hello) {
	for _, r := range hello.GetPendingResults() {
		g.queueUpdate(ctx, s.nodeID, &sessionv1.CommandUpdate{CommandId: r.GetCommandId(),
			Update: &sessionv1.CommandUpdate_Result{Result: r}})
	}
	cmds, err := g.store.CommandInFlight(ctx, s.nodeID)
	if err != nil {
		g.log.WarnContext(ctx, "In-flight commands not redelivered", logkey.NodeID, s.nodeID, logkey.Err, err)
	}
	for _, c := range cmds {
		if c.State == store.CommandDispatched {
			if _, err := g.store.CommandSetState(ctx, &store.CommandSetStateParams{ID: c.ID, State: store.CommandDispatched, GatewayID: g.cfg.ID}); err != nil {
				continue
			}
		}
		g.sendCommand(ctx, c)
	}
	g.Wake()
}

// queueUpdate hands an update to the result writer; it blocks (slowing
// only this session) when the writer is behind.
func (g *Gateway) queueUpdate(ctx context.Context, nodeID string, u *sessionv1.CommandUpdate) {
	if u.GetCommandId() == "" || len(u.GetCommandId()) > 128 {
		return
	}
	held := int64(len(u.GetOutput().GetData()))
	if held > 0 {
		if err := g.dispatch.output.Acquire(ctx, min(held, maxQueuedOutput)); err != nil {
			return
		}
		held = min(held, maxQueuedOutput)
	}
	select {
	case g.dispatch.updates <- nodeUpdate{nodeID: nodeID, update: u, held: held}:
	case <-ctx.Done():
		if held > 0 {
			g.dispatch.output.Release(held)
		}
	}
}

// resultLoop writes queued updates in batches until ctx ends, then writes
// what is left.
func (g *Gateway) resultLoop(ctx context.Context) {
	const maxBatch = 1024
	batch := make([]nodeUpdate, 0, maxBatch)
	var batchOutput int64 // output data the batch holds
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	// flush writes the batch, retrying while the loop runs (not in the
	// final flush at shutdown, which tries once).
	flush := func(ctx context.Context, retry bool) {
		if len(batch) == 0 {
			return
		}
		write := g.writeUpdates
		if retry {
			write = g.writeUpdatesRetrying
		}
		if err := write(ctx, batch); err != nil {
			g.log.WarnContext(ctx, "Command updates not written; the node will resend results on its next session", "updates", len(batch), logkey.Err, err)
		}
		if batchOutput > 0 {
			g.dispatch.output.Release(batchOutput)
		}
		clear(batch) // the written updates' data is not kept alive
		batch, batchOutput = batch[:0], 0
	}
	for {
		select {
		case <-ctx.Done():
			for {
				select {
				case u := <-g.dispatch.updates:
					batch = append(batch, u)
					batchOutput += u.held
				default:
					flush(context.WithoutCancel(ctx), false)
					return
				}
			}
		case u := <-g.dispatch.updates:
			if len(batch) == 0 {
				timer.Reset(g.cfg.ResultFlushInterval)
			}
			batch = append(batch, u)
			if batchOutput += u.held; len(batch) >= maxBatch || batchOutput >= maxBatchOutput {
				flush(ctx, true)
			}
		case <-timer.C:
			flush(ctx, true)
		}
	}
}

// writeUpdatesRetrying writes batch (writeUpdates) and, while that fails,
// again with jittered back-off from 100 ms doubling to 5 s for up to
// Config.ResultRetryFor, or until ctx ends: a database failover or restart
// loses no result of a session that stays open. Each try takes the
// gateway's fence afresh, so a lease taken again at a new epoch meanwhile
// (renewLease) fences the retry. The sessions' updates wait meanwhile
// (queueUpdate blocks), which slows the nodes' streams, not the gateway.
func (g *Gateway) writeUpdatesRetrying(ctx context.Context, batch []nodeUpdate) error {
	deadline := g.cfg.Clock.Now().Add(g.cfg.ResultRetryFor)
	backoff := 100 * time.Millisecond
	for try := 1; ; try++ {
		err := g.writeUpdates(ctx, batch)
		if err == nil || ctx.Err() != nil || !g.cfg.Clock.Now().Before(deadline) {
			if err == nil && try > 1 {
				g.log.InfoContext(ctx, "Command updates written after retries", "updates", len(batch), "tries", try)
			}
			return err
		}
		wait := backoff/2 + rand.N(backoff)
		g.log.WarnContext(ctx, "Command updates not written; retrying", "updates", len(batch), "try", try, "retry_in", wait, logkey.Err, err)
		select {
		case <-ctx.Done():
			// Shutting down: one last try, as the loop's final flush does.
			return g.writeUpdates(context.WithoutCancel(ctx), batch)
		case <-g.cfg.Clock.After(wait):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// states maps the protocol's terminal states to the store's.
var states = map[sessionv1.CommandState]string{
	sessionv1.CommandState_COMMAND_STATE_SUCCEEDED: store.CommandSucceeded,
	sessionv1.CommandState_COMMAND_STATE_FAILED:    store.CommandFailed,
	sessionv1.CommandState_COMMAND_STATE_CANCELLED: store.CommandCancelled,
	sessionv1.CommandState_COMMAND_STATE_EXPIRED:   store.CommandExpired,
	sessionv1.CommandState_COMMAND_STATE_LOST:      store.CommandLost,
}

// maxErrorLen bounds the error text kept from a node.
const maxErrorLen = 4096

// writeUpdates applies a batch in one fenced transaction. Each write is
// conditional on the command being the sending node's: a node reports only
// its own work.
func (g *Gateway) writeUpdates(ctx context.Context, batch []nodeUpdate) error {
	// A command whose result is in this batch needs no accepted/running
	// write: the result supersedes them (one write per command instead of
	// three at high throughput).
	hasResult := map[string]bool{}
	for _, nu := range batch {
		if nu.update.GetResult() != nil {
			hasResult[nu.update.GetCommandId()] = true
		}
	}
	type done struct{ id, state string }
	var finished []done
	err := store.InFencedTx(ctx, g.store, *g.fence.Load(), func(tx updateTx) error {
		finished = finished[:0]
		for _, nu := range batch {
			u := nu.update
			switch u.GetUpdate().(type) {
			case *sessionv1.CommandUpdate_Accepted, *sessionv1.CommandUpdate_Running:
				if hasResult[u.GetCommandId()] {
					continue
				}
			}
			state, err := applyUpdate(ctx, tx, nu.nodeID, u)
			if err != nil {
				return err
			}
			if state != "" {
				finished = append(finished, done{u.GetCommandId(), state})
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, f := range finished {
		g.dispatch.mu.Lock()
		kind, ok := g.dispatch.kinds[f.id]
		delete(g.dispatch.kinds, f.id)
		delete(g.dispatch.cancelSent, f.id)
		g.dispatch.mu.Unlock()
		if !ok {
			kind = "unknown" // dispatched by another gateway, or before a restart
		}
		g.cfg.Metrics.CommandFinished(kind, f.state)
	}
	return nil
}

// applyUpdate writes one update of nodeID; it returns the terminal state
// when the update finished the command.
func applyUpdate(ctx context.Context, tx updateTx, nodeID string, u *sessionv1.CommandUpdate) (string, error) {
	id := u.GetCommandId()
	switch b := u.GetUpdate().(type) {
	case *sessionv1.CommandUpdate_Accepted:
		_, err := tx.CommandSetState(ctx, &store.CommandSetStateParams{ID: id, NodeID: nodeID, State: store.CommandAccepted})
		return "", ignoreMissing(err)
	case *sessionv1.CommandUpdate_Running:
		_, err := tx.CommandSetState(ctx, &store.CommandSetStateParams{ID: id, NodeID: nodeID, State: store.CommandRunning})
		return "", ignoreMissing(err)
	case *sessionv1.CommandUpdate_Output:
		stream := store.StreamStdout
		if b.Output.GetStream() == sessionv1.OutputStream_OUTPUT_STREAM_STDERR {
			stream = store.StreamStderr
		}
		if len(b.Output.GetData()) == 0 || u.GetUpdateSeq() == 0 {
			return "", nil
		}
		// The store keeps it only within the command's output limit and
		// before its result (CommandAppendOutput): a node cannot grow the
		// database past what the command allows.
		_, err := tx.CommandAppendOutput(ctx, &store.CommandOutputChunk{CommandID: id, NodeID: nodeID,
			Seq: int64(u.GetUpdateSeq()), Stream: stream, Data: b.Output.GetData()})
		return "", ignoreMissing(err)
	case *sessionv1.CommandUpdate_Result:
		state, ok := states[b.Result.GetState()]
		if !ok {
			state = store.CommandFailed
		}
		code := int(b.Result.GetExitCode())
		msg := b.Result.GetError()
		if len(msg) > maxErrorLen {
			msg = msg[:maxErrorLen]
		}
		var detail []byte
		if d := b.Result.GetDetailJson(); len(d) > 0 && len(d) <= 64<<10 && json.Valid(d) {
			detail = d
		}
		done, err := tx.CommandFinish(ctx, &store.CommandFinishParams{ID: id, NodeID: nodeID, State: state, ExitCode: &code,
			Error: msg, OutputTruncated: b.Result.GetOutputTruncated(), Result: detail})
		if !done {
			return "", ignoreMissing(err)
		}
		if err == nil && ownBMCOff(detail) {
			// The node's own BMC says it is off: powered-off, not
			// unreachable, until it connects again.
			err = ignoreMissing(tx.NodeSetState(ctx, nodeID, store.NodePoweredOff))
		}
		return state, err
	}
	return "", nil
}

// ownBMCOff reports whether a BMC command's result says the node's own BMC
// (no name: not a site agent's named BMC; no nodeId: not another node's
// BMC driven as its site's agent) left the machine powered off.
func ownBMCOff(detail []byte) bool {
	if len(detail) == 0 {
		return false
	}
	var r struct {
		Name   string `json:"name"`
		NodeID string `json:"nodeId"`
		Power  string `json:"power"`
	}
	return json.Unmarshal(detail, &r) == nil && r.Name == "" && r.NodeID == "" && r.Power == "off"
}

// ignoreMissing drops not-found: a node may report on a command that was
// deleted (or never existed); that fails nothing else in the batch.
func ignoreMissing(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	return err
}
