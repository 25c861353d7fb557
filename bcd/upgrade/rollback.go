package upgrade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// The "rollback" command (a rollout's halt; issue 20): bcd restores the
// release it kept beside the current one, <binary>.prev, with no download,
// so a rollback works when the old release is gone from the server. Every
// upgrade keeps the running binary as <binary>.prev (Swap), and a
// completed upgrade records that binary's version (previousFile), so the
// rollback knows what it goes back to.
//
// Like an upgrade it finishes across a restart: Rollback writes the marker
// (state restored) and the command's record, restores <binary>.prev with
// the Installer, and asks the node to restart; Handover then re-executes
// the restored binary without a trial (it ran here before), and that bcd
// answers the command's redelivery from the record.

// previousFile records the version of <binary>.prev, written when an
// upgrade completes (Connected).
const previousFile = "previous.json"

// stateRestored: a rollback command restored <binary>.prev; bcd restarts
// into it without a trial.
const stateRestored = "restored"

// previous is previousFile's content.
type previous struct {
	Version string `json:"version"`
}

// PreviousVersion returns the version of the binary kept beside the
// installed one, "" when unknown (no upgrade completed under this data
// directory).
func (u *Upgrader) PreviousVersion() string {
	var p previous
	if err := readJSON(u.files.path(previousFile), &p); err != nil {
		return ""
	}
	return p.Version
}

// Rollback runs a "rollback" command (executor.Rollbacker). It returns the
// command's result, or nil once it has restored the previous binary and
// asked the node to restart; the restarted bcd answers the redelivery from
// the record. Refused with one clear line: no previous binary kept, another
// upgrade or rollback in progress, a bcd that cannot restart itself.
func (u *Upgrader) Rollback(ctx context.Context, cmd *sessionv1.Command) *sessionv1.CommandResult {
	if r, err := u.files.readRecord(); err == nil && r.CommandID == cmd.GetId() {
		return r.result()
	}
	if !u.busy.CompareAndSwap(false, true) {
		return failed("another upgrade or rollback is in progress on this node")
	}
	res := u.rollback(ctx, cmd)
	if res != nil {
		u.busy.Store(false)
	}
	return res
}

func (u *Upgrader) rollback(ctx context.Context, cmd *sessionv1.Command) *sessionv1.CommandResult {
	prev := u.cfg.Target + PrevSuffix
	if fi, err := os.Lstat(prev); err != nil || !fi.Mode().IsRegular() {
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return failed(fmt.Sprintf("rollback: no previous bcd is kept at %s (bcd keeps one from its first upgrade on)", prev))
		}
		return failed(fmt.Sprintf("rollback: %v", err))
	}
	to := u.PreviousVersion()
	if to != "" && to == u.cfg.Version {
		return succeeded(Detail{From: u.cfg.Version, To: to, RolledBack: true})
	}
	if u.cfg.Restart == nil {
		return failed("this bcd cannot restart itself, so it cannot roll back")
	}
	log := u.log.With(logkey.CommandID, cmd.GetId(), attrFrom, u.cfg.Version, attrTo, to)
	log.InfoContext(ctx, "Rolling bcd back to the release kept beside it", attrPath, prev)
	m := &Marker{CommandID: cmd.GetId(), From: u.cfg.Version, To: to, Target: u.cfg.Target, State: stateRestored,
		Reason: "rollback command", CreatedAt: u.cfg.Now().UTC()}
	if err := u.files.writeMarker(m); err != nil {
		return failed(fmt.Sprintf("rollback: %v", err))
	}
	if err := u.cfg.Installer.Rollback(ctx); err != nil {
		_ = u.files.removeMarker()
		return failed(fmt.Sprintf("rollback: restore %s: %v", prev, err))
	}
	detail, _ := json.Marshal(Detail{From: u.cfg.Version, To: to, RolledBack: true})
	if err := u.files.writeRecord(&record{CommandID: cmd.GetId(), Succeeded: true, Detail: detail, Finished: u.cfg.Now().UTC()}); err != nil {
		// The binary is restored; the restart must still happen, and the
		// redelivery then runs the command again (a no-op restore).
		log.WarnContext(ctx, "Could not record the rollback", logkey.Err, err)
	}
	log.InfoContext(ctx, "Restored the previous bcd; restarting into it")
	u.cfg.Restart()
	return nil
}
