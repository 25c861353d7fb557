package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/bcd/executor"
	"github.com/better-compute/better-compute/bcd/helper"
	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/sdnotify"
	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/upgrade"
	"github.com/better-compute/better-compute/installer/manifest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// upgradeFlags are bcd node's self-upgrade settings.
type upgradeFlags struct {
	pinsFile        string
	downloadsURL    string
	healthTimeout   time.Duration
	crashLoopStarts int
	crashLoopWindow time.Duration
}

func addUpgradeFlags(cmd *cobra.Command, f *upgradeFlags) {
	fl := cmd.Flags()
	fl.StringVar(&f.pinsFile, "release-pins-file", upgrade.DefaultPinsFile, "pinned release keys (one sha256/... pin a line) that upgrades verify against")
	fl.StringVar(&f.downloadsURL, "downloads-url", "", "downloads route for upgrade commands that name none, e.g. https://compute.example.com/api/downloads")
	fl.DurationVar(&f.healthTimeout, "upgrade-health-timeout", upgrade.DefaultHealthTimeout, "how long an upgraded bcd has to reach a gateway before the previous one is restored")
	fl.IntVar(&f.crashLoopStarts, "upgrade-crash-loop-starts", upgrade.DefaultCrashLoopStarts, "how many starts of an upgraded bcd may end in an exit within --upgrade-crash-loop-window of the upgrade before the previous one is restored")
	fl.DurationVar(&f.crashLoopWindow, "upgrade-crash-loop-window", upgrade.DefaultCrashLoopWindow, "how long after an upgrade the new bcd's exits count towards a crash loop")
}

// nodeUpgrade is the node's Upgrader and what the node does for it: the
// probation timer after an upgrade and the restart. Its methods are safe on
// a nil *nodeUpgrade (bcd then runs without self-upgrade).
type nodeUpgrade struct {
	up        *upgrade.Upgrader
	probation bool
	// stop stops the agent with a cause; set before the agent runs.
	stop context.CancelCauseFunc
}

// startUpgrade makes the node's Upgrader and finishes or rolls back an
// upgrade the previous process began (Resume). It returns nil, after
// logging why, when bcd cannot upgrade itself here.
func startUpgrade(ctx context.Context, log *slog.Logger, f *nodeFlags) (*nodeUpgrade, error) {
	if f.upgrade.healthTimeout <= 0 {
		return nil, usagef("--upgrade-health-timeout must be positive")
	}
	if f.upgrade.crashLoopStarts < 1 || f.upgrade.crashLoopStarts > 100 {
		return nil, usagef("--upgrade-crash-loop-starts must be between 1 and 100")
	}
	if f.upgrade.crashLoopWindow <= 0 {
		return nil, usagef("--upgrade-crash-loop-window must be positive")
	}
	n := &nodeUpgrade{}
	cfg := upgrade.Config{
		Version: bcdVersion(), DataDir: f.dataDir, PinsFile: f.upgrade.pinsFile, BaseURL: f.upgrade.downloadsURL,
		HealthTimeout: f.upgrade.healthTimeout, Logger: log,
		CrashLoopStarts: f.upgrade.crashLoopStarts, CrashLoopWindow: f.upgrade.crashLoopWindow,
		Restart: func() { n.stop(upgrade.ErrRestart) },
	}
	if f.unprivileged {
		cfg.Installer = &helper.Client{Socket: f.helperSocket}
	}
	up, err := upgrade.New(cfg)
	if err != nil {
		log.WarnContext(ctx, "Self-upgrade is off", logkey.Err, err)
		return nil, nil
	}
	n.up = up
	// Resume may roll back and restart into the previous binary; it
	// returns only when this process goes on.
	n.probation, err = up.Resume(ctx)
	if err != nil {
		return nil, err
	}
	return n, nil
}

// upgrader is what the agent runs upgrade commands with.
func (n *nodeUpgrade) upgrader() executor.Upgrader {
	if n == nil {
		return nil
	}
	return n.up
}

// stopped tells the Upgrader that bcd stops cleanly (on a signal).
func (n *nodeUpgrade) stopped() {
	if n != nil {
		n.up.Stopped()
	}
}

// connected tells the Upgrader about a Welcome.
func (n *nodeUpgrade) connected() {
	if n != nil {
		n.up.Connected()
	}
}

// watch stops the agent with cause ErrUnhealthy when bcd, on probation
// after an upgrade, reaches no gateway within the health timeout.
func (n *nodeUpgrade) watch(ctx context.Context) {
	if n == nil || !n.probation {
		return
	}
	t := time.NewTimer(n.up.HealthTimeout())
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
		if !n.up.IsConnected() {
			n.stop(upgrade.ErrUnhealthy)
		}
	}
}

// finish runs after the agent stopped with cause: for an upgrade's restart
// or a failed probation it replaces the process (so returns only on
// failure); for anything else it returns nil at once.
func (n *nodeUpgrade) finish(ctx context.Context, cause error, notify *sdnotify.Notifier) error {
	if n == nil || !errors.Is(cause, upgrade.ErrRestart) && !errors.Is(cause, upgrade.ErrUnhealthy) {
		return nil
	}
	// The unit's watchdog keeps being fed while the new binary is tried.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = notify.Watchdog(wctx) }()
	var err error
	if errors.Is(cause, upgrade.ErrRestart) {
		notify.Status("upgrading: trying the new bcd")
		err = n.up.Handover(ctx)
	} else {
		notify.Status("upgrade failed: restoring the previous bcd")
		err = n.up.RollBack(ctx, fmt.Sprintf("it reached no gateway within %v", n.up.HealthTimeout()))
	}
	if ctx.Err() != nil {
		return nil // stopped by a signal: the next start finishes it (Resume)
	}
	return err
}

// runTrial is `bcd node` as an upgrade's trial (upgrade.TrialEnv): it
// connects once with the node's identity and, on the first Welcome, reports
// its version to the bcd that started it and exits. It runs no commands:
// the gateway delivers them again to the restarted bcd.
func runTrial(ctx context.Context, log *slog.Logger, store *identity.Store, id *identity.Identity) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var reported atomic.Bool
	errc := make(chan error, 1)
	client, err := session.New(session.Config{
		Gateways: id.Gateways,
		// The gateways known so far, so that the Welcome's list merges
		// into them instead of replacing them in identity.json.
		KnownGateways: id.KnownGateways,
		Trust:         id.Trust(),
		Key:           id.Key,
		Chain:         id.Chain,
		RenewAfter:    id.RenewAfter,
		Identity:      identity.NewKeeper(store, id),
		BCDVersion:    bcdVersion(),
		BootID:        readLine(bootIDFile),
		Handler:       ignoreCommands{},
		StartJitter:   -1,
		OnEvent: func(ev session.Event) {
			if ev.Kind == session.EventConnected && reported.CompareAndSwap(false, true) {
				errc <- upgrade.ReportTrial(bcdVersion())
				cancel()
			}
		},
		Logger: log,
	})
	if err != nil {
		return err
	}
	log.InfoContext(ctx, "Upgrade trial: connecting once", "version", bcdVersion())
	if err := client.Run(ctx); err != nil {
		return err
	}
	if !reported.Load() {
		return errors.New("upgrade trial stopped before a gateway answered")
	}
	if err := <-errc; err != nil {
		return err
	}
	log.InfoContext(ctx, "Upgrade trial: a gateway answered", "version", bcdVersion())
	return nil
}

// ignoreCommands is the trial's Handler: commands wait for the restarted
// bcd, which gets them again.
type ignoreCommands struct{}

func (ignoreCommands) HandleCommand(context.Context, *sessionv1.Command, func(*sessionv1.CommandUpdate) error) {
}

func (ignoreCommands) HandleCancel(context.Context, *sessionv1.Cancel) {}

// pinKeeper applies the release pin statements the session receives to
// the pin file (session.ReleasePinKeeper): itself when bcd runs as root,
// through the root helper's pins.apply when unprivileged.
type pinKeeper struct {
	file   string
	helper *helper.Client
}

// ApplyPinStatement verifies and applies one statement; a replayed one is
// not an error. One already in effect (an add of a pin the file holds, a
// remove of one it lacks) is skipped unverified: it would change nothing,
// and its signer may be a key removed since (the gateway resends every
// statement on every session).
func (k *pinKeeper) ApplyPinStatement(ctx context.Context, statement, sig []byte) error {
	if st, err := manifest.ParsePinStatement(statement); err == nil {
		if pins, err := upgrade.ReadPins(k.file); err == nil && slices.Contains(pins, st.Pin) == (st.Action == manifest.PinAdd) {
			return nil
		}
	}
	if k.helper != nil {
		_, err := k.helper.ApplyPinStatement(ctx, statement, sig)
		return err
	}
	_, err := upgrade.ApplyPinStatement(k.file, statement, sig)
	return err
}

// HeldPins reads the pins of the file.
func (k *pinKeeper) HeldPins(context.Context) ([]string, error) { return upgrade.ReadPins(k.file) }

// pinKeeper is the node's keeper of release pins, nil (no release.pins
// capability) when bcd cannot upgrade itself here or its pin file cannot
// be read: with no pin, no statement could verify.
func (n *nodeUpgrade) pinKeeper(ctx context.Context, log *slog.Logger, f *nodeFlags) session.ReleasePinKeeper {
	if n == nil {
		return nil
	}
	if _, err := upgrade.ReadPins(f.upgrade.pinsFile); err != nil {
		log.InfoContext(ctx, "Release pin statements are not applied here", logkey.Err, err)
		return nil
	}
	k := &pinKeeper{file: f.upgrade.pinsFile}
	if f.unprivileged {
		k.helper = &helper.Client{Socket: f.helperSocket}
	}
	return k
}
