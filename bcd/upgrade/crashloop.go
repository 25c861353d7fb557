package upgrade

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// The crash-loop watch (issue 30; DESIGN.md, "Memory and evidence": bcd
// rolls itself back from a crash loop after an upgrade on its own, with no
// control plane). The trial and the probation end at the new release's
// first Welcome; a release that connects and then exits, again and again,
// is caught here:
//
//   - The first Welcome after an upgrade (Connected) writes watchFile: the
//     versions, when the upgrade began, and the starts of the new release
//     so far (1, the start that connected).
//   - Every later start (Resume) of that release within CrashLoopWindow of
//     the upgrade counts one more start in watchFile: the one before it
//     ended in an exit. A start that Stopped marks as a clean stop (a
//     signal, systemctl stop or restart) does not count.
//   - The start that finds CrashLoopStarts starts already counted restores
//     <binary>.prev through the Installer (the root helper on an
//     unprivileged node), writes reportFile and restarts into it.
//   - The restored bcd sends reportFile in every Hello (LocalRollback) until
//     a Welcome answers one; the control plane records it as the event
//     node.rolled-back-locally.
//
// The watch ends (watchFile removed) once the window has passed, when
// another binary runs, or by the rollback itself.

// Defaults of the crash-loop watch.
const (
	// DefaultCrashLoopStarts is how many starts of a new release that end
	// in an exit within the window roll it back.
	DefaultCrashLoopStarts = 3
	// DefaultCrashLoopWindow is how long after an upgrade its release's
	// exits count.
	DefaultCrashLoopWindow = 10 * time.Minute
)

// Files of the crash-loop watch under DataDir/upgrade.
const (
	// watchFile counts the starts of the release an upgrade installed.
	watchFile = "watch.json"
	// reportFile is the rollback made after a crash loop, until a Welcome
	// answers the Hello that carried it.
	reportFile = "local-rollback.json"
)

// watch is watchFile's content.
type watch struct {
	// From and To are the versions before and after the upgrade.
	From string `json:"from"`
	To   string `json:"to"`
	// Since is when the upgrade began; the window runs from it.
	Since time.Time `json:"since"`
	// Starts counts the starts of To since the upgrade, this one included.
	Starts int `json:"starts"`
	// CleanStop is set when the last start stopped on a signal: the next
	// start does not count it.
	CleanStop bool `json:"clean_stop,omitempty"`
}

// report is reportFile's content.
type report struct {
	From   string    `json:"from"`
	To     string    `json:"to"`
	Reason string    `json:"reason"`
	Starts int       `json:"starts"`
	At     time.Time `json:"at"`
}

// startWatch begins the crash-loop watch of the release m installed, from
// its first Welcome.
func (u *Upgrader) startWatch(m *Marker) {
	w := &watch{From: m.From, To: m.To, Since: m.CreatedAt, Starts: max(m.Starts, 1)}
	if err := writeJSON(u.files.path(watchFile), w); err != nil {
		u.log.Warn("Could not start watching the new release for a crash loop", logkey.Err, err)
	}
}

// resumeWatch counts this start in the crash-loop watch and, when it is
// one too many, rolls back and restarts into the previous binary
// (returning only on failure). It is part of Resume.
func (u *Upgrader) resumeWatch(ctx context.Context) error {
	var w watch
	err := readJSON(u.files.path(watchFile), &w)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		u.log.WarnContext(ctx, "Unreadable crash-loop watch removed", logkey.Err, err)
		return u.endWatch()
	}
	if w.To != u.cfg.Version || u.cfg.Now().Sub(w.Since) > u.cfg.CrashLoopWindow {
		return u.endWatch()
	}
	if !w.CleanStop {
		w.Starts++
	}
	w.CleanStop = false
	exits := w.Starts - 1 // every start before this one ended
	if exits < u.cfg.CrashLoopStarts {
		if err := writeJSON(u.files.path(watchFile), &w); err != nil {
			return fmt.Errorf("count the start after an upgrade: %w", err)
		}
		if exits > 0 {
			u.log.WarnContext(ctx, "The release an upgrade installed exited since it started", attrFrom, w.From, attrTo, w.To,
				"exits", exits, "limit", u.cfg.CrashLoopStarts, "window", u.cfg.CrashLoopWindow)
		}
		return nil
	}
	reason := fmt.Sprintf("%d starts of %s ended in an exit within %v of the upgrade", exits, w.To, u.cfg.CrashLoopWindow)
	u.log.ErrorContext(ctx, "The new bcd is crash-looping; rolling back", attrFrom, w.To, attrTo, w.From, attrReason, reason)
	if err := u.cfg.Installer.Rollback(ctx); err != nil {
		return fmt.Errorf("bcd %s crash-looped (%s) and %s could not be restored: %w", w.To, reason, w.From, err)
	}
	rep := &report{From: w.To, To: w.From, Reason: reason, Starts: exits, At: u.cfg.Now().UTC()}
	if err := writeJSON(u.files.path(reportFile), rep); err != nil {
		u.log.WarnContext(ctx, "Could not record the rollback for the control plane", logkey.Err, err)
	}
	// The restored binary is From; the one beside it is To.
	if err := writeJSON(u.files.path(previousFile), previous{Version: w.To}); err != nil {
		u.log.WarnContext(ctx, "Could not record the previous release", logkey.Err, err)
	}
	if err := u.endWatch(); err != nil {
		return err
	}
	return u.restart(ctx)
}

// endWatch removes the crash-loop watch.
func (u *Upgrader) endWatch() error {
	if err := os.Remove(u.files.path(watchFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the crash-loop watch: %w", err)
	}
	return nil
}

// Stopped is called when bcd stops on a signal (not by crashing or for an
// upgrade's restart): the next start does not count this one as an exit of
// a crash loop.
func (u *Upgrader) Stopped() {
	var w watch
	if err := readJSON(u.files.path(watchFile), &w); err != nil || w.To != u.cfg.Version {
		return
	}
	w.CleanStop = true
	if err := writeJSON(u.files.path(watchFile), &w); err != nil {
		u.log.Warn("Could not record the clean stop", logkey.Err, err)
	}
}

// LocalRollback returns the rollback this bcd made on its own after a
// crash loop that no Welcome has acknowledged yet, nil when there is none.
// The session sends it in Hello (session.Config.LocalRollback).
func (u *Upgrader) LocalRollback() *sessionv1.LocalRollback {
	var r report
	if err := readJSON(u.files.path(reportFile), &r); err != nil {
		return nil
	}
	return &sessionv1.LocalRollback{FromVersion: r.From, ToVersion: r.To, Reason: r.Reason, Starts: uint32(max(r.Starts, 0)),
		RolledBackAt: timestamppb.New(r.At)}
}

// ackLocalRollback removes the report once a Welcome answered a Hello that
// carried it.
func (u *Upgrader) ackLocalRollback() {
	if err := os.Remove(u.files.path(reportFile)); err == nil {
		u.log.Info("The control plane has the report of the rollback after a crash loop")
	}
}
