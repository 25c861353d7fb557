package executor_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/executor"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// recorder collects the updates of one session.
type recorder struct {
	mu      sync.Mutex
	updates []*sessionv1.CommandUpdate
	refused []*sessionv1.CommandUpdate // sent once closed
	closed  bool
	result  chan *sessionv1.CommandResult
	changed chan struct{} // closed, and replaced, at every send
}

func newRecorder() *recorder {
	return &recorder{result: make(chan *sessionv1.CommandResult, 16), changed: make(chan struct{})}
}

func (r *recorder) send(u *sessionv1.CommandUpdate) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	close(r.changed)
	r.changed = make(chan struct{})
	if r.closed {
		r.refused = append(r.refused, u)
		return errors.New("session ended")
	}
	r.updates = append(r.updates, u)
	if res := u.GetResult(); res != nil {
		r.result <- res
	}
	return nil
}

func (r *recorder) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return outputOf(r.updates)
}

func outputOf(updates []*sessionv1.CommandUpdate) string {
	var b strings.Builder
	for _, u := range updates {
		b.Write(u.GetOutput().GetData())
	}
	return b.String()
}

// await waits until cond, given the updates sent and those refused, holds;
// it is checked at every send, so the test waits on the executor, not on
// time.
func (r *recorder) await(t *testing.T, what string, cond func(sent, refused []*sessionv1.CommandUpdate) bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		r.mu.Lock()
		ok, changed := cond(r.updates, r.refused), r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// started reports whether updates hold the command's Running update.
func started(sent, _ []*sessionv1.CommandUpdate) bool {
	for _, u := range sent {
		if u.GetRunning() != nil {
			return true
		}
	}
	return false
}

func wait(t *testing.T, r *recorder) *sessionv1.CommandResult {
	t.Helper()
	select {
	case res := <-r.result:
		return res
	case <-time.After(10 * time.Second):
		t.Fatal("no result")
		return nil
	}
}

func execCmd(id string, argv ...string) *sessionv1.Command {
	return &sessionv1.Command{Id: id, Kind: "exec", Spec: &sessionv1.Command_Exec{Exec: &sessionv1.ExecSpec{Argv: argv}}}
}

func TestRunsOnceAndResendsResult(t *testing.T) {
	e := executor.New(executor.Config{Commands: asSelf{}})
	r := newRecorder()
	e.HandleCommand(context.Background(), execCmd("cmd_1", "sh", "-c", "echo hi; echo x >> "+t.TempDir()+"/runs"), r.send)
	res := wait(t, r)
	if res.State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED || r.output() != "hi\n" {
		t.Fatalf("result %v output %q", res, r.output())
	}
	// A redelivery (gateway restart) gets the same result, without a second run.
	r2 := newRecorder()
	e.HandleCommand(context.Background(), execCmd("cmd_1", "sh", "-c", "echo again"), r2.send)
	again := wait(t, r2)
	if again.CommandId != "cmd_1" || r2.output() != "" {
		t.Fatalf("redelivery ran again: %v %q", again, r2.output())
	}
	seqs := map[uint64]bool{}
	for _, u := range r.updates {
		if seqs[u.UpdateSeq] {
			t.Fatalf("update seq %d repeated", u.UpdateSeq)
		}
		seqs[u.UpdateSeq] = true
	}
}

func TestCancel(t *testing.T) {
	e := executor.New(executor.Config{Commands: asSelf{}})
	r := newRecorder()
	e.HandleCommand(context.Background(), execCmd("cmd_sleep", "sleep", "600"), r.send)
	r.await(t, "the command to start", started)
	start := time.Now()
	e.HandleCancel(context.Background(), &sessionv1.Cancel{CommandId: "cmd_sleep"})
	res := wait(t, r)
	// Well before the command's own end; 5 s leaves room for a busy machine.
	if res.State != sessionv1.CommandState_COMMAND_STATE_CANCELLED || time.Since(start) > 5*time.Second {
		t.Fatalf("cancel: %v after %v", res, time.Since(start))
	}
}

func TestDeadlineExpires(t *testing.T) {
	e := executor.New(executor.Config{Commands: asSelf{}})
	r := newRecorder()
	c := execCmd("cmd_late", "sleep", "600")
	c.Deadline = timestamppb.New(time.Now().Add(200 * time.Millisecond))
	e.HandleCommand(context.Background(), c, r.send)
	if res := wait(t, r); res.State != sessionv1.CommandState_COMMAND_STATE_EXPIRED {
		t.Fatalf("deadline: %v", res)
	}
}

// TestDeadlineByGatewayTime: a deadline the gateway set is judged by the
// gateways' time (Config.Now), not this machine's clock: on a machine 48 h
// ahead a command with an hour left runs, and one with 200 ms left expires
// after about 200 ms (issue 36).
func TestDeadlineByGatewayTime(t *testing.T) {
	gw := func() time.Time { return time.Now().Add(-48 * time.Hour) } // this machine is 48 h ahead
	e := executor.New(executor.Config{Commands: asSelf{}, Now: gw})
	r := newRecorder()
	c := execCmd("cmd_ahead", "echo", "ran")
	c.Deadline = timestamppb.New(gw().Add(time.Hour))
	e.HandleCommand(context.Background(), c, r.send)
	if res := wait(t, r); res.State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("an hour left by the gateway's time on a machine 48 h ahead: %v", res)
	}
	r = newRecorder()
	c = execCmd("cmd_ahead_late", "sleep", "600")
	c.Deadline = timestamppb.New(gw().Add(200 * time.Millisecond))
	start := time.Now()
	e.HandleCommand(context.Background(), c, r.send)
	if res := wait(t, r); res.State != sessionv1.CommandState_COMMAND_STATE_EXPIRED || time.Since(start) < 150*time.Millisecond {
		t.Fatalf("200 ms left by the gateway's time: %v after %v", res, time.Since(start))
	}
}

func TestRootWithoutHelperFailsClearly(t *testing.T) {
	e := executor.New(executor.Config{Commands: asSelf{}, IsRoot: func() bool { return false }})
	r := newRecorder()
	c := execCmd("cmd_root", "id", "-u")
	c.GetExec().AsRoot = true
	e.HandleCommand(context.Background(), c, r.send)
	res := wait(t, r)
	if res.State != sessionv1.CommandState_COMMAND_STATE_FAILED || !strings.Contains(res.Error, "root helper") {
		t.Fatalf("root exec without helper: %v", res)
	}
}

func TestResultKeptWhenSessionEnded(t *testing.T) {
	e := executor.New(executor.Config{Commands: asSelf{}})
	r := newRecorder()
	r.closed = true
	e.HandleCommand(context.Background(), execCmd("cmd_off", "true"), r.send)
	e.Wait()
	pending := e.PendingResults()
	if len(pending) != 1 || pending[0].CommandId != "cmd_off" || pending[0].State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("pending = %v", pending)
	}
	if len(e.PendingResults()) != 0 {
		t.Fatal("pending results returned twice")
	}
}

// Stopping the agent (cancelling the context HandleCommand got) cancels
// running commands, and Wait returns once their process groups are gone.
func TestAgentStopCancelsCommands(t *testing.T) {
	e := executor.New(executor.Config{Commands: asSelf{}})
	r := newRecorder()
	ctx, stop := context.WithCancel(context.Background())
	e.HandleCommand(ctx, execCmd("cmd_stop", "sleep", "600"), r.send)
	if got := e.Running(); len(got) != 1 {
		t.Fatalf("Running = %q, want cmd_stop", got)
	}
	start := time.Now()
	stop()
	e.Wait()
	if res := wait(t, r); res.State != sessionv1.CommandState_COMMAND_STATE_CANCELLED || time.Since(start) > 5*time.Second {
		t.Fatalf("after the agent stopped: %v after %v", res, time.Since(start))
	}
}

func TestRedeliveryWhileRunningMovesUpdatesToTheNewSession(t *testing.T) {
	e := executor.New(executor.Config{Commands: asSelf{}})
	old := newRecorder()
	c := execCmd("cmd_move", "sleep", "0.3")
	e.HandleCommand(context.Background(), c, old.send)
	old.await(t, "the command to start", started)
	old.mu.Lock()
	old.closed = true // the node reconnected; that session is gone
	old.mu.Unlock()
	cur := newRecorder()
	e.HandleCommand(context.Background(), c, cur.send)
	if res := wait(t, cur); res.State != sessionv1.CommandState_COMMAND_STATE_SUCCEEDED {
		t.Fatalf("result on the new session = %v", res)
	}
	if p := e.PendingResults(); len(p) != 0 {
		t.Fatalf("result kept pending although a session was up: %v", p)
	}
}

func TestOutputWithoutSessionIsSentLater(t *testing.T) {
	e := executor.New(executor.Config{Commands: asSelf{}})
	old := newRecorder()
	c := execCmd("cmd_gap", "sh", "-c", "echo before; sleep 0.3; echo during; sleep 0.5; echo after")
	e.HandleCommand(context.Background(), c, old.send)
	old.await(t, `"before"`, func(sent, _ []*sessionv1.CommandUpdate) bool { return strings.Contains(outputOf(sent), "before") })
	old.mu.Lock()
	old.closed = true // the session ends while "during" is printed
	old.mu.Unlock()
	old.await(t, `"during" offered to the ended session`, func(_, refused []*sessionv1.CommandUpdate) bool {
		return strings.Contains(outputOf(refused), "during")
	})
	cur := newRecorder()
	e.HandleCommand(context.Background(), c, cur.send) // redelivered on the next session
	wait(t, cur)
	if got := old.output() + cur.output(); got != "before\nduring\nafter\n" {
		t.Fatalf("output across sessions = %q, want every line once", got)
	}
}
