package session_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	"github.com/better-compute/better-compute/proto/jointoken"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

const wait = 10 * time.Second // upper bound for anything a test waits for

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// node is a joined node: its key and identity.
type node struct {
	key *ecdsa.PrivateKey
	id  *session.JoinResult
}

func joinNode(t *testing.T, g *sessiontest.Gateway) node {
	t.Helper()
	tok := g.PKI.NewToken(t)
	g.AddToken(tok)
	key := sessiontest.NewKey(t)
	res, err := session.Join(t.Context(), session.JoinParams{GatewayURL: g.URL, Token: tok, Key: key})
	if err != nil {
		t.Fatalf("Join: %v", err)
	}
	return node{key: key, id: res}
}

// config is a Client config for n with test timings.
func (n node) config(gateways ...string) session.Config {
	if len(gateways) == 0 {
		gateways = n.id.Gateways
	}
	return session.Config{
		Gateways:    gateways,
		Trust:       n.id.Trust,
		Key:         n.key,
		Chain:       n.id.Chain,
		RenewAfter:  n.id.RenewAfter,
		BackoffBase: 20 * time.Millisecond,
		BackoffMax:  100 * time.Millisecond,
		StartJitter: -1,
	}
}

// events collects a Client's events.
type events chan session.Event

func newEvents(cfg *session.Config) events {
	ch := make(events, 4096)
	cfg.OnEvent = func(ev session.Event) {
		select {
		case ch <- ev:
		default:
		}
	}
	return ch
}

// next waits for the next event of kind, skipping others.
func (ch events) next(t *testing.T, kind session.EventKind) session.Event {
	t.Helper()
	timeout := time.After(wait)
	for {
		select {
		case ev := <-ch:
			if ev.Kind == kind {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %v event within %v", kind, wait)
		}
	}
}

// run starts c.Run and returns a function that stops it and returns its
// result, and a channel closed when Run returns (stop then returns at
// once); t's cleanup stops it too.
func run(t *testing.T, c *session.Client) (stop func() error, done <-chan struct{}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan struct{})
	var err error
	go func() {
		defer close(ch)
		err = c.Run(ctx)
	}()
	stop = func() error {
		cancel()
		select {
		case <-ch:
			return err
		case <-time.After(wait):
			t.Errorf("Run did not return within %v of cancellation", wait)
			return nil
		}
	}
	t.Cleanup(func() { _ = stop() })
	return stop, ch
}

// result waits for Run to return by itself and returns its error.
func result(t *testing.T, stop func() error, done <-chan struct{}) error {
	t.Helper()
	select {
	case <-done:
		return stop()
	case <-time.After(wait):
		t.Fatalf("Run did not return within %v", wait)
		return nil
	}
}

func newClient(t *testing.T, cfg session.Config) *session.Client {
	t.Helper()
	c, err := session.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

func TestJoin(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	id := n.id
	if id.NodeID != "node-1" || id.SPIFFEID != "spiffe://test.example/node/node-1" || id.TrustDomain != "test.example" {
		t.Errorf("identity = %q %q %q", id.NodeID, id.SPIFFEID, id.TrustDomain)
	}
	if len(id.Chain) != 1 || !n.key.PublicKey.Equal(id.Chain[0].PublicKey) {
		t.Errorf("chain does not certify the node key")
	}
	if len(id.NodeCARoots) != 1 || !id.NodeCARoots[0].Equal(p.NodeCA) {
		t.Errorf("node CA roots = %v", id.NodeCARoots)
	}
	if len(id.Gateways) != 1 || id.Gateways[0] != g.URL {
		t.Errorf("gateways = %v, want [%s]", id.Gateways, g.URL)
	}
	if id.Trust.Pin != p.Pin() || id.Trust.Roots != nil {
		t.Errorf("trust = %+v, want the token's pin", id.Trust)
	}
	leaf := id.Chain[0]
	// Two thirds from the time of issue, an hour after the backdated
	// NotBefore.
	issued := leaf.NotBefore.Add(time.Hour)
	want := issued.Add(leaf.NotAfter.Sub(issued) * 2 / 3)
	if d := id.RenewAfter.Sub(want); d > time.Second || d < -time.Second {
		t.Errorf("renew after %v, want about %v", id.RenewAfter, want)
	}
	if id.PoolID != "pool-test" || id.Region != "test" {
		t.Errorf("placement = %q %q", id.PoolID, id.Region)
	}
}

func TestJoinWithCAPool(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	tok := p.NewToken(t)
	g.AddToken(tok)
	res, err := session.Join(t.Context(), session.JoinParams{
		GatewayURL: g.URL, Token: tok, Key: sessiontest.NewKey(t),
		Trust: session.Trust{Roots: p.GatewayCAPool()},
	})
	if err != nil {
		t.Fatalf("Join: %v", err)
	}
	if res.Trust.Roots == nil || res.Trust.Pin != "" {
		t.Errorf("trust = %+v, want the CA pool", res.Trust)
	}

	other := sessiontest.NewPKI(t)
	_, err = session.Join(t.Context(), session.JoinParams{
		GatewayURL: g.URL, Token: tok, Key: sessiontest.NewKey(t),
		Trust: session.Trust{Roots: other.GatewayCAPool()},
	})
	if !errors.Is(err, session.ErrUntrustedGateway) {
		t.Errorf("Join with another CA = %v, want ErrUntrustedGateway", err)
	}
}

func TestJoinPinMismatchRefused(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	// A token for another deployment: it pins another gateway CA. The
	// gateway would accept the token; the node must refuse the gateway.
	tok := sessiontest.NewPKI(t).NewToken(t)
	g.AddToken(tok)
	_, err := session.Join(t.Context(), session.JoinParams{GatewayURL: g.URL, Token: tok, Key: sessiontest.NewKey(t)})
	if !errors.Is(err, session.ErrUntrustedGateway) || !errors.Is(err, jointoken.ErrPinMismatch) {
		t.Fatalf("Join = %v, want ErrUntrustedGateway wrapping ErrPinMismatch", err)
	}
	if g.Joins() != 0 {
		t.Errorf("gateway saw %d joins, want 0 (the token must not be sent)", g.Joins())
	}

	// An explicit pin overrides the token's and is checked the same way.
	_, err = session.Join(t.Context(), session.JoinParams{
		GatewayURL: g.URL, Token: tok, Key: sessiontest.NewKey(t), Trust: session.Trust{Pin: p.Pin()},
	})
	if err != nil {
		t.Errorf("Join with the right explicit pin: %v", err)
	}
}

func TestJoinRefusedAndMalformed(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	tok := p.NewToken(t) // never added: unknown to the gateway
	_, err := session.Join(t.Context(), session.JoinParams{GatewayURL: g.URL, Token: tok, Key: sessiontest.NewKey(t)})
	if !errors.Is(err, session.ErrJoinRefused) {
		t.Errorf("Join with an unknown token = %v, want ErrJoinRefused", err)
	}
	if strings.Contains(err.Error(), tok) {
		t.Errorf("error quotes the token: %v", err)
	}

	bad := tok[:len(tok)-1]
	_, err = session.Join(t.Context(), session.JoinParams{GatewayURL: g.URL, Token: bad, Key: sessiontest.NewKey(t)})
	if !errors.Is(err, session.ErrConfig) || !errors.Is(err, jointoken.ErrMalformed) {
		t.Errorf("Join with a malformed token = %v, want ErrConfig and ErrMalformed", err)
	}
	for _, u := range []string{"http://127.0.0.1:1", "https://", "https://h/path", "gw:443"} {
		_, err = session.Join(t.Context(), session.JoinParams{GatewayURL: u, Token: tok, Key: sessiontest.NewKey(t)})
		if !errors.Is(err, session.ErrConfig) {
			t.Errorf("Join via %q = %v, want ErrConfig", u, err)
		}
	}
}

func TestHelloWelcomeHeartbeats(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	const interval = 30 * time.Millisecond
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{HeartbeatInterval: interval})
	n := joinNode(t, g)
	cfg := n.config()
	cfg.BCDVersion = "1.2.3"
	cfg.BootID = "boot-1"
	cfg.Capabilities = []string{"exec", "resume"}
	cfg.Reporter = readings{digest: "digest-1", fill: func(hb *sessionv1.Heartbeat) { hb.Load1 = 0.5 }}
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))

	s := g.NextSession(t, wait)
	h := s.Hello
	if h.GetBcdVersion() != "1.2.3" || h.GetBootId() != "boot-1" || h.GetInventoryDigest() != "digest-1" ||
		len(h.GetCapabilities()) != 2 || h.GetOs() == "" || h.GetArch() == "" || h.GetResume() != nil {
		t.Errorf("Hello = %v", h)
	}
	if s.NodeID != n.id.NodeID {
		t.Errorf("session node = %q, want %q", s.NodeID, n.id.NodeID)
	}
	if e := ev.next(t, session.EventConnected); e.SessionID != s.ID || e.Gateway != g.URL {
		t.Errorf("connected event = %+v", e)
	}
	var last time.Time
	for i := range 3 {
		hb := s.NextHeartbeat(t, wait)
		if hb.GetInventoryDigest() != "digest-1" || hb.GetLoad1() != 0.5 {
			t.Errorf("heartbeat %d = %v", i, hb)
		}
		at := hb.GetSentAt().AsTime()
		if !last.IsZero() && at.Sub(last) < interval {
			t.Errorf("heartbeats %v apart, want at least the gateway's %v", at.Sub(last), interval)
		}
		last = at
	}
}

func TestReconnectAfterDropWithBackoff(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	cfg := n.config()
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))

	s1 := g.NextSession(t, wait)
	s1.End(status.New(codes.Unavailable, "gateway going away"))
	d := ev.next(t, session.EventDisconnected)
	if d.Err == nil || !strings.Contains(d.Err.Error(), "gateway going away") {
		t.Errorf("disconnected event err = %v", d.Err)
	}
	b := ev.next(t, session.EventBackoff)
	if b.Attempt != 0 || b.Delay < 0 || b.Delay > cfg.BackoffBase {
		t.Errorf("backoff after a good session = %+v, want attempt 0 and delay in [0, %v]", b, cfg.BackoffBase)
	}
	s2 := g.NextSession(t, wait)
	if r := s2.Hello.GetResume(); r.GetSessionId() != s1.ID || r.GetLastGatewaySeq() != 1 {
		t.Errorf("resume = %v, want session %s seq 1", r, s1.ID)
	}
}

// TestReconnectWindow (issue 37): a lost session that had lasted waits a
// delay spread over the gateway's reconnect window (Welcome), not over
// BackoffBase, and the backoff while the gateway stays away is capped at
// the window when it is longer than BackoffMax.
func TestReconnectWindow(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{ReconnectWindow: 20 * time.Second})
	n := joinNode(t, g)
	cfg := n.config()
	clk := &steppedClock{}
	cfg.Clock = clk
	// The jitter draws its bound: each delay is the bound it was drawn
	// over, recorded, and the test does not wait it out.
	var mu sync.Mutex
	var bounds []time.Duration
	cfg.Jitter = func(d time.Duration) time.Duration {
		mu.Lock()
		bounds = append(bounds, d)
		mu.Unlock()
		return time.Millisecond
	}
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))

	s := g.NextSession(t, wait)
	ev.next(t, session.EventConnected)
	clk.advance(session.DefaultStableAfter)
	s.End(status.New(codes.Unavailable, "gateway going away"))
	if b := ev.next(t, session.EventBackoff); b.Attempt != 0 {
		t.Fatalf("backoff after a lasting session: attempt %d, want 0", b.Attempt)
	}
	mu.Lock()
	first := bounds[len(bounds)-1]
	mu.Unlock()
	if first != 20*time.Second {
		t.Fatalf("first reconnect drawn over %v, want the gateway's 20s window", first)
	}
	if got := session.ReconnectCeil(cfg.BackoffMax, 20*time.Second); got != 20*time.Second {
		t.Fatalf("backoff cap with a 20s window = %v", got)
	}
	if got := session.ReconnectCeil(session.DefaultBackoffMax, time.Second); got != session.DefaultBackoffMax {
		t.Fatalf("backoff cap with a 1s window = %v, want BackoffMax", got)
	}
}

// TestShortSessionsBackOff: sessions that end soon after their Welcome (as
// when two bcd processes share one identity and supersede each other) count
// as failed attempts; a session that lasted StableAfter starts the backoff
// over.
func TestShortSessionsBackOff(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	cfg := n.config()
	clk := &steppedClock{}
	cfg.Clock = clk
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))

	// Lost connections soon after Welcome: how a session superseded by one
	// on another connection ends.
	for want := range 3 {
		g.NextSession(t, wait).End(status.New(codes.Unavailable, "connection closed"))
		if b := ev.next(t, session.EventBackoff); b.Attempt != want {
			t.Fatalf("backoff after short session %d: attempt %d, want %d", want+1, b.Attempt, want)
		}
	}
	s := g.NextSession(t, wait)
	ev.next(t, session.EventConnected) // the Welcome is taken, its time read
	clk.advance(session.DefaultStableAfter)
	s.End(status.New(codes.Unavailable, "gateway going away"))
	if b := ev.next(t, session.EventBackoff); b.Attempt != 0 {
		t.Fatalf("backoff after a session of %v: attempt %d, want 0", session.DefaultStableAfter, b.Attempt)
	}
}

// steppedClock is the system clock moved on by what a test advanced it:
// a session "lasts" StableAfter without the test waiting for it. Timers
// are the system's.
type steppedClock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *steppedClock) advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

func (c *steppedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (*steppedClock) AfterFunc(d time.Duration, f func()) session.Timer { return time.AfterFunc(d, f) }

// TestWelcomedSessionEndedByGatewayResetsBackoff (issue 15): a session that
// was welcomed and then ended cleanly by the gateway (EOF) or drained starts
// the backoff over at its base, however short it was; attempts that fail
// before Welcome still count.
func TestWelcomedSessionEndedByGatewayResetsBackoff(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	cfg := n.config()
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))

	// failures pushes the attempt counter up with short lost sessions and
	// a refused Connect, checking each counts.
	failures := func() {
		t.Helper()
		for want := range 2 {
			g.NextSession(t, wait).End(status.New(codes.Unavailable, "connection closed"))
			if b := ev.next(t, session.EventBackoff); b.Attempt != want {
				t.Fatalf("backoff after short session %d: attempt %d, want %d", want+1, b.Attempt, want)
			}
		}
		g.RefuseNext(codes.Unavailable, 0)
		if b := ev.next(t, session.EventBackoff); b.Attempt != 2 {
			t.Fatalf("backoff after a refused Connect: attempt %d, want 2", b.Attempt)
		}
	}

	failures()
	g.NextSession(t, wait).End(status.New(codes.OK, ""))
	b := ev.next(t, session.EventBackoff)
	if b.Attempt != 0 || b.Delay > cfg.BackoffBase {
		t.Fatalf("backoff after a session the gateway closed = %+v, want attempt 0, delay within %v", b, cfg.BackoffBase)
	}

	// Back to attempt 0 after that reset; then a Drain resets it too: the
	// first failure after the drained session backs off from the base.
	g.NextSession(t, wait).End(status.New(codes.Unavailable, "connection closed"))
	if b := ev.next(t, session.EventBackoff); b.Attempt != 1 {
		t.Fatalf("backoff after a short session following the reset: attempt %d, want 1", b.Attempt)
	}
	g.NextSession(t, wait).End(status.New(codes.Unavailable, "connection closed"))
	ev.next(t, session.EventBackoff)
	s := g.NextSession(t, wait)
	if err := s.SendDrain(0); err != nil {
		t.Fatal(err)
	}
	ev.next(t, session.EventDraining)
	g.RefuseNext(codes.Unavailable, 0)
	if b := ev.next(t, session.EventBackoff); b.Attempt != 0 || b.Delay > cfg.BackoffBase {
		t.Fatalf("backoff after the drained session = %+v, want attempt 0, delay within %v", b, cfg.BackoffBase)
	}
}

// TestSupersededSessionsCountAsFailures (issue 15): sessions the gateway
// ends as superseded (ABORTED) count as failed attempts however long they
// lasted, so two bcd processes sharing one identity back off.
func TestSupersededSessionsCountAsFailures(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	cfg := n.config()
	clk := &steppedClock{}
	cfg.Clock = clk
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))

	for want := range 4 {
		s := g.NextSession(t, wait)
		ev.next(t, session.EventConnected)      // the Welcome is taken, its time read
		clk.advance(session.DefaultStableAfter) // long enough to reset, were it lost
		s.End(status.New(codes.Aborted, "superseded by session sess_other"))
		if b := ev.next(t, session.EventBackoff); b.Attempt != want {
			t.Fatalf("backoff after superseded session %d: attempt %d, want %d", want+1, b.Attempt, want)
		}
	}
}

func TestRetryAfterHintHonoured(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	const hint = 300 * time.Millisecond
	g.RefuseNext(codes.ResourceExhausted, hint)
	cfg := n.config()
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))

	b := ev.next(t, session.EventBackoff)
	if b.Delay < hint || b.Delay > hint+hint/4 {
		t.Errorf("backoff delay %v, want within [%v, %v]", b.Delay, hint, hint+hint/4)
	}
	ev.next(t, session.EventConnected)
}

func TestBackoffGrowsWhileGatewayDown(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	g.Close()
	cfg := n.config()
	cfg.Jitter = func(d time.Duration) time.Duration { return d } // the bound itself
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))
	want := []time.Duration{20, 40, 80, 100, 100}
	for i, w := range want {
		b := ev.next(t, session.EventBackoff)
		if b.Attempt != i || b.Delay != w*time.Millisecond {
			t.Errorf("backoff %d = attempt %d delay %v, want %v", i, b.Attempt, b.Delay, w*time.Millisecond)
		}
	}
}

func TestFailoverToNextGateway(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "https://" + lis.Addr().String()
	lis.Close()
	cfg := n.config(dead, g.URL)
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))
	if e := ev.next(t, session.EventConnecting); e.Gateway != dead {
		t.Errorf("first attempt to %s, want %s", e.Gateway, dead)
	}
	if e := ev.next(t, session.EventConnected); e.Gateway != g.URL {
		t.Errorf("connected to %s, want %s", e.Gateway, g.URL)
	}
}

func TestHandshakeTimeout(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	// A listener that accepts and never speaks.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	cfg := n.config("https://" + lis.Addr().String())
	cfg.HandshakeTimeout = 100 * time.Millisecond
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))
	d := ev.next(t, session.EventDisconnected)
	if d.Err == nil || !strings.Contains(d.Err.Error(), "no Welcome within 100ms") {
		t.Errorf("disconnected err = %v, want a handshake timeout", d.Err)
	}
}

func TestDrainMovesToAnotherGateway(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	a := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{ID: "a"})
	b := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{ID: "b"})
	n := joinNode(t, a)
	cfg := n.config(a.URL, b.URL)
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))

	sa := a.NextSession(t, wait)
	if err := sa.SendDrain(50 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := ev.next(t, session.EventDraining); d.Delay > 50*time.Millisecond || d.Gateway != a.URL {
		t.Errorf("draining event = %+v", d)
	}
	sb := b.NextSession(t, wait)
	if sb.Hello.GetResume().GetSessionId() != sa.ID {
		t.Errorf("resume after drain = %v", sb.Hello.GetResume())
	}
	select {
	case <-sa.Done():
	case <-time.After(wait):
		t.Error("the drained session stayed open")
	}
}

func TestDrainThenGatewayClosesFirst(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	a := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{ID: "a"})
	b := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{ID: "b"})
	n := joinNode(t, a)
	cfg := n.config(a.URL, b.URL)
	cfg.Jitter = func(d time.Duration) time.Duration { return d } // wait the whole delay
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))

	sa := a.NextSession(t, wait)
	const delay = 300 * time.Millisecond
	if err := sa.SendDrain(delay); err != nil {
		t.Fatal(err)
	}
	ev.next(t, session.EventDraining)
	// The gateway shuts down before the node's wait is over: the node still
	// waits out the rest, then goes to the other gateway.
	sa.End(status.New(codes.Unavailable, "shutting down"))
	bo := ev.next(t, session.EventBackoff)
	if bo.Delay <= 0 || bo.Delay > delay {
		t.Errorf("wait after an early close = %v, want the rest of %v", bo.Delay, delay)
	}
	if e := ev.next(t, session.EventConnecting); e.Gateway != b.URL {
		t.Errorf("reconnected to %s, want %s", e.Gateway, b.URL)
	}
	b.NextSession(t, wait)
}

func TestDrainPrefersNamedGateway(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	a := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{ID: "a"})
	b := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{ID: "b"})
	n := joinNode(t, a)
	cfg := n.config(a.URL) // b is not in the list: only the Drain names it
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))
	sa := a.NextSession(t, wait)
	if err := sa.SendDrain(0, b.URL); err != nil {
		t.Fatal(err)
	}
	b.NextSession(t, wait)
	if e := ev.next(t, session.EventConnected); e.Gateway != a.URL {
		t.Errorf("first session on %s", e.Gateway)
	}
	if e := ev.next(t, session.EventConnected); e.Gateway != b.URL {
		t.Errorf("session after drain on %s, want %s", e.Gateway, b.URL)
	}
	// When b goes away the node returns to its own list.
	b.Close()
	a.NextSession(t, wait)
}

func TestRevokedMessageStopsRun(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	stop, done := run(t, newClient(t, n.config()))
	s := g.NextSession(t, wait)
	if err := s.SendRevoked("decommissioned"); err != nil {
		t.Fatal(err)
	}
	if err := result(t, stop, done); !errors.Is(err, session.ErrRevoked) || !strings.Contains(err.Error(), "decommissioned") {
		t.Errorf("Run = %v, want ErrRevoked with the reason", err)
	}
}

func TestRevokedOnConnect(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	g.Revoke(n.id.NodeID, "stolen")
	stop, done := run(t, newClient(t, n.config()))
	if err := result(t, stop, done); !errors.Is(err, session.ErrRevoked) {
		t.Errorf("Run = %v, want ErrRevoked", err)
	}
}

func TestRenewInSessionPersistsAndIsUsed(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{RenewAfter: 200 * time.Millisecond})
	n := joinNode(t, g)
	cfg := n.config()
	var mu sync.Mutex
	var persisted []*session.Renewal
	cfg.Identity = keeper{renew: func(_ context.Context, r *session.Renewal) error {
		mu.Lock()
		defer mu.Unlock()
		persisted = append(persisted, r)
		return nil
	}}
	ev := newEvents(&cfg)
	c := newClient(t, cfg)
	run(t, c)

	s1 := g.NextSession(t, wait)
	if !s1.Cert.Equal(n.id.Chain[0]) {
		t.Fatal("first session does not use the joined certificate")
	}
	ev.next(t, session.EventRenewed)
	mu.Lock()
	if len(persisted) == 0 {
		mu.Unlock()
		t.Fatal("renewal not persisted")
	}
	renewed := persisted[0]
	mu.Unlock()
	if renewed.Chain[0].SerialNumber.Cmp(n.id.Chain[0].SerialNumber) == 0 {
		t.Fatal("renewal returned the same certificate")
	}
	if !renewed.RenewAfter.After(time.Now().Add(-time.Second)) || len(renewed.NodeCARoots) != 1 {
		t.Errorf("renewal = %+v", renewed)
	}
	chain, _ := c.Certificate()
	if chain[0].SerialNumber.Cmp(n.id.Chain[0].SerialNumber) == 0 {
		t.Error("client still holds the old certificate")
	}
	if s1.Gateway.OpenSessions() != 1 {
		t.Error("renewal disturbed the session")
	}

	// Join offered X25519 alone; the session and Renew keep Go's hybrid
	// post-quantum exchange (docs/pki.md).
	for rpc, want := range map[string]tls.CurveID{"Join": tls.X25519, "Connect": tls.X25519MLKEM768, "Renew": tls.X25519MLKEM768} {
		if got := g.KeyExchange(rpc); got != want {
			t.Errorf("%s key exchange = %v, want %v", rpc, got, want)
		}
	}

	// The next connection presents a renewed certificate.
	s1.End(status.New(codes.Unavailable, "bye"))
	s2 := g.NextSession(t, wait)
	if s2.Cert.SerialNumber.Cmp(n.id.Chain[0].SerialNumber) == 0 {
		t.Error("new connection presented the old certificate")
	}
}

func TestRenewRevokedStopsRun(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	g.Revoke(n.id.NodeID, "retired")
	cfg := n.config()
	cfg.RenewAfter = time.Now().Add(-time.Second) // renews before Connect
	ev := newEvents(&cfg)
	stop, done := run(t, newClient(t, cfg))
	if e := ev.next(t, session.EventRenewFailed); !errors.Is(e.Err, session.ErrRevoked) {
		t.Errorf("renew failed with %v, want ErrRevoked", e.Err)
	}
	if err := result(t, stop, done); !errors.Is(err, session.ErrRevoked) || !strings.Contains(err.Error(), "renew") {
		t.Errorf("Run = %v, want ErrRevoked from Renew", err)
	}
	if g.Renewals() != 0 {
		t.Errorf("%d renewals for a revoked node", g.Renewals())
	}
}

func TestRenewDueAtStart(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	n := joinNode(t, g)
	cfg := n.config()
	cfg.RenewAfter = time.Now().Add(-time.Second) // the machine was off
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))
	ev.next(t, session.EventRenewed)
	s := g.NextSession(t, wait)
	if s.Cert.SerialNumber.Cmp(n.id.Chain[0].SerialNumber) == 0 {
		t.Error("session opened with the certificate that was due for renewal")
	}
}

// TestExpiredCertificateReattests: a node back from an outage longer than
// its certificate's life re-attests with its key and connects, without an
// operator; once the gateway says the grace is over, Run stops with
// ErrCertificateExpired and the exact way back.
func TestExpiredCertificateReattests(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	key := sessiontest.NewKey(t)
	now := time.Now()
	expired := p.NodeCertificate(t, key, "node-1", now.Add(-20*time.Hour), now.Add(-2*time.Hour))

	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	var renewed []*session.Renewal
	var mu sync.Mutex
	c := newClient(t, session.Config{
		Gateways: []string{g.URL},
		Trust:    session.Trust{Pin: p.Pin()},
		Key:      key,
		Chain:    []*x509.Certificate{expired},
		Identity: keeper{renew: func(_ context.Context, r *session.Renewal) error {
			mu.Lock()
			renewed = append(renewed, r)
			mu.Unlock()
			return nil
		}},
	})
	run(t, c)
	g.NextSession(t, wait)
	if g.Reattests() != 1 {
		t.Fatalf("%d re-attestations, want 1", g.Reattests())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(renewed) != 1 || !renewed[0].Chain[0].NotAfter.After(now) {
		t.Fatalf("re-attested certificate not persisted: %+v", renewed)
	}

	over := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{ReattestRefused: true})
	c2 := newClient(t, session.Config{
		Gateways: []string{over.URL},
		Trust:    session.Trust{Pin: p.Pin()},
		Key:      key,
		Chain:    []*x509.Certificate{expired},
	})
	err := c2.Run(t.Context())
	if !errors.Is(err, session.ErrCertificateExpired) || !strings.Contains(err.Error(), "nodes reinstall node-1") || !strings.Contains(err.Error(), "bcd join") {
		t.Errorf("Run = %v, want ErrCertificateExpired with the re-join command", err)
	}
}

// TestExpiredCertificateRetriesWhileUnreachable: with no gateway to answer,
// an expired certificate is not the end: Run keeps trying.
func TestExpiredCertificateRetriesWhileUnreachable(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	key := sessiontest.NewKey(t)
	now := time.Now()
	cert := p.NodeCertificate(t, key, "node-1", now.Add(-48*time.Hour), now.Add(-24*time.Hour))
	failures := make(chan session.Event, 16)
	c := newClient(t, session.Config{
		Gateways:    []string{"https://127.0.0.1:1"},
		Trust:       session.Trust{Pin: p.Pin()},
		Key:         key,
		Chain:       []*x509.Certificate{cert},
		BackoffBase: time.Millisecond,
		OnEvent: func(ev session.Event) {
			if ev.Kind == session.EventRenewFailed {
				select {
				case failures <- ev:
				default:
				}
			}
		},
	})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { done <- c.Run(ctx) }()
	for range 2 {
		select {
		case <-failures:
		case err := <-done:
			t.Fatalf("Run ended with %v while the gateway was unreachable", err)
		case <-time.After(wait):
			t.Fatal("no re-attestation attempt")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v after cancel, want nil", err)
	}
}

// TestRetiredIssuerReattests: a node whose valid certificate comes from a
// node CA that a rotation retired while it was off (the gateway's
// handshakes refuse it with unknown_ca, its key proofs still verify)
// re-attests with its key and connects on a certificate of the CA in force,
// without an operator. A gateway that refuses the proof as well is no
// reason to stop: Run keeps retrying; so is one that answers GRACE_PASSED
// while the certificate is still valid (logged as a refused issuer, not an
// expired certificate). Expired, GRACE_PASSED is final.
func TestRetiredIssuerReattests(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	retired := sessiontest.NewPKI(t) // its node CA is the one retired
	key := sessiontest.NewKey(t)
	now := time.Now()
	cert := retired.NodeCertificate(t, key, "node-1", now.Add(-time.Hour), now.Add(time.Hour))

	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{RetiredNodeCAs: []*x509.Certificate{retired.NodeCA}})
	renewed := make(chan *session.Renewal, 4)
	c := newClient(t, session.Config{
		Gateways: []string{g.URL},
		Trust:    session.Trust{Pin: p.Pin()},
		Key:      key,
		Chain:    []*x509.Certificate{cert},
		Identity: keeper{renew: func(_ context.Context, r *session.Renewal) error {
			renewed <- r
			return nil
		}},
	})
	run(t, c)
	s := g.NextSession(t, wait)
	if g.Reattests() != 1 {
		t.Fatalf("%d re-attestations, want 1", g.Reattests())
	}
	if err := s.Cert.CheckSignatureFrom(p.NodeCA); err != nil {
		t.Fatalf("session opened with a certificate not from the node CA in force: %v", err)
	}
	select {
	case r := <-renewed:
		if r.Chain[0].CheckSignatureFrom(p.NodeCA) != nil {
			t.Fatal("the re-attested certificate persisted is not from the node CA in force")
		}
	case <-time.After(wait):
		t.Fatal("re-attested certificate not persisted")
	}

	// Without the retired root the proof is refused too: not final.
	strict := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	failures := make(chan session.Event, 16)
	c2 := newClient(t, session.Config{
		Gateways:    []string{strict.URL},
		Trust:       session.Trust{Pin: p.Pin()},
		Key:         key,
		Chain:       []*x509.Certificate{cert},
		BackoffBase: time.Millisecond,
		OnEvent: func(ev session.Event) {
			if ev.Kind == session.EventRenewFailed {
				select {
				case failures <- ev:
				default:
				}
			}
		},
	})
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { done <- c2.Run(ctx) }()
	for range 2 {
		select {
		case <-failures:
		case err := <-done:
			t.Fatalf("Run ended with %v when the gateway refused the proof, want it to keep retrying", err)
		case <-time.After(wait):
			t.Fatal("no re-attestation attempt")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v after cancel, want nil", err)
	}

	// A gateway that refuses the issuer and answers the proof with
	// GRACE_PASSED (pki.reattestGrace 0, or a stale bundle) while the
	// certificate is still valid: not final, retried, and logged as what
	// it is, not as an expired certificate.
	refusing := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{ReattestRefused: true,
		RetiredNodeCAs: []*x509.Certificate{retired.NodeCA}})
	var logs logSink
	failures3 := make(chan session.Event, 16)
	c3 := newClient(t, session.Config{
		Gateways:    []string{refusing.URL},
		Trust:       session.Trust{Pin: p.Pin()},
		Key:         key,
		Chain:       []*x509.Certificate{cert},
		BackoffBase: time.Millisecond,
		Logger:      logs.logger(),
		OnEvent: func(ev session.Event) {
			if ev.Kind == session.EventRenewFailed {
				select {
				case failures3 <- ev:
				default:
				}
			}
		},
	})
	done3 := make(chan error, 1)
	ctx3, cancel3 := context.WithCancel(t.Context())
	go func() { done3 <- c3.Run(ctx3) }()
	for range 2 {
		select {
		case ev := <-failures3:
			if errors.Is(ev.Err, session.ErrCertificateExpired) || !strings.Contains(ev.Err.Error(), "still valid") {
				t.Errorf("re-attestation refused for a valid certificate: %v, want a temporary error saying it is still valid", ev.Err)
			}
		case err := <-done3:
			t.Fatalf("Run ended with %v when the gateway refused to re-attest a valid certificate, want it to keep retrying", err)
		case <-time.After(wait):
			t.Fatal("no re-attestation attempt")
		}
	}
	cancel3()
	if err := <-done3; err != nil {
		t.Fatalf("Run = %v after cancel, want nil", err)
	}
	if out := logs.String(); !strings.Contains(out, "does not trust the node certificate's issuer and refused to re-attest it") ||
		strings.Contains(out, "Node certificate expired") {
		t.Errorf("logs say:\n%s\nwant the gateway's refusal of the issuer and of the re-attestation, and nothing about an expired certificate", out)
	}

	// Once that certificate has expired, GRACE_PASSED is final (exit 4).
	expired := retired.NodeCertificate(t, key, "node-1", now.Add(-2*time.Hour), now.Add(-time.Hour))
	c4 := newClient(t, session.Config{
		Gateways: []string{refusing.URL},
		Trust:    session.Trust{Pin: p.Pin()},
		Key:      key,
		Chain:    []*x509.Certificate{expired},
	})
	if err := c4.Run(t.Context()); !errors.Is(err, session.ErrCertificateExpired) {
		t.Errorf("Run with an expired certificate past the grace = %v, want ErrCertificateExpired", err)
	}
}

func TestCommandsDelivered(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{HeartbeatInterval: time.Hour})
	n := joinNode(t, g)
	cfg := n.config()
	h := &recordingHandler{cancels: make(chan string, 1)}
	cfg.Handler = h
	run(t, newClient(t, cfg))
	s := g.NextSession(t, wait)
	if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: &sessionv1.Command{Id: "c1", Kind: "reboot"}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Cancel{Cancel: &sessionv1.Cancel{CommandId: "c1"}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-s.Messages():
		u := m.GetCommandUpdate()
		if u.GetCommandId() != "c1" || u.GetAccepted() == nil || m.GetSeq() != 2 {
			t.Errorf("update = %v, want c1 accepted with seq 2", m)
		}
	case <-time.After(wait):
		t.Fatal("no command update")
	}
	select {
	case id := <-h.cancels:
		if id != "c1" {
			t.Errorf("cancel for %q", id)
		}
	case <-time.After(wait):
		t.Fatal("Cancel not delivered")
	}
}

func TestDefaultHandlerFailsCommands(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{HeartbeatInterval: time.Hour})
	n := joinNode(t, g)
	run(t, newClient(t, n.config()))
	s := g.NextSession(t, wait)
	if err := s.Send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: &sessionv1.Command{Id: "c1", Kind: "exec"}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-s.Messages():
		r := m.GetCommandUpdate().GetResult()
		if r.GetCommandId() != "c1" || r.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED || r.GetExitCode() != -1 {
			t.Errorf("result = %v", r)
		}
	case <-time.After(wait):
		t.Fatal("no result")
	}
}

type recordingHandler struct{ cancels chan string }

func (h *recordingHandler) HandleCommand(_ context.Context, cmd *sessionv1.Command, send func(*sessionv1.CommandUpdate) error) {
	_ = send(&sessionv1.CommandUpdate{CommandId: cmd.GetId(), UpdateSeq: 1, Update: &sessionv1.CommandUpdate_Accepted{Accepted: &sessionv1.Accepted{}}})
}

func (h *recordingHandler) HandleCancel(_ context.Context, c *sessionv1.Cancel) {
	h.cancels <- c.GetCommandId()
}

func TestSendWithoutSession(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	key := sessiontest.NewKey(t)
	cert := p.NodeCertificate(t, key, "node-1", time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	c := newClient(t, session.Config{Gateways: []string{"https://127.0.0.1:1"}, Trust: session.Trust{Pin: p.Pin()}, Key: key, Chain: []*x509.Certificate{cert}})
	if err := c.Send(&sessionv1.NodeMessage{}); !errors.Is(err, session.ErrNotConnected) {
		t.Errorf("Send = %v, want ErrNotConnected", err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	key := sessiontest.NewKey(t)
	cert := p.NodeCertificate(t, key, "node-1", time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	good := session.Config{Gateways: []string{"https://gw.example:8443"}, Trust: session.Trust{Pin: p.Pin()}, Key: key, Chain: []*x509.Certificate{cert}}
	if _, err := session.New(good); err != nil {
		t.Fatalf("New(good) = %v", err)
	}
	for name, mod := range map[string]func(*session.Config){
		"no gateways":    func(c *session.Config) { c.Gateways = nil },
		"http gateway":   func(c *session.Config) { c.Gateways = []string{"http://gw:80"} },
		"no trust":       func(c *session.Config) { c.Trust = session.Trust{} },
		"bad pin":        func(c *session.Config) { c.Trust = session.Trust{Pin: "sha256/nope"} },
		"pin and pool":   func(c *session.Config) { c.Trust.Roots = p.GatewayCAPool() },
		"no key":         func(c *session.Config) { c.Key = nil },
		"other key":      func(c *session.Config) { c.Key = sessiontest.NewKey(t) },
		"no certificate": func(c *session.Config) { c.Chain = nil },
		"cap below base": func(c *session.Config) { c.BackoffBase, c.BackoffMax = time.Minute, time.Second },
	} {
		cfg := good
		mod(&cfg)
		if _, err := session.New(cfg); !errors.Is(err, session.ErrConfig) {
			t.Errorf("%s: New = %v, want ErrConfig", name, err)
		}
	}
}

// TestRunLeaksNoGoroutines runs a full session and checks that nothing the
// client started outlives Run. It is not parallel: it counts goroutines.
func TestRunLeaksNoGoroutines(t *testing.T) {
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{HeartbeatInterval: 10 * time.Millisecond, RenewAfter: 50 * time.Millisecond})
	n := joinNode(t, g)
	ignore := goleak.IgnoreCurrent()
	cfg := n.config()
	ev := newEvents(&cfg)
	stop, _ := run(t, newClient(t, cfg))
	s := g.NextSession(t, wait)
	s.NextHeartbeat(t, wait)
	ev.next(t, session.EventRenewed)
	if err := s.SendDrain(time.Hour); err != nil {
		t.Fatal(err)
	}
	ev.next(t, session.EventDraining)
	if err := stop(); err != nil {
		t.Fatalf("Run = %v, want nil after cancellation", err)
	}
	g.Close()
	goleak.VerifyNone(t, ignore)
}

// keeper is a session.IdentityKeeper of the functions a test sets; an
// unset one keeps nothing and succeeds.
type keeper struct {
	renew    func(context.Context, *session.Renewal) error
	gateways func(context.Context, []session.KnownGateway) error
	bundle   func(context.Context, []*x509.Certificate) error
}

func (k keeper) KeepRenewal(ctx context.Context, r *session.Renewal) error {
	if k.renew == nil {
		return nil
	}
	return k.renew(ctx, r)
}

func (k keeper) KeepGateways(ctx context.Context, known []session.KnownGateway) error {
	if k.gateways == nil {
		return nil
	}
	return k.gateways(ctx, known)
}

func (k keeper) KeepBundle(ctx context.Context, roots []*x509.Certificate) error {
	if k.bundle == nil {
		return nil
	}
	return k.bundle(ctx, roots)
}

// readings is a session.Reporter of a fixed digest and a test's fill.
type readings struct {
	digest string
	fill   func(*sessionv1.Heartbeat)
}

func (r readings) InventoryDigest() string { return r.digest }

func (r readings) FillHeartbeat(hb *sessionv1.Heartbeat) {
	if r.fill != nil {
		r.fill(hb)
	}
}

func (readings) PendingResults() []*sessionv1.CommandResult { return nil }
func (readings) LocalRollback() *sessionv1.LocalRollback    { return nil }
