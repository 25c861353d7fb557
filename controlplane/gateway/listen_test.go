package gateway

import (
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// fakeListener hands out the connections sent on conns and tells on calls
// each time Accept is called, so that a test knows the previous connection
// was admitted.
type fakeListener struct {
	conns chan net.Conn
	calls chan struct{}
	done  chan struct{}
}

func newFakeListener() *fakeListener {
	return &fakeListener{conns: make(chan net.Conn), calls: make(chan struct{}, 1000), done: make(chan struct{})}
}

func (f *fakeListener) Accept() (net.Conn, error) {
	f.calls <- struct{}{}
	select {
	case c := <-f.conns:
		return c, nil
	case <-f.done:
		return nil, net.ErrClosed
	}
}

func (f *fakeListener) Close() error   { close(f.done); return nil }
func (f *fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8443} }

// addrConn is one end of a pipe with the remote address of a source.
type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c *addrConn) RemoteAddr() net.Addr { return c.remote }

// sourceConns makes connections from ip, returning the server ends and
// their client ends.
type testConn struct {
	server *addrConn
	client net.Conn
}

var nextPort atomic.Int32

func dialFrom(t *testing.T, ip string) testConn {
	t.Helper()
	s, c := net.Pipe()
	t.Cleanup(func() { s.Close(); c.Close() })
	return testConn{server: &addrConn{Conn: s, remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000 + int(nextPort.Add(1))}}, client: c}
}

// feed hands c to l's accept loop and waits until it was admitted (the
// loop called Accept again).
func (f *fakeListener) feed(t *testing.T, c testConn) {
	t.Helper()
	select {
	case f.conns <- c.server:
	case <-deadline(t, 10*time.Second):
		t.Fatal("the accept loop did not accept")
	}
	select {
	case <-f.calls:
	case <-deadline(t, 10*time.Second):
		t.Fatal("the accept loop did not come back")
	}
}

// acceptNext returns the next connection l hands out, failing after 10 s.
func acceptNext(t *testing.T, l *listener) *trackedConn {
	t.Helper()
	got := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	select {
	case c := <-got:
		return c.(*trackedConn)
	case <-deadline(t, 10*time.Second):
		t.Fatal("Accept returned nothing")
		return nil
	}
}

// noAccept checks that Accept hands nothing out now, and returns the
// connection it hands out later.
func noAccept(t *testing.T, l *listener) <-chan net.Conn {
	t.Helper()
	got := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			got <- c
		}
	}()
	return got
}

func wantFrom(t *testing.T, c net.Conn, want testConn) {
	t.Helper()
	if c.(*trackedConn).Conn != want.server {
		t.Fatalf("handed out %s, want %s", c.RemoteAddr(), want.server.RemoteAddr())
	}
}

// TestSetupPerSource: a source's connections beyond its slots wait in its
// queue while another source's go ahead; past the queue they are closed;
// a freed slot goes to the next of that source's queue; a source with
// nothing in setup is forgotten.
func TestSetupPerSource(t *testing.T) {
	t.Parallel()
	raw := newFakeListener()
	l := newListener(raw, rate.NewLimiter(rate.Inf, 1), setupLimits{total: 4, perSource: 2, queuedPerSource: 2, queued: 100, settleAfter: time.Hour})
	t.Cleanup(func() { l.Close() })
	first := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept() // starts the accept loop
		first <- c
	}()
	<-raw.calls

	var a, b []testConn
	for range 5 {
		c := dialFrom(t, "127.0.0.2")
		a = append(a, c)
		raw.feed(t, c)
	}
	for range 2 {
		c := dialFrom(t, "127.0.0.1")
		b = append(b, c)
		raw.feed(t, c)
	}
	// The fifth of A found its queue full: closed.
	if _, err := a[4].client.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the connection past its source's queue: read %v, want EOF (closed)", err)
	}
	got := []net.Conn{<-first, acceptNext(t, l), acceptNext(t, l), acceptNext(t, l)}
	wantFrom(t, got[0], a[0])
	wantFrom(t, got[1], a[1])
	wantFrom(t, got[2], b[0])
	wantFrom(t, got[3], b[1])
	if s := l.stats(); s != (setupStats{inSetup: 4, queued: 2, sources: 2, overflow: 1}) {
		t.Fatalf("stats %+v", s)
	}

	// All four slots taken: nothing more until one is given back. A's
	// slot goes to the next of A's queue.
	next := noAccept(t, l)
	got[0].(*trackedConn).settle()
	select {
	case c := <-next:
		wantFrom(t, c, a[2])
	case <-deadline(t, 10*time.Second):
		t.Fatal("a freed slot went to no one")
	}
	// B's slot freed, B has no queue: A's next waits for a slot of A's.
	next = noAccept(t, l)
	got[2].(*trackedConn).Close()
	if s := l.stats(); s.inSetup != 3 || s.queued != 1 || s.waiting != 0 {
		t.Fatalf("after B's connection closed: %+v", s)
	}
	got[1].(*trackedConn).settle()
	select {
	case c := <-next:
		wantFrom(t, c, a[3])
	case <-deadline(t, 10*time.Second):
		t.Fatal("A's freed slot went to no one")
	}
	// Everything settled: no source is kept.
	got[3].(*trackedConn).settle()
	for _, c := range []net.Conn{got[0], got[1], got[2], got[3]} {
		c.(*trackedConn).settle()
	}
	for _, tc := range []*trackedConn{l.conn(a[2].server.RemoteAddr()), l.conn(a[3].server.RemoteAddr())} {
		tc.settle()
	}
	if s := l.stats(); s != (setupStats{overflow: 1}) {
		t.Fatalf("after every connection settled: %+v, want no source kept", s)
	}
}

// TestSetupQueuedInAll: with limits.queued waiting, the listener stops
// accepting until one leaves; Close closes those waiting.
func TestSetupQueuedInAll(t *testing.T) {
	t.Parallel()
	raw := newFakeListener()
	l := newListener(raw, rate.NewLimiter(rate.Inf, 1), setupLimits{total: 1, perSource: 1, queuedPerSource: 10, queued: 3, settleAfter: time.Hour})
	first := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		first <- c
	}()
	<-raw.calls
	var cs []testConn
	for i := range 4 {
		c := dialFrom(t, "127.0.0.3")
		cs = append(cs, c)
		if i < 3 {
			raw.feed(t, c)
			continue
		}
		// The fourth fills the queues: the loop does not come back.
		raw.conns <- c.server
	}
	c0 := <-first
	wantFrom(t, c0, cs[0])
	for deadline := time.Now().Add(10 * time.Second); l.stats().queued != 3; {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v, want 3 queued", l.stats())
		}
		runtime.Gosched()
	}
	// One handed out, three waiting: the loop does not accept the fifth.
	fifth := dialFrom(t, "127.0.0.4")
	select {
	case raw.conns <- fifth.server:
		t.Fatal("accepted with limits.queued connections waiting")
	case <-deadline(t, 200*time.Millisecond):
	}
	// One leaves the queue (handed out after c0 settles): room for one.
	c0.(*trackedConn).settle()
	wantFrom(t, acceptNext(t, l), cs[1])
	select {
	case raw.conns <- fifth.server:
	case <-deadline(t, 10*time.Second):
		t.Fatal("not accepting with room in the queues")
	}
	l.Close()
	for _, c := range []testConn{cs[2], cs[3], fifth} {
		if _, err := c.client.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("a waiting connection after Close: read %v, want EOF", err)
		}
	}
}

// TestJoinLimiter: 20 at once from one source, then 10 a second; other
// sources have their own buckets; idle buckets are evicted, and sources
// beyond the most kept share one.
func TestJoinLimiter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	j := newJoinLimiter(10, 20)
	for i := range 20 {
		if ok, _ := j.allow("127.0.0.3", now); !ok {
			t.Fatalf("join %d of the burst refused", i+1)
		}
	}
	ok, wait := j.allow("127.0.0.3", now)
	if ok || wait <= 0 || wait > 100*time.Millisecond {
		t.Fatalf("join 21 at once: allowed %v, wait %s; want refused, wait 100 ms", ok, wait)
	}
	if ok, _ := j.allow("127.0.0.1", now); !ok {
		t.Fatal("another source's first join refused")
	}
	if ok, _ := j.allow("127.0.0.3", now.Add(wait)); !ok {
		t.Fatalf("refused after the wait it was told (%s)", wait)
	}
	if ok, _ := j.allow("127.0.0.3", now.Add(wait)); ok {
		t.Fatal("allowed twice on one token")
	}
	if n := j.sources(); n != 2 {
		t.Fatalf("%d sources kept, want 2", n)
	}
	later := now.Add(2 * time.Minute)
	j.allow("127.0.0.9", later)
	if n := j.sources(); n != 1 {
		t.Fatalf("%d sources kept after the others were idle 2 min, want 1", n)
	}
	j.max = 1
	for i := range 20 {
		if ok, _ := j.allow("10.0.0."+string(rune('a'+i)), later); !ok {
			t.Fatalf("overflow source %d refused within the shared burst", i)
		}
	}
	if ok, _ := j.allow("10.0.1.1", later); ok {
		t.Fatal("sources beyond the most kept do not share one bucket")
	}
	if n := j.sources(); n != 1 {
		t.Fatalf("%d sources kept, want at most 1", n)
	}
}

// TestAddrIP: the per-source bounds, Join rate and audit rows see one
// source per IP address, a WebSocket connection's included (its TCP peer's
// address, "ws:"-prefixed, carries a port that differs per connection).
func TestAddrIP(t *testing.T) {
	for _, c := range []struct {
		addr net.Addr
		want string
	}{
		{nil, ""},
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 40000}, "127.0.0.2"},
		{&net.TCPAddr{IP: net.ParseIP("::1"), Port: 40000}, "::1"},
		{wsAddr(wsAddrPrefix + "10.1.2.3:51000"), "10.1.2.3"},
		{wsAddr(wsAddrPrefix + "10.1.2.3:51001"), "10.1.2.3"},
		{wsAddr(wsAddrPrefix + "[2001:db8::7]:443"), "2001:db8::7"},
		{wsAddr(wsAddrPrefix + "no-port"), "no-port"},
		{&net.UnixAddr{Name: "@gw", Net: "unix"}, "@gw"},
	} {
		if got := addrIP(c.addr); got != c.want {
			t.Errorf("addrIP(%v) = %q, want %q", c.addr, got, c.want)
		}
	}
}
