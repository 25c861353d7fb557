package session

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// minWindow is the smallest HTTP/2 flow-control window gRPC accepts.
const minWindow = 64 << 10

// transport holds the gRPC connection settings shared by Join and Client.
type transport struct {
	readBuffer       int
	writeBuffer      int
	keepalive        time.Duration
	keepaliveTimeout time.Duration
	userAgent        string
}

// dial returns a lazily connecting ClientConn to gw over TLS cfg. The
// target uses the passthrough resolver: the host is resolved when the
// connection is made, with no resolver goroutine kept per connection. For
// a WebSocket fallback URL the connection is a WebSocket (websocket.go)
// and cfg's TLS runs inside it, end to end.
func dial(gw gatewayAddr, cfg *tls.Config, t transport) (*grpc.ClientConn, error) {
	return dialSeen(gw, cfg, t, nil)
}

// dialSeen is dial that records in seen (nil: nowhere) the TLS alert the
// gateway ends the connection with: in TLS 1.3 the gateway judges the
// client certificate after the client's handshake has finished, so its
// refusal arrives as an alert on the first read, which gRPC reports only
// as text.
func dialSeen(gw gatewayAddr, cfg *tls.Config, t transport, seen *verifyFailure) (*grpc.ClientConn, error) {
	var creds credentials.TransportCredentials = credentials.NewTLS(cfg)
	if seen != nil {
		creds = alertCreds{TransportCredentials: creds, seen: seen}
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithReadBufferSize(t.readBuffer),
		grpc.WithWriteBufferSize(t.writeBuffer),
		grpc.WithInitialWindowSize(minWindow),
		grpc.WithInitialConnWindowSize(minWindow),
		grpc.WithDisableServiceConfig(),
		grpc.WithUserAgent(t.userAgent),
	}
	if t.keepalive > 0 {
		// gRPC also sets TCP_USER_TIMEOUT to the keepalive timeout, so a
		// heartbeat left unacknowledged that long breaks the connection.
		opts = append(opts, grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:    t.keepalive,
			Timeout: t.keepaliveTimeout,
		}))
	}
	if gw.ws != "" {
		opts = append(opts, grpc.WithContextDialer(webSocketDialer(gw.ws)))
	}
	cc, err := grpc.NewClient("passthrough:///"+gw.addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial gateway %s: %w", gw.url, err)
	}
	return cc, nil
}

// verifyFailure remembers the last TLS verification failure of one
// connection, and the alert with which the gateway refused the node's
// certificate, so that an RPC error (which carries either only as text)
// can be reported as what it was.
type verifyFailure struct {
	mu    sync.Mutex
	err   error
	alert tls.AlertError // the gateway's refusal of the node's certificate (setAlert), 0: none
}

func (v *verifyFailure) set(err error) {
	v.mu.Lock()
	v.err = err
	v.mu.Unlock()
}

func (v *verifyFailure) get() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.err
}

// setAlert records that the gateway refused the node's certificate with
// alert a (RFC 8446 §6.2), one of refusalAlerts.
func (v *verifyFailure) setAlert(a tls.AlertError) {
	v.mu.Lock()
	v.alert = a
	v.mu.Unlock()
}

// refusedCertificate reports whether the gateway refused the node's
// certificate as outside its validity period (certificate_expired). Go's
// TLS server sends that alert for a client certificate outside its
// validity period either way (not yet valid or expired, x509.Expired), so
// the alert alone does not say which.
func (v *verifyFailure) refusedCertificate() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.alert == alertCertificateExpired
}

// refusedIssuer reports whether the gateway refused the node's certificate
// as not chaining to a root it trusts (unknown_ca): what a node meets
// whose CA a node-CA rotation retired while it was off. bad_certificate
// (a certificate the gateway could not use for any other reason) is not
// taken as that: it is retried as any failed attempt, without a
// re-attestation.
func (v *verifyFailure) refusedIssuer() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.alert == alertUnknownCA
}

// The TLS alerts (RFC 8446 §6.2) with which crypto/tls refuses a client
// certificate that bcd acts on: outside its validity, or from an unknown
// CA.
const (
	alertCertificateExpired tls.AlertError = 45
	alertUnknownCA          tls.AlertError = 48
)

// refusalAlerts are the alerts verifyFailure records.
var refusalAlerts = [...]tls.AlertError{alertCertificateExpired, alertUnknownCA}

// refusalAlert returns the alert of refusalAlerts that err received from
// the peer, 0 when none. crypto/tls reports a received alert as a
// *net.OpError "remote error" around an unexported alert value, whose text
// is the one tls.AlertError gives the same code.
func refusalAlert(err error) tls.AlertError {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "remote error" || op.Err == nil {
		return 0
	}
	for _, a := range refusalAlerts {
		if op.Err.Error() == a.Error() {
			return a
		}
	}
	return 0
}

// alertCreds are TLS credentials whose connections record in seen the
// alert of refusalAlerts the gateway refused the node's certificate with.
type alertCreds struct {
	credentials.TransportCredentials
	seen *verifyFailure
}

func (a alertCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := a.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		if alert := refusalAlert(err); alert != 0 {
			a.seen.setAlert(alert)
		}
		return conn, info, err
	}
	c := &alertConn{Conn: conn, seen: a.seen}
	c.peek(ctx)
	return c, info, nil
}

func (a alertCreds) Clone() credentials.TransportCredentials {
	return alertCreds{TransportCredentials: a.TransportCredentials.Clone(), seen: a.seen}
}

// peekWait bounds alertConn.peek: the gateway speaks first (its HTTP/2
// SETTINGS follow the handshake at once), so this is reached only when it
// is slow, and costs nothing but the wait.
const peekWait = time.Second

// alertConn is a TLS connection that records an alert of refusalAlerts
// read from it.
type alertConn struct {
	net.Conn
	seen *verifyFailure

	pending []byte // read by peek, not yet returned by Read
	err     error  // what peek's read ended with, returned once pending is
}

// peek reads the gateway's first bytes before anything is written: in TLS
// 1.3 a gateway refuses the client certificate after the client's
// handshake has finished, and its alert, read first, would otherwise be
// lost to a reset when the client's first write meets the closed
// connection. A gateway that answers nothing within peekWait is left to
// the caller's reads.
func (c *alertConn) peek(ctx context.Context) {
	deadline := time.Now().Add(peekWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if c.Conn.SetReadDeadline(deadline) != nil {
		return
	}
	buf := make([]byte, 4096)
	n, err := c.Conn.Read(buf)
	_ = c.Conn.SetReadDeadline(time.Time{})
	c.pending = buf[:n]
	var ne net.Error
	switch {
	case err == nil:
	case refusalAlert(err) != 0:
		c.seen.setAlert(refusalAlert(err))
		c.err = err
	case errors.As(err, &ne) && ne.Timeout():
		// Slow: nothing lost, tls.Conn reads on after a timeout.
	default:
		c.err = err
	}
}

func (c *alertConn) Read(b []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(b, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(b)
	if a := refusalAlert(err); a != 0 {
		c.seen.setAlert(a)
	}
	return n, err
}
