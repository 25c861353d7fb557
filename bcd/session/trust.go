package session

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/proto/jointoken"
)

// Trust says how the node decides that a gateway is genuine. Exactly one of
// Pin and Roots is set. There is no trust on first use: a node that has
// neither refuses to connect.
type Trust struct {
	// Pin is the pin of the gateway serving CA's public key,
	// "sha256/<base64>" (jointoken.Pin): the gateway's chain must contain a
	// certificate with that key and its leaf must verify up to it
	// (jointoken.VerifyChain). A join token carries this pin.
	Pin string
	// ExtraPins are further pins a gateway's chain may verify up to
	// instead of Pin: the second pin of a version 2 join token, and the
	// gateway serving CAs a gateway-CA rotation sent (Bundle's
	// gateway_ca_roots). Only with Pin.
	ExtraPins []string
	// Roots is a pool of CA certificates that gateways' serving certificates
	// must verify against, as read from `bcd join --ca-file`.
	Roots *x509.CertPool
}

// IsZero reports whether t names no trust anchor at all.
func (t Trust) IsZero() bool { return t.Pin == "" && t.Roots == nil }

// withRoots returns t trusting the CA certificates roots as well: their
// pins in pin mode, the certificates themselves with a CA pool.
func (t Trust) withRoots(roots []*x509.Certificate) Trust {
	if t.Roots != nil {
		out := t
		out.Roots = t.Roots.Clone()
		for _, r := range roots {
			out.Roots.AddCert(r)
		}
		return out
	}
	pins := make([]string, len(roots))
	for i, r := range roots {
		pins[i] = jointoken.Pin(r)
	}
	return t.withPins(pins)
}

// withPins returns t trusting pins as well (pin mode only; a CA pool gets
// the certificates instead, see withRoots). Pins already held are skipped.
func (t Trust) withPins(pins []string) Trust {
	if t.Pin == "" {
		return t
	}
	out := t
	out.ExtraPins = slices.Clone(t.ExtraPins)
	for _, p := range pins {
		if p != t.Pin && !slices.Contains(out.ExtraPins, p) {
			out.ExtraPins = append(out.ExtraPins, p)
		}
	}
	return out
}

// validate checks that exactly one anchor is set and the pin parses.
func (t Trust) validate() error {
	switch {
	case t.Pin != "" && t.Roots != nil:
		return fmt.Errorf("%w: trust: set a pin or a CA pool, not both", ErrConfig)
	case len(t.ExtraPins) > 0 && t.Pin == "":
		return fmt.Errorf("%w: trust: extra pins without a pin", ErrConfig)
	case t.Pin != "":
		for _, pin := range append([]string{t.Pin}, t.ExtraPins...) {
			if _, err := jointoken.ParsePin(pin); err != nil {
				return fmt.Errorf("%w: trust: %w", ErrConfig, err)
			}
		}
	case t.Roots == nil:
		return fmt.Errorf("%w: trust: no pin and no CA pool (gateways are never trusted on first use)", ErrConfig)
	}
	return nil
}

// verify decides whether chain, as a gateway sent it (leaf first), is
// trusted for host at now, the gateway's time as the node estimates it;
// local is this machine's clock reading, for the error. Errors wrap
// ErrUntrustedGateway; a certificate outside its validity at now is
// reported as a clock problem (validityError), not as a pin or CA
// mismatch.
func (t Trust) verify(chain []*x509.Certificate, host string, local, now time.Time) error {
	if t.Roots == nil {
		err := jointoken.VerifyChain(t.Pin, chain, host, now)
		for _, pin := range t.ExtraPins {
			if err == nil {
				break
			}
			if jointoken.VerifyChain(pin, chain, host, now) == nil {
				err = nil
			}
		}
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUntrustedGateway, explainValidity(err, local, now))
		}
		return nil
	}
	if len(chain) == 0 {
		return fmt.Errorf("%w: no certificate presented", ErrUntrustedGateway)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{
		DNSName:       host,
		Roots:         t.Roots,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUntrustedGateway, explainValidity(err, local, now))
	}
	return nil
}

// validityError is a chain that failed verification only because a
// certificate in it is not valid at the time it was judged by: most often
// this machine's clock is wrong, and the error says what it reads. It
// unwraps to the x509.CertificateInvalidError.
type validityError struct {
	err        x509.CertificateInvalidError
	local, now time.Time
}

func (e *validityError) Error() string {
	const layout = time.RFC3339
	c := e.err.Cert
	msg := fmt.Sprintf("certificate not yet valid / expired: this machine's clock reads %s", e.local.UTC().Format(layout))
	if d := e.now.Sub(e.local); d.Abs() >= time.Second {
		msg += fmt.Sprintf(" (judged at %s, the gateway's time as last measured)", e.now.UTC().Format(layout))
	}
	if c != nil {
		msg += fmt.Sprintf("; %q is valid from %s to %s", c.Subject.CommonName, c.NotBefore.UTC().Format(layout), c.NotAfter.UTC().Format(layout))
	}
	return msg + ": check this machine's clock (NTP)"
}

func (e *validityError) Unwrap() error { return e.err }

// explainValidity returns err, or a validityError when err is a
// certificate outside its validity period.
func explainValidity(err error, local, now time.Time) error {
	var ci x509.CertificateInvalidError
	if errors.As(err, &ci) && ci.Reason == x509.Expired {
		return &validityError{err: ci, local: local, now: now}
	}
	return err
}

// tlsConfig returns the client TLS configuration for a gateway whose
// certificate must name host: TLS 1.3 only, the chain verified against t
// (see verify) at clk's estimate of the gateway's time, presenting the
// certificate getCert returns (nil: none, as for Join). A verification
// failure is also handed to failed, because gRPC reports handshake errors
// only as text.
func (t Trust) tlsConfig(host string, clk *gatewayClock, getCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error), failed func(error)) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		ServerName:           host,
		GetClientCertificate: getCert,
		// The standard verification is replaced, not skipped: verify runs
		// in VerifyConnection against the pin or the configured pool, with
		// the injected clock.
		InsecureSkipVerify: true, //nolint:gosec // see VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			err := t.verify(cs.PeerCertificates, host, clk.local(), clk.now())
			if err != nil && failed != nil {
				failed(err)
			}
			return err
		},
	}
}

// gatewayAddr is a parsed gateway URL.
type gatewayAddr struct {
	url  string // as configured, for logs and events
	host string // host name or IP, what the certificate must name
	addr string // host:port to dial
	// ws is the WebSocket fallback's URL to dial (wss://host[:port]/v1/session)
	// when url is one; empty for a direct connection.
	ws string
}

// WebSocketPath is the path of the gateway's WebSocket fallback.
const WebSocketPath = "/v1/session"

// CheckGatewayURL reports whether s is a gateway URL Join and Connect
// accept: "https://host[:port]", or "wss://host[:port]/v1/session" for the
// WebSocket fallback. The error wraps ErrConfig.
func CheckGatewayURL(s string) error {
	_, err := parseGatewayURL(s)
	return err
}

// IsWebSocketURL reports whether s is a WebSocket fallback URL (scheme
// wss). A node whose gateways are such URLs connects through the fallback
// only, and one whose gateways are https URLs never does: the transport is
// the one configured, never bcd's own choice, so that no middlebox can
// force a downgrade (DESIGN.md, "the WebSocket fallback").
func IsWebSocketURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && u.Scheme == "wss"
}

// parseGatewayURL parses "https://host[:port]" (port 443 when absent), or
// "wss://host[:port]/v1/session" (the WebSocket fallback; the path may be
// left out). Other paths, query strings, fragments and credentials are
// refused.
func parseGatewayURL(s string) (gatewayAddr, error) {
	u, err := url.Parse(s)
	if err != nil {
		return gatewayAddr{}, fmt.Errorf("%w: gateway URL %q: %w", ErrConfig, s, err)
	}
	if u.Scheme != "https" && u.Scheme != "wss" {
		return gatewayAddr{}, fmt.Errorf("%w: gateway URL %q: scheme must be https (or wss for the WebSocket fallback)", ErrConfig, s)
	}
	if u.Hostname() == "" {
		return gatewayAddr{}, fmt.Errorf("%w: gateway URL %q: no host", ErrConfig, s)
	}
	ws := u.Scheme == "wss"
	pathOK := u.Path == "" || u.Path == "/" || (ws && u.Path == WebSocketPath)
	if !pathOK || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		if ws {
			return gatewayAddr{}, fmt.Errorf("%w: gateway URL %q: want wss://host[:port]%s only", ErrConfig, s, WebSocketPath)
		}
		return gatewayAddr{}, fmt.Errorf("%w: gateway URL %q: want https://host[:port] only", ErrConfig, s)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	host := strings.TrimSuffix(u.Hostname(), ".")
	gw := gatewayAddr{url: s, host: host, addr: net.JoinHostPort(host, port)}
	if ws {
		gw.ws = "wss://" + gw.addr + WebSocketPath
	}
	return gw, nil
}
