package upgrade

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/installer/manifest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// DefaultHealthTimeout is how long a new binary has to reach a gateway's
// Welcome, in its trial and again after the restart.
const DefaultHealthTimeout = 60 * time.Second

// Causes with which the node's agent is stopped (context.Cause).
var (
	// ErrRestart: an upgrade installed a new binary; call Handover.
	ErrRestart = errors.New("bcd restarts to finish an upgrade")
	// ErrUnhealthy: the new binary reached no gateway within the health
	// timeout; call RollBack.
	ErrUnhealthy = errors.New("the upgraded bcd reached no gateway in time")
)

// Log attribute keys of this package.
const (
	attrFrom   = "from"
	attrTo     = "to"
	attrPath   = "path"
	attrReason = "reason"
)

// Installer swaps bcd's binary. LocalInstaller does it in this process (bcd
// runs as root); the root helper's client does it for an unprivileged bcd.
type Installer interface {
	// Install verifies req against the pinned keys and installs its
	// binary, keeping the running one as <binary>.prev (see Swap).
	Install(ctx context.Context, req *InstallRequest) error
	// Rollback puts <binary>.prev back in place (see Restore).
	Rollback(ctx context.Context) error
}

// LocalInstaller swaps the binary in this process.
type LocalInstaller struct {
	// Target is the installed binary.
	Target string
	// PinsFile holds the pinned release keys. Defaults to DefaultPinsFile.
	PinsFile string
}

// Install implements Installer with Swap.
func (l *LocalInstaller) Install(_ context.Context, req *InstallRequest) error {
	pins, err := ReadPins(cmp.Or(l.PinsFile, DefaultPinsFile))
	if err != nil {
		return err
	}
	_, err = Swap(SwapParams{InstallRequest: *req, Target: l.Target, Pins: pins})
	return err
}

// Rollback implements Installer with Restore.
func (l *LocalInstaller) Rollback(context.Context) error { return Restore(l.Target) }

// Config configures an Upgrader. Zero values take the documented defaults.
type Config struct {
	// Version is the running bcd's version. Required.
	Version string
	// DataDir holds the upgrade's files (DataDir/upgrade: marker, result,
	// downloads) and the installed release's signed manifest
	// (DataDir/release). Required.
	DataDir string
	// Target is the installed binary the upgrade replaces. Defaults to this
	// process's executable with symbolic links resolved, read by New (so
	// before any swap).
	Target string
	// PinsFile holds the pinned release keys, one a line. Defaults to
	// DefaultPinsFile (/etc/bcd/release-pins).
	PinsFile string
	// BaseURL is the downloads route used when a command names none, such
	// as "https://compute.example.com/api/downloads". Defaults to none: such
	// a command fails.
	BaseURL string
	// Installer swaps the binary. Defaults to a LocalInstaller on Target
	// and PinsFile.
	Installer Installer
	// HealthTimeout is how long a new binary has to reach a gateway's
	// Welcome. Defaults to DefaultHealthTimeout (60 s).
	HealthTimeout time.Duration
	// CrashLoopStarts is how many starts of the release an upgrade
	// installed may end in an exit within CrashLoopWindow of the upgrade:
	// the start after the last of them restores the previous binary
	// (crashloop.go). Defaults to DefaultCrashLoopStarts (3).
	CrashLoopStarts int
	// CrashLoopWindow is how long after an upgrade its release's exits
	// count. Defaults to DefaultCrashLoopWindow (10 min).
	CrashLoopWindow time.Duration
	// Attempts is how many times each download is tried. Defaults to
	// DefaultAttempts (4).
	Attempts int
	// RetryDelay is the first wait between download attempts; it doubles.
	// Defaults to DefaultRetryDelay (1 s).
	RetryDelay time.Duration
	// HTTPClient downloads. Defaults to a client with 15 s connect and TLS
	// timeouts and a 30 s wait for response headers.
	HTTPClient *http.Client
	// Restart asks the node to stop its agent with cause ErrRestart and
	// then call Handover. Required to upgrade.
	Restart func()
	// Args and Env are the command line and environment of the restarted
	// bcd. Default to os.Args and os.Environ().
	Args, Env []string
	// Stdout and Stderr receive the trial's output. Default to os.Stdout and
	// os.Stderr.
	Stdout, Stderr *os.File
	// Exec replaces the process with another program. Defaults to
	// syscall.Exec.
	Exec func(path string, args, env []string) error
	// Logger defaults to discarding.
	Logger *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

// Upgrader runs upgrade commands and finishes them across the restart.
// Create one with New.
type Upgrader struct {
	cfg   Config
	log   *slog.Logger
	files files
	fetch *fetcher

	busy      atomic.Bool
	connected atomic.Bool
	once      sync.Once
}

// New returns an Upgrader for cfg with its defaults filled in.
func New(cfg Config) (*Upgrader, error) {
	if cfg.Version == "" || cfg.DataDir == "" {
		return nil, errors.New("new upgrader: version and data directory are required")
	}
	if cfg.Target == "" {
		exe, err := os.Executable()
		if err == nil {
			exe, err = filepath.EvalSymlinks(exe)
		}
		if err != nil {
			return nil, fmt.Errorf("new upgrader: find the bcd binary: %w", err)
		}
		cfg.Target = exe
	}
	cfg.PinsFile = cmp.Or(cfg.PinsFile, DefaultPinsFile)
	if cfg.Installer == nil {
		cfg.Installer = &LocalInstaller{Target: cfg.Target, PinsFile: cfg.PinsFile}
	}
	cfg.HealthTimeout = cmp.Or(cfg.HealthTimeout, DefaultHealthTimeout)
	cfg.CrashLoopStarts = cmp.Or(cfg.CrashLoopStarts, DefaultCrashLoopStarts)
	cfg.CrashLoopWindow = cmp.Or(cfg.CrashLoopWindow, DefaultCrashLoopWindow)
	if cfg.HealthTimeout < 0 || cfg.CrashLoopStarts < 1 || cfg.CrashLoopWindow < 0 {
		return nil, errors.New("new upgrader: the health timeout, crash-loop starts and crash-loop window must be positive")
	}
	cfg.Attempts = cmp.Or(cfg.Attempts, DefaultAttempts)
	cfg.RetryDelay = cmp.Or(cfg.RetryDelay, DefaultRetryDelay)
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = newHTTPClient()
	}
	if cfg.Args == nil {
		cfg.Args = os.Args
	}
	if cfg.Env == nil {
		cfg.Env = os.Environ()
	}
	cfg.Stdout = cmp.Or(cfg.Stdout, os.Stdout)
	cfg.Stderr = cmp.Or(cfg.Stderr, os.Stderr)
	if cfg.Exec == nil {
		cfg.Exec = syscall.Exec
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))
	return &Upgrader{cfg: cfg, log: log, files: files{cfg.DataDir},
		fetch: &fetcher{client: cfg.HTTPClient, attempts: cfg.Attempts, delay: cfg.RetryDelay}}, nil
}

// Target is the installed binary the Upgrader replaces.
func (u *Upgrader) Target() string { return u.cfg.Target }

// HealthTimeout is how long a new binary has to reach a gateway's Welcome.
func (u *Upgrader) HealthTimeout() time.Duration { return u.cfg.HealthTimeout }

// Upgrade runs an "upgrade" command (executor.Upgrader). It returns the
// command's result, or nil once it has installed the new binary and asked
// the node to restart (Config.Restart): the restarted bcd reports the result
// when the gateway delivers the command again. A command the last restart
// finished is answered from its record.
func (u *Upgrader) Upgrade(ctx context.Context, cmd *sessionv1.Command) *sessionv1.CommandResult {
	if r, err := u.files.readRecord(); err == nil && r.CommandID == cmd.GetId() {
		return r.result()
	}
	if !u.busy.CompareAndSwap(false, true) {
		return failed("another upgrade is in progress on this node")
	}
	res := u.upgrade(ctx, cmd)
	if res != nil {
		u.busy.Store(false)
	}
	return res
}

func (u *Upgrader) upgrade(ctx context.Context, cmd *sessionv1.Command) *sessionv1.CommandResult {
	version := cmd.GetUpgrade().GetVersion()
	switch {
	case version == "":
		return failed("upgrade names no version")
	case !manifest.ValidVersion(version):
		return failed(fmt.Sprintf("upgrade to %q: not a release version (want semantic versioning without a leading v, like 0.2.0)", version))
	case version == u.cfg.Version:
		return succeeded(Detail{From: version, To: version})
	case u.cfg.Restart == nil:
		return failed("this bcd cannot restart itself, so it cannot upgrade")
	}
	base, err := downloadsURL(cmp.Or(cmd.GetUpgrade().GetBaseUrl(), u.cfg.BaseURL))
	if err != nil {
		return failed(fmt.Sprintf("upgrade to %s: %v", version, err))
	}
	log := u.log.With(logkey.CommandID, cmd.GetId(), attrFrom, u.cfg.Version, attrTo, version)
	log.InfoContext(ctx, "Upgrading bcd", "base_url", base)
	pins, err := ReadPins(u.cfg.PinsFile)
	if err != nil {
		return failed(fmt.Sprintf("upgrade to %s: %v", version, err))
	}
	rel := base + "/bcd/" + url.PathEscape(version) + "/"
	mf, err := u.fetch.get(ctx, rel+"manifest.json", manifest.MaxSize)
	if err != nil {
		return failed(fmt.Sprintf("upgrade to %s: release manifest: %v", version, err))
	}
	sig, err := u.fetch.get(ctx, rel+"manifest.json.minisig", 4<<10)
	if err != nil {
		return failed(fmt.Sprintf("upgrade to %s: release manifest signature: %v", version, err))
	}
	m, err := manifest.Verify(mf, sig, pins, u.cfg.Now())
	if err != nil {
		return failed(fmt.Sprintf("upgrade to %s refused: %v (manifest from %s)", version, err, rel+"manifest.json"))
	}
	if m.Version != version {
		return failed(fmt.Sprintf("upgrade to %s refused: the signed manifest at %s is for version %s", version, rel+"manifest.json", m.Version))
	}
	bin, ok := m.Find(manifest.KindBinary, "bcd", runtime.GOOS, runtime.GOARCH)
	if !ok {
		return failed(fmt.Sprintf("upgrade to %s: the release lists no bcd binary for %s/%s", version, runtime.GOOS, runtime.GOARCH))
	}
	if bin.Size > MaxBinarySize {
		return failed(fmt.Sprintf("upgrade to %s: bcd is %d bytes, more than %d", version, bin.Size, MaxBinarySize))
	}
	staged := u.files.path("bcd-" + version)
	if err := os.MkdirAll(filepath.Dir(staged), 0o700); err != nil {
		return failed(fmt.Sprintf("upgrade to %s: %v", version, err))
	}
	if err := u.fetch.download(ctx, rel+runtime.GOOS+"-"+runtime.GOARCH, staged, bin.Size, bin.SHA256); err != nil {
		os.Remove(staged)
		return failed(fmt.Sprintf("upgrade to %s: %v", version, err))
	}
	for name, b := range map[string][]byte{"manifest.json": mf, "manifest.json.minisig": sig} {
		if err := writeFile(u.files.path(name), b); err != nil {
			os.Remove(staged)
			return failed(fmt.Sprintf("upgrade to %s: %v", version, err))
		}
	}
	marker := &Marker{CommandID: cmd.GetId(), From: u.cfg.Version, To: version, Target: u.cfg.Target,
		State: stateSwapped, CreatedAt: u.cfg.Now().UTC()}
	if err := u.files.writeMarker(marker); err != nil {
		os.Remove(staged)
		return failed(fmt.Sprintf("upgrade to %s: %v", version, err))
	}
	if err := u.cfg.Installer.Install(ctx, &InstallRequest{Version: version, Staged: staged, Manifest: mf, Signature: sig}); err != nil {
		_ = u.files.removeMarker()
		os.Remove(staged)
		return failed(fmt.Sprintf("upgrade to %s: install: %v", version, err))
	}
	log.InfoContext(ctx, "Installed the new bcd; restarting to try it", attrPath, u.cfg.Target)
	u.cfg.Restart()
	return nil
}

// Handover finishes an upgrade once the agent has stopped (cause
// ErrRestart): it tries the new binary (see the package documentation),
// restores the previous one when the trial fails, records the command's
// result and re-executes the installed binary. It returns only on failure,
// or with ctx's error when bcd is being stopped, which leaves the marker
// for the next start.
func (u *Upgrader) Handover(ctx context.Context) error {
	m, err := u.files.readMarker()
	if err != nil {
		return fmt.Errorf("finish upgrade: %w", err)
	}
	if m.State == stateRestored {
		// A rollback command restored the binary that ran here before:
		// no trial (rollback.go).
		return u.restart(ctx)
	}
	log := u.log.With(logkey.CommandID, m.CommandID, attrFrom, m.From, attrTo, m.To)
	log.InfoContext(ctx, "Trying the new bcd before restarting into it", "timeout", u.cfg.HealthTimeout)
	terr := u.trial(ctx, m.To)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if terr != nil {
		return u.rollBack(ctx, m, terr.Error())
	}
	log.InfoContext(ctx, "The new bcd reached a gateway; restarting into it")
	m.State = statePassed
	detail, _ := json.Marshal(Detail{From: m.From, To: m.To})
	rec := &record{CommandID: m.CommandID, Succeeded: true, Detail: detail, Finished: u.cfg.Now().UTC()}
	if err := u.files.writeRecord(rec); err != nil {
		return fmt.Errorf("finish upgrade: %w", err)
	}
	if err := u.files.writeMarker(m); err != nil {
		return fmt.Errorf("finish upgrade: %w", err)
	}
	return u.restart(ctx)
}

// Resume is called as bcd starts, before it connects. It reports whether
// this is a new binary on probation: it must reach a gateway's Welcome
// (Connected) within HealthTimeout, or the node stops its agent with cause
// ErrUnhealthy and calls RollBack. When an earlier start of the new binary
// never got there (it crashed), Resume rolls back and restarts into the
// previous binary itself, returning only on failure. Without an upgrade in
// progress it counts the start in the crash-loop watch, which may roll back
// the same way (crashloop.go).
func (u *Upgrader) Resume(ctx context.Context) (probation bool, err error) {
	m, err := u.files.readMarker()
	if errors.Is(err, os.ErrNotExist) {
		return false, u.resumeWatch(ctx)
	}
	if err != nil {
		u.log.WarnContext(ctx, "Unreadable upgrade marker removed", logkey.Err, err)
		return false, u.files.removeMarker()
	}
	if m.State == stateRolledBack || m.State == stateRestored {
		return false, nil
	}
	if m.To != u.cfg.Version {
		// The upgrade never got as far as starting the new binary: bcd
		// stopped before the swap, or someone put another binary back.
		reason := fmt.Sprintf("bcd restarted as %s before the upgrade to %s finished", u.cfg.Version, m.To)
		u.log.WarnContext(ctx, "Upgrade abandoned", attrReason, reason)
		detail, _ := json.Marshal(Detail{From: m.From, To: m.To})
		_ = u.files.writeRecord(&record{CommandID: m.CommandID, Error: "upgrade abandoned: " + reason, Detail: detail, Finished: u.cfg.Now().UTC()})
		return false, u.files.removeMarker()
	}
	m.Starts++
	if m.Starts > 1 {
		return false, u.rollBack(ctx, m, fmt.Sprintf("it stopped before reaching a gateway (start %d since the upgrade)", m.Starts))
	}
	if err := u.files.writeMarker(m); err != nil {
		return false, fmt.Errorf("resume upgrade: %w", err)
	}
	u.log.InfoContext(ctx, "Starting after an upgrade", attrFrom, m.From, attrTo, m.To, "health_timeout", u.cfg.HealthTimeout)
	return true, nil
}

// Connected is called on each Welcome; the first one after an upgrade ends
// it: the marker and the download are removed and the release's signed
// manifest becomes the installed one's (DataDir/release).
func (u *Upgrader) Connected() {
	u.connected.Store(true)
	u.once.Do(func() {
		u.ackLocalRollback()
		m, err := u.files.readMarker()
		if err != nil {
			return
		}
		// The binary kept beside the installed one is now the one that ran
		// before the upgrade (or, after a rollback, the installed one
		// itself): a rollback command goes back to it.
		kept := m.From
		switch m.State {
		case stateRestored:
			kept = m.To
			u.log.Info("Rolled back by a rollback command", attrFrom, m.From, attrTo, m.To)
		case stateRolledBack:
			u.log.Warn("Running the previous bcd again after a failed upgrade", attrFrom, m.From, attrTo, m.To, attrReason, m.Reason)
		}
		if kept != "" {
			if err := writeJSON(u.files.path(previousFile), previous{Version: kept}); err != nil {
				u.log.Warn("Could not record the previous release", logkey.Err, err)
			}
		}
		if m.State != stateRolledBack && m.State != stateRestored {
			u.log.Info("Upgrade complete", attrFrom, m.From, attrTo, m.To)
			u.startWatch(m)
			for _, name := range []string{"manifest.json", "manifest.json.minisig"} {
				if b, err := os.ReadFile(u.files.path(name)); err == nil {
					if err := writeFile(filepath.Join(u.cfg.DataDir, releaseDir, name), b); err != nil {
						u.log.Warn("Could not keep the release manifest", logkey.Err, err)
					}
				}
			}
		}
		for _, name := range []string{"bcd-" + m.To, "manifest.json", "manifest.json.minisig"} {
			os.Remove(u.files.path(name))
		}
		if err := u.files.removeMarker(); err != nil {
			u.log.Warn("Could not remove the upgrade marker", logkey.Err, err)
		}
	})
}

// IsConnected reports whether a Welcome has arrived since start.
func (u *Upgrader) IsConnected() bool { return u.connected.Load() }

// RollBack restores the previous binary after a new one failed its
// probation (cause ErrUnhealthy), records why and restarts into it. It
// returns only on failure.
func (u *Upgrader) RollBack(ctx context.Context, reason string) error {
	m, err := u.files.readMarker()
	if err != nil {
		return fmt.Errorf("roll back upgrade: %w", err)
	}
	return u.rollBack(ctx, m, reason)
}

func (u *Upgrader) rollBack(ctx context.Context, m *Marker, reason string) error {
	u.log.ErrorContext(ctx, "The new bcd failed to start; rolling back", attrFrom, m.From, attrTo, m.To, attrReason, reason)
	if err := u.cfg.Installer.Rollback(ctx); err != nil {
		return fmt.Errorf("bcd %s failed to start (%s) and %s could not be restored: %w", m.To, reason, m.From, err)
	}
	m.State, m.Reason = stateRolledBack, reason
	detail, _ := json.Marshal(Detail{From: m.From, To: m.To, RolledBack: true})
	rec := &record{CommandID: m.CommandID, Detail: detail, Finished: u.cfg.Now().UTC(),
		Error: fmt.Sprintf("bcd %s failed to start: %s; rolled back to %s", m.To, reason, m.From)}
	if err := u.files.writeRecord(rec); err != nil {
		return fmt.Errorf("roll back upgrade: %w", err)
	}
	if err := u.files.writeMarker(m); err != nil {
		return fmt.Errorf("roll back upgrade: %w", err)
	}
	return u.restart(ctx)
}

// restart replaces the process with the installed binary, keeping its
// arguments and environment (without TrialEnv).
func (u *Upgrader) restart(ctx context.Context) error {
	args := append([]string{u.cfg.Target}, u.cfg.Args[1:]...)
	u.log.InfoContext(ctx, "Restarting into the installed bcd", attrPath, u.cfg.Target)
	err := u.cfg.Exec(u.cfg.Target, args, withoutTrial(u.cfg.Env))
	return fmt.Errorf("restart into %s: %w", u.cfg.Target, err)
}

// downloadsURL checks a downloads route URL and trims its trailing slash.
func downloadsURL(s string) (string, error) {
	if s == "" {
		return "", errors.New("no downloads URL: the command names none and bcd has no --downloads-url")
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("downloads URL %q: want http(s)://host[:port]/path", s)
	}
	return strings.TrimRight(s, "/"), nil
}

func failed(msg string) *sessionv1.CommandResult {
	return &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_FAILED, ExitCode: -1, Error: msg,
		FinishedAt: timestamppb.Now()}
}

func succeeded(d Detail) *sessionv1.CommandResult {
	b, _ := json.Marshal(d)
	return &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED, DetailJson: b, FinishedAt: timestamppb.Now()}
}
