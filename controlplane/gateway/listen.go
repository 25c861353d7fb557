package gateway

import (
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// listener accepts connections at a bounded rate and keeps the open ones by
// remote address, so that a session can be ended by closing its connection.
type listener struct {
	net.Listener
	limiter *rate.Limiter
	done    chan struct{}
	once    sync.Once

	mu    sync.Mutex
	conns map[string]*trackedConn
}

func newListener(ln net.Listener, limiter *rate.Limiter) *listener {
	return &listener{Listener: ln, limiter: limiter, done: make(chan struct{}), conns: map[string]*trackedConn{}}
}

// Accept waits for the rate limiter, then accepts. Connections beyond the
// rate wait in the kernel's backlog.
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
	tc := &trackedConn{Conn: c, l: l, key: c.RemoteAddr().String()}
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
	l    *listener
	key  string
	once sync.Once
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
		err = c.Conn.Close()
	})
	return err
}
