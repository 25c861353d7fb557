package session

import (
	"fmt"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Bounds of a Bundle message.
const (
	// MaxBundleRoots is how many node CA roots a Bundle may carry.
	MaxBundleRoots = 8
	// MaxBundleRootBytes bounds one root's DER encoding.
	MaxBundleRootBytes = 16 << 10
)

// checkBundle checks a Bundle's bounds and parses its roots.
func checkBundle(b *sessionv1.Bundle) error {
	switch {
	case b == nil:
		return fmt.Errorf("%w: empty bundle", errOutOfRange)
	case len(b.GetNodeCaRoots()) == 0 || len(b.GetNodeCaRoots()) > MaxBundleRoots:
		return fmt.Errorf("%w: bundle of %d node CA roots, want 1 to %d", errOutOfRange, len(b.GetNodeCaRoots()), MaxBundleRoots)
	}
	for i, der := range b.GetNodeCaRoots() {
		if len(der) > MaxBundleRootBytes {
			return fmt.Errorf("%w: bundle root %d of %d bytes, at most %d", errOutOfRange, i, len(der), MaxBundleRootBytes)
		}
	}
	if n := len(b.GetGatewayCaRoots()); n > MaxBundleRoots {
		return fmt.Errorf("%w: bundle of %d gateway CA roots, at most %d", errOutOfRange, n, MaxBundleRoots)
	}
	for i, der := range b.GetGatewayCaRoots() {
		if len(der) > MaxBundleRootBytes {
			return fmt.Errorf("%w: bundle gateway root %d of %d bytes, at most %d", errOutOfRange, i, len(der), MaxBundleRootBytes)
		}
	}
	return checkID("bundle rotation id", b.GetRotationId())
}

// gatewayBundle keeps a gateway-CA rotation's gateway roots through
// GatewayRootsKeeper and trusts them from the next handshake on; it
// reports whether the bundle may be acknowledged.
func (s *session) gatewayBundle(b *sessionv1.Bundle) bool {
	c := s.c
	keeper, ok := c.cfg.Identity.(GatewayRootsKeeper)
	if !ok {
		return false // not offered: the gateway should not have sent it
	}
	roots, err := parseDERs("bundle gateway CA root", b.GetGatewayCaRoots())
	if err != nil {
		c.log.WarnContext(s.ctx, "Gateway CA bundle refused", attrGateway, s.gw.url, logkey.Err, err.Error())
		return false
	}
	for _, r := range roots {
		if !r.IsCA {
			c.log.WarnContext(s.ctx, "Gateway CA bundle refused: a root is not a CA certificate", attrGateway, s.gw.url)
			return false
		}
	}
	if err := keeper.KeepGatewayRoots(s.ctx, roots); err != nil {
		c.log.ErrorContext(s.ctx, "Gateway CA bundle not stored", attrGateway, s.gw.url, logkey.Err, err.Error())
		return false
	}
	c.gwRoots.Store(&roots)
	c.log.InfoContext(s.ctx, "Gateway CA bundle stored", attrGateway, s.gw.url, "rotation_id", b.GetRotationId(), "roots", len(roots))
	return true
}

// trust is Config.Trust with the gateway serving CAs a gateway-CA
// rotation's Bundle added.
func (c *Client) trust() Trust {
	roots := c.gwRoots.Load()
	if roots == nil {
		return c.cfg.Trust
	}
	return c.cfg.Trust.withRoots(*roots)
}

// bundle stores a Bundle's node CA roots through Config.Identity (KeepBundle),
// or a gateway-CA rotation's gateway roots (gatewayBundle), and
// acknowledges it. A bundle that fails its checks or cannot be stored is
// logged and not acknowledged: the gateway sends it again on the next
// session, and the rotation's status lists the node as not acked.
func (s *session) bundle(b *sessionv1.Bundle) {
	c := s.c
	if err := checkBundle(b); err != nil {
		c.log.WarnContext(s.ctx, "Node CA bundle refused", attrGateway, s.gw.url, logkey.Err, err.Error())
		return
	}
	roots, err := parseDERs("bundle node CA root", b.GetNodeCaRoots())
	if err != nil {
		c.log.WarnContext(s.ctx, "Node CA bundle refused", attrGateway, s.gw.url, logkey.Err, err.Error())
		return
	}
	for _, r := range roots {
		if !r.IsCA {
			c.log.WarnContext(s.ctx, "Node CA bundle refused: a root is not a CA certificate", attrGateway, s.gw.url)
			return
		}
	}
	switch {
	case len(b.GetGatewayCaRoots()) > 0:
		// A gateway-CA rotation's: the node CA roots are those in force.
		if !s.gatewayBundle(b) {
			return
		}
	default:
		if err := c.cfg.Identity.KeepBundle(s.ctx, roots); err != nil {
			c.log.ErrorContext(s.ctx, "Node CA bundle not stored", attrGateway, s.gw.url, logkey.Err, err.Error())
			return
		}
		c.log.InfoContext(s.ctx, "Node CA bundle stored", attrGateway, s.gw.url, "rotation_id", b.GetRotationId(), "roots", len(roots))
	}
	if err := s.send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_BundleAck{BundleAck: &sessionv1.BundleAck{
		RotationId: b.GetRotationId()}}}); err != nil {
		c.log.DebugContext(s.ctx, "Node CA bundle ack not sent", attrGateway, s.gw.url, logkey.Err, err.Error())
	}
}
