package executor_test

import (
	"context"
	"testing"

	"github.com/better-compute/better-compute/bcd/executor"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// upgrader answers "upgrade" with a result, or hands it over (nil) for
// version "restart".
type upgrader struct{}

func (upgrader) Upgrade(_ context.Context, cmd *sessionv1.Command) *sessionv1.CommandResult {
	if cmd.GetUpgrade().GetVersion() == "restart" {
		return nil
	}
	return &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED, DetailJson: []byte(`{"from":"a","to":"b"}`)}
}

func TestUpgradeKind(t *testing.T) {
	t.Parallel()
	upgrade := func(id, version string) *sessionv1.Command {
		return &sessionv1.Command{Id: id, Kind: sessionv1.KindUpgrade, Spec: &sessionv1.Command_Upgrade{Upgrade: &sessionv1.UpgradeSpec{Version: version}}}
	}
	// Without an Upgrader the kind fails.
	r := newRecorder()
	executor.New(executor.Config{Commands: asSelf{}}).HandleCommand(context.Background(), upgrade("c0", "b"), r.send)
	if res := wait(t, r); res.GetState() != sessionv1.CommandState_COMMAND_STATE_FAILED {
		t.Fatalf("without an upgrader: %v", res)
	}

	e := executor.New(executor.Config{Commands: asSelf{}, Upgrader: upgrader{}})
	r = newRecorder()
	e.HandleCommand(context.Background(), upgrade("c1", "b"), r.send)
	if res := wait(t, r); res.GetState() != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || string(res.GetDetailJson()) != `{"from":"a","to":"b"}` || res.GetCommandId() != "c1" {
		t.Fatalf("upgrade: %v", res)
	}
	// A handed-over upgrade sends no result, keeps none for the next Hello,
	// and is not running any more.
	r = newRecorder()
	e.HandleCommand(context.Background(), upgrade("c2", "restart"), r.send)
	e.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range r.updates {
		if u.GetResult() != nil {
			t.Fatalf("a handed-over upgrade sent %v", u)
		}
	}
	if p := e.PendingResults(); len(p) != 0 || len(e.Running()) != 0 {
		t.Fatalf("pending %v, running %v", p, e.Running())
	}
}
