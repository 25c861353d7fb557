package gateway

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// skewStep is how far a node's measured clock skew must move before it is
// written again: heartbeats measure it every interval, but a write per
// heartbeat would double the gateway's writes for nothing.
const skewStep = time.Second

// skewWrite is one node's clock skew to store: the node's clock minus the
// gateway's (store.Node.ClockSkew), measured at at.
type skewWrite struct {
	skew time.Duration
	at   time.Time
}

// skewBatch holds the skews measured since the last write, the latest per
// node.
type skewBatch = latest[skewWrite]

// measureSkew takes the node's clock from a heartbeat received at now (the
// gateway's clock): the node's clock minus the gateway's, network delay
// included (milliseconds, well under what matters). It is queued for the
// next write on the session's first heartbeat and then only when it moved
// by more than skewStep (DESIGN.md, "Identity over time", Clocks). Called
// on the session's handler goroutine.
func (g *Gateway) measureSkew(s *session, hb *sessionv1.Heartbeat, now time.Time) {
	sent := hb.GetSentAt()
	if sent == nil || !sent.IsValid() {
		return
	}
	skew := sent.AsTime().Sub(now)
	if s.skewMeasured && (skew-s.skew).Abs() <= skewStep {
		return
	}
	s.skew, s.skewMeasured = skew, true
	g.skews.put(s.nodeID, skewWrite{skew: skew, at: now})
}

// storeSkews writes the pending clock skews in one transaction, in node id
// order; a node deleted meanwhile is skipped. When the transaction fails
// they stay pending for the next flush.
func (g *Gateway) storeSkews(ctx context.Context) error {
	m := g.skews.take()
	if len(m) == 0 {
		return nil
	}
	err := g.store.Tx(ctx, func(tx store.Store) error {
		for _, id := range slices.Sorted(maps.Keys(m)) {
			w := m[id]
			if err := tx.NodeSetClockSkew(ctx, id, w.skew, &w.at); err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
		return nil
	})
	if err != nil {
		g.skews.putBack(m)
	}
	return err
}
