package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/better-compute/better-compute/bcd/agent"
	"github.com/better-compute/better-compute/bcd/bmc"
	"github.com/better-compute/better-compute/bcd/cmduser"
	"github.com/better-compute/better-compute/bcd/helper"
	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/ib"
	"github.com/better-compute/better-compute/bcd/plugin"
	"github.com/better-compute/better-compute/bcd/sdnotify"
	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/upgrade"
)

// testGPUs, set only by the nvmlmock test build (nvmlmock.go), gives bcd
// node its GPUs and kernel log instead of the system's: go-nvml's mock DGX
// A100 and XIDs raised by the test (docs/gpu-health.md, "Test hook"). Nil in
// production builds.
var testGPUs func(ctx context.Context, log *slog.Logger, dataDir string) (*gpu.Collector, gpu.KernelLog, error)

// testClock, set only by the clockshift test build (clockshift.go), is
// this machine's wall clock off by the test's offset, for tests of a
// machine whose clock is wrong (issue 36). Nil in production builds: the
// system clock.
var testClock session.Clock

// testCrash, set only by the crashafter test build (crashafter.go), makes
// bcd node exit some time after it starts.
var testCrash func(ctx context.Context, log *slog.Logger)

// wallNow is this machine's wall clock: the system's, or the clockshift
// test build's.
func wallNow() time.Time {
	if testClock != nil {
		return testClock.Now()
	}
	return time.Now()
}

type nodeFlags struct {
	dataDir      string
	logLevel     string
	unprivileged bool
	helperSocket string
	rescan       time.Duration
	upgrade      upgradeFlags
	bmcFile      string
	pluginDir    string
	commandUser  string
	sysfsRoot    string
}

func newNodeCmd(e env) *cobra.Command {
	var f nodeFlags
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run the node agent: session, inventory, GPU events and commands",
		Long: `Node loads the identity bcd join wrote, scans the machine (CPU, memory, disks,
NICs, DMI, and GPUs through NVML when a driver is present), connects to a
gateway of the node's region and holds the session until SIGINT or SIGTERM:
heartbeats, certificate renewal, reconnection with backoff and failover, the
inventory after each connect and whenever the machine changes (re-scanned
every --inventory-interval), GPU XID events as they happen, and the commands
the gateway sends.

Commands and shells that do not ask for root run as --command-user (bcd-cmd),
never as root and never as the user bcd runs as; their HOME is home/ in the
data directory. A root bcd creates that user when it is missing.

With --unprivileged, bcd runs as a plain user and asks the root helper (bcd
helper) on --helper-socket to start every command and shell: as its command
user, or as root under a grant bound to the command; without a running helper
those commands fail and say so.

Under systemd it sends READY=1 after the first session is established,
STATUS= lines ("connected to <gateway> since <time>", "disconnected since
<time>: <last error>; certificate valid until <time>") and WATCHDOG=1 pings when
the unit sets WatchdogSec=, disconnected or not. It keeps its state in
<data-dir>/state.json for bcd status and bcd doctor.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return node(cmd.Context(), e, &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dataDir, "data-dir", identity.DefaultDir, "directory holding the node's identity")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fl.BoolVar(&f.unprivileged, "unprivileged", false, "run as a plain user: commands that need root go to the root helper")
	fl.StringVar(&f.helperSocket, "helper-socket", helper.DefaultSocket, "Unix socket of the root helper (with --unprivileged)")
	fl.DurationVar(&f.rescan, "inventory-interval", agent.DefaultRescanInterval, "how often the machine is scanned again for changes")
	addUpgradeFlags(cmd, &f.upgrade)
	fl.StringVar(&f.bmcFile, "bmc-file", bmc.DefaultFile, "root-only file of BMC addresses and credentials (without --unprivileged; the helper has its own)")
	fl.StringVar(&f.pluginDir, "plugin-dir", plugin.DefaultDir, "directory of bcx-<name> plugins (without --unprivileged; the helper has its own)")
	fl.StringVar(&f.sysfsRoot, "sysfs-root", "/sys", "the sysfs root the InfiniBand/RoCE ports are read under (class/infiniband); tests point it at a fixture tree")
	fl.StringVar(&f.commandUser, "command-user", cmduser.DefaultName, "the user commands and shells without as_root run as (created when missing; with --unprivileged the helper's --command-user counts)")
	return cmd
}

func node(ctx context.Context, e env, f *nodeFlags) error {
	log, err := newLogger(e.stderr, f.logLevel)
	if err != nil {
		return err
	}
	if f.rescan <= 0 {
		return usagef("--inventory-interval must be positive")
	}
	if f.dataDir == "" {
		return usagef("--data-dir must not be empty")
	}
	if f.sysfsRoot == "" {
		return usagef("--sysfs-root must not be empty")
	}
	if fi, err := os.Stat(f.sysfsRoot); err != nil || !fi.IsDir() {
		// A typo would read as a host without InfiniBand ports.
		return usagef("--sysfs-root %s: not a directory (want the sysfs root, /sys, or a fixture tree with class/infiniband)", f.sysfsRoot)
	}
	store := identity.NewStore(f.dataDir)
	id, err := store.Load()
	if errors.Is(err, identity.ErrNotJoined) {
		return fmt.Errorf("%w: no identity in %s: run bcd join first", identity.ErrNotJoined, store.Dir())
	}
	if err != nil {
		return err
	}
	log = log.With(logkey.NodeID, id.NodeID)
	if upgrade.InTrial() {
		// A trial runs beside the bcd that started it, which holds the lock.
		return runTrial(ctx, log, store, id)
	}
	release, err := store.Lock()
	switch {
	case errors.Is(err, identity.ErrInUse):
		return err
	case err != nil:
		// A data directory this user cannot write (renewals will say so
		// too) does not stop the agent; it only loses the guard.
		log.WarnContext(ctx, "Data directory not locked; a second bcd node on it would not be refused", logkey.Err, err)
	default:
		defer release()
	}
	cu, err := commandUser(ctx, log, e, f)
	if err != nil {
		return err
	}
	up, err := startUpgrade(ctx, log, f)
	if err != nil {
		return err
	}
	notify := sdnotify.New(log)

	// Production builds read the system's NVML and kernel log (nil: the
	// agent's defaults); the nvmlmock test build, go-nvml's mock.
	var gpus *gpu.Collector
	var kernelLog gpu.KernelLog
	if testGPUs != nil {
		if gpus, kernelLog, err = testGPUs(ctx, log, f.dataDir); err != nil {
			return err
		}
	}

	a, err := agent.New(agent.Config{
		Session: session.Config{
			Gateways:      id.Gateways,
			Trust:         id.Trust(),
			Key:           id.Key,
			Chain:         id.Chain,
			RenewAfter:    id.RenewAfter,
			ReattestGrace: id.ReattestGrace,
			KnownGateways: id.KnownGateways,
			JoinFlags:     rejoinFlags(store.Dir()),
			Identity:      identity.NewKeeper(store, id),
			BCDVersion:    bcdVersion(),
			BootID:        readLine(bootIDFile),
			OnEvent: func(ev session.Event) {
				if ev.Kind == session.EventConnected {
					notify.Ready()
					up.connected()
				}
			},
			ReleasePins: up.pinKeeper(ctx, log, f),
			Clock:       testClock,
			Logger:      log,
		},
		Unprivileged:   f.unprivileged,
		HelperSocket:   f.helperSocket,
		CommandUser:    cu,
		CommandHome:    cmduser.Home(f.dataDir),
		RescanInterval: f.rescan,
		GPU:            gpus,
		IB:             ib.New(ib.Config{SysFS: os.DirFS(f.sysfsRoot)}),
		KernelLog:      kernelLog,
		Upgrader:       up.upgrader(),
		BMC:            agent.BMCConfig{NodeID: id.NodeID, File: f.bmcFile, PluginDir: f.pluginDir},
		StateDir:       f.dataDir,
		Notifier:       notify,
		Logger:         log,
	})
	if err != nil {
		return err
	}
	trustedBy := "CA file"
	if id.GatewayPin != "" {
		trustedBy = "pin " + id.GatewayPin
	}
	log.InfoContext(ctx, "Starting node agent", "version", bcdVersion(), "spiffe_id", id.SPIFFEID,
		"gateways", id.Gateways, "gateway_trust", trustedBy, "cert_not_after", id.NotAfter(),
		"unprivileged", f.unprivileged, "uid", os.Geteuid())

	if testCrash != nil {
		testCrash(ctx, log)
	}
	g, gctx := errgroup.WithContext(ctx)
	gctx, stop := context.WithCancelCause(gctx)
	if up != nil {
		up.stop = stop
	}
	g.Go(func() error {
		defer stop(nil)
		return a.Run(gctx)
	})
	g.Go(func() error { return notify.Watchdog(gctx) })
	g.Go(func() error {
		up.watch(gctx)
		return nil
	})
	err = g.Wait()
	if err == nil {
		// An upgrade's restart replaces the process; finish returns only
		// when it failed.
		err = up.finish(ctx, context.Cause(gctx), notify)
	}
	if err == nil && ctx.Err() != nil {
		up.stopped() // a signal: not an exit of a crash loop
	}
	notify.Stopping()
	switch {
	case errors.Is(err, session.ErrRevoked):
		return fmt.Errorf("%w; revocation is final: a revoked node comes back only with a token from better-compute nodes reinstall NODE (an admin's), "+
			"as a new node (bcd join --force with that token, then systemctl restart bcd); a deleted node's machine joins as a new node with a new token", err)
	case err != nil:
		return err
	}
	log.InfoContext(ctx, "Node agent stopped")
	return nil
}

// commandUser readies the command user for a root bcd: it creates the
// user when missing (and says so), checks it is neither root nor bcd's own
// uid, and makes its HOME in the data directory, which it lets the user
// pass through. An unprivileged bcd only opens its data directory: the
// helper starts the commands as its own command user. A bcd that is
// neither root nor unprivileged starts no command or shell without as_root
// (nil).
func commandUser(ctx context.Context, log *slog.Logger, e env, f *nodeFlags) (*cmduser.User, error) {
	if f.commandUser == "" {
		return nil, usagef("--command-user must not be empty")
	}
	home := cmduser.Home(f.dataDir)
	euid := e.geteuid()
	if f.unprivileged || euid != 0 {
		if err := cmduser.OpenDataDir(f.dataDir); err != nil {
			log.WarnContext(ctx, "Commands may not reach their home", logkey.Err, err)
		}
		if !f.unprivileged {
			log.WarnContext(ctx, "bcd runs neither as root nor with --unprivileged: commands and shells without as_root are refused, since they never run as bcd's own user",
				"uid", euid)
		}
		return nil, nil
	}
	u, created, err := cmduser.Ensure(ctx, f.commandUser, home)
	if err != nil {
		return nil, err
	}
	if created {
		log.InfoContext(ctx, "Created the command user", logkey.CommandUser, u.Name, "uid", u.UID, "gid", u.GID)
	}
	if err := u.Check(uint32(euid)); err != nil {
		return nil, usagef("%v", err)
	}
	if err := cmduser.OpenDataDir(f.dataDir); err != nil {
		return nil, err
	}
	if err := cmduser.MakeHome(home, u); err != nil {
		return nil, err
	}
	if err := cmduser.Reachable(home, u); err != nil {
		log.WarnContext(ctx, "Commands cannot reach their home: they will fail to start", logkey.Err, err)
	}
	log.InfoContext(ctx, "Commands run as the command user", logkey.CommandUser, u.Name, "uid", u.UID, "home", home)
	return &u, nil
}

// rejoinFlags are the flags a printed `bcd join` needs to join into dataDir.
func rejoinFlags(dataDir string) string {
	if dataDir == identity.DefaultDir {
		return ""
	}
	return "--data-dir " + dataDir
}
