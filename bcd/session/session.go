package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// RetryAfterKey is the response metadata key (header or trailer) in which a
// gateway that refuses a session (RESOURCE_EXHAUSTED or UNAVAILABLE) says
// how many milliseconds to wait before trying again.
const RetryAfterKey = "retry-after-ms"

// maxSkew is the clock difference with a gateway above which the node
// warns: certificates are checked against clocks.
const maxSkew = time.Minute

// Causes of a session's end set by the Client itself.
var (
	errDrained          = errors.New("drained by the gateway")
	errGatewayClosed    = errors.New("the gateway closed the session")
	errSuperseded       = errors.New("superseded by a newer session of this node")
	errHandshakeTimeout = errors.New("handshake timed out")
)

// outcome says how one attempt or session ended.
type outcome struct {
	sessionID  string
	welcomed   bool          // a Welcome arrived
	welcomedAt time.Time     // when, by the Client's clock
	drained    bool          // a Drain arrived: go elsewhere, without backoff
	drainLeft  time.Duration // what is left of the Drain's wait when it ended sooner
	prefer     []string      // the Drain's preferred gateways
	retryAfter time.Duration // the gateway's retry hint
	err        error         // why it ended
}

// timerSlot names the timers a session keeps.
type timerSlot int

const (
	slotHandshake timerSlot = iota
	slotHeartbeat
	slotRenew
	slotDrain
	numSlots
)

// nodeStream is the part of the Connect stream a session uses.
type nodeStream interface {
	Send(*sessionv1.NodeMessage) error
}

// session is one Connect stream. Its receive loop runs on the goroutine
// running Client.Run; heartbeats, renewals and the drain delay run as timer
// callbacks, which close waits for.
type session struct {
	c      *Client
	gw     gatewayAddr
	cc     *grpc.ClientConn
	runCtx context.Context // Run's context, handed to the Handler
	ctx    context.Context // the session's, ends with it
	cancel context.CancelCauseFunc
	id     string

	sendMu sync.Mutex
	stream nodeStream
	seq    uint64

	mu       sync.Mutex
	closed   bool
	timers   [numSlots]Timer
	wg       sync.WaitGroup
	interval time.Duration
	draining bool
	drainAt  time.Time // when the Drain's wait ends
	prefer   []string
}

func newSession(ctx context.Context, c *Client, gw gatewayAddr, cc *grpc.ClientConn) *session {
	s := &session{c: c, gw: gw, cc: cc, runCtx: ctx}
	s.ctx, s.cancel = context.WithCancelCause(ctx)
	return s
}

// attempt dials gw, opens a session and holds it until it ends. When the
// gateway refuses the node's certificate in the handshake as outside its
// validity, attempt asks the gateway's time (refused): an expired
// certificate is re-attested and the session tried once more at once; a
// certificate not yet valid by the gateway's clock is reported as that.
// When the gateway refuses the certificate's issuer (unknown_ca: a node-CA
// rotation retired it while the node was off), the certificate is
// re-attested as an expired one is (untrusted), and the session tried once
// more at once.
func (c *Client) attempt(ctx context.Context, gw gatewayAddr) outcome {
	var vf verifyFailure
	out := c.attemptOnce(ctx, gw, &vf)
	if out.welcomed || ctx.Err() != nil {
		return out
	}
	switch {
	case vf.refusedCertificate():
		c.log.InfoContext(ctx, "Gateway refused the node certificate in the TLS handshake (expired or not yet valid): judging it by the gateway's time",
			attrGateway, gw.url, logkey.Err, out.err)
		if err := c.refused(ctx, gw); err != nil {
			out.err = err
			return out
		}
	case vf.refusedIssuer():
		c.log.InfoContext(ctx, "Gateway refused the node certificate's issuer in the TLS handshake (a node CA rotation may have retired it): re-attesting",
			attrGateway, gw.url, logkey.Err, out.err)
		if err := c.untrusted(ctx, gw); err != nil {
			out.err = err
			return out
		}
	default:
		return out
	}
	return c.attemptOnce(ctx, gw, &verifyFailure{})
}

// attemptOnce is one attempt; vf learns what the TLS handshake met.
func (c *Client) attemptOnce(ctx context.Context, gw gatewayAddr, vf *verifyFailure) outcome {
	if c.expired() {
		// The mTLS handshake would fail: re-attest first.
		if err := c.reattestVia(ctx, gw, false); err != nil {
			return outcome{err: err}
		}
	} else if c.renewDue() {
		// Renew first, on a connection of its own, so that the session's
		// connection presents the new certificate.
		if err := c.renewVia(ctx, gw); errors.Is(err, ErrRevoked) {
			return outcome{err: err}
		}
	}
	cc, err := dialSeen(gw, c.trust().tlsConfig(gw.host, c.gwClock, c.getClientCertificate, vf.set), c.transport, vf)
	if err != nil {
		return outcome{err: err}
	}
	defer cc.Close()
	s := newSession(ctx, c, gw, cc)
	defer s.close()

	s.schedule(slotHandshake, c.cfg.HandshakeTimeout, func() { s.cancel(errHandshakeTimeout) })
	stream, err := sessionv1.NewSessionServiceClient(cc).Connect(s.ctx)
	if err != nil {
		return s.failed(err, nil, vf, outcome{})
	}
	s.stream = stream
	if err := s.send(c.hello()); err != nil {
		// The stream's status comes from Recv.
		_, err = stream.Recv()
		return s.failed(err, stream, vf, outcome{})
	}
	msg, err := stream.Recv()
	if err != nil {
		return s.failed(err, stream, vf, outcome{})
	}
	w := msg.GetWelcome()
	if w == nil {
		return outcome{err: fmt.Errorf("%w: gateway %s answered Hello with %T, not Welcome", ErrProtocol, gw.url, msg.GetBody())}
	}
	if err := checkGatewayMessage(msg); err != nil {
		return outcome{err: fmt.Errorf("%w: gateway %s: refused its Welcome: %w", ErrProtocol, gw.url, err)}
	}
	s.stop(slotHandshake)
	s.welcome(msg.GetSeq(), w)
	out := outcome{sessionID: s.id, welcomed: true, welcomedAt: c.clock.Now()}

	c.setCurrent(s)
	defer c.setCurrent(nil)
	c.emit(Event{Kind: EventConnected, Gateway: gw.url, SessionID: s.id, GPUHealth: w.GetGpuHealth()})
	s.schedule(slotHeartbeat, s.interval, s.heartbeat)
	s.schedule(slotRenew, c.untilRenew(), s.renew)

	for {
		msg, err := stream.Recv()
		if err != nil {
			return s.failed(err, stream, vf, out)
		}
		if seq := msg.GetSeq(); seq > c.resume.GetLastGatewaySeq() {
			c.resume.LastGatewaySeq = seq
		}
		// A message out of range ends the session, as the gateway ends a
		// node's that sends one: nothing of it is kept or acted on.
		if err := checkGatewayMessage(msg); err != nil {
			c.log.WarnContext(s.ctx, "Gateway message refused: ending the session", attrGateway, gw.url, logkey.Err, err)
			out.err = fmt.Errorf("%w: gateway %s: %w", ErrProtocol, gw.url, err)
			return out
		}
		if err := s.handle(msg); err != nil {
			out.err = err
			return out
		}
	}
}

// welcome takes the Welcome of the session.
func (s *session) welcome(seq uint64, w *sessionv1.Welcome) {
	c := s.c
	s.id = w.GetSessionId()
	c.resume = &sessionv1.ResumeCursor{SessionId: s.id, LastGatewaySeq: seq}
	s.interval = DefaultHeartbeatInterval
	if hi := w.GetHeartbeatInterval(); hi != nil && hi.IsValid() && hi.AsDuration() > 0 {
		s.interval = max(hi.AsDuration(), MinHeartbeatInterval)
	}
	c.log.InfoContext(s.ctx, "Session established", attrGateway, s.gw.url, attrSessionID, s.id,
		logkey.NodeID, w.GetNodeId(), attrInterval, s.interval)
	if rw := w.GetReconnectWindow(); rw != nil && rw.IsValid() && rw.AsDuration() >= time.Second {
		c.window.Store(int64(min(rw.AsDuration(), MaxReconnectWindow)))
	}
	c.gwClock.observe(s.ctx, s.gw.url, w.GetServerTime())
	c.listed(s.ctx, s.gw, w.GetGateways())
}

// failed builds the outcome of a stream that ended with err.
func (s *session) failed(err error, stream grpc.ClientStream, vf *verifyFailure, out outcome) outcome {
	cause := context.Cause(s.ctx)
	s.mu.Lock()
	if s.draining {
		// Whatever ended the session (the wait, or the gateway closing
		// first), the node goes elsewhere, and not before the wait it drew
		// is over, so that drained nodes stay spread out.
		out.drained = true
		out.prefer = s.prefer
		out.drainLeft = max(s.drainAt.Sub(s.c.clock.Now()), 0)
	}
	s.mu.Unlock()
	switch {
	case s.ctx.Err() != nil && errors.Is(cause, errDrained):
		out.err = errDrained
		return out
	case s.ctx.Err() != nil && errors.Is(cause, errHandshakeTimeout):
		out.err = fmt.Errorf("gateway %s: no Welcome within %v", s.gw.url, s.c.cfg.HandshakeTimeout)
		return out
	case s.ctx.Err() != nil && cause != context.Canceled && cause != context.DeadlineExceeded:
		// Set by a heartbeat that could not be sent or a renewal that
		// found the node revoked.
		out.err = cause
		return out
	}
	if verr := vf.get(); verr != nil {
		out.err = fmt.Errorf("gateway %s: %w", s.gw.url, verr)
		return out
	}
	if stream != nil {
		out.retryAfter = retryHint(stream.Trailer())
		if out.retryAfter == 0 {
			if md, herr := stream.Header(); herr == nil {
				out.retryAfter = retryHint(md)
			}
		}
	}
	st := status.Convert(err)
	switch {
	case errors.Is(err, io.EOF):
		out.err = fmt.Errorf("gateway %s: %w", s.gw.url, errGatewayClosed)
	case st.Code() == codes.PermissionDenied:
		out.err = revokedError(st.Message())
	default:
		out.err = fmt.Errorf("gateway %s: %w", s.gw.url, err)
	}
	return out
}

// retryHint reads RetryAfterKey from md; 0 when absent or unusable.
func retryHint(md metadata.MD) time.Duration {
	v := md.Get(RetryAfterKey)
	if len(v) == 0 {
		return 0
	}
	ms, err := strconv.ParseInt(v[0], 10, 64)
	if err != nil || ms <= 0 {
		return 0
	}
	return min(time.Duration(min(ms, int64(MaxRetryHint/time.Millisecond)))*time.Millisecond, MaxRetryHint)
}

// revokedError wraps ErrRevoked with the gateway's reason.
func revokedError(reason string) error {
	if reason == "" {
		return ErrRevoked
	}
	return fmt.Errorf("%w: %s", ErrRevoked, reason)
}

// handle acts on one message after Welcome. It returns an error only when
// the session must end because of it (Revoked).
func (s *session) handle(msg *sessionv1.GatewayMessage) error {
	c := s.c
	switch b := msg.GetBody().(type) {
	case *sessionv1.GatewayMessage_Command:
		if b.Command != nil {
			c.cfg.Handler.HandleCommand(s.runCtx, b.Command, s.sendUpdate)
		}
	case *sessionv1.GatewayMessage_Cancel:
		if b.Cancel != nil {
			c.cfg.Handler.HandleCancel(s.runCtx, b.Cancel)
		}
	case *sessionv1.GatewayMessage_TunnelOpen:
		if b.TunnelOpen != nil {
			go s.openTunnel(b.TunnelOpen)
		}
	case *sessionv1.GatewayMessage_Drain:
		s.drain(b.Drain)
	case *sessionv1.GatewayMessage_Revoked:
		return revokedError(b.Revoked.GetReason())
	case *sessionv1.GatewayMessage_Superseded:
		return fmt.Errorf("gateway %s: %w (%s): is another bcd running with this node's identity?",
			s.gw.url, errSuperseded, b.Superseded.GetBySessionId())
	case *sessionv1.GatewayMessage_Bundle:
		s.bundle(b.Bundle)
	case *sessionv1.GatewayMessage_ReleasePins:
		s.releasePins(b.ReleasePins)
	case *sessionv1.GatewayMessage_Welcome:
		c.log.DebugContext(s.ctx, "Ignoring a second Welcome", attrGateway, s.gw.url, attrSessionID, s.id)
	default:
		// A variant added after this build, or none: skipped, as
		// session.proto asks.
	}
	return nil
}

// drain starts the wait after a Drain: a uniformly random share of its
// delay (at most MaxDrainDelay), then the session ends. A second Drain
// during the wait is ignored.
func (s *session) drain(d *sessionv1.Drain) {
	s.mu.Lock()
	if s.draining || s.closed {
		s.mu.Unlock()
		return
	}
	var delay time.Duration
	if dd := d.GetDelay(); dd != nil && dd.IsValid() {
		delay = min(max(dd.AsDuration(), 0), MaxDrainDelay)
	}
	wait := s.c.cfg.Jitter(delay)
	s.draining = true
	s.drainAt = s.c.clock.Now().Add(wait)
	s.prefer = d.GetPreferGateways()
	s.mu.Unlock()

	s.c.log.InfoContext(s.ctx, "Gateway asked the node to reconnect elsewhere", attrGateway, s.gw.url,
		attrSessionID, s.id, attrReason, d.GetReason(), attrDelay, wait)
	s.c.emit(Event{Kind: EventDraining, Gateway: s.gw.url, SessionID: s.id, Delay: wait})
	s.schedule(slotDrain, wait, func() { s.cancel(errDrained) })
}

// heartbeat sends one Heartbeat and schedules the next.
func (s *session) heartbeat() {
	c := s.c
	hb := &sessionv1.Heartbeat{SentAt: timestamppb.New(c.clock.Now())}
	hb.InventoryDigest = c.cfg.Reporter.InventoryDigest()
	c.cfg.Reporter.FillHeartbeat(hb)
	if err := s.send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Heartbeat{Heartbeat: hb}}); err != nil {
		// io.EOF: the stream has ended and Recv reports why.
		if s.ctx.Err() == nil && !errors.Is(err, io.EOF) {
			s.cancel(fmt.Errorf("send heartbeat to %s: %w", s.gw.url, err))
		}
		return
	}
	s.schedule(slotHeartbeat, s.interval, s.heartbeat)
}

// renew renews the certificate in the session and schedules the next
// renewal, or a retry after a failure.
func (s *session) renew() {
	c := s.c
	// A connection of its own each time: the session's connection was
	// authenticated with a certificate that expires before the next
	// renewal, so a second Renew on it would be refused.
	err := c.renewVia(s.ctx, s.gw)
	switch {
	case err == nil:
		s.schedule(slotRenew, c.untilRenew(), s.renew)
	case errors.Is(err, ErrRevoked) || errors.Is(err, ErrCertificateExpired):
		// Revoked ends the session for good; expired ends it for a
		// re-attestation on the next attempt.
		s.cancel(err)
	case s.ctx.Err() == nil:
		retry := c.cfg.RenewRetry/2 + c.cfg.Jitter(c.cfg.RenewRetry/2)
		s.schedule(slotRenew, retry, s.renew)
	}
}

// send sends msg on the stream with the next sequence number.
func (s *session) send(msg *sessionv1.NodeMessage) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.ctx.Err() != nil || s.stream == nil {
		return ErrNotConnected
	}
	s.seq++
	msg.Seq = s.seq
	if err := s.stream.Send(msg); err != nil {
		return fmt.Errorf("%w: %w", ErrNotConnected, err)
	}
	return nil
}

// sendUpdate is the send function handed to Handler.HandleCommand.
func (s *session) sendUpdate(u *sessionv1.CommandUpdate) error {
	return s.send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_CommandUpdate{CommandUpdate: u}})
}

// schedule runs f after d in slot, replacing the slot's pending call.
// Nothing is scheduled once the session is closed.
func (s *session) schedule(slot timerSlot, d time.Duration, f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if t := s.timers[slot]; t != nil && t.Stop() {
		s.wg.Done()
	}
	s.wg.Add(1)
	s.timers[slot] = s.c.clock.AfterFunc(d, func() {
		defer s.wg.Done()
		f()
	})
}

// stop cancels the pending call of slot, if any.
func (s *session) stop(slot timerSlot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.timers[slot]; t != nil && t.Stop() {
		s.wg.Done()
	}
	s.timers[slot] = nil
}

// close ends the session: no new timers, pending ones stopped, the stream's
// context cancelled, and running callbacks waited for.
func (s *session) close() {
	s.mu.Lock()
	s.closed = true
	for i, t := range s.timers {
		if t != nil && t.Stop() {
			s.wg.Done()
		}
		s.timers[i] = nil
	}
	s.mu.Unlock()
	s.cancel(nil)
	s.wg.Wait()
}
