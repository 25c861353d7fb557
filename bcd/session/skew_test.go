package session_test

import (
	"bytes"
	"crypto/x509"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
)

// shiftedClock is the system clock moved by d: a machine whose clock is
// wrong. The machine's real clock is never changed.
type shiftedClock struct{ d time.Duration }

func (c shiftedClock) Now() time.Time { return time.Now().Add(c.d) }

func (shiftedClock) AfterFunc(d time.Duration, f func()) session.Timer { return time.AfterFunc(d, f) }

// logSink is a logger whose output tests can read while it is written.
type logSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func (s *logSink) logger() *slog.Logger { return slog.New(slog.NewTextHandler(s, nil)) }

// TestClockBehindJoinsConnectsAndRenews is the clock rule end to end
// against the in-process gateway: a node whose clock is 90 minutes behind
// gets a certificate that is not yet valid by its own clock; it keeps it
// (judged by the gateway's time), logs the skew, connects, sends its own
// time in heartbeats, and renews on the gateway's schedule, not 90 minutes
// late.
func TestClockBehindJoinsConnectsAndRenews(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{HeartbeatInterval: 20 * time.Millisecond, RenewAfter: 200 * time.Millisecond})
	tok := p.NewToken(t)
	g.AddToken(tok)
	clk := shiftedClock{-90 * time.Minute}
	var logs logSink
	key := sessiontest.NewKey(t)
	res, err := session.Join(t.Context(), session.JoinParams{GatewayURL: g.URL, Token: tok, Key: key, Now: clk.Now, Logger: logs.logger()})
	if err != nil {
		t.Fatalf("Join with the clock 90 min behind: %v", err)
	}
	if !clk.Now().Before(res.Chain[0].NotBefore) {
		t.Fatalf("certificate valid from %s, already valid by the node's clock %s: the test proves nothing", res.Chain[0].NotBefore, clk.Now())
	}
	if s := res.ClockSkew.Round(time.Minute); s != -90*time.Minute {
		t.Errorf("JoinResult.ClockSkew = %s, want -90m", res.ClockSkew)
	}
	if out := logs.String(); !strings.Contains(out, "this machine's clock is 5400 s behind the gateway's") && !strings.Contains(out, "this machine's clock is 5399 s behind the gateway's") {
		t.Errorf("join log %q does not give the skew", out)
	}

	cfg := node{key: key, id: res}.config()
	cfg.Clock = clk
	cfg.Logger = logs.logger()
	ev := newEvents(&cfg)
	c := newClient(t, cfg)
	stop, _ := run(t, c)
	ev.next(t, session.EventConnected)
	s := g.NextSession(t, wait)
	// Heartbeats carry the node's own time, so the gateway can measure
	// the skew.
	hb := s.NextHeartbeat(t, wait)
	if behind := time.Since(hb.GetSentAt().AsTime()); behind < 89*time.Minute || behind > 91*time.Minute {
		t.Errorf("heartbeat sent_at is %s behind, want the node's clock (90 min behind)", behind)
	}
	// Renewal due 200 ms after issue by the gateway's time comes then.
	ev.next(t, session.EventRenewed)
	if err := stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
}

// TestClockFarBehindSaysSo checks that a clock so far off that the
// gateway's certificate is outside its validity fails the Join before the
// token is spent, with an error naming this machine's clock instead of the
// pin.
func TestClockFarBehindSaysSo(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	tok := p.NewToken(t)
	g.AddToken(tok)
	clk := shiftedClock{-48 * time.Hour} // before the gateway's CA and certificate
	_, err := session.Join(t.Context(), session.JoinParams{GatewayURL: g.URL, Token: tok, Key: sessiontest.NewKey(t), Now: clk.Now})
	if !errors.Is(err, session.ErrUntrustedGateway) {
		t.Fatalf("Join = %v, want ErrUntrustedGateway", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "certificate not yet valid / expired: this machine's clock reads") || strings.Contains(msg, "pinned key") {
		t.Errorf("Join error %q does not name the clock", msg)
	}
	if n := g.Joins(); n != 0 {
		t.Errorf("gateway saw %d joins: the token was spent", n)
	}
}

// TestClockRefusedHandshakeDeadRTC: a machine whose clock is 30 days behind
// holds a certificate that expired while it was off but looks valid by its
// own clock. It presents it, the gateway refuses it in the handshake, and
// bcd, judging by the time of the gateway's Challenge, re-attests and
// connects without retrying first.
func TestClockRefusedHandshakeDeadRTC(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	key := sessiontest.NewKey(t)
	now := time.Now()
	expired := p.NodeCertificate(t, key, "node-1", now.Add(-30*time.Minute), now.Add(-time.Second))
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	var logs logSink
	cfg := session.Config{Gateways: []string{g.URL}, Trust: session.Trust{Pin: p.Pin()}, Key: key,
		Chain: []*x509.Certificate{expired}, Clock: shiftedClock{-30 * 24 * time.Hour}, Logger: logs.logger()}
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))
	ev.next(t, session.EventConnected)
	if n := g.Reattests(); n != 1 {
		t.Fatalf("%d re-attestations, want 1", n)
	}
	out := logs.String()
	if !strings.Contains(out, "Gateway refused the node certificate in the TLS handshake") || !strings.Contains(out, "Node certificate re-attested") {
		t.Errorf("log %q: want the refusal, then the re-attestation", out)
	}
	if strings.Contains(out, "Session with gateway ended") {
		t.Errorf("log %q: the node backed off before re-attesting", out)
	}
}

// TestClockRefusedHandshakeGatewayBehind: a gateway whose clock is 48 h
// behind refuses a valid certificate as not yet valid, with the same TLS
// alert as an expired one; bcd asks the gateway's time and reports the real
// reason (ErrCertificateNotYetValid, the control plane's clock), never
// "expired", and does not re-attest.
func TestClockRefusedHandshakeGatewayBehind(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	key := sessiontest.NewKey(t)
	now := time.Now()
	cert := p.NodeCertificate(t, key, "node-1", now.Add(-time.Hour), now.Add(23*time.Hour))
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{ClockOffset: -48 * time.Hour})
	cfg := session.Config{Gateways: []string{g.URL}, Trust: session.Trust{Pin: p.Pin()}, Key: key,
		Chain: []*x509.Certificate{cert}, BackoffBase: time.Second}
	ev := newEvents(&cfg)
	run(t, newClient(t, cfg))
	var got session.Event
	for got.Err == nil {
		got = ev.next(t, session.EventDisconnected)
	}
	msg := got.Err.Error()
	if !errors.Is(got.Err, session.ErrCertificateNotYetValid) || !strings.Contains(msg, "the control plane's clock is behind") ||
		errors.Is(got.Err, session.ErrCertificateExpired) {
		t.Fatalf("disconnected with %v, want ErrCertificateNotYetValid naming the control plane's clock", got.Err)
	}
	if n := g.Reattests(); n != 0 {
		t.Errorf("%d re-attestations of a valid certificate", n)
	}
}
