package serve

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
)

// notifier tells systemd how serve is doing through the sd_notify protocol
// (go-systemd's daemon package; better-compute.service is Type=notify):
// STATUS= lines as serve starts, READY=1 once every role it runs is up,
// WATCHDOG=1 every half of the interval systemd asks for in WATCHDOG_USEC
// (the unit's WatchdogSec=), and STOPPING=1 when it starts to stop. Outside
// systemd (NOTIFY_SOCKET unset) every message is dropped.
type notifier struct {
	log *slog.Logger
}

// send sends one message of one or more NAME=VALUE lines; a failure is
// logged, never fatal.
func (n notifier) send(ctx context.Context, lines ...string) {
	msg := strings.Join(lines, "\n")
	if _, err := daemon.SdNotify(false, msg); err != nil {
		n.log.WarnContext(ctx, "Cannot notify systemd", "state", msg, logkey.Err, err)
	}
}

// status sends STATUS=s, which systemctl status shows.
func (n notifier) status(ctx context.Context, s string) { n.send(ctx, "STATUS="+s) }

// watchdogInterval is how often to send WATCHDOG=1: half of WATCHDOG_USEC,
// or 0 when systemd asked for no watchdog (or the variables are malformed,
// which is logged).
func (n notifier) watchdogInterval(ctx context.Context) time.Duration {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		n.log.WarnContext(ctx, "Ignoring the systemd watchdog settings", logkey.Err, err)
		return 0
	}
	return d / 2
}

// supervise waits, in Run's goroutine, until ctx ends or a role fails, and
// returns the role's error (nil on cancellation). On the way it sends
// READY=1 with STATUS=status() once every channel in ready is closed, and
// WATCHDOG=1 on schedule; when it returns it has sent STOPPING=1. Sending
// them all from this one loop keeps their order (READY before STOPPING) and
// ties the watchdog to serve's own loop.
func (n notifier) supervise(ctx context.Context, failed <-chan error, ready []<-chan struct{}, status func() string) error {
	allReady := make(chan struct{})
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	go func() {
		for _, r := range ready {
			select {
			case <-r:
			case <-waitCtx.Done():
				return
			}
		}
		close(allReady)
	}()
	var tick <-chan time.Time
	if d := n.watchdogInterval(ctx); d > 0 {
		t := time.NewTicker(d)
		defer t.Stop()
		tick = t.C
		n.send(ctx, daemon.SdNotifyWatchdog)
	}
	for {
		select {
		case <-allReady:
			allReady = nil
			n.send(ctx, daemon.SdNotifyReady, "STATUS="+status())
		case <-tick:
			n.send(ctx, daemon.SdNotifyWatchdog)
		case <-ctx.Done():
			n.log.Info("Stopping: gateway drains, then HTTP closes, then workers release their leases")
			n.send(ctx, daemon.SdNotifyStopping, "STATUS=Stopping: gateway drains, then HTTP closes, then workers release their leases")
			return nil
		case err := <-failed:
			n.log.Error("A role failed; stopping the others", logkey.Err, err)
			n.send(ctx, daemon.SdNotifyStopping, "STATUS=Stopping: a role failed: "+err.Error())
			return err
		}
	}
}
