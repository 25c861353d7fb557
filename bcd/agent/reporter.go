package agent

import (
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// reporter is the agent's session.Reporter: the digest of its last scan,
// the host's readings and running commands, the results the executor could
// not deliver, and the Upgrader's local rollback.
type reporter struct{ a *Agent }

// localRollbacker is an Upgrader that reports the rollback bcd made by
// itself after a crash loop (*upgrade.Upgrader).
type localRollbacker interface {
	LocalRollback() *sessionv1.LocalRollback
}

func (r reporter) InventoryDigest() string                    { return r.a.currentDigest() }
func (r reporter) FillHeartbeat(hb *sessionv1.Heartbeat)      { r.a.heartbeat(hb) }
func (r reporter) PendingResults() []*sessionv1.CommandResult { return r.a.pendingResults() }

func (r reporter) LocalRollback() *sessionv1.LocalRollback {
	if lr, ok := r.a.cfg.Upgrader.(localRollbacker); ok {
		return lr.LocalRollback()
	}
	return nil
}
