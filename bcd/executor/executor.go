// Package executor runs the commands a gateway sends to bcd: it implements
// session.Handler. Delivery is at-least-once, so the command id is the
// idempotency key: a command id seen before is never run twice (a finished
// one has its result sent again). Results that could not be sent because the
// session ended are kept and go into the next Hello.
package executor

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"google.golang.org/protobuf/types/known/timestamppb"

	bcexec "github.com/better-compute/better-compute/bcd/exec"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Command kinds this executor runs.
const (
	KindExec             = "exec"
	KindInventoryRefresh = "inventory.refresh"
)

// RootRunner runs programs as root (the root helper's client).
type RootRunner interface {
	Exec(ctx context.Context, spec bcexec.Spec, out func(stream int, data []byte)) bcexec.Result
}

// Config configures an Executor.
type Config struct {
	// Root runs as_root commands when bcd is unprivileged. When nil, bcd
	// running as root runs them itself and an unprivileged bcd refuses them.
	Root RootRunner
	// RefreshInventory rescans and reports the inventory (inventory.refresh).
	RefreshInventory func(ctx context.Context) error
	// Remember is how many recent command ids are kept for deduplication.
	// Defaults to 4,096.
	Remember int
	// IsRoot reports whether bcd runs as root. Defaults to os.Geteuid() == 0.
	IsRoot func() bool
	// Upgrader runs "upgrade" commands. When nil they fail.
	Upgrader Upgrader
	// BMC carries out the BMC kinds (power.*, boot.set). When nil they
	// fail.
	BMC BMC
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Executor runs commands.
type Executor struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	seen    map[string]*list.Element // command id -> entry in order
	order   *list.List               // of *entry, oldest first
	pending []*sessionv1.CommandResult
	wg      sync.WaitGroup
}

type entry struct {
	id     string
	cancel context.CancelFunc // nil once finished
	result *sessionv1.CommandResult
	u      *updater // numbers and sends the command's updates
}

// New returns an Executor.
func New(cfg Config) *Executor {
	cfg.Remember = cmp.Or(cfg.Remember, 4096)
	if cfg.IsRoot == nil {
		cfg.IsRoot = func() bool { return os.Geteuid() == 0 }
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Executor{cfg: cfg, log: log, seen: map[string]*list.Element{}, order: list.New()}
}

// Wait waits for running commands to end. Cancelling the context given to
// HandleCommand (the agent stopping) cancels them, which is how bcd shuts
// down: cancel, then Wait.
func (e *Executor) Wait() { e.wg.Wait() }

// PendingResults returns, and forgets, the results not yet delivered.
func (e *Executor) PendingResults() []*sessionv1.CommandResult {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.pending
	e.pending = nil
	return out
}

// Running returns the ids of running commands (for Heartbeat).
func (e *Executor) Running() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ids []string
	for el := e.order.Front(); el != nil; el = el.Next() {
		if en := el.Value.(*entry); en.cancel != nil {
			ids = append(ids, en.id)
		}
	}
	return ids
}

// HandleCommand starts a command, or answers a redelivery.
func (e *Executor) HandleCommand(ctx context.Context, cmd *sessionv1.Command, send func(*sessionv1.CommandUpdate) error) {
	e.mu.Lock()
	if el, ok := e.seen[cmd.GetId()]; ok {
		en := el.Value.(*entry)
		result, u := en.result, en.u
		e.mu.Unlock()
		switch {
		case result != nil:
			// Output the old session could not take goes first, then
			// the result again.
			if u != nil {
				u.setTransmit(send)
				u.flush()
			}
			_ = send(&sessionv1.CommandUpdate{CommandId: en.id, Update: &sessionv1.CommandUpdate_Result{Result: result}})
		case u != nil:
			// Redelivered while running (the node reconnected): the rest
			// of its updates, and the output the old session could not
			// take, go to the session it came on now.
			u.setTransmit(send)
			u.flush()
		}
		return
	}
	// ctx is the agent's, not the session's: the command outlives the
	// session it came on (a result reaches the next session through Hello)
	// but not the agent, so stopping bcd kills its process group rather
	// than leaving it orphaned.
	cctx, cancel := context.WithCancel(ctx)
	if d := cmd.GetDeadline(); d != nil {
		cctx, cancel = context.WithDeadline(ctx, d.AsTime())
	}
	en := &entry{id: cmd.GetId(), cancel: cancel, u: &updater{id: cmd.GetId(), transmit: send}}
	e.seen[en.id] = e.order.PushBack(en)
	for e.order.Len() > e.cfg.Remember {
		old := e.order.Front()
		if old.Value.(*entry).cancel != nil {
			break // never forget a running command
		}
		delete(e.seen, old.Value.(*entry).id)
		e.order.Remove(old)
	}
	e.mu.Unlock()
	e.wg.Go(func() {
		defer cancel()
		u := en.u
		u.send(&sessionv1.CommandUpdate{Update: &sessionv1.CommandUpdate_Accepted{Accepted: &sessionv1.Accepted{AcceptedAt: timestamppb.Now()}}})
		res := e.run(cctx, cmd, u)
		if res == nil {
			// Handed over to the restarted bcd (Upgrader): no result here.
			e.mu.Lock()
			en.cancel = nil
			e.mu.Unlock()
			return
		}
		res.CommandId = en.id
		res.FinishedAt = timestamppb.Now()
		e.mu.Lock()
		en.cancel, en.result = nil, res
		e.mu.Unlock()
		if err := u.send(&sessionv1.CommandUpdate{Update: &sessionv1.CommandUpdate_Result{Result: res}}); err != nil {
			e.mu.Lock()
			e.pending = append(e.pending, res)
			e.mu.Unlock()
			e.log.Info("Kept a command result for the next session", "command", en.id, "err", err)
		}
	})
}

// HandleCancel cancels a running command.
func (e *Executor) HandleCancel(_ context.Context, c *sessionv1.Cancel) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if el, ok := e.seen[c.GetCommandId()]; ok {
		if en := el.Value.(*entry); en.cancel != nil {
			e.log.Info("Cancelling a command", "command", en.id, "reason", c.GetReason())
			en.cancel()
		}
	}
}

// updater numbers a command's updates.
type updater struct {
	id       string
	mu       sync.Mutex
	seq      uint64
	transmit func(*sessionv1.CommandUpdate) error
	// backlog holds output chunks no session took yet, in order; they are
	// sent before anything else once a session takes updates again. The
	// output cap bounds it.
	backlog []*sessionv1.CommandUpdate
}

// setTransmit sends the following updates through send.
func (u *updater) setTransmit(send func(*sessionv1.CommandUpdate) error) {
	u.mu.Lock()
	u.transmit = send
	u.mu.Unlock()
}

func (u *updater) send(m *sessionv1.CommandUpdate) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.seq++
	m.CommandId, m.UpdateSeq = u.id, u.seq
	err := u.drain()
	if err == nil {
		err = u.transmit(m)
	}
	if err != nil && m.GetOutput() != nil {
		u.backlog = append(u.backlog, m)
	}
	return err
}

// flush sends the backlog through the current transmit, if it can.
func (u *updater) flush() {
	u.mu.Lock()
	defer u.mu.Unlock()
	_ = u.drain()
}

// drain sends the backlog in order; it stops at the first failure.
func (u *updater) drain() error {
	for len(u.backlog) > 0 {
		if err := u.transmit(u.backlog[0]); err != nil {
			return err
		}
		u.backlog = u.backlog[1:]
	}
	u.backlog = nil
	return nil
}

// errRootUnavailable is the clear error for root work without a helper.
var errRootUnavailable = errors.New("this command must run as root, but bcd runs unprivileged and no root helper is configured (start bcd-helper.service)")

func (e *Executor) run(ctx context.Context, cmd *sessionv1.Command, u *updater) *sessionv1.CommandResult {
	switch cmd.GetKind() {
	case KindExec:
		return e.exec(ctx, cmd.GetExec(), u)
	case KindUpgrade:
		return e.upgrade(ctx, cmd)
	case KindInventoryRefresh:
		if e.cfg.RefreshInventory == nil {
			return failed("inventory refresh is not available")
		}
		if err := e.cfg.RefreshInventory(ctx); err != nil {
			return failed("inventory refresh: " + err.Error())
		}
		return &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED}
	case KindPowerStatus, KindPowerOn, KindPowerOff, KindPowerSoftOff, KindPowerCycle, KindPowerReset, KindBootSet:
		return e.bmc(ctx, cmd, u)
	}
	return failed(fmt.Sprintf("unsupported command kind %q", cmd.GetKind()))
}

func (e *Executor) exec(ctx context.Context, spec *sessionv1.ExecSpec, u *updater) *sessionv1.CommandResult {
	if spec == nil || len(spec.GetArgv()) == 0 {
		return failed("exec without argv")
	}
	if t := spec.GetTimeout(); t != nil && t.AsDuration() > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.AsDuration())
		defer cancel()
	}
	s := bcexec.Spec{Argv: spec.GetArgv(), Env: spec.GetEnv(), Dir: spec.GetCwd(), OutputLimit: int64(spec.GetOutputLimitBytes()),
		Home: os.Getenv("HOME")}
	var offsets [3]uint64
	out := func(stream int, data []byte) {
		st := sessionv1.OutputStream_OUTPUT_STREAM_STDOUT
		if stream == bcexec.Stderr {
			st = sessionv1.OutputStream_OUTPUT_STREAM_STDERR
		}
		off := offsets[stream]
		offsets[stream] += uint64(len(data))
		_ = u.send(&sessionv1.CommandUpdate{Update: &sessionv1.CommandUpdate_Output{Output: &sessionv1.OutputChunk{Stream: st, Data: data, Offset: off}}})
	}
	_ = u.send(&sessionv1.CommandUpdate{Update: &sessionv1.CommandUpdate_Running{Running: &sessionv1.Running{StartedAt: timestamppb.Now()}}})
	var res bcexec.Result
	switch {
	case !spec.GetAsRoot() || (e.cfg.Root == nil && e.cfg.IsRoot()):
		res = bcexec.Run(ctx, s, out)
	case e.cfg.Root != nil:
		res = e.cfg.Root.Exec(ctx, s, out)
	default:
		return failed(errRootUnavailable.Error())
	}
	r := &sessionv1.CommandResult{ExitCode: int32(res.ExitCode), OutputTruncated: res.Truncated}
	switch {
	case res.Cancelled && errors.Is(ctx.Err(), context.DeadlineExceeded):
		r.State, r.Error = sessionv1.CommandState_COMMAND_STATE_EXPIRED, "deadline passed: the program was killed"
	case res.Cancelled:
		r.State, r.Error = sessionv1.CommandState_COMMAND_STATE_CANCELLED, "cancelled: the program's process group was killed"
	case res.Err != nil:
		r.State, r.Error = sessionv1.CommandState_COMMAND_STATE_FAILED, res.Err.Error()
	case res.ExitCode != 0:
		r.State, r.Error = sessionv1.CommandState_COMMAND_STATE_FAILED, fmt.Sprintf("exit status %d", res.ExitCode)
	default:
		r.State = sessionv1.CommandState_COMMAND_STATE_SUCCEEDED
	}
	return r
}

func failed(msg string) *sessionv1.CommandResult {
	return &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_FAILED, ExitCode: -1, Error: msg}
}
