package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/better-compute/better-compute/bcd/cmduser"
	"github.com/better-compute/better-compute/bcd/executor"
	"github.com/better-compute/better-compute/bcd/helper"
	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/inventory"
	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/ib"
	"github.com/better-compute/better-compute/bcd/inventory/seen"
	"github.com/better-compute/better-compute/bcd/journal"
	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/tunnel"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Defaults of Config.
const (
	// DefaultRescanInterval is how often the host is scanned again.
	DefaultRescanInterval = 5 * time.Minute
	// MaxPendingEvents is how many GPU events are kept while there is no
	// session; older ones are dropped first.
	MaxPendingEvents = 64
	// helperCheckTimeout bounds the start-up check of the root helper.
	helperCheckTimeout = 5 * time.Second
)

// Log attribute keys of this package.
const (
	attrDigest       = "inventory_digest"
	attrReason       = "reason"
	attrGPUs         = "gpus"
	attrGPUStatus    = "gpu_status"
	attrCapabilities = "capabilities"
	attrSocket       = "helper_socket"
	attrKind         = "kind"
	attrRetryIn      = "retry_in"
	attrTook         = "took"
	attrDropped      = "dropped"
	attrPath         = "path"
)

// Scanner reads the host's inventory; *inventory.Scanner implements it.
type Scanner interface {
	// Scan reads the inventory; it fails only when ctx is done.
	Scan(ctx context.Context) (*inventory.Host, error)
}

// Config configures an Agent. Zero values take the documented defaults.
type Config struct {
	// Session holds the session settings: the node's identity (Gateways,
	// Trust, Key, Chain, RenewAfter, and Identity that keeps what changes),
	// BCDVersion, timeouts and backoff, OnEvent, Logger and Clock. The
	// agent sets Handler, Tunnels, Capabilities and Reporter (the agent's
	// readings, and the Upgrader's local rollback when it reports one)
	// itself, and BootID when it is empty (from the scan). Required: see
	// session.Config.
	Session session.Config
	// Unprivileged sends commands that ask for root to the root helper at
	// HelperSocket instead of running them in this process. Defaults to
	// false: bcd runs them itself when it runs as root and refuses them
	// otherwise.
	Unprivileged bool
	// HelperSocket is the root helper's Unix socket. Defaults to
	// helper.DefaultSocket (/run/bcd/helper.sock).
	HelperSocket string
	// CommandUser is the user that exec commands and shells without
	// as_root run as when bcd runs as root (package bcd/cmduser); when
	// Unprivileged the root helper starts them as its own command user.
	// When nil (and not Unprivileged) such commands and shells are
	// refused: none runs as root or as bcd's own uid.
	CommandUser *cmduser.User
	// CommandHome is CommandUser's HOME (cmduser.Home of the data
	// directory). Required with CommandUser.
	CommandHome string
	// RescanInterval is how often the host is scanned again to notice
	// changes. Defaults to DefaultRescanInterval (5 min).
	RescanInterval time.Duration
	// GPU reads GPUs for the scans and watches their XID and ECC events.
	// Defaults to a gpu.Collector on the system's NVML (nvml.New()); a host
	// without NVIDIA driver then reports no GPUs and why.
	GPU *gpu.Collector
	// IB reads and judges the InfiniBand/RoCE ports for the scans, and
	// the mlx5_core lines of the kernel log. Defaults to an ib.Monitor on
	// /sys.
	IB *ib.Monitor
	// Scanner reads the host. Defaults to inventory.NewScanner with GPU as
	// its GPU collector and IB as its InfiniBand collector.
	Scanner Scanner
	// KernelLog is where the NVRM Xid lines of the kernel log are read
	// from, on hosts with GPUs (gpu.Collector.WatchKernelLog). Defaults to
	// the root helper (its "kmsg.xid" operation) when Unprivileged, else
	// the kernel log device itself (gpu.DeviceLog, /dev/kmsg).
	KernelLog gpu.KernelLog
	// Plugins lists the plugins bcd runs, for the Inventory. Defaults to
	// PluginsIn(BMC.PluginDir): the bcx-* executables there, with their
	// --version answers.
	Plugins func() []*sessionv1.PluginInfo
	// Upgrader runs "upgrade" commands (*upgrade.Upgrader); with one the
	// agent offers sessionv1.CapabilityUpgrade, and CapabilityRollback when
	// it is an executor.Rollbacker. When it has a LocalRollback method
	// (*upgrade.Upgrader does), Hello reports the rollback it made by
	// itself after a crash loop. Defaults to none: they fail.
	Upgrader executor.Upgrader
	// BMC configures the BMC commands (power.*, boot.set); see BMCConfig.
	BMC BMCConfig
	// StateDir is where the agent keeps its state file (nodestate.File,
	// package bcd/nodestate), rewritten on every change of the connection
	// state and of the certificate, for bcd status and bcd doctor; the data
	// directory. The command journal (package bcd/journal, file
	// journal.File) is kept there too, so that commands survive bcd's
	// restarts without running twice. Defaults to "": no state file, and
	// commands are remembered in memory only.
	StateDir string
	// Notifier is told the one-line state (nodestate.State.Line) whenever
	// it changes, for systemd's STATUS=. Defaults to none.
	Notifier Notifier
	// Logger receives the agent's logs. Defaults to Session.Logger, else
	// discarding them.
	Logger *slog.Logger
}

// Agent is bcd's node agent. Create one with New and call Run once.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	clock   session.Clock
	exec    *executor.Executor
	journal *journal.Journal // nil without StateDir
	seen    *seen.Record     // the GPUs seen on this machine; nil without StateDir
	bmc     *bmcRunner
	gpu     *gpu.Collector
	ib      *ib.Monitor
	probe   *gpuProbe
	scanner Scanner
	client  atomic.Pointer[session.Client]
	running atomic.Bool
	state   *stateKeeper

	// kernelLog is Config.KernelLog with its default.
	kernelLog gpu.KernelLog

	connected  chan struct{}   // a Welcome arrived: send the inventory
	gpuChanged chan struct{}   // a GPU event arrived: scan again
	refresh    chan chan error // inventory.refresh: scan, send, answer

	digest atomic.Pointer[string]

	mu  sync.Mutex
	inv *sessionv1.Inventory // the latest scan

	evMu   sync.Mutex // serialises sending events, guards events
	events []*sessionv1.Event

	resMu   sync.Mutex
	unacked []*sessionv1.CommandResult // results in a Hello not yet answered by a Welcome
}

// New returns an Agent for cfg with its defaults filled in. It fails when
// cfg is invalid, including its session settings (errors wrapping
// session.ErrConfig).
func New(cfg Config) (*Agent, error) {
	cfg.RescanInterval = cmp.Or(cfg.RescanInterval, DefaultRescanInterval)
	if cfg.RescanInterval < 0 {
		return nil, fmt.Errorf("new agent: negative rescan interval %v", cfg.RescanInterval)
	}
	cfg.HelperSocket = cmp.Or(cfg.HelperSocket, helper.DefaultSocket)
	if cfg.Plugins == nil {
		cfg.Plugins = PluginsIn(cfg.BMC.PluginDir)
	}
	log := cmp.Or(cfg.Logger, cfg.Session.Logger, slog.New(slog.DiscardHandler))
	// The session client is made in Run, once the first scan has decided
	// the capabilities; this one only checks the settings early.
	if _, err := session.New(cfg.Session); err != nil {
		return nil, fmt.Errorf("new agent: %w", err)
	}
	a := &Agent{
		cfg:        cfg,
		log:        log,
		clock:      cmp.Or[session.Clock](cfg.Session.Clock, systemClock{}),
		connected:  make(chan struct{}, 1),
		gpuChanged: make(chan struct{}, 1),
		refresh:    make(chan chan error),
	}
	a.state = &stateKeeper{dir: cfg.StateDir, notify: cfg.Notifier, clock: a.clock, log: log}
	a.gpu = cfg.GPU
	if a.gpu == nil {
		c, err := gpu.New(gpu.Config{Logger: log})
		if err != nil {
			return nil, fmt.Errorf("new agent: %w", err)
		}
		a.gpu = c
	}
	a.probe = &gpuProbe{c: a.gpu}
	a.ib = cmp.Or(cfg.IB, ib.New(ib.Config{}))
	a.kernelLog = cfg.KernelLog
	if a.kernelLog == nil {
		if cfg.Unprivileged {
			a.kernelLog = &helper.Client{Socket: cfg.HelperSocket}
		} else {
			a.kernelLog = gpu.DeviceLog{}
		}
	}
	a.scanner = cfg.Scanner
	if a.scanner == nil {
		a.scanner = inventory.NewScanner(inventory.Config{GPU: a.probe, IB: a.ib, Logger: log})
	}
	ecfg := executor.Config{RefreshInventory: a.refreshInventory, Now: a.gatewayNow, Logger: log}
	ecfg.Upgrader = cfg.Upgrader
	ecfg.GPUs = a.gpu
	switch {
	case cfg.Unprivileged:
		hc := &helper.Client{Socket: cfg.HelperSocket}
		ecfg.Commands, ecfg.Root, ecfg.Reboot = hc, hc, hc
	case cfg.CommandUser != nil:
		if cfg.CommandHome == "" {
			return nil, errors.New("new agent: a command user needs a home (CommandHome)")
		}
		ecfg.Commands = &cmduser.Runner{User: *cfg.CommandUser, Home: cfg.CommandHome}
	}
	ecfg.BMC = a.newBMC()
	if cfg.StateDir != "" {
		j, err := journal.Open(journal.Config{Path: filepath.Join(cfg.StateDir, journal.File), Logger: log})
		if err != nil {
			return nil, fmt.Errorf("new agent: %w", err)
		}
		a.journal, ecfg.Journal = j, j
		if a.seen, err = seen.Open(cfg.StateDir); err != nil {
			return nil, fmt.Errorf("new agent: %w", err)
		}
	}
	a.exec = executor.New(ecfg)
	empty := ""
	a.digest.Store(&empty)
	return a, nil
}

// Run scans the host, then holds the session, reports inventory and GPU
// events and runs commands until ctx ends (nil) or the session client fails
// for good (an error wrapping session.ErrRevoked or
// session.ErrCertificateExpired). Running commands are cancelled and waited
// for before Run returns. Run must be called only once.
func (a *Agent) Run(ctx context.Context) error {
	if !a.running.CompareAndSwap(false, true) {
		return errors.New("agent: Run called twice")
	}
	start := a.clock.Now()
	host, err := a.scanner.Scan(ctx)
	if err != nil {
		return nil // only when ctx is done
	}
	a.setInventory(host)
	a.scanFindings(ctx, host)
	caps := a.capabilities(host)
	a.log.InfoContext(ctx, "Inventory scanned", attrTook, a.clock.Now().Sub(start).Round(time.Millisecond),
		attrGPUs, len(host.GPUs), attrGPUStatus, host.GPUStatus, attrDigest, a.currentDigest())

	scfg := a.cfg.Session
	scfg.Handler = a.exec
	tcfg := tunnel.Config{Unprivileged: a.cfg.Unprivileged, CommandUser: a.cfg.CommandUser, CommandHome: a.cfg.CommandHome, Logger: a.log}
	if a.cfg.Unprivileged {
		tcfg.Helper = &helper.Client{Socket: a.cfg.HelperSocket}
	}
	scfg.Tunnels = tunnel.New(tcfg)
	scfg.Capabilities = caps
	scfg.Reporter = reporter{a}
	scfg.BootID = cmp.Or(scfg.BootID, host.BootID)
	scfg.Logger = cmp.Or(scfg.Logger, a.log)
	next := scfg.OnEvent
	scfg.OnEvent = func(ev session.Event) {
		if ev.Kind == session.EventConnected {
			a.setThresholds(ev.GPUHealth)
			a.helloAccepted()
			signal(a.connected)
		}
		a.state.event(ctx, ev, a.client.Load())
		if next != nil {
			next(ev)
		}
	}
	client, err := session.New(scfg)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	a.client.Store(client)
	a.state.start(ctx, client)
	a.log.InfoContext(ctx, "Node agent running", attrCapabilities, caps)
	if a.cfg.Unprivileged {
		a.checkHelper(ctx)
	}

	g, gctx := errgroup.WithContext(ctx)
	gctx, cancel := context.WithCancel(gctx)
	defer cancel()
	g.Go(func() error {
		defer cancel()
		err := client.Run(gctx)
		a.state.stopped(ctx, err)
		return err
	})
	g.Go(func() error { return a.report(gctx) })
	g.Go(func() error {
		a.watchGPUs(gctx)
		return nil
	})
	if a.hasGPUs(host) || len(host.IBPorts) > 0 {
		a.replayResets(scfg.BootID)
		g.Go(func() error {
			a.watchKernelLog(gctx)
			return nil
		})
	}
	err = g.Wait()
	// The Handler's context was gctx: the commands are being cancelled.
	a.exec.Wait()
	a.closeBMC()
	if a.journal != nil {
		_ = a.journal.Close()
	}
	return err
}

// capabilities returns what the node offers in Hello: gpu.nvml only when
// the first scan reached NVML (GPUs found, or the driver answered with
// none).
func (a *Agent) capabilities(host *inventory.Host) []string {
	caps := []string{sessionv1.CapabilityExec, sessionv1.CapabilityCancel, sessionv1.CapabilityInventory, sessionv1.CapabilityResume,
		sessionv1.CapabilityPower, sessionv1.CapabilityBoot, sessionv1.CapabilityReboot, sessionv1.CapabilityTunnel}
	if a.cfg.Upgrader != nil {
		caps = append(caps, sessionv1.CapabilityUpgrade)
	}
	if _, ok := a.cfg.Upgrader.(executor.Rollbacker); ok {
		caps = append(caps, sessionv1.CapabilityRollback)
	}
	if a.hasGPUs(host) {
		caps = append(caps, sessionv1.CapabilityGPUNVML, sessionv1.CapabilityGPUReset, sessionv1.CapabilityGPUDiag)
	}
	return caps
}

// hasGPUs reports whether the first scan reached NVML (GPUs found, or the
// driver answered with none).
func (a *Agent) hasGPUs(host *inventory.Host) bool {
	return a.probe.nvml.Load() || len(host.GPUs) > 0
}

// checkHelper says at start whether the root helper answers, so that an
// operator sees a missing helper before a root command fails.
func (a *Agent) checkHelper(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, helperCheckTimeout)
	defer cancel()
	c := &helper.Client{Socket: a.cfg.HelperSocket}
	if err := c.Ping(cctx); err != nil {
		a.log.WarnContext(ctx, "Root helper not usable: commands that need root fail until it is", attrSocket, a.cfg.HelperSocket, logkey.Err, err)
		return
	}
	a.log.InfoContext(ctx, "Root helper answers", attrSocket, a.cfg.HelperSocket)
}

// pendingResults gives a Hello the results the executor could not send,
// and keeps them until a Welcome shows that the gateway took that Hello: an
// attempt that fails before its Welcome puts them in the next Hello again
// (the gateway ignores a result it already recorded).
func (a *Agent) pendingResults() []*sessionv1.CommandResult {
	a.resMu.Lock()
	defer a.resMu.Unlock()
	a.unacked = append(a.unacked, a.exec.PendingResults()...)
	return slices.Clone(a.unacked)
}

// helloAccepted forgets the results of the Hello a Welcome answered.
func (a *Agent) helloAccepted() {
	a.resMu.Lock()
	acked := a.unacked
	a.unacked = nil
	a.resMu.Unlock()
	a.exec.Delivered(acked)
}

// heartbeat fills a Heartbeat's readings; the session set its digest.
func (a *Agent) heartbeat(hb *sessionv1.Heartbeat) {
	readings(hb)
	hb.RunningCommandIds = a.exec.Running()
}

// send sends msg on the current session.
func (a *Agent) send(msg *sessionv1.NodeMessage) error {
	c := a.client.Load()
	if c == nil {
		return session.ErrNotConnected
	}
	return c.Send(msg)
}

// signal wakes the receiver of ch without blocking; wake-ups merge.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// gpuProbe passes Collect through and remembers whether NVML ever answered.
type gpuProbe struct {
	c    *gpu.Collector
	nvml atomic.Bool
}

func (p *gpuProbe) Collect(ctx context.Context) (gpu.Report, error) {
	rep, err := p.c.Collect(ctx)
	if rep.NVML {
		p.nvml.Store(true)
	}
	return rep, err
}

// gatewayNow is the gateways' time as the session client estimates it
// (session.Client.GatewayNow), this machine's clock before the client
// exists: commands come only through it.
func (a *Agent) gatewayNow() time.Time {
	if c := a.client.Load(); c != nil {
		return c.GatewayNow()
	}
	return a.clock.Now()
}

// systemClock is the clock of the real world.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) session.Timer { return time.AfterFunc(d, f) }

// setThresholds gives the GPU collector the health thresholds a Welcome
// carried (the control plane's gpuHealth.*); nil (an older gateway) keeps
// what the collector has.
func (a *Agent) setThresholds(t *sessionv1.GPUHealthThresholds) {
	if t == nil {
		return
	}
	a.gpu.SetThresholds(gpu.Thresholds{
		PCIeReplayThreshold: t.GetPcieReplayThreshold(),
		PCIeReplayWindow:    t.GetPcieReplayWindow().AsDuration(),
		PCIeCheckGeneration: t.GetPcieCheckGeneration(),
		LogFindingHold:      t.GetLogFindingHold().AsDuration(),
		FabricGrace:         t.GetFabricGrace().AsDuration(),

		IgnorePersistenceMode:     t.GetIgnorePersistenceMode(),
		FabricManagerFlapRestarts: uint64(t.GetFabricManagerFlapRestarts()),
		FabricManagerWindow:       t.GetFabricManagerWindow().AsDuration(),
	})
	a.ib.SetThresholds(ib.Thresholds{
		ErrorThreshold: t.GetIbErrorThreshold(),
		ErrorWindow:    t.GetIbErrorWindow().AsDuration(),
		FlapWindow:     t.GetIbFlapWindow().AsDuration(),
		DownGrace:      t.GetIbDownGrace().AsDuration(),
		LogHold:        t.GetLogFindingHold().AsDuration(),
	})
}
