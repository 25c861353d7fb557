package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/bmc"
	"github.com/better-compute/better-compute/bcd/executor"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// fakeBMC answers BMC calls.
type fakeBMC struct {
	got []*bmc.Request
	do  func(ctx context.Context, req *bmc.Request) (*bmc.Result, error)
}

func (f *fakeBMC) Do(ctx context.Context, req *bmc.Request) (*bmc.Result, error) {
	f.got = append(f.got, req)
	return f.do(ctx, req)
}

func TestBMCCommands(t *testing.T) {
	f := &fakeBMC{do: func(_ context.Context, req *bmc.Request) (*bmc.Result, error) {
		return &bmc.Result{BMC: "10.0.0.1", Name: req.BMC, Action: req.Action, Power: bmc.PowerOn, Provider: "ipmitool"}, nil
	}}
	e := executor.New(executor.Config{Commands: asSelf{}, BMC: f})
	ctx := context.Background()
	run := func(id string, cmd *sessionv1.Command) *sessionv1.CommandResult {
		t.Helper()
		r := newRecorder()
		cmd.Id = id
		e.HandleCommand(ctx, cmd, r.send)
		return wait(t, r)
	}

	res := run("c1", &sessionv1.Command{Kind: "power.status"})
	var detail bmc.Result
	if err := json.Unmarshal(res.GetDetailJson(), &detail); err != nil || res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED ||
		detail.Power != "on" || detail.BMC != "10.0.0.1" {
		t.Fatalf("power.status: %v (%v)", res, err)
	}
	run("c2", &sessionv1.Command{Kind: "power.soft-off", Spec: &sessionv1.Command_Power{Power: &sessionv1.PowerSpec{Bmc: "rack1", Action: "soft-off"}}})
	run("c3", &sessionv1.Command{Kind: "boot.set", Spec: &sessionv1.Command_Boot{Boot: &sessionv1.BootSpec{Bmc: "rack2", Device: "pxe", Persistent: true}}})
	if len(f.got) != 3 || f.got[1].Action != "soft-off" || f.got[1].BMC != "rack1" ||
		f.got[2].Action != "boot" || f.got[2].Device != "pxe" || !f.got[2].Persistent || f.got[2].BMC != "rack2" {
		t.Fatalf("requests: %+v %+v %+v", f.got[0], f.got[1], f.got[2])
	}

	// Refused before any call: kind and action disagree, no boot spec, a
	// bad device.
	for id, cmd := range map[string]*sessionv1.Command{
		"r1": {Kind: "power.on", Spec: &sessionv1.Command_Power{Power: &sessionv1.PowerSpec{Action: "off"}}},
		"r2": {Kind: "boot.set"},
		"r3": {Kind: "boot.set", Spec: &sessionv1.Command_Boot{Boot: &sessionv1.BootSpec{Device: "floppy"}}},
		"r4": {Kind: "power.explode"},
	} {
		if res := run(id, cmd); res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED || res.GetError() == "" {
			t.Errorf("%s %v: %v, want FAILED", id, cmd.GetKind(), res)
		}
	}
	if len(f.got) != 3 {
		t.Errorf("refused commands reached the BMC: %d calls", len(f.got))
	}

	// A failure keeps the result's detail and the error's text.
	f.do = func(_ context.Context, req *bmc.Request) (*bmc.Result, error) {
		return &bmc.Result{BMC: "10.0.0.1", Action: req.Action, Reason: "AUTH_FAILED"}, errors.New("bmc 10.0.0.1: wrong password")
	}
	res = run("c4", &sessionv1.Command{Kind: "power.off"})
	if res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED || res.GetError() != "bmc 10.0.0.1: wrong password" ||
		!strings.Contains(string(res.GetDetailJson()), `"reason":"AUTH_FAILED"`) {
		t.Fatalf("failed call: %v", res)
	}

	// The deadline ends a hung call: EXPIRED.
	f.do = func(ctx context.Context, req *bmc.Request) (*bmc.Result, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	res = run("c5", &sessionv1.Command{Kind: "power.cycle", Deadline: timestamppb.New(time.Now().Add(100 * time.Millisecond))})
	if res.GetState() != sessionv1.CommandState_COMMAND_STATE_EXPIRED {
		t.Fatalf("hung call past its deadline: %v", res)
	}
}

func TestBMCCommandsWithoutBMC(t *testing.T) {
	e := executor.New(executor.Config{Commands: asSelf{}})
	r := newRecorder()
	e.HandleCommand(context.Background(), &sessionv1.Command{Id: "x", Kind: "power.status"}, r.send)
	if res := wait(t, r); res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.GetError(), "not available") {
		t.Fatalf("without a BMC: %v", res)
	}
}
