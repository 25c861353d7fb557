package session

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// renewVia renews through a connection of its own to gw.
func (c *Client) renewVia(ctx context.Context, gw gatewayAddr) error {
	cc, err := dial(gw, c.trust().tlsConfig(gw.host, c.gwClock, c.getClientCertificate, nil), c.transport)
	if err != nil {
		return err
	}
	defer cc.Close()
	return c.renewLogged(ctx, cc)
}

// renewLogged renews through cc and reports the result in the log and as
// an Event.
func (c *Client) renewLogged(ctx context.Context, cc *grpc.ClientConn) error {
	err := c.renew(ctx, cc)
	switch {
	case err == nil:
		chain, renewAfter := c.Certificate()
		c.log.InfoContext(ctx, "Node certificate renewed", attrNotAfter, chain[0].NotAfter, attrRenew, renewAfter)
		c.emit(Event{Kind: EventRenewed})
	case errors.Is(err, ErrRevoked) || ctx.Err() == nil:
		c.log.WarnContext(ctx, "Node certificate renewal failed", logkey.Err, err)
		c.emit(Event{Kind: EventRenewFailed, Err: err})
	}
	return err
}

// renew asks for a new certificate for the node's key (JoinService.Renew,
// mutual TLS with the current certificate) and adopts it. A refusal is read
// by identityError: ErrRevoked only when the gateway says revoked or
// deleted.
func (c *Client) renew(ctx context.Context, cc *grpc.ClientConn) error {
	c.renewMu.Lock()
	defer c.renewMu.Unlock()
	csr, err := newCSR(c.cfg.Key)
	if err != nil {
		return fmt.Errorf("renew certificate: %w", err)
	}
	rctx, cancel := context.WithTimeout(ctx, c.cfg.RenewTimeout)
	defer cancel()
	resp, err := sessionv1.NewJoinServiceClient(cc).Renew(rctx, &sessionv1.RenewRequest{Csr: csr})
	if err != nil {
		return fmt.Errorf("renew certificate: %w", identityError(err))
	}
	if err := c.adopt(ctx, cc, resp); err != nil {
		return fmt.Errorf("renew certificate: %w", err)
	}
	return nil
}

// identityError reads a refused Renew or Reattest as what it is: revoked or
// deleted (ErrRevoked: join again), expired (ErrCertificateExpired), or any
// other failure, which is worth retrying.
func identityError(err error) error {
	st := status.Convert(err)
	switch refusalOf(err) {
	case sessionv1.IdentityRefusal_REVOKED, sessionv1.IdentityRefusal_UNKNOWN_NODE:
		return revokedError(st.Message())
	case sessionv1.IdentityRefusal_CERT_EXPIRED:
		return fmt.Errorf("%w: %s", ErrCertificateExpired, st.Message())
	case sessionv1.IdentityRefusal_GRACE_PASSED:
		// The gateway's message says the grace passed; the sentinels only
		// classify it.
		return &refusedError{msg: fmt.Sprintf("%s: %s", ErrCertificateExpired, st.Message()), said: st.Message(),
			is: []error{ErrCertificateExpired, errGracePassed}}
	}
	if st.Code() == codes.PermissionDenied && len(st.Details()) == 0 {
		// A gateway older than IdentityRefusal said revoked this way.
		return revokedError(st.Message())
	}
	return err
}

// adopt checks a renewed or re-attested certificate, persists it through
// Config.Identity (KeepRenewal) and then uses it for every new connection.
func (c *Client) adopt(ctx context.Context, cc *grpc.ClientConn, resp *sessionv1.RenewResponse) error {
	chain, err := parseDERs("certificate", resp.GetCertificateChain())
	if err != nil {
		return err
	}
	roots, err := parseDERs("node CA root", resp.GetNodeCaRoots())
	if err != nil {
		return err
	}
	// Judged by the gateway's time when the clocks disagree (gatewayClock).
	judge, _ := c.gwClock.observe(ctx, "https://"+strings.TrimPrefix(cc.Target(), "passthrough:///"), resp.GetServerTime())
	if err := checkIssued(chain, roots, c.cfg.Key, judge); err != nil {
		return err
	}
	r := &Renewal{Chain: chain, NodeCARoots: roots, RenewAfter: defaultRenewAfter(chain[0]), ReattestGrace: c.ReattestGrace()}
	if ra := resp.GetRenewAfter(); ra != nil && ra.IsValid() {
		r.RenewAfter = ra.AsTime()
	}
	if g := resp.GetReattestGrace(); g != nil && g.IsValid() {
		r.ReattestGrace = g.AsDuration()
	}
	if err := c.cfg.Identity.KeepRenewal(ctx, r); err != nil {
		return fmt.Errorf("persist: %w", err)
	}
	c.mu.Lock()
	c.chain = chain
	c.renewAfter = r.RenewAfter
	c.reattestGrace = r.ReattestGrace
	c.mu.Unlock()
	c.cert.Store(tlsCertificate(chain, c.cfg.Key))
	return nil
}

// refusedError is a gateway's refusal in its own words, matching the
// sentinels that classify it.
type refusedError struct {
	msg  string
	said string // the gateway's message alone
	is   []error
}

func (e *refusedError) Error() string   { return e.msg }
func (e *refusedError) Unwrap() []error { return e.is }
