// Package executor runs the commands a gateway sends to bcd: it implements
// session.Handler. Delivery is at-least-once, so the command id is the
// idempotency key: a command id seen before is never run twice (a finished
// one has its result sent again). Results that could not be sent because the
// session ended are kept and go into the next Hello.
//
// With a Config.Journal (package bcd/journal) this holds across bcd's own
// restarts: every command is recorded before it starts, with the process
// group it runs in, and a new Executor over the same journal recognises the
// commands an earlier bcd accepted. Finished ones answer their redelivery
// with the recorded result (undelivered results go into the next Hello);
// unfinished ones are reported LOST, after the process group left behind is
// ended when the boot id and the start time of its leader show it is the
// recorded one; a "reboot" accepted in an earlier boot is reported
// SUCCEEDED. docs/bcd.md, "Commands across restarts", gives the rules.
package executor

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/journal"
	"github.com/better-compute/better-compute/bcd/process"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// RootRunner runs programs as root for a command (the root helper's
// client, which asks for a grant bound to the command id first).
type RootRunner interface {
	ExecRoot(ctx context.Context, commandID string, spec process.Spec, out func(stream int, data []byte)) process.Result
}

// Runner runs programs as the command user (package bcd/cmduser): a
// *cmduser.Runner when bcd is root, the root helper's client when it is
// unprivileged.
type Runner interface {
	Exec(ctx context.Context, spec process.Spec, out func(stream int, data []byte)) process.Result
}

// Config configures an Executor.
type Config struct {
	// Commands runs exec commands without as_root, as the command user,
	// never as root or bcd's own uid (issue 27). When nil they fail with
	// errNoCommandUser.
	Commands Runner
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
	// Journal records every command before it starts, so that a new
	// Executor over it (after bcd restarted) recognises the commands this
	// one accepted; New reads it. The Executor does not close it. Defaults
	// to none: commands are remembered in memory only.
	Journal *journal.Journal
	// Proc reads the boot id and processes, and signals process groups.
	// Defaults to ProcFS("/proc").
	Proc Proc
	// KillGrace is how long a process group left behind by an earlier bcd
	// has after SIGTERM before SIGKILL, and after SIGKILL before it is
	// reported as not ended. Defaults to DefaultKillGrace (5 s).
	KillGrace time.Duration
	// GPUs answers gpu.reset's questions (who uses the GPU) and hears of
	// its success (*gpu.Collector). When nil, gpu.reset fails.
	GPUs GPUs
	// NvidiaSMI is the nvidia-smi program gpu.reset runs as root ("-r -i
	// UUID"); a name without a slash is looked up in bcd's PATH, else in
	// the root side's. Defaults to DefaultNvidiaSMI.
	NvidiaSMI string
	// DCGMI is NVIDIA DCGM's command line gpu.diag runs as root ("diag -r
	// LEVEL -j"), looked up as NvidiaSMI is; where neither PATH has it,
	// gpu.diag runs the built-in NVML check. Defaults to DefaultDCGMI.
	DCGMI string
	// Reboot reboots the machine for "reboot" commands (the root helper's
	// client when bcd is unprivileged). Defaults to running RebootCommand
	// when bcd is root; otherwise reboot commands fail.
	Reboot Rebooter
	// RebootCommand is the program that reboots the machine when bcd is
	// root and Reboot is nil, its name looked up in bcd's own PATH first
	// (as NvidiaSMI's), else in the default PATH (process.DefaultPath).
	// Defaults to DefaultRebootCommand.
	RebootCommand []string
	// Now is the gateways' time, by which a command's deadline (set by the
	// control plane's clock) is turned into the time the command has left:
	// a machine whose own clock is wrong still runs it for as long as was
	// meant (issue 36). Defaults to time.Now.
	Now func() time.Time
	// Logger defaults to discarding.
	Logger *slog.Logger
}

// Log attribute keys of this package.
const (
	attrKind   = "kind"
	attrPGID   = "pgid"
	attrState  = "state"
	attrReason = "reason"
)

// Executor runs commands.
type Executor struct {
	cfg    Config
	log    *slog.Logger
	proc   Proc
	bootID string

	mu      sync.Mutex
	seen    map[string]*list.Element // command id -> entry in order
	order   *list.List               // of *entry, oldest first
	pending []*sessionv1.CommandResult
	// changed is closed, and replaced, whenever a command stops running
	// (drain waits on it).
	changed chan struct{}
	// drains counts running drain commands; while any runs, the kinds in
	// refusedWhileDraining are refused.
	drains int
	wg     sync.WaitGroup
}

type entry struct {
	id        string
	kind      string
	cancel    context.CancelFunc // nil once finished
	result    *sessionv1.CommandResult
	delivered bool // result reached a gateway
	handover  bool // recovered: an earlier bcd handed it to this one (Upgrader)
	// unrecorded: refused because the journal could not record it, so the
	// journal has nothing of it to change.
	unrecorded bool
	u          *updater // numbers and sends the command's updates
}

// errCancelled is the cause with which Cancel stops a command.
var errCancelled = errors.New("cancelled")

// New returns an Executor. With a Journal it takes over the commands an
// earlier bcd recorded there: it ends the process groups they left behind
// in the background (Wait waits for that too) and keeps their results for
// the next Hello.
func New(cfg Config) *Executor {
	cfg.Remember = cmp.Or(cfg.Remember, 4096)
	cfg.KillGrace = cmp.Or(cfg.KillGrace, DefaultKillGrace)
	if cfg.IsRoot == nil {
		cfg.IsRoot = func() bool { return os.Geteuid() == 0 }
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.NvidiaSMI = cmp.Or(cfg.NvidiaSMI, DefaultNvidiaSMI)
	cfg.DCGMI = cmp.Or(cfg.DCGMI, DefaultDCGMI)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if len(cfg.RebootCommand) == 0 {
		cfg.RebootCommand = DefaultRebootCommand
	}
	e := &Executor{cfg: cfg, log: log, proc: cmp.Or[Proc](cfg.Proc, ProcFS("/proc")),
		seen: map[string]*list.Element{}, order: list.New(), changed: make(chan struct{})}
	if cfg.Journal != nil {
		id, err := e.proc.BootID()
		if err != nil {
			log.Warn("No boot id: commands of an earlier bcd are reported lost and their processes left alone", logkey.Err, err)
		}
		e.bootID = id
		e.recoverRecords(cfg.Journal.Records())
	}
	return e
}

// now is the gateways' time (Config.Now).
func (e *Executor) now() time.Time { return e.cfg.Now() }

// Wait waits for running commands to end. Cancelling the context given to
// HandleCommand (the agent stopping) cancels them, which is how bcd shuts
// down: cancel, then Wait.
func (e *Executor) Wait() { e.wg.Wait() }

// Delivered records that results reached a gateway (a Welcome answered the
// Hello that carried them), so that a restarted bcd does not send them
// again unasked.
func (e *Executor) Delivered(results []*sessionv1.CommandResult) {
	for _, r := range results {
		e.mu.Lock()
		en := &entry{id: r.GetCommandId()}
		if el, ok := e.seen[en.id]; ok {
			en = el.Value.(*entry)
		}
		already := en.delivered
		e.mu.Unlock()
		if !already {
			e.markDelivered(en)
		}
	}
}

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
	if el, ok := e.seen[cmd.GetId()]; ok && el.Value.(*entry).handover {
		// An earlier bcd restarted to finish this upgrade: the Upgrader
		// answers it from its own record.
		delete(e.seen, cmd.GetId())
		e.order.Remove(el)
	} else if ok {
		en := el.Value.(*entry)
		result, u, delivered := en.result, en.u, en.delivered
		e.mu.Unlock()
		switch {
		case result != nil:
			// Output the old session could not take goes first, then
			// the result again.
			if u != nil {
				u.setTransmit(send)
				u.flush()
			}
			err := send(&sessionv1.CommandUpdate{CommandId: en.id, Update: &sessionv1.CommandUpdate_Result{Result: result}})
			if err == nil && !delivered {
				e.markDelivered(en)
			}
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
	cctx, cancelCause := context.WithCancelCause(ctx)
	cancel := func() { cancelCause(errCancelled) }
	stopDeadline := func() {}
	if d := cmd.GetDeadline(); d != nil {
		// The time left by the gateways' clock, counted on this machine's
		// monotonic clock: never this machine's wall clock, which may be
		// off by days.
		cctx, stopDeadline = context.WithTimeout(cctx, d.AsTime().Sub(e.now()))
	}
	en := &entry{id: cmd.GetId(), kind: cmd.GetKind(), cancel: cancel, u: &updater{id: cmd.GetId(), transmit: send}}
	e.seen[en.id] = e.order.PushBack(en)
	var forget []string
	for e.order.Len() > e.cfg.Remember {
		old := e.order.Front()
		oe := old.Value.(*entry)
		if oe.cancel != nil {
			break // never forget a running command
		}
		if (oe.delivered || oe.handover) && !oe.unrecorded {
			forget = append(forget, oe.id) // an undelivered one waits for Delivered
		}
		delete(e.seen, oe.id)
		e.order.Remove(old)
	}
	e.mu.Unlock()
	e.forget(forget)
	// Recorded before it starts, so that a bcd restarted after a crash
	// knows it was accepted.
	if j := e.cfg.Journal; j != nil {
		if err := j.Accept(journal.Record{ID: en.id, Kind: en.kind, BootID: e.bootID, AcceptedAt: time.Now()}); err != nil {
			cancelCause(nil)
			stopDeadline()
			e.mu.Lock()
			en.unrecorded = true
			e.mu.Unlock()
			if errors.Is(err, journal.ErrDiskFull) {
				e.log.Error("Refused a command: disk full on the node's data dir", logkey.CommandID, en.id, logkey.Err, err)
				e.finish(en, failed(errDiskFull.Error()+" ("+err.Error()+")"))
				return
			}
			e.log.Error("Refused a command that could not be recorded", logkey.CommandID, en.id, logkey.Err, err)
			e.finish(en, failed("bcd could not record the command before running it: "+err.Error()))
			return
		}
	}
	e.wg.Go(func() {
		defer cancelCause(nil)
		defer stopDeadline()
		u := en.u
		u.send(&sessionv1.CommandUpdate{Update: &sessionv1.CommandUpdate_Accepted{Accepted: &sessionv1.Accepted{AcceptedAt: timestamppb.Now()}}})
		res := e.run(cctx, cmd, u)
		if res == unfinished {
			// A reboot under way: its journal record, unfinished, is
			// answered after the reboot.
			e.stopped(en)
			return
		}
		if res == nil {
			// Handed over to the restarted bcd (Upgrader): no result here.
			e.stopped(en)
			if j := e.cfg.Journal; j != nil {
				if err := j.HandedOver(en.id); err != nil {
					e.log.Warn("Could not record a command handed to the restarted bcd", logkey.CommandID, en.id, logkey.Err, err)
				}
			}
			return
		}
		e.finish(en, res)
	})
}

// finish records a command's result, in the journal first, and sends it;
// one no session took is kept for the next Hello.
func (e *Executor) finish(en *entry, res *sessionv1.CommandResult) {
	res.CommandId = en.id
	if res.FinishedAt == nil {
		res.FinishedAt = timestamppb.Now()
	}
	e.mu.Lock()
	en.cancel, en.result = nil, res
	unrecorded := en.unrecorded
	e.notifyLocked()
	e.mu.Unlock()
	if j := e.cfg.Journal; j != nil && !unrecorded {
		if err := j.Finished(en.id, res); err != nil {
			e.log.Warn("Could not record a command result", logkey.CommandID, en.id, logkey.Err, err)
		}
	}
	if err := en.u.send(&sessionv1.CommandUpdate{Update: &sessionv1.CommandUpdate_Result{Result: res}}); err != nil {
		e.mu.Lock()
		e.pending = append(e.pending, res)
		e.mu.Unlock()
		e.log.Info("Kept a command result for the next session", logkey.CommandID, en.id, logkey.Err, err)
		return
	}
	e.markDelivered(en)
}

// stopped marks en as no longer running, without a result.
func (e *Executor) stopped(en *entry) {
	e.mu.Lock()
	en.cancel = nil
	e.notifyLocked()
	e.mu.Unlock()
}

// notifyLocked wakes those waiting for a command to stop. e.mu must be held.
func (e *Executor) notifyLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// markDelivered records that en's result reached a gateway; a command no
// longer remembered is forgotten by the journal too.
func (e *Executor) markDelivered(en *entry) {
	e.mu.Lock()
	en.delivered = true
	el, known := e.seen[en.id]
	known = known && el.Value.(*entry) == en
	unrecorded := en.unrecorded
	e.mu.Unlock()
	if j := e.cfg.Journal; j != nil && !unrecorded {
		err := j.Delivered(en.id)
		if err == nil && !known {
			err = j.Forget(en.id)
		}
		if err != nil {
			e.log.Warn("Could not record a delivered result", logkey.CommandID, en.id, logkey.Err, err)
		}
	}
}

// forget removes the records of commands no longer remembered.
func (e *Executor) forget(ids []string) {
	if e.cfg.Journal == nil {
		return
	}
	for _, id := range ids {
		if err := e.cfg.Journal.Forget(id); err != nil {
			e.log.Warn("Could not forget a command record", logkey.CommandID, id, logkey.Err, err)
		}
	}
}

// HandleCancel cancels a running command.
func (e *Executor) HandleCancel(_ context.Context, c *sessionv1.Cancel) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if el, ok := e.seen[c.GetCommandId()]; ok {
		if en := el.Value.(*entry); en.cancel != nil {
			e.log.Info("Cancelling a command", logkey.CommandID, en.id, "reason", c.GetReason())
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

// errNoCommandUser is the error of an exec without as_root when the
// Executor has no Config.Commands.
var errNoCommandUser = errors.New("this bcd has no command user to run commands as (bcd node --command-user); it runs no command as root or as itself")

// errDiskFull is the error of a command refused because the journal had no
// room to record it (journal.ErrDiskFull): bcd runs nothing it has not
// recorded, and keeps the room left for the results of commands it took.
var errDiskFull = errors.New("refused: disk full on the node's data dir: bcd records every command before running it; free space there and run the command again")

// errRootUnavailable is the clear error for root work without a helper.
var errRootUnavailable = errors.New("this command must run as root, but bcd runs unprivileged and no root helper is configured (start bcd-helper.service)")

func (e *Executor) run(ctx context.Context, cmd *sessionv1.Command, u *updater) *sessionv1.CommandResult {
	if slices.Contains(refusedWhileDraining, cmd.GetKind()) && e.draining() {
		return failed(fmt.Sprintf("refused: the node is draining (a drain command runs), so it takes no new %s commands", cmd.GetKind()))
	}
	switch cmd.GetKind() {
	case sessionv1.KindGPUReset:
		return e.gpuReset(ctx, cmd, u)
	case sessionv1.KindGPUDiag:
		return e.gpuDiag(ctx, cmd, u)
	case sessionv1.KindReboot:
		return e.reboot(ctx, u)
	case sessionv1.KindDrain:
		return e.drain(ctx, u)
	case sessionv1.KindExec:
		return e.exec(ctx, cmd.GetExec(), u)
	case sessionv1.KindUpgrade:
		return e.upgrade(ctx, cmd)
	case sessionv1.KindRollback:
		return e.rollback(ctx, cmd)
	case sessionv1.KindInventoryRefresh:
		if e.cfg.RefreshInventory == nil {
			return failed("inventory refresh is not available")
		}
		if err := e.cfg.RefreshInventory(ctx); err != nil {
			return failed("inventory refresh: " + err.Error())
		}
		return &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED}
	case sessionv1.KindPowerStatus, sessionv1.KindPowerOn, sessionv1.KindPowerOff, sessionv1.KindPowerSoftOff,
		sessionv1.KindPowerCycle, sessionv1.KindPowerReset, sessionv1.KindBootSet:
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
	s := process.Spec{Argv: spec.GetArgv(), Env: spec.GetEnv(), Dir: spec.GetCwd(), OutputLimit: int64(spec.GetOutputLimitBytes()),
		Started: func(pid int) { e.started(u.id, pid) }}
	var offsets [3]uint64
	out := func(stream int, data []byte) {
		st := sessionv1.OutputStream_OUTPUT_STREAM_STDOUT
		if stream == process.Stderr {
			st = sessionv1.OutputStream_OUTPUT_STREAM_STDERR
		}
		off := offsets[stream]
		offsets[stream] += uint64(len(data))
		_ = u.send(&sessionv1.CommandUpdate{Update: &sessionv1.CommandUpdate_Output{Output: &sessionv1.OutputChunk{Stream: st, Data: data, Offset: off}}})
	}
	_ = u.send(&sessionv1.CommandUpdate{Update: &sessionv1.CommandUpdate_Running{Running: &sessionv1.Running{StartedAt: timestamppb.Now()}}})
	var res process.Result
	switch {
	case !spec.GetAsRoot() && e.cfg.Commands == nil:
		return failed(errNoCommandUser.Error())
	case !spec.GetAsRoot():
		res = e.cfg.Commands.Exec(ctx, s, out)
	case e.cfg.Root != nil:
		res = e.cfg.Root.ExecRoot(ctx, u.id, s, out)
	case e.cfg.IsRoot():
		s.Home, s.User = "/root", "root"
		res = process.Run(ctx, s, out)
	default:
		return failed(errRootUnavailable.Error())
	}
	r := &sessionv1.CommandResult{ExitCode: int32(res.ExitCode), OutputTruncated: res.Truncated}
	switch {
	case res.Cancelled && errors.Is(ctx.Err(), context.DeadlineExceeded):
		r.State, r.Error = sessionv1.CommandState_COMMAND_STATE_EXPIRED, "deadline passed: the program was killed"
	case res.Cancelled && !errors.Is(context.Cause(ctx), errCancelled):
		r.State, r.Error = sessionv1.CommandState_COMMAND_STATE_CANCELLED, "bcd stopped while the command ran: the program's process group was killed"
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

// started records the process group a command's program runs in.
func (e *Executor) started(id string, pid int) {
	j := e.cfg.Journal
	if j == nil {
		return
	}
	ticks, err := e.proc.StartTime(pid)
	if err == nil {
		err = j.Started(id, pid, ticks)
	}
	if err != nil {
		e.log.Warn("Could not record a command's process group; a restarted bcd would not end it", logkey.CommandID, id, attrPGID, pid, logkey.Err, err)
	}
}

func failed(msg string) *sessionv1.CommandResult {
	return &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_FAILED, ExitCode: -1, Error: msg}
}
