package executor

import (
	"context"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Upgrader runs "upgrade" commands (*upgrade.Upgrader). Upgrade returns the
// command's result, or nil when bcd restarts to finish the upgrade: the
// executor then sends no result, and the restarted bcd answers the
// command's redelivery.
type Upgrader interface {
	Upgrade(ctx context.Context, cmd *sessionv1.Command) *sessionv1.CommandResult
}

func (e *Executor) upgrade(ctx context.Context, cmd *sessionv1.Command) *sessionv1.CommandResult {
	if e.cfg.Upgrader == nil {
		return failed("this bcd does not upgrade itself")
	}
	return e.cfg.Upgrader.Upgrade(ctx, cmd)
}

// Rollbacker runs "rollback" commands (*upgrade.Upgrader): it restores the
// release bcd kept beside the current one. Like Upgrade, Rollback returns
// nil when bcd restarts to finish it (the restarted bcd answers the
// redelivery). The executor runs the kind when its Upgrader is one.
type Rollbacker interface {
	Rollback(ctx context.Context, cmd *sessionv1.Command) *sessionv1.CommandResult
}

func (e *Executor) rollback(ctx context.Context, cmd *sessionv1.Command) *sessionv1.CommandResult {
	r, ok := e.cfg.Upgrader.(Rollbacker)
	if !ok {
		return failed("this bcd does not roll itself back")
	}
	return r.Rollback(ctx, cmd)
}
