package gateway

// The gateway's side of the internal control API (package control): the
// api wakes the gateway holding a node's session right after it commits
// the node's commands, and pushes revocations so that they need not wait
// for the next poll of the feed.

// Wake-up sources reported to Metrics.Wakeup.
const (
	// WakeInternal is a Wake call of the internal control API naming a
	// node with a session here.
	WakeInternal = "internal"
	// WakeBus is a wake-up from the bus: in-process, or PostgreSQL NOTIFY
	// (Config.Wakeups).
	WakeBus = "bus"
)

// WakeNodes runs a dispatch round now when any of nodeIDs holds a session
// on this gateway, and returns how many do (control.Gateway).
func (g *Gateway) WakeNodes(nodeIDs []string) int {
	held := 0
	for _, id := range nodeIDs {
		if g.sessions.get(id) != nil {
			held++
		}
	}
	if held > 0 {
		g.cfg.Metrics.Wakeup(g.cfg.ID, WakeInternal)
		g.Wake()
	}
	return held
}

// RevokeNow reads the revocation feed at once instead of at the next poll,
// and reports whether nodeID (empty: none) holds a session here
// (control.Gateway).
func (g *Gateway) RevokeNow(nodeID string) bool {
	select {
	case g.revokeNow <- struct{}{}:
	default: // a read is already pending
	}
	return nodeID != "" && g.sessions.get(nodeID) != nil
}
