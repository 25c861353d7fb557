// Package accept keeps the control plane's listeners accepting.
//
// A listener's Accept can fail for a moment: the process is out of file
// descriptors (EMFILE, ENFILE), the kernel out of buffers, a peer reset the
// connection while it waited in the backlog. Go's net/http backs off and
// accepts again after such an error (5 ms, doubling to 1 s); an accept loop
// that returns on it instead stops serving its port for good, silently
// (issue 28). Every accept loop of the control plane (the gateway's direct
// and WebSocket ports, the API, the internal control API, the CLI's
// port-forward) goes through a Listener of this package, so that it:
//
//   - never returns a temporary error: Accept backs off (5 ms, doubling to
//     1 s, as net/http) and accepts again, until the listener is closed;
//   - logs once when an episode of failures starts and once when it ends,
//     with the count of failed accepts;
//   - counts every failed accept (Metrics.AcceptError, the metric
//     bettercompute_listener_accept_errors_total);
//   - reports the episode to its Watch, whose Check fails (and /readyz
//     answers not ready) while a listener has failed to accept for more
//     than Watch's threshold (10 s) in a row.
//
// Errors that are not temporary (the listener closed) are returned as
// they are.
package accept

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
)

// Backoff bounds, as net/http's Server.Serve.
const (
	// MinBackoff is the wait after the first failed accept of an episode.
	MinBackoff = 5 * time.Millisecond
	// MaxBackoff is the longest wait between two accepts.
	MaxBackoff = time.Second
	// DefaultUnreadyAfter is how long a listener may fail to accept in a
	// row before Watch.Check reports it.
	DefaultUnreadyAfter = 10 * time.Second
)

// Metrics counts failed accepts (a *metrics.Metrics satisfies it).
type Metrics interface {
	// AcceptError counts one failed accept of the named listener.
	AcceptError(listener string)
}

type noMetrics struct{}

func (noMetrics) AcceptError(string) {}

// Config configures a Watch. Zero fields take the documented defaults.
type Config struct {
	// Log receives one line when a listener starts failing and one when
	// it accepts again. Defaults to discarding them.
	Log *slog.Logger
	// Metrics counts failed accepts. Defaults to none.
	Metrics Metrics
	// UnreadyAfter is how long a listener may fail in a row before Check
	// reports it. Defaults to DefaultUnreadyAfter (10 s).
	UnreadyAfter time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Watch holds a process's listeners and tells whether any of them has
// been failing to accept for too long. A nil *Watch wraps listeners with
// no logging, metrics or readiness.
type Watch struct {
	cfg Config

	mu        sync.Mutex
	listeners []*Listener
}

// NewWatch returns a Watch with cfg.
func NewWatch(cfg Config) *Watch {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noMetrics{}
	}
	cfg.UnreadyAfter = cmp.Or(cfg.UnreadyAfter, DefaultUnreadyAfter)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Watch{cfg: cfg}
}

// Wrap returns ln as a Listener named name (its metric label and log
// attribute: "gateway", "api", ...), watched by w until it is closed.
func (w *Watch) Wrap(name string, ln net.Listener) *Listener {
	if w == nil {
		w = NewWatch(Config{})
	}
	l := &Listener{Listener: ln, name: name, w: w, done: make(chan struct{})}
	w.mu.Lock()
	w.listeners = append(w.listeners, l)
	w.mu.Unlock()
	return l
}

// Check returns nil, or an error naming each listener that has failed
// every accept for more than UnreadyAfter, with its last error.
func (w *Watch) Check() error {
	if w == nil {
		return nil
	}
	now := w.cfg.Now()
	w.mu.Lock()
	ls := slices.Clone(w.listeners)
	w.mu.Unlock()
	var errs []error
	for _, l := range ls {
		l.mu.Lock()
		since, last := l.failingSince, l.lastErr
		l.mu.Unlock()
		if !since.IsZero() && now.Sub(since) > w.cfg.UnreadyAfter {
			errs = append(errs, fmt.Errorf("listener %s has failed to accept for %s: %w", l.name, now.Sub(since).Round(time.Second), last))
		}
	}
	return errors.Join(errs...)
}

func (w *Watch) forget(l *Listener) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.listeners = slices.DeleteFunc(w.listeners, func(x *Listener) bool { return x == l })
}

// Listener is a net.Listener whose Accept backs off on temporary errors
// instead of returning them.
type Listener struct {
	net.Listener
	name string
	w    *Watch
	done chan struct{}
	once sync.Once

	mu           sync.Mutex
	failingSince time.Time // start of the current episode; zero when accepting
	failures     int       // failed accepts in the current episode
	lastErr      error
}

// Accept returns the next connection. On a temporary error it waits (5 ms,
// doubling to 1 s) and accepts again; it returns net.ErrClosed once Close
// was called, and any error that is not temporary as it is.
func (l *Listener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			l.recovered()
			return c, nil
		}
		select {
		case <-l.done:
			return nil, net.ErrClosed
		default:
		}
		if !Temporary(err) {
			return nil, err
		}
		l.failed(err)
		delay = min(max(2*delay, MinBackoff), MaxBackoff)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
			return nil, net.ErrClosed
		}
	}
}

// Close stops accepting and leaves the Watch.
func (l *Listener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.w.forget(l)
	})
	return l.Listener.Close()
}

// failed records a failed accept; the first of an episode is logged.
func (l *Listener) failed(err error) {
	l.w.cfg.Metrics.AcceptError(l.name)
	l.mu.Lock()
	first := l.failingSince.IsZero()
	if first {
		l.failingSince = l.w.cfg.Now()
	}
	l.failures++
	l.lastErr = err
	l.mu.Unlock()
	if first {
		l.w.cfg.Log.Warn("Listener failing to accept; backing off and retrying", logkey.Listener, l.name,
			"addr", l.Addr().String(), logkey.Err, err)
	}
}

// recovered ends an episode, if one was on, and logs it with its count.
func (l *Listener) recovered() {
	l.mu.Lock()
	if l.failingSince.IsZero() {
		l.mu.Unlock()
		return
	}
	since, n, last := l.failingSince, l.failures, l.lastErr
	l.failingSince, l.failures, l.lastErr = time.Time{}, 0, nil
	l.mu.Unlock()
	l.w.cfg.Log.Warn("Listener accepting again", logkey.Listener, l.name, "addr", l.Addr().String(),
		"failed_accepts", n, "failing_for", l.w.cfg.Now().Sub(since).Round(time.Millisecond).String(), logkey.Err, last)
}

// Temporary reports whether an accept error is one to back off on and
// retry, as net/http does: the process or the system out of descriptors or
// memory, a connection aborted or reset in the backlog, an interrupted or
// timed-out call, or any error that says it is temporary.
func Temporary(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EAGAIN, syscall.EINTR, syscall.ETIMEDOUT, syscall.EPROTO, syscall.EPERM} {
		if errors.Is(err, e) {
			return true
		}
	}
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}
