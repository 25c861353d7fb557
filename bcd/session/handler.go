package session

import (
	"context"

	"google.golang.org/protobuf/types/known/timestamppb"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// refuseCommands is the Handler of a Client configured without one: every
// Command fails at once, as session.proto asks for kinds a node cannot run.
type refuseCommands struct{}

func (refuseCommands) HandleCommand(_ context.Context, cmd *sessionv1.Command, send func(*sessionv1.CommandUpdate) error) {
	code := int32(0)
	if cmd.GetKind() == sessionv1.KindExec {
		code = -1 // never started
	}
	_ = send(&sessionv1.CommandUpdate{
		CommandId: cmd.GetId(),
		UpdateSeq: 1,
		Update: &sessionv1.CommandUpdate_Result{Result: &sessionv1.CommandResult{
			CommandId:  cmd.GetId(),
			State:      sessionv1.CommandState_COMMAND_STATE_FAILED,
			ExitCode:   code,
			Error:      "this node runs no commands",
			FinishedAt: timestamppb.Now(),
		}},
	})
}

func (refuseCommands) HandleCancel(context.Context, *sessionv1.Cancel) {}
