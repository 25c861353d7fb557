package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TrailerRetryAfter is the trailer of a refused Connect that says, in
// milliseconds, when to try again.
const TrailerRetryAfter = "retry-after-ms"

// ErrNoSession is returned by Send when the node holds no session on this
// gateway.
var ErrNoSession = errors.New("node has no session on this gateway")

// revokedGrace is how long a revoked session's connection stays open after
// Revoked is sent, for the message to reach the node.
const revokedGrace = 500 * time.Millisecond

// session is one node's Connect stream. Its fields above the line are set
// before it is shared; the handler goroutine alone uses the ones below.
type session struct {
	g           *Gateway
	nodeID      string
	id          string
	epoch       int64
	connectedAt time.Time // database clock
	conn        *trackedConn
	stream      sessionv1.SessionService_ConnectServer
	caps        []string // capabilities in force (Welcome's)

	serial  atomic.Pointer[string] // certificate serial the session answers to
	closed  atomic.Bool            // ended from outside
	drained atomic.Bool            // sent Drain (drainAll)
	reason  atomic.Pointer[string] // why, once closed

	sendMu   sync.Mutex
	seq      uint64 // last GatewayMessage.seq sent; under sendMu
	ended    bool   // the handler returned; under sendMu
	welcomed bool   // Welcome went first (welcome); under sendMu

	// handler goroutine only
	lastBeat        time.Time
	skew            time.Duration // the node's clock minus ours, as last queued (measureSkew)
	skewMeasured    bool
	inventoryDigest string
	missingSent     map[string]bool // GPUs reported missing in this session (gpucount), until the count is back
	writes          *rate.Limiter   // inventory and event writes, made on first use
	notes           nodeNotes       // log lines about the node, limited (warnNode)
}

// sessionService implements SessionService.
type sessionService struct {
	sessionv1.UnimplementedSessionServiceServer
	g *Gateway
}

// Connect runs one session (see the package documentation): accept admits
// and opens it, then the handler goroutine stays in this loop for the
// session's life. The loop is here, after accept has returned, with no
// defers and few variables, so that little of our own frames stays on the
// goroutine's stack while it waits for a message: the runtime keeps a
// stack at up to four times what it uses, and gRPC's frames below ours
// come to just under the 3.2 KiB that lets a waiting handler's stack
// shrink from 16 KiB to 8 KiB. The handler is one of the session's four
// goroutines, with gRPC's reader, writer and keepalive;
// docs/performance.md has the figures.
func (ss *sessionService) Connect(stream sessionv1.SessionService_ConnectServer) error {
	s, err := ss.g.accept(stream)
	if s == nil {
		return err
	}
	for err == nil {
		msg := new(sessionv1.NodeMessage)
		if err = s.stream.RecvMsg(msg); err != nil || s.closed.Load() {
			break
		}
		s.g.handle(s.stream.Context(), s, msg)
	}
	return s.finish(err)
}

// finish ends the session Connect held and returns what Connect returns
// for the error that ended its loop: nil when the daemon closed its side.
// It is not inlined, so that its variables stay out of Connect's frame.
//
//go:noinline
func (s *session) finish(err error) error {
	s.g.end(s)
	s.g.streams.Add(-1)
	switch {
	case s.closed.Load():
		return status.Error(codes.Aborted, s.closeReason())
	case errors.Is(err, io.EOF):
		return nil
	}
	return err
}

// accept admits a Connect stream: capacity, the node's certificate, Hello,
// the session row, Welcome. It returns a nil session when nothing is held;
// otherwise the session holds a stream reservation and is registered, and
// the caller ends it (also when err, from sending Welcome, is not nil).
func (g *Gateway) accept(stream sessionv1.SessionService_ConnectServer) (*session, error) {
	ctx := stream.Context()
	if p, ok := peer.FromContext(ctx); ok {
		// Welcome sent or the stream refused: the connection is set up.
		defer g.ln.conn(p.Addr).settle()
	}
	if g.draining.Load() {
		g.cfg.Metrics.Refused(g.cfg.ID, reasonDraining)
		return nil, status.Error(codes.Unavailable, "gateway is draining: connect to another gateway of the region")
	}
	// A cheap refusal first, so a storm beyond capacity costs no database
	// reads; the reservation below is the exact one.
	if g.streams.Load() >= int64(g.cfg.MaxStreams) {
		return nil, g.full(stream)
	}
	id, err := g.authenticate(ctx, codes.PermissionDenied)
	if err != nil {
		g.cfg.Metrics.Refused(g.cfg.ID, reasonUntrusted)
		return nil, err
	}
	if n := g.streams.Add(1); n > int64(g.cfg.MaxStreams) {
		g.streams.Add(-1)
		return nil, g.full(stream)
	}
	held := false
	defer func() {
		if !held {
			g.streams.Add(-1)
		}
	}()

	conn := g.ln.conn(id.addr)
	hello, err := g.awaitHello(stream, conn)
	if err != nil {
		reason := reasonProtocol
		if status.Code(err) == codes.DeadlineExceeded {
			reason = reasonHelloTimeout
		}
		g.cfg.Metrics.Refused(g.cfg.ID, reason)
		return nil, err
	}
	h := g.negotiate(hello)
	s := &session{g: g, nodeID: id.nodeID, id: store.NewID("sess"), conn: conn, stream: stream, caps: h.capabilities}
	s.serial.Store(&id.serial)
	if err := g.open(ctx, s, id, h); err != nil {
		return nil, err
	}
	held = true

	err = s.welcome(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Welcome{Welcome: &sessionv1.Welcome{
		SessionId:         s.id,
		HeartbeatInterval: durationpb.New(g.cfg.HeartbeatInterval),
		ServerTime:        timestamppb.New(g.cfg.Clock.Now()),
		Capabilities:      h.capabilities,
		NodeId:            s.nodeID,
		GatewayId:         g.cfg.ID,
		Gateways:          g.regionGateways(ctx, g.cfg.Region),
		GpuHealth:         g.cfg.GPUHealth,
		ReconnectWindow:   durationpb.New(ReconnectWindow(g.sessions.len(), g.cfg.HandshakeRate)),
	}}})
	if err != nil {
		return s, err
	}
	g.cfg.Metrics.SessionOpened(g.cfg.ID, hello.GetResume().GetSessionId() != "")
	g.log.InfoContext(ctx, "Session opened", logkey.NodeID, s.nodeID, "session_id", s.id, "epoch", s.epoch,
		"remote", id.addr.String(), "bcd_version", hello.GetBcdVersion())
	go g.sessionOpened(ctx, s, hello)
	g.sendBundle(s)
	g.sendReleasePins(s)
	return s, nil
}

// ReconnectWindow is the Welcome's reconnect_window for a gateway holding
// sessions sessions that admits rate new connections a second
// (Config.HandshakeRate): the time it needs to take every one of them back
// after a restart, whole seconds, at least one. Nodes spread their first
// reconnect over it and cap their backoff at it (bcd/session), so a fleet
// arrives at the rate the gateway admits instead of in one second's storm
// followed by a long tail.
func ReconnectWindow(sessions int, rate float64) time.Duration {
	if rate <= 0 {
		return time.Second
	}
	secs := math.Ceil(float64(sessions) / rate)
	return time.Duration(max(secs, 1)) * time.Second
}

// full refuses a stream beyond MaxStreams with a retry hint.
func (g *Gateway) full(stream sessionv1.SessionService_ConnectServer) error {
	g.cfg.Metrics.Refused(g.cfg.ID, reasonFull)
	d := g.cfg.RetryAfter + rand.N(g.cfg.RetryAfter+1)
	stream.SetTrailer(metadata.Pairs(TrailerRetryAfter, strconv.FormatInt(d.Milliseconds(), 10)))
	st := status.New(codes.ResourceExhausted, fmt.Sprintf("gateway %s is full (%d sessions): retry in %s or connect to another gateway of the region",
		g.cfg.ID, g.cfg.MaxStreams, d.Round(time.Millisecond)))
	if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)}); err == nil {
		st = withInfo
	}
	return st.Err()
}

// awaitHello reads the first message, which must be Hello and must come
// within HelloTimeout; after that the connection is closed.
func (g *Gateway) awaitHello(stream sessionv1.SessionService_ConnectServer, conn *trackedConn) (*sessionv1.Hello, error) {
	var timer *time.Timer
	if conn != nil {
		timer = time.AfterFunc(g.cfg.HelloTimeout, func() { conn.Close() })
	}
	msg, err := stream.Recv()
	if timer != nil && !timer.Stop() {
		return nil, status.Errorf(codes.DeadlineExceeded, "no Hello within %s", g.cfg.HelloTimeout)
	}
	if err != nil {
		return nil, err
	}
	hello := msg.GetHello()
	if hello == nil {
		return nil, status.Error(codes.InvalidArgument, "the first message of a session must be Hello")
	}
	return hello, nil
}

// openTx is what opening a session touches: the session and its node.
type openTx interface {
	SessionOpen(ctx context.Context, p *store.SessionOpenParams) (session, previous *store.Session, err error)
	NodeGet(ctx context.Context, id string) (*store.Node, error)
	NodeSetState(ctx context.Context, id, state string) error
	NodeRolledBackLocally(ctx context.Context, p *store.NodeRolledBackLocallyParams) error
	NodeUpsert(ctx context.Context, p *store.NodeUpsertParams) (*store.Node, error)
}

// open records the session and the node's boot id, supersedes older ones
// and marks the node ready.
func (g *Gateway) open(ctx context.Context, s *session, id *identity, h *helloInfo) error {
	var previous *store.Session
	err := store.InFencedTx(ctx, g.store, *g.fence.Load(), func(tx openTx) error {
		row, prev, err := tx.SessionOpen(ctx, &store.SessionOpenParams{
			NodeID: s.nodeID, SessionID: s.id, GatewayID: g.cfg.ID, RemoteAddr: id.addr.String(), BootID: h.bootID, Fresh: h.fresh,
		})
		if err != nil {
			return err
		}
		s.epoch, s.connectedAt, previous = row.Epoch, row.ConnectedAt, prev
		n, err := tx.NodeGet(ctx, s.nodeID)
		if err != nil {
			return err
		}
		// The inventory a daemon sends on every connect is stored only if
		// it changed: a gateway restart does not rewrite the fleet's.
		s.inventoryDigest = n.InventoryDigest
		switch n.State {
		case store.NodeJoined, store.NodeUnreachable, store.NodePoweredOff:
			if err := tx.NodeSetState(ctx, s.nodeID, store.NodeReady); err != nil {
				return err
			}
		}
		if h.rollback != nil {
			// bcd rolled itself back after a crash loop, perhaps while no
			// control plane answered: recorded once per Welcome it gets.
			p := *h.rollback
			p.NodeID = s.nodeID
			if err := tx.NodeRolledBackLocally(ctx, &p); err != nil {
				return err
			}
		}
		if h.changes(n) {
			_, err = tx.NodeUpsert(ctx, &store.NodeUpsertParams{
				ID: n.ID, PoolID: n.PoolID, Hostname: n.Hostname, MachineID: n.MachineID, Labels: n.Labels,
				BCDVersion: h.bcdVersion, OS: h.os, Arch: h.arch, CertSerial: n.CertSerial, CertNotAfter: n.CertNotAfter,
			})
		}
		return err
	})
	switch {
	case errors.Is(err, store.ErrFenced):
		return status.Error(codes.Unavailable, "gateway is renewing its lease: retry shortly")
	case err != nil:
		g.log.ErrorContext(ctx, "Session not opened", logkey.NodeID, s.nodeID, logkey.Err, err)
		return status.Error(codes.Unavailable, "cannot record the session now: retry shortly")
	}
	replaced, current := g.sessions.add(s)
	if !current {
		// A newer session of the node opened here meanwhile.
		g.pending.close(s.nodeID, s.id)
		return status.Error(codes.Aborted, "superseded by a newer session of this node")
	}
	if replaced != nil {
		replaced.supersede(s)
	}
	if previous != nil && previous.GatewayID != g.cfg.ID {
		g.log.InfoContext(ctx, "Session superseded a session on another gateway", logkey.NodeID, s.nodeID,
			"session_id", s.id, "previous_gateway_id", previous.GatewayID)
	}
	return nil
}

// end forgets an ended session and queues its row's removal.
func (g *Gateway) end(s *session) {
	s.sendMu.Lock()
	s.ended = true
	s.sendMu.Unlock()
	g.sessions.remove(s)
	g.pending.close(s.nodeID, s.id)
	g.log.Info("Session closed", logkey.NodeID, s.nodeID, "session_id", s.id, "reason", s.closeReason())
}

// Send sends msg to the node's session on this gateway, numbered with the
// session's next GatewayMessage.seq (msg itself is not changed). It is the
// seam command dispatch uses. It fails with ErrNoSession when the node
// holds no session here, and with the stream's error when the send fails.
func (g *Gateway) Send(nodeID string, msg *sessionv1.GatewayMessage) error {
	s := g.sessions.get(nodeID)
	if s == nil || s.closed.Load() {
		return ErrNoSession
	}
	return s.send(msg)
}

// send numbers msg and sends it; sends are serialised. Before Welcome it
// fails with ErrNoSession: the session is registered (open) before accept
// sends Welcome, and a dispatch round that finds it meanwhile must not
// answer the node's Hello with a Command (the node ends such a session as
// a protocol violation). The command goes back to the queue, and the
// round sessionOpened asks for after Welcome sends it.
func (s *session) send(msg *sessionv1.GatewayMessage) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.ended || !s.welcomed {
		return ErrNoSession
	}
	s.seq++
	return s.stream.Send(&sessionv1.GatewayMessage{Seq: s.seq, Body: msg.Body})
}

// welcome sends msg, the session's Welcome, first of its messages; send
// works from then on.
func (s *session) welcome(msg *sessionv1.GatewayMessage) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.ended {
		return ErrNoSession
	}
	s.welcomed = true
	s.seq++
	return s.stream.Send(&sessionv1.GatewayMessage{Seq: s.seq, Body: msg.Body})
}

// terminate ends the session from outside: final, when given, is sent
// first and the connection closed grace later (or at once when the send
// fails); without final the connection is closed at once. It reports
// whether this call ended the session.
func (s *session) terminate(reason string, final *sessionv1.GatewayMessage, grace time.Duration) bool {
	if !s.closed.CompareAndSwap(false, true) {
		return false
	}
	s.reason.Store(&reason)
	if final == nil {
		s.closeConn()
		return true
	}
	// The timer also frees a send blocked on flow control.
	t := time.AfterFunc(grace, s.closeConn)
	if err := s.send(final); err != nil {
		t.Stop()
		s.closeConn()
	}
	return true
}

// supersede ends s in favour of newer. When both share a connection (a
// client that opened a second stream on it), s ends at its next message
// instead, so newer survives.
func (s *session) supersede(newer *session) {
	if s.conn != nil && s.conn == newer.conn {
		if s.closed.CompareAndSwap(false, true) {
			reason := "superseded by session " + newer.id
			s.reason.Store(&reason)
		}
		return
	}
	// Told why, the node backs off rather than reconnecting at once (two
	// bcd processes sharing an identity would otherwise loop).
	s.terminate("superseded by session "+newer.id, &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Superseded{
		Superseded: &sessionv1.Superseded{BySessionId: newer.id}}}, time.Second)
}

func (s *session) closeConn() {
	if s.conn != nil {
		s.conn.Close()
	}
}

func (s *session) closeReason() string {
	if r := s.reason.Load(); r != nil {
		return *r
	}
	return "stream ended"
}

// drainAll sends Drain, giving reason, to every session not sent one yet,
// each with its own random delay up to DrainDelay, giving up after
// ShutdownGrace (a blocked send is freed when the connections close). It
// returns how many sessions it drained.
func (g *Gateway) drainAll(reason string) int {
	all := slices.DeleteFunc(g.sessions.snapshot(), func(s *session) bool { return !s.drained.CompareAndSwap(false, true) })
	if len(all) == 0 {
		return 0
	}
	// The region's other live gateways, read afresh once for every Drain.
	g.gateways.forget()
	prefer := slices.DeleteFunc(g.regionGateways(context.Background(), g.cfg.Region), func(u string) bool { return u == g.publicURL })
	work := make(chan *session)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range min(8, len(all)) {
		wg.Go(func() {
			for s := range work {
				delay := time.Duration(rand.Int64N(int64(g.cfg.DrainDelay) + 1))
				_ = s.send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Drain{Drain: &sessionv1.Drain{
					Delay: durationpb.New(delay), Reason: reason, PreferGateways: prefer,
				}}})
			}
		})
	}
	go func() {
		for _, s := range all {
			work <- s
		}
		close(work)
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(g.cfg.ShutdownGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		g.log.Warn("Drain not sent to every session within the grace", "sessions", len(all))
	}
	return len(all)
}
