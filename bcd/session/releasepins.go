package session

import (
	"context"
	"fmt"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Bounds of a ReleasePins message.
const (
	// MaxReleasePinStatements is how many statements a ReleasePins may
	// carry, and how many pins a ReleasePinsHeld reports.
	MaxReleasePinStatements = 64
	// MaxReleasePinStatementBytes bounds one statement
	// (manifest.MaxPinStatementSize).
	MaxReleasePinStatementBytes = 4 << 10
	// MaxReleasePinSignatureBytes bounds one statement's signature.
	MaxReleasePinSignatureBytes = 2 << 10
)

// ReleasePinKeeper applies release pin statements to the node's pin file
// and reads the pins it holds (bcd's keeper: upgrade.ApplyPinStatement, or
// the root helper's pins.apply when unprivileged). With one the Client
// offers sessionv1.CapabilityReleasePins.
type ReleasePinKeeper interface {
	// ApplyPinStatement verifies a statement and its signature against the
	// pin file and applies it; a replayed one changes nothing and is not an
	// error.
	ApplyPinStatement(ctx context.Context, statement, sig []byte) error
	// HeldPins returns the pins (sha256/...) in the pin file.
	HeldPins(ctx context.Context) ([]string, error)
}

// checkReleasePins checks a ReleasePins' bounds.
func checkReleasePins(m *sessionv1.ReleasePins) error {
	if n := len(m.GetStatements()); n > MaxReleasePinStatements {
		return fmt.Errorf("%w: %d release pin statements, at most %d", errOutOfRange, n, MaxReleasePinStatements)
	}
	for i, st := range m.GetStatements() {
		if len(st.GetStatement()) == 0 || len(st.GetStatement()) > MaxReleasePinStatementBytes ||
			len(st.GetSignature()) == 0 || len(st.GetSignature()) > MaxReleasePinSignatureBytes {
			return fmt.Errorf("%w: release pin statement %d of %d bytes with a signature of %d, want 1 to %d and 1 to %d",
				errOutOfRange, i, len(st.GetStatement()), len(st.GetSignature()), MaxReleasePinStatementBytes, MaxReleasePinSignatureBytes)
		}
	}
	return nil
}

// releasePins applies each statement in order through Config.ReleasePins
// (each is verified against the node's own pins there: nothing from the
// gateway is trusted) and answers ReleasePinsHeld with the pins held
// after. A statement refused is logged and skipped: the next ones may
// still apply, and the gateway sends them all again on the next session.
func (s *session) releasePins(m *sessionv1.ReleasePins) {
	c := s.c
	k := c.cfg.ReleasePins
	if k == nil {
		return
	}
	if err := checkReleasePins(m); err != nil {
		c.log.WarnContext(s.ctx, "Release pin statements refused", attrGateway, s.gw.url, logkey.Err, err.Error())
		return
	}
	for i, st := range m.GetStatements() {
		if err := k.ApplyPinStatement(s.ctx, st.GetStatement(), st.GetSignature()); err != nil {
			c.log.WarnContext(s.ctx, "Release pin statement not applied", attrGateway, s.gw.url, "index", i, logkey.Err, err.Error())
		}
	}
	pins, err := k.HeldPins(s.ctx)
	if err != nil {
		c.log.WarnContext(s.ctx, "Release pins not read", attrGateway, s.gw.url, logkey.Err, err.Error())
		return
	}
	if len(pins) > MaxReleasePinStatements {
		pins = pins[:MaxReleasePinStatements]
	}
	if err := s.send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_ReleasePinsHeld{ReleasePinsHeld: &sessionv1.ReleasePinsHeld{
		Pins: pins}}}); err != nil {
		c.log.DebugContext(s.ctx, "Release pins held not sent", attrGateway, s.gw.url, logkey.Err, err.Error())
	}
}
