package session

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Log attribute keys of this package.
const (
	attrGateway   = "gateway"
	attrSessionID = "session_id"
	attrDelay     = "delay"
	attrAttempt   = "attempt"
	attrHeld      = "held"
	attrInterval  = "heartbeat_interval"
	attrReason    = "reason"
	attrSkew      = "clock_skew"   // in words: "this machine's clock is 5400 s behind the gateway's"
	attrSkewSec   = "clock_skew_s" // this machine's clock minus the gateway's, seconds
	attrLocalTime = "local_time"
	attrNotAfter  = "not_after"
	attrRenew     = "renew_after"
	attrGWTime    = "gateway_time"  // the gateway's time a certificate was judged by
	attrReattest  = "reattest_left" // how long re-attestation can still bring the node back
)

// Client holds a node's session with the gateways of its region. Create
// one with New and call Run; Send and Certificate are safe to call from any
// goroutine while it runs.
type Client struct {
	cfg       Config
	gws       []gatewayAddr  // the order attempts go in (gatewayOrder); Run's goroutine only
	known     []KnownGateway // the gateways Welcomes listed; Run's goroutine only
	log       *slog.Logger
	clock     Clock
	gwClock   *gatewayClock // the gateways' time, as certificates are judged (gatewayClock)
	transport transport
	running   atomic.Bool

	// cert is the client certificate presented at every new handshake.
	cert atomic.Pointer[tls.Certificate]
	// gwRoots are the gateway serving CAs a gateway-CA rotation's Bundle
	// added to Config.Trust (trust), nil before any.
	gwRoots atomic.Pointer[[]*x509.Certificate]

	renewMu sync.Mutex // serialises renewals

	// window is the reconnect window of the last Welcome
	// (Welcome.reconnect_window, at most MaxReconnectWindow), 0 before
	// any: the first reconnect after a lost session is spread over it, and
	// the backoff is capped at it when it is longer than BackoffMax.
	window atomic.Int64

	mu         sync.Mutex
	chain      []*x509.Certificate
	renewAfter time.Time
	// reattestGrace is the gateway's re-attestation grace, as last said.
	reattestGrace time.Duration
	cur           *session // the session that has had its Welcome, if any

	// State of the connect loop, used only by the goroutine running Run.
	next     int          // index into gws of the next gateway to try
	override *gatewayAddr // gateway to try next instead, after a Drain
	resume   *sessionv1.ResumeCursor
}

// New returns a Client for cfg with its defaults filled in. It fails with
// an error wrapping ErrConfig when cfg is invalid.
func New(cfg Config) (*Client, error) {
	cfg = cfg.withDefaults()
	gws, err := cfg.validate()
	if err != nil {
		return nil, fmt.Errorf("new session client: %w", err)
	}
	cfg.Gateways = slices.Clone(cfg.Gateways)
	cfg.Chain = slices.Clone(cfg.Chain)
	c := &Client{
		cfg:   cfg,
		gws:   gws,
		known: slices.Clone(cfg.KnownGateways),
		log:   cfg.Logger,
		clock: cfg.Clock,
		transport: transport{
			readBuffer:       cfg.ReadBufferSize,
			writeBuffer:      cfg.WriteBufferSize,
			keepalive:        max(cfg.Keepalive, 0),
			keepaliveTimeout: cfg.KeepaliveTimeout,
			userAgent:        "bcd/" + cfg.BCDVersion,
		},
		chain:         cfg.Chain,
		renewAfter:    cfg.RenewAfter,
		reattestGrace: cfg.ReattestGrace,
	}
	c.cert.Store(tlsCertificate(cfg.Chain, cfg.Key))
	c.gwClock = newGatewayClock(cfg.Clock.Now, func() time.Time { return c.cert.Load().Leaf.NotBefore }, cfg.Logger)
	return c, nil
}

// Certificate returns the node's current certificate chain (leaf first)
// and when it is due for renewal.
func (c *Client) Certificate() (chain []*x509.Certificate, renewAfter time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.chain), c.renewAfter
}

// GatewayNow is the client's estimate of the gateways' time: this
// machine's clock corrected by the offset last measured from a gateway's
// answer (gatewayClock). Deadlines the gateways set (a command's) are judged
// by it, so that a machine whose clock is wrong runs its work for as long as
// the control plane meant.
func (c *Client) GatewayNow() time.Time { return c.gwClock.now() }

// Send sends msg (an Inventory or an Event, say) on the current session,
// setting msg.Seq. It fails with ErrNotConnected when there is no session.
func (c *Client) Send(msg *sessionv1.NodeMessage) error {
	c.mu.Lock()
	s := c.cur
	c.mu.Unlock()
	if s == nil {
		return ErrNotConnected
	}
	return s.send(msg)
}

// Run holds the session until ctx ends (see the package documentation for
// the loop). It returns nil when ctx ends, an error wrapping ErrRevoked when
// the node is revoked and one wrapping ErrCertificateExpired when the
// node's certificate has expired. Run must not be called again while it
// runs.
func (c *Client) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("session client: Run is already running")
	}
	defer c.running.Store(false)

	if c.cfg.StartJitter > 0 && !c.wait(ctx, c.cfg.Jitter(c.cfg.StartJitter)) {
		return nil
	}
	attempt := 0
	tried := 0 // gateways that failed before Welcome in this round of the list
	churn := 0 // welcomed sessions in a row that counted as failures
	for {
		gw := c.pick()
		c.emit(Event{Kind: EventConnecting, Gateway: gw.url, Attempt: attempt})
		out := c.attempt(ctx, gw)
		if ctx.Err() != nil {
			c.emit(Event{Kind: EventDisconnected, Gateway: gw.url, SessionID: out.sessionID})
			return nil
		}
		c.emit(Event{Kind: EventDisconnected, Gateway: gw.url, SessionID: out.sessionID, Err: out.err})
		switch {
		case errors.Is(out.err, ErrRevoked):
			c.log.ErrorContext(ctx, "Node identity revoked: stopping, join the node again to bring it back",
				attrGateway, gw.url, logkey.Err, out.err)
			return out.err
		case errors.Is(out.err, errGracePassed):
			c.log.ErrorContext(ctx, "Node certificate expired longer ago than the gateway re-attests: stopping; join the node again",
				attrGateway, gw.url, logkey.Err, out.err)
			return out.err
		}
		var held time.Duration
		if out.welcomed {
			held = c.clock.Now().Sub(out.welcomedAt)
		}
		failed := backoffAfter(out, held, c.cfg.StableAfter) == endFailed
		switch {
		case !failed:
			attempt, tried, churn = 0, 0, 0
		case out.welcomed:
			// Superseded, or lost early: sessions that keep ending soon
			// after they start, counted for the warning below.
			churn++
			tried = 0
		}
		if out.drained {
			c.log.InfoContext(ctx, "Session drained, reconnecting elsewhere", attrGateway, gw.url,
				attrSessionID, out.sessionID, attrDelay, out.drainLeft)
			c.afterDrain(gw, out.prefer)
			if out.drainLeft > 0 {
				c.emit(Event{Kind: EventBackoff, Gateway: gw.url, Delay: out.drainLeft})
				if !c.wait(ctx, out.drainLeft) {
					return nil
				}
			}
			continue
		}
		// The backoff grows once per round of the gateway list, not per
		// gateway: a gateway that is gone (kept in the list for a day) or
		// down costs the next one of the list only BackoffBase.
		nextInRound := false
		if !out.welcomed {
			c.failover(gw)
			tried++
			nextInRound = tried < len(c.gws) && out.retryAfter == 0
		}
		window := time.Duration(c.window.Load())
		ceil := ReconnectCeil(c.cfg.BackoffMax, window)
		var delay time.Duration
		switch {
		case nextInRound:
			delay = c.cfg.Jitter(c.cfg.BackoffBase)
		case out.welcomed && !failed:
			// A session that had lasted was lost (the gateway went away):
			// the first try again is spread over the gateway's reconnect
			// window, so its whole fleet does not come in the first
			// second.
			delay = reconnectDelay(c.cfg.Jitter, max(c.cfg.BackoffBase, window), ceil, 0, out.retryAfter)
		default:
			delay = reconnectDelay(c.cfg.Jitter, c.cfg.BackoffBase, ceil, attempt, out.retryAfter)
		}
		c.log.WarnContext(ctx, "Session with gateway ended, reconnecting",
			attrGateway, gw.url, attrSessionID, out.sessionID, logkey.Err, out.err, attrHeld, held, attrDelay, delay, attrAttempt, attempt)
		if out.welcomed && failed && churn >= 3 {
			c.log.WarnContext(ctx, "Sessions keep ending soon after they start: is another bcd running with this node's identity (a copied data directory)?",
				attrGateway, gw.url, attrHeld, held, attrAttempt, attempt)
		}
		c.emit(Event{Kind: EventBackoff, Gateway: gw.url, Delay: delay, Attempt: attempt})
		if !nextInRound {
			attempt++
			tried = 0
		}
		if !c.wait(ctx, delay) {
			return nil
		}
	}
}

// pick returns the gateway for the next attempt.
func (c *Client) pick() gatewayAddr {
	if o := c.override; o != nil {
		c.override = nil
		return *o
	}
	return c.gws[c.next%len(c.gws)]
}

// failover moves past gw after a failed attempt.
func (c *Client) failover(gw gatewayAddr) {
	if c.gws[c.next%len(c.gws)].addr == gw.addr {
		c.next = (c.next + 1) % len(c.gws)
	}
}

// afterDrain chooses where to go after gw drained the session: one of the
// gateways the Drain preferred, else another gateway of the list at random
// (spreading the drained nodes), else gw again.
func (c *Client) afterDrain(gw gatewayAddr, prefer []string) {
	var ok []gatewayAddr
	for _, p := range prefer {
		if g, err := parseGatewayURL(p); err == nil && (g.ws != "") == (gw.ws != "") {
			ok = append(ok, g)
		}
	}
	if len(ok) > 0 {
		g := ok[int(c.cfg.Jitter(time.Duration(len(ok)-1)))]
		c.override = &g
		return
	}
	var others []int
	for i, g := range c.gws {
		if g.addr != gw.addr {
			others = append(others, i)
		}
	}
	if len(others) > 0 {
		c.next = others[int(c.cfg.Jitter(time.Duration(len(others)-1)))]
	}
}

// wait waits d or until ctx ends, and reports whether d passed.
func (c *Client) wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	done := make(chan struct{})
	t := c.clock.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return true
	case <-ctx.Done():
		if !t.Stop() {
			<-done
		}
		return false
	}
}

// emit hands ev to Config.OnEvent.
func (c *Client) emit(ev Event) {
	if f := c.cfg.OnEvent; f != nil {
		f(ev)
	}
}

// setCurrent records s as the session Send uses (nil: none).
func (c *Client) setCurrent(s *session) {
	c.mu.Lock()
	c.cur = s
	c.mu.Unlock()
}

// getClientCertificate is TLS's source of the client certificate.
func (c *Client) getClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return c.cert.Load(), nil
}

// ClockSkew returns this machine's clock minus the gateways' as last
// measured from their answers (Join, Renew, Challenge, Welcome): 0 while
// the two agree within a minute, or before any answer. Certificates are
// judged by the gateway's time, this machine's clock minus ClockSkew.
func (c *Client) ClockSkew() time.Duration { return c.gwClock.skew() }

// ReattestGrace returns the re-attestation grace the gateway last said
// (zero: unknown or off).
func (c *Client) ReattestGrace() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reattestGrace
}

// renewDue reports whether the certificate is due for renewal, by the
// gateway's time (renew_after is the gateway's).
func (c *Client) renewDue() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.gwClock.now().Before(c.renewAfter)
}

// untilRenew is the time left until renewal, at least 0.
func (c *Client) untilRenew() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return max(c.renewAfter.Sub(c.gwClock.now()), 0)
}

// hello builds the Hello of a new session.
func (c *Client) hello() *sessionv1.NodeMessage {
	h := &sessionv1.Hello{
		BcdVersion:   c.cfg.BCDVersion,
		Os:           c.cfg.OS,
		Arch:         c.cfg.Arch,
		BootId:       c.cfg.BootID,
		Capabilities: c.cfg.Capabilities,
		Resume:       c.resume,
	}
	if c.cfg.ReleasePins != nil && !slices.Contains(h.Capabilities, sessionv1.CapabilityReleasePins) {
		h.Capabilities = append(slices.Clip(h.Capabilities), sessionv1.CapabilityReleasePins)
	}
	if _, ok := c.cfg.Identity.(GatewayRootsKeeper); ok && !slices.Contains(h.Capabilities, sessionv1.CapabilityGatewayBundle) {
		h.Capabilities = append(slices.Clip(h.Capabilities), sessionv1.CapabilityGatewayBundle)
	}
	r := c.cfg.Reporter
	h.InventoryDigest, h.PendingResults, h.LocalRollback = r.InventoryDigest(), r.PendingResults(), r.LocalRollback()
	return &sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Hello{Hello: h}}
}
