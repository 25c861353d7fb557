package session

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/proto/keyproof"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// errGracePassed marks the one expiry that is final: the gateway answered
// that the certificate expired longer ago than it re-attests (reason
// GRACE_PASSED). It is wrapped together with ErrCertificateExpired.
var errGracePassed = errors.New("re-attestation grace passed")

// expired reports whether the current leaf has expired, by the gateway's
// time as last seen.
func (c *Client) expired() bool {
	return !c.gwClock.now().Before(c.cert.Load().Leaf.NotAfter)
}

// reattestVia renews an expired certificate through JoinService.Reattest,
// on a connection of its own to gw that presents no client certificate
// (the expired one would fail the mTLS handshake): the node proves its
// latest key over a nonce of that connection. The certificate is judged
// first by the time of the gateway's Challenge: one that has not expired
// by it (this machine's clock is ahead) is kept, and nil returned, unless
// untrusted is set (the gateway refused its issuer: it is re-attested all
// the same). A refusal for good wraps ErrCertificateExpired and
// errGracePassed (the grace is over) or ErrRevoked; any other failure
// (the gateway down, say) is retried by the caller, with backoff.
//
// GRACE_PASSED is final only for a certificate that has expired by the
// gateway's time: for one still valid (untrusted set, the gateway refused
// its issuer) the gateway may hold a stale bundle, or re-attestation be
// off (pki.reattestGrace 0), and another gateway, or this one later, may
// still take it; the error then wraps neither sentinel, and is retried.
func (c *Client) reattestVia(ctx context.Context, gw gatewayAddr, untrusted bool) error {
	attested, err := c.reattest(ctx, gw, untrusted)
	switch {
	case err == nil && !attested:
		return nil
	case err == nil:
		chain, renewAfter := c.Certificate()
		c.log.InfoContext(ctx, "Node certificate re-attested", attrGateway, gw.url, attrNotAfter, chain[0].NotAfter, attrRenew, renewAfter)
		c.emit(Event{Kind: EventRenewed, Gateway: gw.url})
		return nil
	case errors.Is(err, errGracePassed) && untrusted && !c.expired():
		err = c.refusedValid(ctx, gw, err)
	case errors.Is(err, errGracePassed):
		return c.rejoinError(err, gw)
	}
	if ctx.Err() == nil {
		c.emit(Event{Kind: EventRenewFailed, Gateway: gw.url, Err: err})
	}
	return err
}

// refusedValid is the error, not final, of a re-attestation refused with
// GRACE_PASSED (refusal) for a certificate still valid by the gateway's
// time whose issuer gw does not trust: it logs so and says it in words,
// wrapping neither errGracePassed nor ErrCertificateExpired, so the caller
// retries, with backoff and on the other gateways. Once the certificate
// has expired, a GRACE_PASSED is final (reattestVia).
func (c *Client) refusedValid(ctx context.Context, gw gatewayAddr, refusal error) error {
	leaf := c.cert.Load().Leaf
	gwNow := c.gwClock.now()
	c.log.WarnContext(ctx, "Gateway does not trust the node certificate's issuer and refused to re-attest it, "+
		"though the certificate is still valid: retrying with backoff, on the other gateways too "+
		"(the gateway's bundle may be stale, or re-attestation off: pki.reattestGrace)",
		attrGateway, gw.url, attrNotAfter, leaf.NotAfter, attrGWTime, gwNow.UTC(), logkey.Err, refusal)
	said := refusal.Error()
	if re := (*refusedError)(nil); errors.As(refusal, &re) {
		said = re.said
	}
	return fmt.Errorf("re-attestation refused with GRACE_PASSED (%q) for a node certificate still valid until %s by the gateway's time: "+
		"not final, retrying", said, leaf.NotAfter.UTC().Format(time.RFC3339))
}

// rejoinError is the one final word of a node the gateway will no longer
// re-attest (errGracePassed): err with the exact way back, for this node
// and gw. bcd prints it and exits 4.
func (c *Client) rejoinError(err error, gw gatewayAddr) error {
	flags := ""
	if c.cfg.JoinFlags != "" {
		flags = " " + c.cfg.JoinFlags
	}
	return fmt.Errorf("%w; to bring it back: on the control plane run `better-compute nodes reinstall %s --out token`, "+
		"then here `bcd join --gateway %s --token-file token --force%s` and restart bcd", err, nodeIDOf(c.cert.Load().Leaf.URIs), gw.url, flags)
}

// untrusted follows a handshake in which gw refused the node's certificate
// as not chaining to a root it trusts: a node-CA rotation retired the CA
// that issued it while the node was off (docs/pki.md, "Rotating the node
// CA"). The gateway still verifies key proofs against retired roots, so the
// node re-attests with its key, as after an outage, and is issued a
// certificate by the CA in force; re-attestation is refused for good when
// revoked, or with GRACE_PASSED once the certificate has expired (a
// GRACE_PASSED for a certificate still valid is not final: refusedValid),
// and any other failure is retried by the caller, with backoff.
func (c *Client) untrusted(ctx context.Context, gw gatewayAddr) error {
	if err := c.reattestVia(ctx, gw, true); err != nil {
		return fmt.Errorf("gateway %s does not trust the issuer of the node certificate: %w", gw.url, err)
	}
	return nil
}

// reattest makes one Reattest call and adopts its certificate; attested
// is false when, by the time of the gateway's Challenge, the certificate
// has not expired and untrusted is not set (nothing is asked then).
func (c *Client) reattest(ctx context.Context, gw gatewayAddr, untrusted bool) (attested bool, err error) {
	c.renewMu.Lock()
	defer c.renewMu.Unlock()
	cc, err := dial(gw, c.trust().tlsConfig(gw.host, c.gwClock, nil, nil), c.transport)
	if err != nil {
		return false, err
	}
	defer cc.Close()
	rctx, cancel := context.WithTimeout(ctx, c.cfg.RenewTimeout)
	defer cancel()
	chain, _ := c.Certificate()
	leaf := chain[0]
	proof, ch, err := prove(rctx, cc, keyproof.PurposeReattest, c.cfg.Key, chain)
	if err != nil {
		// The gateway's time is not known: judged by the last estimate.
		c.logReattest(ctx, gw, leaf, c.gwClock.now(), untrusted)
		return false, fmt.Errorf("re-attest certificate: %w", err)
	}
	gwNow, _ := c.gwClock.observe(ctx, gw.url, ch.GetServerTime())
	if gwNow.Before(leaf.NotAfter) && !untrusted {
		return false, nil
	}
	c.logReattest(ctx, gw, leaf, gwNow, untrusted)
	csr, err := newCSR(c.cfg.Key)
	if err != nil {
		return false, fmt.Errorf("re-attest certificate: %w", err)
	}
	resp, err := sessionv1.NewJoinServiceClient(cc).Reattest(rctx, &sessionv1.ReattestRequest{Proof: proof, Csr: csr})
	if err != nil {
		return false, fmt.Errorf("re-attest certificate: %w", identityError(err))
	}
	if err := c.adopt(ctx, cc, resp); err != nil {
		return false, fmt.Errorf("re-attest certificate: %w", err)
	}
	return true, nil
}

// logReattest says why the certificate leaf is re-attested (expired by
// gwNow, or its issuer no longer trusted) and how long re-attestation has
// left.
func (c *Client) logReattest(ctx context.Context, gw gatewayAddr, leaf *x509.Certificate, gwNow time.Time, untrusted bool) {
	if untrusted && gwNow.Before(leaf.NotAfter) {
		c.log.WarnContext(ctx, "Node certificate's issuer not trusted by the gateway: re-attesting with the node's key",
			attrGateway, gw.url, attrNotAfter, leaf.NotAfter, attrGWTime, gwNow.UTC(), attrReattest, c.reattestLeft(leaf, gwNow))
		return
	}
	c.logExpired(ctx, gw, leaf, gwNow)
}

// reattestLeft is how long re-attestation of leaf has left at gwNow, in
// words ("unknown" when the gateway never said its grace).
func (c *Client) reattestLeft(leaf *x509.Certificate, gwNow time.Time) string {
	if grace := c.ReattestGrace(); grace > 0 {
		return max(leaf.NotAfter.Add(grace).Sub(gwNow), 0).Round(time.Second).String()
	}
	return "unknown"
}

// logExpired says that the certificate leaf expired by gwNow and how long
// re-attestation has left.
func (c *Client) logExpired(ctx context.Context, gw gatewayAddr, leaf *x509.Certificate, gwNow time.Time) {
	c.log.WarnContext(ctx, "Node certificate expired: re-attesting with the node's key",
		attrGateway, gw.url, attrNotAfter, leaf.NotAfter, attrGWTime, gwNow.UTC(), attrReattest, c.reattestLeft(leaf, gwNow))
}

// refused follows a handshake in which gw refused the node's certificate
// as outside its validity period: crypto/tls sends the same alert
// (certificate_expired) for a certificate not yet valid, so the gateway's
// time is asked over a connection without a client certificate (a
// Challenge's server_time) and the certificate judged by it. Expired, it
// is re-attested (nil once done). Not yet valid, the control plane's clock
// is behind the one that issued it, and the error wraps
// ErrCertificateNotYetValid and says so. Valid, the error says the gateway
// refused it all the same.
func (c *Client) refused(ctx context.Context, gw gatewayAddr) error {
	gwNow, err := c.askTime(ctx, gw)
	if err != nil {
		return fmt.Errorf("gateway %s refused the node certificate as expired or not yet valid, and its time is unknown: %w", gw.url, err)
	}
	leaf := c.cert.Load().Leaf
	const layout = time.RFC3339
	switch {
	case !gwNow.Before(leaf.NotAfter):
		return c.reattestVia(ctx, gw, false)
	case gwNow.Before(leaf.NotBefore):
		return fmt.Errorf("gateway %s: %w by the gateway's clock, which reads %s, before the certificate's start %s "+
			"(this certificate was issued an hour after its start): the control plane's clock is behind; fix its clock (NTP)",
			gw.url, ErrCertificateNotYetValid, gwNow.UTC().Format(layout), leaf.NotBefore.UTC().Format(layout))
	}
	return fmt.Errorf("gateway %s refused the node certificate as expired or not yet valid, though by the gateway's time (%s) it is valid from %s to %s",
		gw.url, gwNow.UTC().Format(layout), leaf.NotBefore.UTC().Format(layout), leaf.NotAfter.UTC().Format(layout))
}

// askTime asks gw its time over a connection without a client
// certificate (JoinService.Challenge, whose answer carries server_time),
// takes it as the gateway's clock (gatewayClock.observe), and returns it.
func (c *Client) askTime(ctx context.Context, gw gatewayAddr) (time.Time, error) {
	cc, err := dial(gw, c.trust().tlsConfig(gw.host, c.gwClock, nil, nil), c.transport)
	if err != nil {
		return time.Time{}, err
	}
	defer cc.Close()
	rctx, cancel := context.WithTimeout(ctx, c.cfg.RenewTimeout)
	defer cancel()
	ch, err := sessionv1.NewJoinServiceClient(cc).Challenge(rctx, &sessionv1.ChallengeRequest{})
	if err != nil {
		return time.Time{}, fmt.Errorf("challenge: %w", err)
	}
	st := ch.GetServerTime()
	if !st.IsValid() {
		return time.Time{}, fmt.Errorf("challenge: gateway %s sent no time", gw.url)
	}
	gwNow, _ := c.gwClock.observe(ctx, gw.url, st)
	return gwNow, nil
}

// nodeIDOf returns the node id of a node SPIFFE ID among uris, "NODE" when
// there is none.
func nodeIDOf(uris []*url.URL) string {
	for _, u := range uris {
		if i := strings.LastIndex(u.Path, "/node/"); u.Scheme == "spiffe" && i >= 0 {
			return u.Path[i+len("/node/"):]
		}
	}
	return "NODE"
}
