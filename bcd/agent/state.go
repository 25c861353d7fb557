package agent

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/nodestate"
	"github.com/better-compute/better-compute/bcd/session"
)

// Notifier is told the agent's status line on every change of its
// connection state (systemd's STATUS=); *sdnotify.Notifier implements it.
type Notifier interface {
	// Status shows line, one line of text, as the service's status.
	Status(line string)
}

// errStopped is the last error recorded when Run's context ends.
var errStopped = errors.New("bcd node stopped")

// stateKeeper keeps the agent's nodestate.State, writes it to the data
// directory and tells the Notifier when it changes. Its methods are safe
// for concurrent use.
type stateKeeper struct {
	dir    string // "" writes no file
	notify Notifier
	clock  session.Clock
	log    *slog.Logger

	mu      sync.Mutex // serialises updates, writes and notifications
	st      nodestate.State
	line    string // last line told to notify
	failed  bool   // the last write failed (logged once per run of failures)
	started bool
}

// start records the state before the first connection, with the client's
// certificate.
func (k *stateKeeper) start(ctx context.Context, c *session.Client) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.started = true
	k.st = nodestate.State{PID: os.Getpid(), Since: k.clock.Now()}
	k.setCertificate(c)
	k.publish(ctx)
}

// event applies a session event.
func (k *stateKeeper) event(ctx context.Context, ev session.Event, c *session.Client) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.started {
		return
	}
	now := k.clock.Now()
	switch ev.Kind {
	case session.EventConnected:
		k.st.Connected, k.st.Since = true, now
		k.st.Gateway, k.st.SessionID = ev.Gateway, ev.SessionID
	case session.EventDisconnected:
		if k.st.Connected {
			k.st.Since = now
		}
		k.st.Connected, k.st.SessionID = false, ""
		k.st.Gateway = ev.Gateway
		err := ev.Err
		if err == nil { // Run's context ended
			err = errStopped
		}
		k.setError(err)
	case session.EventRenewed:
		k.setCertificate(c)
	case session.EventRenewFailed:
		k.setError(ev.Err)
	default:
		return
	}
	k.setSkew(c)
	k.publish(ctx)
}

// setSkew records the client's measured clock skew.
func (k *stateKeeper) setSkew(c *session.Client) {
	if c != nil {
		k.st.ClockSkewSeconds = int64(c.ClockSkew().Round(time.Second) / time.Second)
	}
}

// stopped records why the session client's Run returned: err (revoked,
// the certificate expired), or errStopped when it is nil.
func (k *stateKeeper) stopped(ctx context.Context, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.started {
		return
	}
	if err == nil {
		err = errStopped
	}
	if k.st.Connected {
		k.st.Since = k.clock.Now()
	}
	k.st.Connected, k.st.SessionID = false, ""
	k.setError(err)
	k.publish(ctx)
}

func (k *stateKeeper) setError(err error) {
	if err == nil {
		return
	}
	k.st.LastError, k.st.LastErrorAt = nodestate.OneLine(err), k.clock.Now()
}

func (k *stateKeeper) setCertificate(c *session.Client) {
	if c == nil {
		return
	}
	chain, renewAfter := c.Certificate()
	if len(chain) == 0 {
		return
	}
	k.st.CertNotAfter, k.st.CertRenewAfter = chain[0].NotAfter, renewAfter
	// Zero is "never said" (or off): the default is assumed, and said so.
	grace, from := c.ReattestGrace(), nodestate.GraceFromGateway
	if grace <= 0 {
		grace, from = nodestate.DefaultReattestGrace, nodestate.GraceFromDefault
	}
	k.st.ReattestGraceSeconds, k.st.ReattestGraceFrom = int64(grace/time.Second), from
	k.st.ReattestDeadline = chain[0].NotAfter.Add(grace)
}

// publish writes the state and tells the Notifier its line when it
// changed. Called with mu held.
func (k *stateKeeper) publish(ctx context.Context) {
	if k.dir != "" {
		k.st.UpdatedAt = k.clock.Now()
		err := nodestate.Write(k.dir, &k.st)
		switch {
		case err != nil && !k.failed:
			k.log.WarnContext(ctx, "Cannot write the node state: bcd status and bcd doctor will not see it", logkey.Err, err)
		case err == nil && k.failed:
			k.log.InfoContext(ctx, "Node state written again", attrPath, nodestate.Path(k.dir))
		}
		k.failed = err != nil
	}
	if line := k.st.Line(); k.notify != nil && line != k.line {
		k.line = line
		k.notify.Status(line)
	}
}
