package doctor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/proto/jointoken"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Skew limits of gateway.clock.
const (
	SkewWarn = 5 * time.Second
	// SkewFail is the control plane's backdate of certificates
	// (controlplane/pkg/pki NodeBackdate): within it every certificate verifies
	// by either clock; beyond it bcd relies on judging by the gateway's time,
	// which a first join cannot do yet.
	SkewFail = time.Hour
	// GatewayCertWarnWithin is how close to its end the gateway's serving
	// certificate warns.
	GatewayCertWarnWithin = 7 * 24 * time.Hour
)

// Gateway runs the network checks of one gateway URL in order (dns, tcp,
// tls, clock); a failed step ends the list, since the next ones need it.
func Gateway(ctx context.Context, rawURL string, trust session.Trust, cfg Config) []Result {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "wss") || u.Hostname() == "" {
		return []Result{result(IDDNS, rawURL, Fail, "not a gateway URL: want https://host[:port] or wss://host[:port]/v1/session")}
	}
	host := strings.TrimSuffix(u.Hostname(), ".")
	port := u.Port()
	if port == "" {
		port = "443"
	}
	out := []Result{}
	addrs, res := DNS(ctx, cfg.Resolver, host, rawURL, cfg.Timeout)
	out = append(out, res)
	if res.Status == Fail {
		return out
	}
	conn, res := TCP(ctx, addrs, port, rawURL, cfg.Timeout)
	out = append(out, res)
	if res.Status == Fail {
		return out
	}
	if u.Scheme == "wss" {
		// The WebSocket fallback: the outer TLS is the site proxy's; the
		// gateway's own is checked inside the WebSocket when bcd connects.
		conn.Close()
		return append(out, result(IDTLS, rawURL, OK,
			"WebSocket fallback: the gateway's certificate and pin are checked in-band, inside the WebSocket, when bcd connects"))
	}
	res = TLS(ctx, conn, host, trust, rawURL, cfg.Timeout, cfg.Now)
	conn.Close()
	out = append(out, res)
	if res.Status == Fail {
		return out
	}
	return append(out, GatewayClock(ctx, net.JoinHostPort(addrs[0], port), host, trust, rawURL, cfg.Timeout, cfg.Now))
}

// DNS resolves host; an IP address needs no lookup.
func DNS(ctx context.Context, r *net.Resolver, host, target string, timeout time.Duration) ([]string, Result) {
	if ip, err := netip.ParseAddr(host); err == nil {
		return []string{ip.String()}, result(IDDNS, target, OK, "an IP address: nothing to resolve")
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	addrs, err := r.LookupHost(ctx, host)
	took := time.Since(start).Round(time.Millisecond)
	if err != nil {
		return nil, result(IDDNS, target, Fail, "cannot resolve "+host+": check /etc/resolv.conf and the site's DNS", err.Error())
	}
	return addrs, result(IDDNS, target, OK, fmt.Sprintf("%s resolves to %s", host, strings.Join(addrs, ", ")), "in "+took.String())
}

// TCP connects to the first address of addrs that answers.
func TCP(ctx context.Context, addrs []string, port, target string, timeout time.Duration) (net.Conn, Result) {
	var errs []string
	d := net.Dialer{Timeout: timeout}
	for _, a := range addrs {
		addr := net.JoinHostPort(a, port)
		start := time.Now()
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return c, result(IDTCP, target, OK, "connected to "+addr, "in "+time.Since(start).Round(time.Microsecond).String())
		}
		errs = append(errs, err.Error())
	}
	return nil, result(IDTCP, target, Fail, "cannot connect on port "+port+": the site must allow outbound connections to the gateway", strings.Join(errs, "; "))
}

// verifier returns the function that decides, as the agent does, whether
// a gateway's chain is trusted for host: through the pin
// (jointoken.VerifyChain) or the CA pool the node joined with.
func verifier(trust session.Trust, host string, now func() time.Time) (func([]*x509.Certificate) error, string, error) {
	switch {
	case trust.Roots != nil:
		return func(chain []*x509.Certificate) error {
			if len(chain) == 0 {
				return errors.New("no certificate presented")
			}
			inter := x509.NewCertPool()
			for _, c := range chain[1:] {
				inter.AddCert(c)
			}
			_, err := chain[0].Verify(x509.VerifyOptions{DNSName: host, Roots: trust.Roots, Intermediates: inter, CurrentTime: now(),
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			return err
		}, "the CA file the node joined with", nil
	case trust.Pin != "":
		return func(chain []*x509.Certificate) error {
			return jointoken.VerifyChain(trust.Pin, chain, host, now())
		}, "pin " + trust.Pin, nil
	}
	return nil, "", errors.New("no trust anchor: join first, or pass --token-file to check with the token's pin")
}

// tlsConfig is the agent's client TLS configuration, without a client
// certificate: TLS 1.3, HTTP/2, the chain checked by verify.
func tlsConfig(host string, verify func([]*x509.Certificate) error, seen *[]*x509.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: host,
		NextProtos: []string{"h2"},
		// Replaced, not skipped: VerifyConnection checks the chain as the
		// agent does.
		InsecureSkipVerify: true, //nolint:gosec // see VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			if seen != nil {
				*seen = cs.PeerCertificates
			}
			return verify(cs.PeerCertificates)
		},
	}
}

// TLS runs the TLS handshake on conn, trusting only what the node trusts,
// and reports the gateway's certificate.
func TLS(ctx context.Context, conn net.Conn, host string, trust session.Trust, target string, timeout time.Duration, now func() time.Time) Result {
	verify, anchor, err := verifier(trust, host, now)
	if err != nil {
		return result(IDTLS, target, Fail, err.Error())
	}
	var chain []*x509.Certificate
	tc := tls.Client(conn, tlsConfig(host, verify, &chain))
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err = tc.HandshakeContext(ctx)
	var detail []string
	if len(chain) > 0 {
		leaf := chain[0]
		detail = append(detail, fmt.Sprintf("certificate %q issued by %q, names %s, valid until %s", leaf.Subject.CommonName, leaf.Issuer.CommonName,
			strings.Join(leaf.DNSNames, ", "), leaf.NotAfter.UTC().Format(time.RFC3339)))
	}
	detail = append(detail, "trusted through "+anchor)
	switch {
	case errors.Is(err, jointoken.ErrPinMismatch):
		return result(IDTLS, target, Fail, "the gateway's chain does not hold the pinned CA: a TLS-inspecting proxy, or a gateway of another deployment", append(detail, err.Error())...)
	case err != nil && len(chain) > 0:
		return result(IDTLS, target, Fail, "the gateway's certificate does not verify: "+oneLine(err), detail...)
	case err != nil:
		return result(IDTLS, target, Fail, "the TLS handshake failed: "+oneLine(err), detail...)
	}
	cs := tc.ConnectionState()
	leaf := cs.PeerCertificates[0]
	if cs.NegotiatedProtocol != "h2" {
		return result(IDTLS, target, Fail, "the gateway does not speak HTTP/2 (ALPN h2): is this the gateway port?", detail...)
	}
	if left := leaf.NotAfter.Sub(now()); left < GatewayCertWarnWithin {
		return result(IDTLS, target, Warn, fmt.Sprintf("the gateway's certificate ends in %s: tell the operator", left.Round(time.Hour)), detail...)
	}
	return result(IDTLS, target, OK, "TLS 1.3 handshake; the gateway's certificate verifies", detail...)
}

// GatewayClock asks the gateway for its time over a verified TLS connection
// without a client certificate, writing nothing on the gateway: the
// server_time of a JoinService.Challenge (a stateless nonce), or, from a
// gateway that sends none, the "date" header of a gRPC health check, to the
// second. See the package documentation.
func GatewayClock(ctx context.Context, addr, host string, trust session.Trust, target string, timeout time.Duration, now func() time.Time) Result {
	verify, _, err := verifier(trust, host, now)
	if err != nil {
		return result(IDGatewayTime, target, Fail, err.Error())
	}
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig(host, verify, nil))),
		grpc.WithUserAgent("bcd-doctor"))
	if err != nil {
		return result(IDGatewayTime, target, Fail, "cannot ask the gateway's time", err.Error())
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	t0 := now()
	ch, err := sessionv1.NewJoinServiceClient(cc).Challenge(ctx, &sessionv1.ChallengeRequest{})
	t1 := now()
	if st := ch.GetServerTime(); err == nil && st.IsValid() {
		// The gateway read its clock between t0 and t1.
		rtt := t1.Sub(t0)
		return clockResult(target, st.AsTime(), t0.Add(rtt/2), rtt/2, "from the gateway's Challenge (server_time)")
	}
	challengeErr := err

	var header, trailer metadata.MD
	t0 = now()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
	t1 = now()
	answer := "health " + resp.GetStatus().String()
	if st, ok := status.FromError(err); err != nil && ok {
		answer = "health check answered " + st.Code().String()
	}
	if challengeErr != nil {
		answer += "; challenge: " + oneLine(challengeErr)
	}
	dates := append(header.Get("date"), trailer.Get("date")...)
	if len(dates) == 0 {
		if err != nil && ctx.Err() != nil {
			return result(IDGatewayTime, target, Warn, "the gateway did not answer in time: its clock is unknown", err.Error())
		}
		return result(IDGatewayTime, target, OK, "the gateway does not report its time (no Challenge server_time, no Date header): see the clock check", answer)
	}
	gw, err := http.ParseTime(dates[0])
	if err != nil {
		return result(IDGatewayTime, target, Warn, "the gateway's Date header does not parse: its clock is unknown", dates[0])
	}
	rtt := t1.Sub(t0)
	// Date is truncated to the second: the gateway's clock read between
	// gw and gw + 1 s.
	return clockResult(target, gw.Add(500*time.Millisecond), t0.Add(rtt/2), 500*time.Millisecond+rtt/2, "from the Date header of a health check", answer)
}

// clockResult judges the gateway's time gw against this machine's mid,
// both read within ± margin of each other.
func clockResult(target string, gw, mid time.Time, margin time.Duration, source string, more ...string) Result {
	skew := gw.Sub(mid) // the gateway's clock minus this machine's
	known := skew.Abs() - margin
	detail := append([]string{fmt.Sprintf("gateway %s, local %s, skew %s ± %s, %s", gw.UTC().Format(time.RFC3339Nano), mid.UTC().Format(time.RFC3339Nano),
		skew.Round(time.Millisecond), margin.Round(time.Millisecond), source)}, more...)
	way := "ahead of"
	if skew > 0 {
		way = "behind"
	}
	switch {
	case known > SkewFail:
		return result(IDGatewayTime, target, Fail, fmt.Sprintf("this machine's clock is %s %s the gateway's: certificates fail to verify; fix NTP", skew.Abs().Round(time.Second), way), detail...)
	case known > SkewWarn:
		return result(IDGatewayTime, target, Warn, fmt.Sprintf("this machine's clock is %s %s the gateway's: fix NTP", skew.Abs().Round(time.Second), way), detail...)
	}
	return result(IDGatewayTime, target, OK, "this machine's clock agrees with the gateway's", detail...)
}

// oneLine keeps an error message on one line.
func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }
