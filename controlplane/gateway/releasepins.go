package gateway

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Bounds of the release pin messages (docs/releases.md, "Pin statements").
const (
	// maxReleasePins is how many statements a ReleasePins carries (the
	// newest when more were accepted) and how many pins a ReleasePinsHeld
	// may report.
	maxReleasePins = 64
	// maxReleasePinLen bounds one pin of ReleasePinsHeld ("sha256/" and
	// 44 characters of base64).
	maxReleasePinLen = 64
)

// releasePinStore is what releasePinLoop and releasePinsHeld read and
// write.
type releasePinStore interface {
	ReleasePinStatements(ctx context.Context) ([]*store.ReleasePinStatement, error)
	NodeReleasePinsSet(ctx context.Context, nodeID string, pins []string, now *time.Time) error
}

// releasePinLoop reads the accepted pin statements at start and every
// Config.BundleReload; when they changed it sends them to every session
// with the release.pins capability. A read that fails keeps the ones in
// force, logged.
func (g *Gateway) releasePinLoop(ctx context.Context) {
	for {
		if err := g.reloadReleasePins(ctx); err != nil && ctx.Err() == nil {
			g.log.WarnContext(ctx, "Release pin statements not read; the ones in force stay", logkey.Err, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-g.cfg.Clock.After(g.cfg.BundleReload):
		}
	}
}

// reloadReleasePins reads the statements once and broadcasts them when
// they changed.
func (g *Gateway) reloadReleasePins(ctx context.Context) error {
	sts, err := g.store.ReleasePinStatements(ctx)
	if err != nil {
		return err
	}
	if len(sts) > maxReleasePins {
		sts = sts[len(sts)-maxReleasePins:]
	}
	ids := make([]string, len(sts))
	msg := &sessionv1.ReleasePins{}
	for i, st := range sts {
		ids[i] = st.ID
		msg.Statements = append(msg.Statements, &sessionv1.ReleasePinStatement{Statement: st.Statement, Signature: st.Signature})
	}
	key := strings.Join(ids, ",")
	if cur := g.releasePins.Load(); cur != nil && cur.key == key {
		return nil
	}
	next := &releasePins{key: key, msg: &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_ReleasePins{ReleasePins: msg}}}
	g.releasePins.Store(next)
	n := 0
	for _, s := range g.sessions.snapshot() {
		if s.hasCap(sessionv1.CapabilityReleasePins) {
			n++
			go func() { _ = s.send(next.msg) }() // a session that ended reports at its next one
		}
	}
	g.log.InfoContext(ctx, "Release pin statements sending to sessions", "statements", len(sts), "sessions", n)
	return nil
}

// releasePins is the ReleasePins message in force and the ids of its
// statements, to tell a change.
type releasePins struct {
	key string
	msg *sessionv1.GatewayMessage
}

// sendReleasePins sends the statements in force to s after its Welcome
// when it has the capability (once the loop read them).
func (g *Gateway) sendReleasePins(s *session) {
	if cur := g.releasePins.Load(); cur != nil && s.hasCap(sessionv1.CapabilityReleasePins) {
		_ = s.send(cur.msg) // a session that ended reports at its next one
	}
}

// releasePinsHeld records the pins a node reports; a report out of bounds
// is dropped, logged.
func (g *Gateway) releasePinsHeld(ctx context.Context, s *session, m *sessionv1.ReleasePinsHeld) {
	pins := m.GetPins()
	ok := len(pins) <= maxReleasePins
	for _, p := range pins {
		ok = ok && strings.HasPrefix(p, "sha256/") && len(p) <= maxReleasePinLen
	}
	if !ok {
		g.log.WarnContext(ctx, "Release pins report refused: at most 64 pins sha256/...", logkey.NodeID, s.nodeID, "pins", len(pins))
		return
	}
	if err := g.store.NodeReleasePinsSet(ctx, s.nodeID, pins, nil); err != nil {
		g.log.WarnContext(ctx, "Release pins of a node not recorded", logkey.NodeID, s.nodeID, logkey.Err, err)
	}
}

// hasCap reports whether capability c is in force on s (Welcome's).
func (s *session) hasCap(c string) bool { return slices.Contains(s.caps, c) }
