package session

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// renewVia renews through a connection of its own to gw.
func (c *Client) renewVia(ctx context.Context, gw gatewayAddr) error {
	cc, err := dial(gw, c.cfg.Trust.tlsConfig(gw.host, c.clock.Now, c.getClientCertificate, nil), c.transport)
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
		c.log.WarnContext(ctx, "Node certificate renewal failed", attrErr, err)
		c.emit(Event{Kind: EventRenewFailed, Err: err})
	}
	return err
}

// renew asks for a new certificate for the node's key (JoinService.Renew,
// mutual TLS with the current certificate), persists it through
// Config.OnRenew and then uses it for every new connection. UNAUTHENTICATED
// means the certificate is revoked: ErrRevoked.
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
		if st := status.Convert(err); st.Code() == codes.Unauthenticated {
			return fmt.Errorf("renew certificate: %w", revokedError(st.Message()))
		}
		return fmt.Errorf("renew certificate: %w", err)
	}
	chain, err := parseDERs("certificate", resp.GetCertificateChain())
	if err != nil {
		return fmt.Errorf("renew certificate: %w", err)
	}
	roots, err := parseDERs("node CA root", resp.GetNodeCaRoots())
	if err != nil {
		return fmt.Errorf("renew certificate: %w", err)
	}
	if err := checkIssued(chain, roots, c.cfg.Key, c.clock.Now()); err != nil {
		return fmt.Errorf("renew certificate: %w", err)
	}
	r := &Renewal{Chain: chain, NodeCARoots: roots, RenewAfter: defaultRenewAfter(chain[0])}
	if ra := resp.GetRenewAfter(); ra != nil && ra.IsValid() {
		r.RenewAfter = ra.AsTime()
	}
	if f := c.cfg.OnRenew; f != nil {
		if err := f(ctx, r); err != nil {
			return fmt.Errorf("renew certificate: persist: %w", err)
		}
	}
	c.mu.Lock()
	c.chain = chain
	c.renewAfter = r.RenewAfter
	c.mu.Unlock()
	c.cert.Store(tlsCertificate(chain, c.cfg.Key))
	return nil
}
