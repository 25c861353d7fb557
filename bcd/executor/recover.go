package executor

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/journal"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// DefaultKillGrace is Config.KillGrace's default.
const DefaultKillGrace = 5 * time.Second

// Errors of the commands an earlier bcd accepted and did not finish.
const (
	msgRestarted   = "bcd restarted while the command ran; it may have partly run"
	msgGroupEnded  = "bcd restarted while the command ran; the process group it left behind was ended; it may have partly run"
	msgRebooted    = "the node rebooted while the command ran; it may have partly run"
	msgUnknownBoot = "bcd restarted while the command ran and cannot tell whether the node rebooted (no boot id); it may have partly run"
)

// verdict is what recovery makes of an unfinished record.
type verdict struct {
	result   *sessionv1.CommandResult // how it ended, when known now
	endGroup int                      // else: end this process group, then report msgGroupEnded
}

// judge applies the rules for a command an earlier bcd accepted and did not
// finish (docs/bcd.md, "Commands across restarts"):
//   - another boot: a reboot command succeeded; anything else was ended by
//     the reboot;
//   - the same boot, and the process group it ran in still has live members,
//     whose leader, if still there, has the recorded start time: the group
//     was left behind and is ended;
//   - otherwise it is gone, or its pid now belongs to another process,
//     which is left alone.
//
// A pid is never reused while a process group of that number exists (the
// kernel keeps the number until the last member is reaped), so a group whose
// leader has exited but whose members live is still the recorded one; a
// leader with another start time is a new process that reused the pid.
func (e *Executor) judge(r journal.Record) verdict {
	switch {
	case r.BootID == "" || e.bootID == "":
		return verdict{result: lost(msgUnknownBoot)}
	// A reboot command's record is how bcd knows, after the reboot, that
	// it is done: one accepted in an earlier boot succeeded.
	case r.BootID != e.bootID && r.Kind == sessionv1.KindReboot:
		detail, _ := json.Marshal(map[string]string{"boot_id_before": r.BootID, "boot_id_after": e.bootID})
		return verdict{result: &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED, DetailJson: detail}}
	case r.BootID != e.bootID:
		return verdict{result: lost(msgRebooted)}
	case r.PGID <= 1:
		return verdict{result: lost(msgRestarted)}
	}
	start, err := e.proc.StartTime(r.PGID)
	switch {
	case err == nil && start != r.StartTicks:
		e.log.Info("A command's pid belongs to another process now; leaving it alone",
			logkey.CommandID, r.ID, attrPGID, r.PGID)
		return verdict{result: lost(msgRestarted)}
	case err != nil && !errors.Is(err, os.ErrNotExist):
		e.log.Warn("Could not read a command's process; leaving it alone", logkey.CommandID, r.ID, attrPGID, r.PGID, logkey.Err, err)
		return verdict{result: lost(msgRestarted)}
	}
	alive, err := e.proc.GroupAlive(r.PGID)
	if err != nil {
		e.log.Warn("Could not read a command's process group; leaving it alone", logkey.CommandID, r.ID, attrPGID, r.PGID, logkey.Err, err)
		return verdict{result: lost(msgRestarted)}
	}
	if !alive {
		return verdict{result: lost(msgRestarted)}
	}
	return verdict{endGroup: r.PGID}
}

// recoverRecords turns the journal's records into entries: finished ones
// answer redeliveries (and go into the next Hello when undelivered), handed
// over ones go to the Upgrader again, and unfinished ones are judged.
func (e *Executor) recoverRecords(recs []journal.Record) {
	type job struct {
		en *entry
		v  verdict
	}
	var jobs []job
	e.mu.Lock()
	for _, r := range recs {
		en := &entry{id: r.ID, kind: r.Kind, u: &updater{id: r.ID, transmit: noSession}}
		e.seen[r.ID] = e.order.PushBack(en)
		switch {
		case r.Result != nil:
			en.result, en.delivered = r.Result, r.Delivered
			if !r.Delivered {
				e.pending = append(e.pending, r.Result)
			}
		case r.HandedOver:
			en.handover = true
		default:
			v := e.judge(r)
			if v.result == nil {
				// Running until its group is ended: a redelivery
				// meanwhile moves its result to the session it came on.
				en.cancel = func() {}
			}
			jobs = append(jobs, job{en, v})
		}
	}
	e.mu.Unlock()
	for _, jb := range jobs {
		en, v := jb.en, jb.v
		if v.result != nil {
			e.log.Warn("A command was left unfinished by an earlier bcd", logkey.CommandID, en.id, attrKind, en.kind,
				attrState, v.result.GetState().String(), attrReason, v.result.GetError())
			e.finish(en, v.result)
			continue
		}
		e.wg.Go(func() {
			e.log.Warn("Ending the process group a command left behind", logkey.CommandID, en.id, attrPGID, v.endGroup)
			res := lost(msgGroupEnded)
			if err := e.endGroup(v.endGroup); err != nil {
				res = lost(fmt.Sprintf("bcd restarted while the command ran; the process group it left behind could not be ended: %v", err))
				e.log.Error("Could not end the process group a command left behind", logkey.CommandID, en.id, attrPGID, v.endGroup, logkey.Err, err)
			}
			e.finish(en, res)
		})
	}
}

// endGroup sends the group SIGTERM and, when members are still there after
// KillGrace, SIGKILL.
func (e *Executor) endGroup(pgid int) error {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if err := e.proc.KillGroup(pgid, sig); errors.Is(err, syscall.ESRCH) {
			return nil
		} else if err != nil {
			return fmt.Errorf("send %v to process group %d: %w", sig, pgid, err)
		}
		if gone, err := e.waitGone(pgid); err != nil || gone {
			return err
		}
	}
	return fmt.Errorf("process group %d still has members %v after SIGKILL", pgid, e.cfg.KillGrace)
}

// waitGone waits up to KillGrace for process group pgid to have no live
// member.
func (e *Executor) waitGone(pgid int) (bool, error) {
	deadline := time.NewTimer(e.cfg.KillGrace)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		alive, err := e.proc.GroupAlive(pgid)
		if err != nil || !alive {
			return !alive, err
		}
		select {
		case <-deadline.C:
			return false, nil
		case <-tick.C:
		}
	}
}

// noSession is the transmit of recovered commands until their redelivery.
func noSession(*sessionv1.CommandUpdate) error { return errNoSession }

var errNoSession = errors.New("no session yet")

func lost(msg string) *sessionv1.CommandResult {
	return &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_LOST, ExitCode: -1, Error: msg,
		FinishedAt: timestamppb.Now()}
}
