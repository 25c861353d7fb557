package gateway

import (
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// setupLimits bounds the connections in setup (from accept until Welcome,
// the stream refused, a Join connection's handshake, or settleAfter).
type setupLimits struct {
	// total is the most connections in setup at once.
	total int
	// perSource is the most in setup at once from one source address.
	perSource int
	// queuedPerSource is the most accepted connections of one source
	// waiting for one of its setup slots; past it a new one is closed.
	queuedPerSource int
	// queued is the most accepted connections waiting in all (for a
	// source's slot or for a slot in all); past it the listener stops
	// accepting, and the rest wait in the kernel's backlog.
	queued int
	// settleAfter is the longest one connection keeps its setup slots.
	settleAfter time.Duration
}

// listener accepts connections, hands them to the gRPC server at a bounded
// rate with no more than limits.total in setup at a time, of which no more
// than limits.perSource from one source address, and keeps the open ones by
// remote address, so that a session can be ended by closing its connection.
//
// The setup bound keeps a reconnect storm from collapsing: the gateway
// finishes the connections it took before it takes more, instead of running
// thousands of handshakes at once and letting the daemons' handshake
// deadlines pass while their sessions wait for the database, so that every
// one of them is retried. The bound per source keeps junk from one address
// (idle TCP connections that never start a handshake, each holding its slot
// for settleAfter) from starving the nodes of every other address: that
// address's connections wait in its own queue, the others' go ahead. Many
// nodes can share one address (NAT), so a source's extra connections are
// queued rather than refused, up to limits.queuedPerSource.
type listener struct {
	net.Listener
	limiter *rate.Limiter
	limits  setupLimits
	done    chan struct{}
	once    sync.Once
	// ready is signalled when a connection may be handed out (one became
	// ready, or a slot in all was freed); room when the queues shrank.
	ready, room chan struct{}
	errs        chan error // the accept loop's final error, for Accept
	start       sync.Once

	mu       sync.Mutex
	inSetup  int                // connections in setup, at most limits.total
	waiting  []pendingConn      // holding their source's slot, waiting for one in all
	queued   int                // in the sources' queues, summed
	sources  map[string]*source // sources with a connection in setup or queued
	conns    map[string]*trackedConn
	overflow int // connections closed because their source's queue was full
}

// source is one address's connections in setup and waiting for a slot.
type source struct {
	setup int           // holding one of the source's slots (in setup, or in waiting)
	queue []pendingConn // waiting for one of the source's slots
}

// pendingConn is an accepted connection not yet handed to the server.
type pendingConn struct {
	c   net.Conn
	src string
}

// newListener serves ln's connections at limiter's rate within limits.
func newListener(ln net.Listener, limiter *rate.Limiter, limits setupLimits) *listener {
	return &listener{Listener: ln, limiter: limiter, limits: limits, done: make(chan struct{}),
		ready: make(chan struct{}, 1), room: make(chan struct{}, 1), errs: make(chan error, 1),
		sources: map[string]*source{}, conns: map[string]*trackedConn{}}
}

// sourceOf is the source address of c: its remote IP (addrIP).
func sourceOf(c net.Conn) string { return addrIP(c.RemoteAddr()) }

// addrIP is the IP address of a connection's remote address a, as text:
// a TCP address's IP, a WebSocket connection's TCP peer's IP (wsAddr), the
// host part of anything else with a port, or "" for nil. Per-source bounds,
// Join rates and audit rows use it, so a WebSocket client (or the proxy in
// front of it) is one source however many connections it opens.
func addrIP(a net.Addr) string {
	switch a := a.(type) {
	case nil:
		return ""
	case *net.TCPAddr:
		return a.IP.String()
	case wsAddr:
		return a.ip()
	}
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}

// Accept returns the next connection allowed into setup, waiting for a
// slot in all, then for the rate limiter. Accepting from the network
// happens in a loop of its own (acceptLoop), started by the first call.
func (l *listener) Accept() (net.Conn, error) {
	l.start.Do(func() { go l.acceptLoop() })
	for {
		l.mu.Lock()
		if l.inSetup < l.limits.total && len(l.waiting) > 0 {
			p := l.waiting[0]
			l.waiting[0] = pendingConn{}
			l.waiting = l.waiting[1:]
			l.inSetup++
			tc := &trackedConn{Conn: p.c, l: l, key: p.c.RemoteAddr().String(), src: p.src}
			// A connection that never gets as far as Welcome (a stalled
			// client) gives its slots back at settleAfter at the latest.
			// The timer is set before tc is published in conns, where
			// another goroutine may settle or close it.
			tc.timer = time.AfterFunc(l.limits.settleAfter, tc.giveBack)
			l.conns[tc.key] = tc
			l.mu.Unlock()
			signal(l.room)
			if err := l.wait(); err != nil {
				tc.Close()
				return nil, err
			}
			return tc, nil
		}
		l.mu.Unlock()
		select {
		case <-l.ready:
		case err := <-l.errs:
			return nil, err
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
}

// wait waits for the rate limiter; it fails when the listener closes.
func (l *listener) wait() error {
	r := l.limiter.Reserve()
	if !r.OK() {
		return nil
	}
	d := r.Delay()
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-l.done:
		r.Cancel()
		return net.ErrClosed
	}
}

// acceptLoop accepts connections and admits them (admit), pausing while
// limits.queued are waiting, until accepting fails for good.
func (l *listener) acceptLoop() {
	for {
		for l.full() {
			select {
			case <-l.room:
			case <-l.done:
				return
			}
		}
		c, err := l.Listener.Accept()
		if err != nil {
			l.errs <- err
			return
		}
		l.admit(c)
	}
}

// full reports whether limits.queued connections are waiting.
func (l *listener) full() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.waiting)+l.queued >= l.limits.queued
}

// admit takes an accepted connection: it waits for a slot in all when its
// source has a slot free, joins its source's queue otherwise, and is closed
// when that queue is full or the listener closed.
func (l *listener) admit(c net.Conn) {
	src := sourceOf(c)
	l.mu.Lock()
	select {
	case <-l.done:
		l.mu.Unlock()
		c.Close()
		return
	default:
	}
	s := l.sources[src]
	if s == nil {
		s = &source{}
		l.sources[src] = s
	}
	switch {
	case s.setup < l.limits.perSource:
		s.setup++
		l.waiting = append(l.waiting, pendingConn{c: c, src: src})
		l.mu.Unlock()
		signal(l.ready)
	case len(s.queue) < l.limits.queuedPerSource:
		s.queue = append(s.queue, pendingConn{c: c, src: src})
		l.queued++
		l.mu.Unlock()
	default:
		l.overflow++
		l.mu.Unlock()
		c.Close()
	}
}

// release gives back the setup slots of a connection of src that was in
// setup: the next of src's queue takes its source slot.
func (l *listener) release(src string) {
	l.mu.Lock()
	l.inSetup--
	s := l.sources[src]
	if s != nil {
		if len(s.queue) > 0 {
			p := s.queue[0]
			s.queue[0] = pendingConn{}
			s.queue = s.queue[1:]
			l.queued--
			l.waiting = append(l.waiting, p)
		} else if s.setup--; s.setup == 0 {
			delete(l.sources, src)
		}
	}
	l.mu.Unlock()
	signal(l.ready)
	signal(l.room)
}

// signal wakes ch's waiter, if any, without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Close stops accepting and closes the connections not yet handed out.
func (l *listener) Close() error {
	l.once.Do(func() { close(l.done) })
	err := l.Listener.Close()
	l.mu.Lock()
	var pending []pendingConn
	pending = append(pending, l.waiting...)
	for _, s := range l.sources {
		pending = append(pending, s.queue...)
	}
	l.waiting, l.sources, l.queued = nil, map[string]*source{}, 0
	l.mu.Unlock()
	for _, p := range pending {
		p.c.Close()
	}
	return err
}

// setupStats is a snapshot of the listener's setup bounds at work.
type setupStats struct {
	inSetup, waiting, queued, sources, overflow int
}

func (l *listener) stats() setupStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return setupStats{inSetup: l.inSetup, waiting: len(l.waiting), queued: l.queued, sources: len(l.sources), overflow: l.overflow}
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
	src     string
	once    sync.Once
	settled sync.Once
	timer   *time.Timer
}

// settle ends the connection's setup (Welcome sent or the stream refused)
// and gives its slots back; only the first call of settle, Close or the
// timer does. A nil c does nothing.
func (c *trackedConn) settle() {
	if c == nil {
		return
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	c.giveBack()
}

// giveBack returns the connection's setup slots once.
func (c *trackedConn) giveBack() {
	c.settled.Do(func() { c.l.release(c.src) })
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
