package gateway

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// DefaultClockSkewLimit is Config.ClockSkewLimit's default: a node whose
// clock is further off than this either way is clock-skewed.
const DefaultClockSkewLimit = 5 * time.Minute

// Log attribute keys of the clock checks.
const (
	attrClockSkewSec   = "clock_skew_s" // the node's clock minus the gateway's, seconds
	attrClockSkewLimit = "clock_skew_limit"
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
	g.skewSeen.put(s.nodeID, s.id, skew)
}

// skewSeen keeps the latest skew measured on each session, for the
// gateway's ClockSkewMax gauge.
type skewSeen struct {
	mu sync.Mutex
	m  map[string]seenSkew // by node id
}

type seenSkew struct {
	sessionID string
	skew      time.Duration
}

func (k *skewSeen) put(nodeID, sessionID string, skew time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[string]seenSkew{}
	}
	k.m[nodeID] = seenSkew{sessionID, skew}
}

// max returns the largest skew, either way, of the sessions still held
// (in sessions), and forgets those of sessions that ended. O(sessions
// measured), once per flush.
func (k *skewSeen) max(sessions *registry) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	var worst time.Duration
	for id, e := range k.m {
		if s := sessions.get(id); s == nil || s.id != e.sessionID {
			delete(k.m, id)
			continue
		}
		worst = max(worst, e.skew.Abs())
	}
	return worst
}

// skewTx is what storing clock skews touches.
type skewTx interface {
	NodeSetClockSkew(ctx context.Context, id string, skew time.Duration, now *time.Time) error
	NodeGet(ctx context.Context, id string) (*store.Node, error)
	NodeSetState(ctx context.Context, id, state string) error
}

// storeSkews writes the pending clock skews in one transaction, in node id
// order; a node deleted meanwhile is skipped. A ready node whose skew is
// past ClockSkewLimit either way becomes clock-skewed (an event says so),
// and a clock-skewed one within it ready again (issue 36). When the
// transaction fails they stay pending for the next flush.
func (g *Gateway) storeSkews(ctx context.Context) error {
	m := g.skews.take()
	if len(m) == 0 {
		return nil
	}
	err := store.InTx(ctx, g.store, func(tx skewTx) error {
		for _, id := range slices.Sorted(maps.Keys(m)) {
			w := m[id]
			err := tx.NodeSetClockSkew(ctx, id, w.skew, &w.at)
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if err := g.judgeSkew(ctx, tx, id, w.skew); err != nil && !errors.Is(err, store.ErrNotFound) {
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

// judgeSkew moves node id between ready and clock-skewed by its skew.
func (g *Gateway) judgeSkew(ctx context.Context, tx skewTx, id string, skew time.Duration) error {
	n, err := tx.NodeGet(ctx, id)
	if err != nil {
		return err
	}
	past := skew.Abs() > g.cfg.ClockSkewLimit
	switch {
	case past && n.State == store.NodeReady:
		g.log.WarnContext(ctx, "Node clock skewed: it takes no new commands until its clock is fixed (NTP)", logkey.NodeID, id,
			attrClockSkewSec, int64(skew.Round(time.Second)/time.Second), attrClockSkewLimit, g.cfg.ClockSkewLimit)
		return tx.NodeSetState(ctx, id, store.NodeClockSkewed)
	case !past && n.State == store.NodeClockSkewed:
		g.log.InfoContext(ctx, "Node clock within the limit again: ready", logkey.NodeID, id,
			attrClockSkewSec, int64(skew.Round(time.Second)/time.Second))
		return tx.NodeSetState(ctx, id, store.NodeReady)
	}
	return nil
}
