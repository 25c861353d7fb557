package gateway

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// LeaseName returns the name of gateway id's lease, "gateway:<id>".
func LeaseName(id string) string { return store.GatewayLeasePrefix + id }

// supersededMessage ends a session superseded on another gateway (whose
// id this gateway does not know).
var supersededMessage = &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Superseded{Superseded: &sessionv1.Superseded{}}}

// heartbeatChunk is the most session ids one SessionHeartbeatBatch call
// carries, under the backends' limits on statement parameters.
const heartbeatChunk = 5000

// livenessTx is what a flush of heartbeats and ended sessions touches.
type livenessTx interface {
	SessionClose(ctx context.Context, nodeID, sessionID string) error
	SessionHeartbeatBatch(ctx context.Context, gatewayID string, sessionIDs []string, now *time.Time) (int, error)
	SessionIDs(ctx context.Context, gatewayID string) ([]string, error)
}

// pending is what waits for the next flush: sessions heard from, and
// sessions ended whose rows are still to be removed.
type pending struct {
	mu     sync.Mutex
	beats  map[string]struct{}
	closes []endedSession
}

type endedSession struct{ nodeID, sessionID string }

func (p *pending) beat(sessionID string) {
	p.mu.Lock()
	p.beats[sessionID] = struct{}{}
	p.mu.Unlock()
}

func (p *pending) close(nodeID, sessionID string) {
	p.mu.Lock()
	delete(p.beats, sessionID)
	p.closes = append(p.closes, endedSession{nodeID, sessionID})
	p.mu.Unlock()
}

// take empties p and returns what it held.
func (p *pending) take() ([]string, []endedSession) {
	p.mu.Lock()
	defer p.mu.Unlock()
	beats := make([]string, 0, len(p.beats))
	for id := range p.beats {
		beats = append(beats, id)
	}
	clear(p.beats)
	closes := p.closes
	p.closes = nil
	return beats, closes
}

// putBack returns what a failed flush took, for the next one.
func (p *pending) putBack(beats []string, closes []endedSession) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range beats {
		p.beats[id] = struct{}{}
	}
	p.closes = append(closes, p.closes...)
}

// readbackEvery is how many flushes pass between read-backs of this
// gateway's session rows.
const readbackEvery = 3

// flushLoop writes heartbeats and ended sessions every FlushInterval.
func (g *Gateway) flushLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.cfg.Clock.After(g.cfg.FlushInterval):
			if err := g.flush(ctx, true); err != nil && ctx.Err() == nil {
				g.log.WarnContext(ctx, "Heartbeat write failed; retrying at the next flush", logkey.Err, err)
			}
			if err := g.storeSkews(ctx); err != nil && ctx.Err() == nil {
				g.log.WarnContext(ctx, "Clock skew write failed; retrying at the next flush", logkey.Err, err)
			}
			g.cfg.Metrics.ClockSkewMax(g.cfg.ID, g.skewSeen.max(&g.sessions))
			// The counts of Join refusals no later refusal carries.
			g.admit.SweepRefusals(ctx)
		}
	}
}

// flush writes, in one transaction (fenced on the gateway lease when
// fenced is set), the rows of ended sessions and the liveness of the
// sessions heard from, and reads back which sessions the database still
// gives this gateway. Sessions it no longer does were superseded elsewhere
// (or removed): they are closed.
func (g *Gateway) flush(ctx context.Context, fenced bool) error {
	g.flushMu.Lock()
	defer g.flushMu.Unlock()
	beats, closes := g.pending.take()
	// Sessions are registered after their row commits, so every session in
	// this snapshot has a row unless something removed it. Reading the ids of
	// all of them back is O(sessions) (an index-only scan): it is done every readbackEvery-th flush
	// (every 3 s by default), which bounds how long a session superseded on
	// another gateway stays open here.
	g.flushes++
	var local []*session
	if g.flushes%readbackEvery == 0 {
		local = g.sessions.snapshot()
	}
	var rows []string
	var err error
	if len(beats) == 0 && len(closes) == 0 {
		if len(local) == 0 {
			return nil
		}
		rows, err = g.store.SessionIDs(ctx, g.cfg.ID)
	} else {
		// Node rows are locked in id order, as the liveness reconciler
		// locks them (store.NodeLivenessReconcile): a flush closing a
		// rack's sessions and a liveness pass over the same nodes cannot
		// deadlock on PostgreSQL.
		slices.SortFunc(closes, func(a, b endedSession) int {
			return cmp.Or(cmp.Compare(a.nodeID, b.nodeID), cmp.Compare(a.sessionID, b.sessionID))
		})
		write := func(tx livenessTx) error {
			for _, c := range closes {
				if err := tx.SessionClose(ctx, c.nodeID, c.sessionID); err != nil {
					return err
				}
			}
			for i := 0; i < len(beats); i += heartbeatChunk {
				if _, err := tx.SessionHeartbeatBatch(ctx, g.cfg.ID, beats[i:min(i+heartbeatChunk, len(beats))], nil); err != nil {
					return err
				}
			}
			if len(local) > 0 {
				var err error
				rows, err = tx.SessionIDs(ctx, g.cfg.ID)
				return err
			}
			return nil
		}
		if fenced {
			err = store.InFencedTx(ctx, g.store, *g.fence.Load(), write)
		} else {
			err = store.InTx(ctx, g.store, write)
		}
		if err != nil {
			g.pending.putBack(beats, closes)
		}
	}
	if err != nil {
		return fmt.Errorf("flush sessions: %w", err)
	}
	current := make(map[string]struct{}, len(rows))
	for _, id := range rows {
		current[id] = struct{}{}
	}
	for _, s := range local {
		if _, ok := current[s.id]; !ok && s.terminate("superseded by a newer session on another gateway", supersededMessage, time.Second) {
			g.log.InfoContext(ctx, "Session superseded elsewhere; closed", logkey.NodeID, s.nodeID, "session_id", s.id)
		}
	}
	return nil
}

// acquireLease takes the gateway's lease at start.
func (g *Gateway) acquireLease(ctx context.Context) error {
	name := LeaseName(g.cfg.ID)
	l, ok, err := g.store.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: name, Holder: g.cfg.ID, TTL: g.cfg.LeaseTTL})
	switch {
	case err != nil:
		return fmt.Errorf("gateway lease %s: %w", name, err)
	case !ok:
		return fmt.Errorf("gateway lease %s is held by another process: is a gateway with id %s running?", name, g.cfg.ID)
	}
	g.fence.Store(&store.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch})
	return nil
}

// leaseLoop renews the lease and refreshes the gateways row.
func (g *Gateway) leaseLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.cfg.Clock.After(g.cfg.LeaseRenewInterval):
		}
		g.renewLease(ctx)
		row, err := g.upsertRow(ctx)
		if err != nil {
			if ctx.Err() == nil {
				g.log.WarnContext(ctx, "Gateway row not refreshed", logkey.Err, err)
			}
			continue
		}
		g.followDrainRequest(ctx, row.DrainRequested)
	}
}

// renewLease renews the lease, and takes it again (at a new epoch) when it
// was lost, as after the database was unreachable for longer than its TTL.
func (g *Gateway) renewLease(ctx context.Context) {
	f := g.fence.Load()
	_, ok, err := g.store.LeaseRenew(ctx, &store.LeaseRenewParams{Name: f.Lease, Holder: f.Holder, Epoch: f.Epoch, TTL: g.cfg.LeaseTTL})
	switch {
	case err != nil:
		if ctx.Err() == nil {
			g.log.WarnContext(ctx, "Gateway lease not renewed", logkey.Err, err)
		}
	case !ok:
		g.log.WarnContext(ctx, "Gateway lease lost; taking it again", "lease", f.Lease, "epoch", f.Epoch)
		if err := g.acquireLease(ctx); err != nil {
			g.log.ErrorContext(ctx, "Gateway lease not taken again", logkey.Err, err)
		}
	}
}

// releaseLease gives the lease up at shutdown.
func (g *Gateway) releaseLease() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if f := g.fence.Load(); f != nil {
		if err := g.store.LeaseRelease(ctx, f.Lease, f.Holder, f.Epoch); err != nil {
			g.log.WarnContext(ctx, "Gateway lease not released; it expires on its own", logkey.Err, err)
		}
	}
}

// upsertRow writes the gateways row and returns it as written (with the
// operator's drain request, which only the API writes).
func (g *Gateway) upsertRow(ctx context.Context) (*store.Gateway, error) {
	return g.store.GatewayUpsert(ctx, &store.GatewayUpsertParams{
		ID: g.cfg.ID, Region: g.cfg.Region, Address: g.publicURL, Version: g.cfg.Version,
		Sessions: g.sessions.len(), MaxStreams: g.cfg.MaxStreams, Draining: g.draining.Load(),
		InternalAddress: g.cfg.InternalAddress,
	})
}
