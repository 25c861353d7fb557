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
