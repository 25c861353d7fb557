package gateway

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// recvCommand reads messages until a Command or Cancel arrives.
func recvBody(t *testing.T, s *clientSession, within time.Duration) *sessionv1.GatewayMessage {
	t.Helper()
	got := make(chan *sessionv1.GatewayMessage, 1)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := s.stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			if m.GetCommand() != nil || m.GetCancel() != nil {
				got <- m
				return
			}
		}
	}()
	select {
	case m := <-got:
		return m
	case err := <-errc:
		t.Fatalf("stream ended: %v", err)
	case <-deadline(t, within):
		t.Fatalf("nothing dispatched within %v", within)
	}
	return nil
}

func sendUpdate(t *testing.T, s *clientSession, u *sessionv1.CommandUpdate) {
	t.Helper()
	if err := s.stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_CommandUpdate{CommandUpdate: u}}); err != nil {
		t.Fatal(err)
	}
}

func TestDispatchAndResults(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		wake := make(chan struct{}, 1)
		g := e.start(func(c *Config) { c.Wakeups = wake; c.DispatchInterval = time.Hour })
		defer g.stop(t)
		n := e.join(g, "gpu-01", "m-1")
		other := e.join(g, "gpu-02", "m-2")
		s := e.connect(g, n)
		cmds, err := e.st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{n.id}, Kind: "exec",
			SessionSpec: []byte(`{"exec":{"argv":["uname","-a"],"asRoot":true}}`), Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		wake <- struct{}{} // as the API does right after commit; the loop alone waits an hour here
		m := recvBody(t, s, 20*time.Second)
		t.Logf("commit to node: %v with the wake-up", time.Since(start))
		c := m.GetCommand()
		if c.GetId() != cmds[0].ID || c.GetKind() != "exec" || c.GetExec().GetArgv()[1] != "-a" || !c.GetExec().GetAsRoot() || c.GetDeadline() == nil {
			t.Fatalf("command = %v", c)
		}
		// A node cannot report on another node's command.
		so := e.connect(g, other)
		sendUpdate(t, so, &sessionv1.CommandUpdate{CommandId: c.GetId(), UpdateSeq: 1, Update: &sessionv1.CommandUpdate_Result{
			Result: &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_FAILED}}})
		sendUpdate(t, s, &sessionv1.CommandUpdate{CommandId: c.GetId(), UpdateSeq: 1, Update: &sessionv1.CommandUpdate_Accepted{Accepted: &sessionv1.Accepted{}}})
		sendUpdate(t, s, &sessionv1.CommandUpdate{CommandId: c.GetId(), UpdateSeq: 2, Update: &sessionv1.CommandUpdate_Running{Running: &sessionv1.Running{}}})
		sendUpdate(t, s, &sessionv1.CommandUpdate{CommandId: c.GetId(), UpdateSeq: 3, Update: &sessionv1.CommandUpdate_Output{Output: &sessionv1.OutputChunk{
			Stream: sessionv1.OutputStream_OUTPUT_STREAM_STDOUT, Data: []byte("Linux gpu-01\n")}}})
		sendUpdate(t, s, &sessionv1.CommandUpdate{CommandId: c.GetId(), UpdateSeq: 4, Update: &sessionv1.CommandUpdate_Result{
			Result: &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED}}})
		// A duplicate result (redelivery) changes nothing.
		sendUpdate(t, s, &sessionv1.CommandUpdate{CommandId: c.GetId(), UpdateSeq: 4, Update: &sessionv1.CommandUpdate_Result{
			Result: &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_FAILED, ExitCode: 9}}})
		var got *store.Command
		e.eventually(t, 30*time.Second, "the result to be written", func() bool {
			got, _ = e.st.CommandGet(ctx, c.GetId())
			return got != nil && store.IsTerminal(got.State)
		})
		if got.State != store.CommandSucceeded || *got.ExitCode != 0 || got.GatewayID != g.ID() {
			t.Fatalf("command = %+v", got)
		}
		page, _ := e.st.CommandOutputPage(ctx, &store.CommandOutputPageParams{CommandID: c.GetId()})
		var out []*store.CommandOutputChunk
		if page != nil {
			out = page.Chunks
		}
		if len(out) != 1 || string(out[0].Data) != "Linux gpu-01\n" {
			t.Fatalf("output = %+v", out)
		}
	})
}

func TestRedeliveryAndCancel(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(func(c *Config) { c.DispatchInterval = 50 * time.Millisecond })
		defer g.stop(t)
		n := e.join(g, "gpu-01", "m-1")
		s := e.connect(g, n)
		cmds, err := e.st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{n.id}, Kind: "exec",
			SessionSpec: []byte(`{"exec":{"argv":["sleep","600"]}}`), Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		first := recvBody(t, s, 20*time.Second).GetCommand()
		sendUpdate(t, s, &sessionv1.CommandUpdate{CommandId: first.GetId(), UpdateSeq: 1, Update: &sessionv1.CommandUpdate_Running{Running: &sessionv1.Running{}}})
		e.eventually(t, 30*time.Second, "running", func() bool {
			c, _ := e.st.CommandGet(ctx, first.GetId())
			return c.State == store.CommandRunning
		})
		// The node reconnects (a new session): the command is sent again,
		// for the node to recognise by its id.
		s.cancel()
		s2 := e.connect(g, n)
		again := recvBody(t, s2, 5*time.Second).GetCommand()
		if again.GetId() != cmds[0].ID {
			t.Fatalf("redelivered %v", again)
		}
		if _, err := e.st.CommandRequestCancel(ctx, cmds[0].ID); err != nil {
			t.Fatal(err)
		}
		cancel := recvBody(t, s2, 5*time.Second).GetCancel()
		if cancel.GetCommandId() != cmds[0].ID {
			t.Fatalf("cancel = %v", cancel)
		}
	})
}

func TestOwnBMCOffMarksNodePoweredOff(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(func(c *Config) { c.DispatchInterval = 50 * time.Millisecond })
		defer g.stop(t)
		n := e.join(g, "gpu-01", "m-1")
		s := e.connect(g, n)
		finish := func(detail string) {
			t.Helper()
			cmds, err := e.st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{n.id}, Kind: "power.off", SessionSpec: []byte(`{"power":{"action":"off"}}`), Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			id := recvBody(t, s, 20*time.Second).GetCommand().GetId()
			sendUpdate(t, s, &sessionv1.CommandUpdate{CommandId: id, UpdateSeq: 1, Update: &sessionv1.CommandUpdate_Result{
				Result: &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED, DetailJson: []byte(detail)}}})
			e.eventually(t, 30*time.Second, "the result", func() bool {
				c, _ := e.st.CommandGet(ctx, cmds[0].ID)
				return c.State == store.CommandSucceeded
			})
		}
		// A site agent's named BMC powering another machine off changes
		// nothing about the agent itself.
		finish(`{"name":"rack-7","action":"off","power":"off"}`)
		if got, _ := e.st.NodeGet(ctx, n.id); got.State != store.NodeReady {
			t.Fatalf("state after a named BMC's off = %s", got.State)
		}
		finish(`{"action":"off","power":"off"}`)
		if got, _ := e.st.NodeGet(ctx, n.id); got.State != store.NodePoweredOff {
			t.Fatalf("state after its own BMC's off = %s, want powered-off", got.State)
		}
	})
}

// outageStore fails every transaction with a connection error while down,
// as a store does while its database fails over.
type outageStore struct {
	store.Store
	down    atomic.Bool
	refused atomic.Int64 // transactions refused while down
}

var errConnClosed = errors.New("begin: conn closed")

func (o *outageStore) Tx(ctx context.Context, fn func(store.Store) error) error {
	if o.down.Load() {
		o.refused.Add(1)
		return errConnClosed
	}
	return o.Store.Tx(ctx, fn)
}

func (o *outageStore) FencedTx(ctx context.Context, f store.Fence, fn func(store.Store) error) error {
	if o.down.Load() {
		o.refused.Add(1)
		return errConnClosed
	}
	return o.Store.FencedTx(ctx, f, fn)
}

// TestResultsWrittenAfterStoreOutage checks that a command's result that
// arrives while the store fails (a database failover) is written once the
// store answers again, on the same session: the gateway retries the batch
// rather than leaving the command to expire.
func TestResultsWrittenAfterStoreOutage(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		st := &outageStore{Store: b.open(t)}
		e := newEnv(t, st)
		wake := make(chan struct{}, 1)
		g := e.start(func(c *Config) { c.Wakeups = wake; c.DispatchInterval = time.Hour })
		defer g.stop(t)
		n := e.join(g, "gpu-01", "m-1")
		s := e.connect(g, n)
		cmds, err := e.st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{n.id}, Kind: "exec",
			SessionSpec: []byte(`{"exec":{"argv":["true"]}}`), Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		wake <- struct{}{}
		id := recvBody(t, s, 20*time.Second).GetCommand().GetId()
		if id != cmds[0].ID {
			t.Fatalf("dispatched %q, want %q", id, cmds[0].ID)
		}
		st.down.Store(true)
		sendUpdate(t, s, &sessionv1.CommandUpdate{CommandId: id, UpdateSeq: 1, Update: &sessionv1.CommandUpdate_Result{
			Result: &sessionv1.CommandResult{State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED}}})
		e.eventually(t, 30*time.Second, "the result's write to be refused twice", func() bool { return st.refused.Load() >= 2 })
		st.down.Store(false)
		var got *store.Command
		e.eventually(t, 30*time.Second, "the result to be written after the outage", func() bool {
			got, _ = st.CommandGet(ctx, id)
			return got != nil && got.State == store.CommandSucceeded
		})
	})
}
