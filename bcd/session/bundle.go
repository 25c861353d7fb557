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
	return checkID("bundle rotation id", b.GetRotationId())
}

// bundle stores a Bundle's node CA roots through Config.Identity (KeepBundle) and
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
	if err := c.cfg.Identity.KeepBundle(s.ctx, roots); err != nil {
		c.log.ErrorContext(s.ctx, "Node CA bundle not stored", attrGateway, s.gw.url, logkey.Err, err.Error())
		return
	}
	c.log.InfoContext(s.ctx, "Node CA bundle stored", attrGateway, s.gw.url, "rotation_id", b.GetRotationId(), "roots", len(roots))
	if err := s.send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_BundleAck{BundleAck: &sessionv1.BundleAck{
		RotationId: b.GetRotationId()}}}); err != nil {
		c.log.DebugContext(s.ctx, "Node CA bundle ack not sent", attrGateway, s.gw.url, logkey.Err, err.Error())
	}
}
