package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/bmc"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// BMC carries out BMC calls: the agent's, which adds the node's sealed
// credentials and sends the call to the root helper (or runs it in bcd when
// bcd runs as root). The Result is the command's detail_json, also on
// failure; errors name the BMC and hold no password.
type BMC interface {
	Do(ctx context.Context, req *bmc.Request) (*bmc.Result, error)
}

// bmc runs a power.* or boot.set command.
func (e *Executor) bmc(ctx context.Context, cmd *sessionv1.Command, u *updater) *sessionv1.CommandResult {
	if e.cfg.BMC == nil {
		return failed("BMC commands are not available on this node")
	}
	req, err := bmcRequest(cmd)
	if err != nil {
		return failed(err.Error())
	}
	_ = u.send(&sessionv1.CommandUpdate{Update: &sessionv1.CommandUpdate_Running{Running: &sessionv1.Running{StartedAt: timestamppb.Now()}}})
	res, err := e.cfg.BMC.Do(ctx, req)
	r := &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED}
	if res != nil {
		r.DetailJson, _ = json.Marshal(res)
	}
	switch {
	case err == nil:
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		r.State, r.ExitCode, r.Error = sessionv1.CommandState_COMMAND_STATE_EXPIRED, -1, "deadline passed during the BMC call: "+err.Error()
	case ctx.Err() != nil:
		r.State, r.ExitCode, r.Error = sessionv1.CommandState_COMMAND_STATE_CANCELLED, -1, "cancelled during the BMC call: "+err.Error()
	default:
		r.State, r.ExitCode, r.Error = sessionv1.CommandState_COMMAND_STATE_FAILED, -1, err.Error()
	}
	return r
}

// bmcRequest turns a command into a BMC call.
func bmcRequest(cmd *sessionv1.Command) (*bmc.Request, error) {
	kind := cmd.GetKind()
	if kind == sessionv1.KindBootSet {
		spec := cmd.GetBoot()
		if spec == nil {
			return nil, errors.New("boot.set without a boot spec")
		}
		req := &bmc.Request{Action: bmc.ActionBoot, BMC: spec.GetBmc(), Device: spec.GetDevice(), Persistent: spec.GetPersistent()}
		return req, bmc.CheckDevice(req.Device)
	}
	action, ok := sessionv1.PowerAction(kind)
	if !ok {
		return nil, fmt.Errorf("unsupported command kind %q", kind)
	}
	spec := cmd.GetPower()
	if a := spec.GetAction(); a != "" && a != action {
		return nil, fmt.Errorf("command kind %s disagrees with its action %q", kind, a)
	}
	if err := bmc.CheckAction(action); err != nil || action == bmc.ActionBoot {
		return nil, fmt.Errorf("unsupported command kind %q", kind)
	}
	return &bmc.Request{Action: action, BMC: spec.GetBmc(), NodeID: spec.GetNodeId()}, nil
}
