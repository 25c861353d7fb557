package sim

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// commands is a FakeDaemon's simulated command runner: an exec "runs"
// instantly and prints what it would have run; inventory.refresh re-sends
// the simulated inventory. Like bcd, it runs a command id once and answers
// a repeat with the same result.
type commands struct {
	d    *FakeDaemon
	mu   sync.Mutex
	done map[string]*sessionv1.CommandResult
	// execDelay keeps each exec running this long before its output and
	// result (SetExecDelay); 0: at once.
	execDelay time.Duration
}

// SetExecDelay makes each exec the daemon runs from now on stay running for
// delay before it answers (0, the default: at once), as a long job on a
// node does: what a drain waits for.
func (d *FakeDaemon) SetExecDelay(delay time.Duration) {
	c := d.commands()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.execDelay = delay
}

func (c *commands) HandleCommand(_ context.Context, cmd *sessionv1.Command, send func(*sessionv1.CommandUpdate) error) {
	if c.d.hung() {
		return // a hung machine answers nothing (faults.go)
	}
	c.mu.Lock()
	if c.done == nil {
		c.done = map[string]*sessionv1.CommandResult{}
	}
	res, seen := c.done[cmd.GetId()]
	if !seen {
		res = c.run(cmd)
		c.done[cmd.GetId()] = res
	}
	delay := c.execDelay
	c.mu.Unlock()
	if seen {
		_ = send(&sessionv1.CommandUpdate{CommandId: cmd.GetId(), UpdateSeq: 4, Update: &sessionv1.CommandUpdate_Result{Result: res}})
		return
	}
	if c.d.recovers(cmd, res, send) {
		// A gpu.reset answers after its delay; a reboot takes the
		// daemon away and its redelivery is answered after it
		// (faults.go).
		return
	}
	if c.d.restarts(cmd, res) {
		// An upgrade or rollback restarts the daemon (release.go): the
		// result answers the redelivery after it.
		for i, u := range []*sessionv1.CommandUpdate{
			{Update: &sessionv1.CommandUpdate_Accepted{Accepted: &sessionv1.Accepted{AcceptedAt: timestamppb.Now()}}},
			{Update: &sessionv1.CommandUpdate_Running{Running: &sessionv1.Running{StartedAt: timestamppb.Now()}}},
		} {
			u.CommandId, u.UpdateSeq = cmd.GetId(), uint64(i+1)
			_ = send(u)
		}
		c.d.restart()
		return
	}
	updates := []*sessionv1.CommandUpdate{
		{Update: &sessionv1.CommandUpdate_Accepted{Accepted: &sessionv1.Accepted{AcceptedAt: timestamppb.Now()}}},
		{Update: &sessionv1.CommandUpdate_Running{Running: &sessionv1.Running{StartedAt: timestamppb.Now()}}},
	}
	if cmd.GetKind() == sessionv1.KindExec {
		out := fmt.Sprintf("simulated %s: %s\n", c.d.cfg.Name, strings.Join(cmd.GetExec().GetArgv(), " "))
		updates = append(updates, &sessionv1.CommandUpdate{Update: &sessionv1.CommandUpdate_Output{Output: &sessionv1.OutputChunk{
			Stream: sessionv1.OutputStream_OUTPUT_STREAM_STDOUT, Data: []byte(out)}}})
	}
	updates = append(updates, &sessionv1.CommandUpdate{Update: &sessionv1.CommandUpdate_Result{Result: res}})
	for i, u := range updates {
		u.CommandId, u.UpdateSeq = cmd.GetId(), uint64(i+1)
	}
	if cmd.GetKind() == sessionv1.KindExec && delay > 0 {
		// Accepted and running now, the rest after the delay.
		for _, u := range updates[:2] {
			if err := send(u); err != nil {
				return
			}
		}
		time.AfterFunc(delay, func() {
			res.FinishedAt = timestamppb.Now()
			for _, u := range updates[2:] {
				if err := send(u); err != nil {
					return
				}
			}
		})
		return
	}
	for _, u := range updates {
		if err := send(u); err != nil {
			return
		}
	}
}

func (c *commands) HandleCancel(context.Context, *sessionv1.Cancel) {}

func (c *commands) run(cmd *sessionv1.Command) *sessionv1.CommandResult {
	res := &sessionv1.CommandResult{CommandId: cmd.GetId(), State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED, FinishedAt: timestamppb.Now()}
	switch cmd.GetKind() {
	case sessionv1.KindExec:
		if len(cmd.GetExec().GetArgv()) == 0 {
			res.State, res.ExitCode, res.Error = sessionv1.CommandState_COMMAND_STATE_FAILED, -1, "exec without argv"
		}
	case sessionv1.KindInventoryRefresh:
		_ = c.d.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Inventory{Inventory: c.d.CurrentInventory()}})
	case sessionv1.KindUpgrade, sessionv1.KindRollback:
		return c.d.releaseCommand(cmd)
	case sessionv1.KindGPUReset, sessionv1.KindReboot, sessionv1.KindDrain, sessionv1.KindGPUDiag:
		return c.d.recoveryResult(cmd)
	default:
		res.State, res.ExitCode, res.Error = sessionv1.CommandState_COMMAND_STATE_FAILED, -1, "unsupported command kind "+cmd.GetKind()
	}
	return res
}
