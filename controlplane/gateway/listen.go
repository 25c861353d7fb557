package gateway

import (
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// listener accepts connections at a bounded rate, and no more than
// cap(setup) at a time in setup (from accept to Welcome), and keeps the open
// ones by remote address, so that a session can be ended by closing its
// connection.
//
// The setup bound keeps a reconnect storm from collapsing: the gateway
// finishes the connections it took before it takes more (the rest wait in the
// kernel's backlog, costing nothing), instead of running thousands of
// handshakes at once and letting the daemons' handshake deadlines pass while
// their sessions wait for the database, so that every one of them is retried.
type listener struct {
	net.Listener
	limiter *rate.Limiter
	// setup holds a token per connection in setup; settleAfter is the
	// longest one keeps it.
	setup       chan struct{}
	settleAfter time.Duration
	done        chan struct{}
	once        sync.Once

	mu    sync.Mutex
	conns map[string]*trackedConn
}

// newListener accepts on ln at limiter's rate, with at most maxSetup
// connections in setup, each for at most settleAfter.
func newListener(ln net.Listener, limiter *rate.Limiter, maxSetup int, settleAfter time.Duration) *listener {
	return &listener{Listener: ln, limiter: limiter, setup: make(chan struct{}, maxSetup), settleAfter: settleAfter,
		done: make(chan struct{}), conns: map[string]*trackedConn{}}
}

// Accept waits for the rate limiter, accepts, and waits for a setup slot
// before it returns the connection. Connections beyond either wait in the
// kernel's backlog.
func (l *listener) Accept() (net.Conn, error) {
	if r := l.limiter.Reserve(); r.OK() {
		if d := r.Delay(); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				r.Cancel()
				return nil, net.ErrClosed
			}
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	// The accepted connection waits here, unserved, and the next ones in the
	// backlog, until a connection in setup leaves it.
	select {
	case l.setup <- struct{}{}:
	case <-l.done:
		c.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: c, l: l, key: c.RemoteAddr().String()}
	// A connection that never gets as far as Welcome (a Join, a stalled
	// client) gives its slot back at settleAfter at the latest.
	tc.timer = time.AfterFunc(l.settleAfter, tc.giveBack)
	l.mu.Lock()
	l.conns[tc.key] = tc
	l.mu.Unlock()
	return tc, nil
}

// Close stops accepting.
func (l *listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// conn returns the open connection from remote address addr, or nil.
func (l *listener) conn(addr net.Addr) *trackedConn {
	if l == nil || addr == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[addr.String()]
}

// trackedConn is an accepted connection that leaves the listener's table when
// closed.
type trackedConn struct {
	net.Conn
	l       *listener
	key     string
	once    sync.Once
	settled sync.Once
	timer   *time.Timer
}

// settle ends the connection's setup (Welcome sent or the stream refused)
// and gives its slot back; only the first call of settle, Close or the
// timer does. A nil c does nothing.
func (c *trackedConn) settle() {
	if c == nil {
		return
	}
	c.timer.Stop()
	c.giveBack()
}

// giveBack returns the connection's setup slot once.
func (c *trackedConn) giveBack() {
	c.settled.Do(func() { <-c.l.setup })
}

// Close closes the connection; closing twice is harmless.
func (c *trackedConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		c.l.mu.Lock()
		if c.l.conns[c.key] == c {
			delete(c.l.conns, c.key)
		}
		c.l.mu.Unlock()
		c.settle()
		err = c.Conn.Close()
	})
	return err
}
