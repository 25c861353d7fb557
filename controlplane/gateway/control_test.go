package gateway

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// wakeCounter counts Metrics.Wakeup by source.
type wakeCounter struct {
	noMetrics
	mu sync.Mutex
	n  map[string]int
}

func (w *wakeCounter) Wakeup(_, source string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n[source]++
}

func (w *wakeCounter) get(source string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n[source]
}

// TestWakeNodes: the internal control API's Wake dispatches at once for a
// node with a session here (the loop alone would wait an hour), is counted
// as an internal wake-up, and does nothing for a node held elsewhere; the
// gateway advertises its internal address in its row.
func TestWakeNodes(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, backends[0].open(t))
	wc := &wakeCounter{n: map[string]int{}}
	g := e.start(func(c *Config) {
		c.DispatchInterval = time.Hour
		c.Metrics = wc
		c.InternalAddress = "127.0.0.1:8444"
	})
	n := e.join(g, "gpu-01", "m-1")
	s := e.connect(g, n)
	if held := g.WakeNodes([]string{"node-elsewhere"}); held != 0 || wc.get(WakeInternal) != 0 {
		t.Fatalf("WakeNodes(elsewhere) = %d, %d internal wake-ups; want 0, 0", held, wc.get(WakeInternal))
	}
	cmds, err := e.st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{n.id}, Kind: "exec",
		SessionSpec: []byte(`{"exec":{"argv":["true"]}}`), Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if held := g.WakeNodes([]string{n.id, "node-elsewhere"}); held != 1 {
		t.Fatalf("WakeNodes = %d, want 1", held)
	}
	if m := recvBody(t, s, 20*time.Second); m.GetCommand().GetId() != cmds[0].ID {
		t.Fatalf("dispatched %v, want %s", m, cmds[0].ID)
	}
	if got := wc.get(WakeInternal); got != 1 {
		t.Fatalf("internal wake-ups = %d, want 1", got)
	}
	row, err := e.st.GatewayGet(ctx, g.ID())
	if err != nil || row.InternalAddress != "127.0.0.1:8444" {
		t.Fatalf("gateway row = %+v, %v; want internal address 127.0.0.1:8444", row, err)
	}
	if g.RevokeNow(n.id) != true || g.RevokeNow("node-elsewhere") != false {
		t.Fatal("RevokeNow: want true for the node held here, false for another")
	}
}
