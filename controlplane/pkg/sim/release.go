package sim

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// A FakeDaemon plays bcd's self-upgrade (issue 20): an "upgrade" command
// restarts it (its session ends and, after Release.RestartDelay, a new one
// says Hello with the new version) and the restarted daemon answers the
// command's redelivery, as bcd does; a "rollback" command takes it back to
// the version it ran before, the same way, with no download. What each
// version does is its Release (SetRelease): the default starts and stays
// healthy; one can fail its trial (the daemon comes back on its old
// version and the upgrade fails, "rolled back"), or start and then turn
// unhealthy after a delay (the daemon's session drops for DownFor, then it
// comes back on the same bad version, again and again, until it is rolled
// back).

// Release is how a FakeDaemon behaves on a bcd version it is upgraded to.
type Release struct {
	// FailTrial makes the version fail its trial: the upgrade fails and
	// the daemon stays on its version.
	FailTrial bool
	// UnhealthyAfter, when positive, makes the version turn unhealthy
	// that long after it starts: its session drops for DownFor, then it
	// reconnects, repeatedly.
	UnhealthyAfter time.Duration
	// DownFor is how long an unhealthy daemon stays away each time.
	// Defaults to 1 s.
	DownFor time.Duration
	// RollBackAfter, when positive, makes the daemon restore the version
	// kept beside this one by itself that long after it starts, as bcd
	// does after a crash loop (issue 30), and restart into it.
	RollBackAfter time.Duration
	// XIDEvery, when positive, makes the version raise XID XIDCode on
	// GPU 0 every XIDEvery while it runs (a release that raises its
	// nodes' XID rate: issue 30's health gate); XIDCode defaults to 13, a
	// RESTART_APP XID that leaves the GPU healthy. It needs a daemon with
	// an inventory (FleetConfig.NoInventory unset).
	XIDEvery time.Duration
	XIDCode  uint32
}

// DefaultRestartDelay is how long a FakeDaemon's restart takes.
const DefaultRestartDelay = 50 * time.Millisecond

// releaseState is a FakeDaemon's release: its version, the one kept
// beside it, the releases it knows, and its restarts.
type releaseState struct {
	mu       sync.Mutex
	version  string // "" is Version
	previous string
	releases map[string]Release
	delay    time.Duration
	handler  *commands
	// cancel ends the current session (a restart); restarting says one
	// was asked for, down how long the next start waits.
	cancel     context.CancelFunc
	restarting bool
	down       time.Duration
	// upgrades counts the upgrade commands run (not their redeliveries),
	// rollbacks the rollback commands.
	upgrades, rollbacks int
	// pending is the version the restart brings up, when it changes.
	pending string
}

// Version returns the bcd version the daemon reports (Version until an
// upgrade).
func (d *FakeDaemon) Version() string {
	d.rel.mu.Lock()
	defer d.rel.mu.Unlock()
	if d.rel.version == "" {
		return Version
	}
	return d.rel.version
}

// SetVersion sets the version the daemon reports from its next session
// (a daemon installed with another release).
func (d *FakeDaemon) SetVersion(v string) {
	d.rel.mu.Lock()
	defer d.rel.mu.Unlock()
	d.rel.version = v
}

// SetRelease tells the daemon how version behaves when it is upgraded to
// it.
func (d *FakeDaemon) SetRelease(version string, r Release) {
	d.rel.mu.Lock()
	defer d.rel.mu.Unlock()
	if d.rel.releases == nil {
		d.rel.releases = map[string]Release{}
	}
	d.rel.releases[version] = r
}

// SetRestartDelay sets how long the daemon's restarts take. Defaults to
// DefaultRestartDelay.
func (d *FakeDaemon) SetRestartDelay(delay time.Duration) {
	d.rel.mu.Lock()
	defer d.rel.mu.Unlock()
	d.rel.delay = delay
}

// Upgrades returns how many upgrade commands the daemon ran (redeliveries
// answered from the record not counted), and Rollbacks its rollback
// commands.
func (d *FakeDaemon) Upgrades() int {
	d.rel.mu.Lock()
	defer d.rel.mu.Unlock()
	return d.rel.upgrades
}

// Rollbacks returns how many rollback commands the daemon ran.
func (d *FakeDaemon) Rollbacks() int {
	d.rel.mu.Lock()
	defer d.rel.mu.Unlock()
	return d.rel.rollbacks
}

// commands returns the daemon's command runner, one for its life, so that
// a restarted session answers redeliveries from what the earlier one ran.
func (d *FakeDaemon) commands() *commands {
	d.rel.mu.Lock()
	defer d.rel.mu.Unlock()
	if d.rel.handler == nil {
		d.rel.handler = &commands{d: d}
	}
	return d.rel.handler
}

// Run holds the daemon's session until ctx ends, as session.Client.Run
// does (nil when ctx ends, ErrRevoked, ErrCertificateExpired), starting a
// new one after each simulated restart. It fails with ErrNotJoined before
// Join.
func (d *FakeDaemon) Run(ctx context.Context) error {
	for {
		sctx, cancel := context.WithCancel(ctx)
		d.rel.mu.Lock()
		d.rel.cancel, d.rel.restarting = cancel, false
		d.rel.mu.Unlock()
		d.watchHealth(sctx)
		err := d.runSession(sctx)
		cancel()
		d.rel.mu.Lock()
		restarting, down := d.rel.restarting, d.rel.down
		if restarting && d.rel.pending != "" {
			d.rel.version, d.rel.pending = d.rel.pending, ""
		}
		d.rel.down = 0
		d.rel.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
		if !restarting {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(down):
		}
	}
}

// restartDelay is the daemon's restart time.
func (s *releaseState) restartDelay() time.Duration {
	if s.delay > 0 {
		return s.delay
	}
	return DefaultRestartDelay
}

// restart ends the current session; Run starts the next after the restart
// delay.
func (d *FakeDaemon) restart() {
	d.rel.mu.Lock()
	defer d.rel.mu.Unlock()
	d.rel.restarting = true
	if d.rel.down == 0 {
		d.rel.down = d.rel.restartDelay()
	}
	if d.rel.cancel != nil {
		d.rel.cancel()
	}
}

// watchHealth makes a session of an unhealthy release drop after its
// UnhealthyAfter, and one of a release with XIDEvery raise its XIDs.
func (d *FakeDaemon) watchHealth(ctx context.Context) {
	d.rel.mu.Lock()
	r, ok := d.rel.releases[d.rel.version]
	d.rel.mu.Unlock()
	if ok && r.RollBackAfter > 0 {
		go func() {
			select {
			case <-ctx.Done():
			case <-time.After(r.RollBackAfter):
				d.rel.mu.Lock()
				to := d.rel.previous
				d.rel.pending, d.rel.previous = to, d.rel.version
				d.rel.mu.Unlock()
				d.log.Info("Simulated release crash-looped: restoring the previous version", "version", to)
				d.restart()
			}
		}()
	}
	if ok && r.XIDEvery > 0 {
		go func() {
			tick := time.NewTicker(r.XIDEvery)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
					if err := d.RaiseXID(0, cmp.Or(r.XIDCode, 13)); err != nil {
						d.log.Debug("Simulated release: XID not raised", logkey.Err, err)
					}
				}
			}
		}()
	}
	if !ok || r.UnhealthyAfter <= 0 {
		return
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-time.After(r.UnhealthyAfter):
			d.log.Info("Simulated release turned unhealthy: dropping the session", "down_for", cmpDuration(r.DownFor, time.Second))
			d.rel.mu.Lock()
			d.rel.down = cmpDuration(r.DownFor, time.Second)
			d.rel.mu.Unlock()
			d.restart()
		}
	}()
}

func cmpDuration(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// restarts reports whether cmd, just run with result res, restarts the
// daemon: an upgrade to another version or a rollback that succeeded or
// rolled back its trial.
func (d *FakeDaemon) restarts(cmd *sessionv1.Command, res *sessionv1.CommandResult) bool {
	switch cmd.GetKind() {
	case sessionv1.KindUpgrade, sessionv1.KindRollback:
		var detail struct{ From, To string }
		_ = json.Unmarshal(res.GetDetailJson(), &detail)
		return detail.From != detail.To
	}
	return false
}

// releaseCommand runs an upgrade or rollback command: it returns the
// result the restarted daemon reports and records the version the restart
// brings up.
func (d *FakeDaemon) releaseCommand(cmd *sessionv1.Command) *sessionv1.CommandResult {
	d.rel.mu.Lock()
	defer d.rel.mu.Unlock()
	cur := d.rel.version
	if cur == "" {
		cur = Version
	}
	res := &sessionv1.CommandResult{CommandId: cmd.GetId(), State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED, FinishedAt: timestamppb.Now()}
	detail := func(from, to string, rolledBack bool) []byte {
		b, _ := json.Marshal(map[string]any{"from": from, "to": to, "rolled_back": rolledBack})
		return b
	}
	switch cmd.GetKind() {
	case sessionv1.KindUpgrade:
		to := cmd.GetUpgrade().GetVersion()
		if to == cur {
			res.DetailJson = detail(cur, cur, false)
			return res
		}
		d.rel.upgrades++
		if d.rel.releases[to].FailTrial {
			// The trial failed and the previous binary is back: the
			// daemon restarts on cur.
			res.State, res.ExitCode = sessionv1.CommandState_COMMAND_STATE_FAILED, -1
			res.Error = fmt.Sprintf("bcd %s failed to start: simulated failing trial; rolled back to %s", to, cur)
			res.DetailJson = detail(cur, to, true)
			return res
		}
		d.rel.previous, d.rel.pending = cur, to
		res.DetailJson = detail(cur, to, false)
	case sessionv1.KindRollback:
		d.rel.rollbacks++
		if d.rel.previous == "" {
			res.State, res.ExitCode = sessionv1.CommandState_COMMAND_STATE_FAILED, -1
			res.Error = "rollback: no previous bcd is kept (simulated)"
			return res
		}
		to := d.rel.previous
		d.rel.pending = to
		res.DetailJson = detail(cur, to, true)
	}
	return res
}
