package executor_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/better-compute/better-compute/bcd/executor"
	"github.com/better-compute/better-compute/bcd/process"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// asSelf runs the commands of the executor's tests as the test's own user:
// these tests are about the executor's rules, and package bcd/cmduser's
// tests and the e2e tests run them as the command user.
type asSelf struct{}

func (asSelf) Exec(ctx context.Context, spec process.Spec, out func(int, []byte)) process.Result {
	return process.Run(ctx, spec, out)
}

// rootRecorder stands in for the root helper's client: it records the
// command ids it was asked to run root programs for.
type rootRecorder struct {
	mu  sync.Mutex
	ids []string
}

func (r *rootRecorder) ExecRoot(ctx context.Context, id string, spec process.Spec, out func(int, []byte)) process.Result {
	r.mu.Lock()
	r.ids = append(r.ids, id)
	r.mu.Unlock()
	return process.Run(ctx, spec, out)
}

// TestExecWithoutCommandUserFails: with no command user an exec without
// as_root is refused, never run as bcd's own uid.
func TestExecWithoutCommandUserFails(t *testing.T) {
	e := executor.New(executor.Config{})
	r := newRecorder()
	e.HandleCommand(context.Background(), execCmd("cmd_nouser", "true"), r.send)
	res := wait(t, r)
	if res.State != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.Error, "no command user") {
		t.Fatalf("exec without a command user: %v", res)
	}
}

// TestPlainAndRootExecGoTheirWays: a plain exec goes to Commands, an
// as_root one to Root with its command id (the grant is bound to it).
func TestPlainAndRootExecGoTheirWays(t *testing.T) {
	var plain []string
	var mu sync.Mutex
	root := &rootRecorder{}
	e := executor.New(executor.Config{Commands: runnerFunc(func(spec process.Spec) {
		mu.Lock()
		plain = append(plain, spec.Argv[0])
		mu.Unlock()
	}), Root: root, IsRoot: func() bool { return true }})
	r := newRecorder()
	e.HandleCommand(context.Background(), execCmd("cmd_plain", "true"), r.send)
	if res := wait(t, r); res.State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("plain: %v", res)
	}
	c := execCmd("cmd_asroot", "true")
	c.GetExec().AsRoot = true
	r = newRecorder()
	e.HandleCommand(context.Background(), c, r.send)
	if res := wait(t, r); res.State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("as root: %v", res)
	}
	if len(plain) != 1 || plain[0] != "true" || len(root.ids) != 1 || root.ids[0] != "cmd_asroot" {
		t.Fatalf("plain runs %q, root runs for %q", plain, root.ids)
	}
}

// runnerFunc is a Runner that records the spec and runs it as the test's
// user.
type runnerFunc func(process.Spec)

func (f runnerFunc) Exec(ctx context.Context, spec process.Spec, out func(int, []byte)) process.Result {
	f(spec)
	return process.Run(ctx, spec, out)
}
