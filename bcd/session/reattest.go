package session

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

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
// latest key over a nonce of that connection. A refusal for good wraps
// ErrCertificateExpired and errGracePassed (the grace is over) or
// ErrRevoked; any other failure is retried by the caller, with backoff.
func (c *Client) reattestVia(ctx context.Context, gw gatewayAddr) error {
	leaf := c.cert.Load().Leaf
	grace := c.ReattestGrace()
	left := "unknown"
	if grace > 0 {
		left = max(leaf.NotAfter.Add(grace).Sub(c.gwClock.now()), 0).Round(time.Second).String()
	}
	c.log.WarnContext(ctx, "Node certificate expired: re-attesting with the node's key",
		attrGateway, gw.url, attrNotAfter, leaf.NotAfter, "reattest_left", left)
	err := c.reattest(ctx, gw)
	switch {
	case err == nil:
		chain, renewAfter := c.Certificate()
		c.log.InfoContext(ctx, "Node certificate re-attested", attrGateway, gw.url, attrNotAfter, chain[0].NotAfter, attrRenew, renewAfter)
		c.emit(Event{Kind: EventRenewed, Gateway: gw.url})
		return nil
	case errors.Is(err, errGracePassed):
		flags := ""
		if c.cfg.JoinFlags != "" {
			flags = " " + c.cfg.JoinFlags
		}
		return fmt.Errorf("%w; to bring it back: on the control plane run `better-compute nodes reinstall %s --out token`, "+
			"then here `bcd join --gateway %s --token-file token --force%s` and restart bcd", err, nodeIDOf(leaf.URIs), gw.url, flags)
	case ctx.Err() == nil:
		c.emit(Event{Kind: EventRenewFailed, Gateway: gw.url, Err: err})
	}
	return err
}

// reattest makes one Reattest call and adopts its certificate.
func (c *Client) reattest(ctx context.Context, gw gatewayAddr) error {
	c.renewMu.Lock()
	defer c.renewMu.Unlock()
	cc, err := dial(gw, c.cfg.Trust.tlsConfig(gw.host, c.gwClock, nil, nil), c.transport)
	if err != nil {
		return err
	}
	defer cc.Close()
	rctx, cancel := context.WithTimeout(ctx, c.cfg.RenewTimeout)
	defer cancel()
	chain, _ := c.Certificate()
	proof, _, err := prove(rctx, cc, keyproof.PurposeReattest, c.cfg.Key, chain)
	if err != nil {
		return fmt.Errorf("re-attest certificate: %w", err)
	}
	csr, err := newCSR(c.cfg.Key)
	if err != nil {
		return fmt.Errorf("re-attest certificate: %w", err)
	}
	resp, err := sessionv1.NewJoinServiceClient(cc).Reattest(rctx, &sessionv1.ReattestRequest{Proof: proof, Csr: csr})
	if err != nil {
		return fmt.Errorf("re-attest certificate: %w", identityError(err))
	}
	if err := c.adopt(ctx, cc, resp); err != nil {
		return fmt.Errorf("re-attest certificate: %w", err)
	}
	return nil
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
