package gateway

import (
	"context"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

const (
	// revocationLookback is how far before its start the gateway reads the
	// revocation feed first.
	revocationLookback = time.Minute
	// revocationOverlap is how far behind the newest revocation seen each
	// read starts, so a revocation whose transaction committed late is
	// still seen. Reading one twice is harmless.
	revocationOverlap = 10 * time.Second
)

// revocationLoop reads the revocation feed every RevocationPollInterval.
func (g *Gateway) revocationLoop(ctx context.Context) {
	since := g.cfg.Clock.Now().Add(-revocationLookback)
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.cfg.Clock.After(g.cfg.RevocationPollInterval):
			since = g.applyRevocations(ctx, since)
		case <-g.revokeNow:
			since = g.applyRevocations(ctx, since)
		}
	}
}

// applyRevocations ends the sessions that revocations made at or after since
// concern, and returns where the next read starts.
func (g *Gateway) applyRevocations(ctx context.Context, since time.Time) time.Time {
	revs, err := g.store.RevocationList(ctx, since)
	if err != nil {
		if ctx.Err() == nil {
			g.log.WarnContext(ctx, "Revocation feed unavailable", logkey.Err, err)
		}
		return since
	}
	if len(revs) == 0 {
		return since
	}
	bySerial := make(map[string]*store.Revocation, len(revs))
	byNode := map[string]*store.Revocation{}
	newest := since
	for _, r := range revs {
		bySerial[r.Serial] = r
		if r.NodeID != "" {
			if prev, ok := byNode[r.NodeID]; !ok || r.RevokedAt.After(prev.RevokedAt) {
				byNode[r.NodeID] = r
			}
		}
		if r.RevokedAt.After(newest) {
			newest = r.RevokedAt
		}
	}
	for _, s := range g.sessions.snapshot() {
		r, ok := bySerial[*s.serial.Load()]
		if !ok {
			// A revocation naming the node ends the sessions it opened
			// before the revocation (both times are the database's).
			if nr, found := byNode[s.nodeID]; found && s.connectedAt.Before(nr.RevokedAt) {
				r, ok = nr, true
			}
		}
		if !ok {
			continue
		}
		reason := "certificate " + r.Serial + " revoked"
		if r.Reason != "" {
			reason += " (" + r.Reason + ")"
		}
		msg := &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Revoked{Revoked: &sessionv1.Revoked{Reason: reason}}}
		if s.terminate(reason, msg, revokedGrace) {
			g.log.InfoContext(ctx, "Session revoked", logkey.NodeID, s.nodeID, "session_id", s.id, "serial", r.Serial, "reason", r.Reason)
		}
	}
	if next := newest.Add(-revocationOverlap); next.After(since) {
		return next
	}
	return since
}
