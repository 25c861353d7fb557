// Package sdnotify tells systemd how bcd is doing, through the sd_notify
// protocol (go-systemd's daemon package): READY=1 once the node holds its
// first session, STATUS= lines, STOPPING=1 on shutdown, and WATCHDOG=1 at
// half the interval systemd asks for in WATCHDOG_USEC (a unit with
// WatchdogSec=). Outside systemd (NOTIFY_SOCKET unset) every call does
// nothing.
package sdnotify

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
)

// Notifier sends sd_notify messages. Its methods are safe for concurrent
// use.
type Notifier struct {
	log   *slog.Logger
	ready sync.Once
}

// New returns a Notifier logging failures to log (nil: discarded).
func New(log *slog.Logger) *Notifier {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Notifier{log: log}
}

// Ready sends READY=1, the first time only.
func (n *Notifier) Ready() {
	n.ready.Do(func() { n.send(daemon.SdNotifyReady) })
}

// Status sends STATUS=<s>, shown by systemctl status.
func (n *Notifier) Status(s string) { n.send("STATUS=" + s) }

// Stopping sends STOPPING=1.
func (n *Notifier) Stopping() { n.send(daemon.SdNotifyStopping) }

// Watchdog sends WATCHDOG=1 every half of the watchdog interval systemd
// set, until ctx ends. It returns at once, with nil, when systemd asked for
// no watchdog.
func (n *Notifier) Watchdog(ctx context.Context) error {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		n.log.WarnContext(ctx, "Ignoring the systemd watchdog settings", logkey.Err, err)
		return nil
	}
	if interval <= 0 {
		return nil
	}
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	n.send(daemon.SdNotifyWatchdog)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			n.send(daemon.SdNotifyWatchdog)
		}
	}
}

func (n *Notifier) send(state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		n.log.Warn("Cannot notify systemd", "state", state, logkey.Err, err)
	}
}
