package gateway

import (
	"context"
	"slices"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
)

// drainReason is the Drain reason a node is given when an operator drains
// its gateway (gateways.drain).
const drainReason = "gateway drained by an operator"

// followDrainRequest brings the gateway in line with the operator's drain
// request read back from its row (gateways.drain and gateways.undrain,
// docs/gateway.md "Draining on command"), at each lease renewal:
//
//   - requested, not yet draining: it refuses new sessions (as a shutdown
//     does), records by when its nodes are due back elsewhere and sends each
//     session Drain with a random delay up to DrainDelay (the window),
//     preferring the region's other live gateways. The gateway stays up.
//   - requested and draining: sessions that opened while the drain began
//     are drained too.
//   - no longer requested: it takes sessions again. A shutdown in progress
//     is never undone.
func (g *Gateway) followDrainRequest(ctx context.Context, requested bool) {
	if g.stopping.Load() {
		return
	}
	switch {
	case requested && !g.commanded.Load():
		g.commanded.Store(true)
		g.draining.Store(true)
		g.log.InfoContext(ctx, "Gateway draining on command", "sessions", g.sessions.len(), "drain_delay", g.cfg.DrainDelay.String())
		if _, err := g.upsertRow(ctx); err != nil {
			g.log.WarnContext(ctx, "Gateway row not marked draining", logkey.Err, err)
		}
		g.recordDrain(ctx)
		// Off the lease loop: drainAll may take up to ShutdownGrace.
		g.drains.Go(func() { g.drainAll(drainReason) })
	case requested:
		if slices.ContainsFunc(g.sessions.snapshot(), func(s *session) bool { return !s.drained.Load() }) {
			g.recordDrain(ctx)
			g.drains.Go(func() { g.drainAll(drainReason) })
		}
	case g.commanded.Load():
		g.commanded.Store(false)
		g.draining.Store(false)
		g.log.InfoContext(ctx, "Gateway undrained: taking sessions again")
		if _, err := g.upsertRow(ctx); err != nil {
			g.log.WarnContext(ctx, "Gateway row not marked undrained", logkey.Err, err)
		}
	}
}

// recordDrain records, before any Drain goes out, that this gateway's
// nodes are due back within DrainDelay plus one heartbeat interval: a node
// waiting out its delay is not silent (liveness counts it heard from until
// then), so no remediation case opens for it. The write has its own
// deadline: the drain goes on without it.
func (g *Gateway) recordDrain(ctx context.Context) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := g.store.SessionDrain(wctx, &store.SessionDrainParams{GatewayID: g.cfg.ID,
		Within: g.cfg.DrainDelay + g.cfg.HeartbeatInterval}); err != nil {
		g.log.WarnContext(ctx, "Nodes' reconnect delay not recorded: liveness may count them silent", logkey.Err, err)
	}
}
