package sinks_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/reconcilers/sinks"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
)

func openStore(t *testing.T) store.Store {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st
}

func run(t *testing.T, st store.Store, sink sinks.Sink, cfg sinks.Config) {
	t.Helper()
	cfg.Holder = "w1"
	cfg.Poll, cfg.RetryBase, cfg.RetryMax = 20*time.Millisecond, 10*time.Millisecond, 40*time.Millisecond
	d, err := sinks.NewDispatcher(cfg, sink, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// insert writes an event of typ about subject, as the store does.
func insert(t *testing.T, st store.Store, typ, subject string) string {
	t.Helper()
	env, err := events.New(typ, subject, map[string]string{"subject": subject}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.OutboxInsert(context.Background(), typ, subject, b); err != nil {
		t.Fatal(err)
	}
	return env.ID
}

// receiver is a webhook endpoint that checks signatures and records the
// events it accepted, in order; refuse decides which batches it answers 503.
type receiver struct {
	t      *testing.T
	secret []byte
	mu     sync.Mutex
	refuse func(batch []events.Envelope) bool
	got    []events.Envelope
	posts  int
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	ts, _ := strconv.ParseInt(req.Header.Get(sinks.HeaderTimestamp), 10, 64)
	if !sinks.Verify(r.secret, ts, body, req.Header.Get(sinks.HeaderSignature)) || req.Header.Get("Content-Type") != events.BatchContentType {
		r.t.Errorf("bad request: signature %q, content type %q", req.Header.Get(sinks.HeaderSignature), req.Header.Get("Content-Type"))
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		r.t.Errorf("body %s: %v", body, err)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	var batch []events.Envelope
	for _, m := range raw {
		e, err := events.Parse(m)
		if err != nil {
			r.t.Errorf("event %s: %v", m, err)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		batch = append(batch, *e)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.posts++
	if r.refuse != nil && r.refuse(batch) {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	r.got = append(r.got, batch...)
}

func (r *receiver) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.got {
		out = append(out, e.ID)
	}
	return out
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
	}
}

func TestWebhookAtLeastOnceWithSignatures(t *testing.T) {
	st := openStore(t)
	failing := 3
	recv := &receiver{t: t, secret: []byte("webhook-secret"), refuse: func([]events.Envelope) bool { failing--; return failing >= 0 }}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	var want []string
	for i := range 5 {
		want = append(want, insert(t, st, events.NodeJoined, "node_"+strconv.Itoa(i)))
	}
	// A row an older build wrote, not an envelope: delivered wrapped.
	legacy, err := st.OutboxInsert(context.Background(), "command.created", "batch_1", []byte(`{"batch_id":"batch_1"}`))
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, "outbox-"+strconv.FormatInt(legacy, 10))
	run(t, st, &sinks.Webhook{SinkName: "hook", URL: srv.URL, Secret: recv.secret}, sinks.Config{})
	eventually(t, "not every event delivered", func() bool { return len(recv.ids()) >= len(want) })
	if got := recv.ids(); !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v in order", got, want)
	}
	if l := recv.got[5]; l.Type != "com.better-compute.command.created" || l.Subject != "batch_1" || string(l.Data) != `{"batch_id":"batch_1"}` {
		t.Fatalf("legacy row delivered as %+v", l)
	}
	eventually(t, "cursor did not reach the last entry", func() bool {
		c, _ := st.OutboxCursor(context.Background(), "hook")
		return c == legacy
	})
}

func TestTypePrefixes(t *testing.T) {
	st := openStore(t)
	recv := &receiver{t: t, secret: []byte("s")}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	var want []string
	for i := range 3 {
		want = append(want, insert(t, st, events.NodeReady, "node_"+strconv.Itoa(i)))
		insert(t, st, events.CommandCreated, "cmd_"+strconv.Itoa(i))
		want = append(want, insert(t, st, events.GPUHealthChanged, "GPU-"+strconv.Itoa(i)))
	}
	insert(t, st, events.TokenCreated, "tok")
	run(t, st, &sinks.Webhook{SinkName: "hook", URL: srv.URL, Secret: recv.secret},
		sinks.Config{Types: []string{"node.", events.TypePrefix + "gpu."}})
	max, _ := st.OutboxMaxID(context.Background())
	eventually(t, "cursor did not pass the events the sink does not take", func() bool {
		c, _ := st.OutboxCursor(context.Background(), "hook")
		return c == max
	})
	if got := recv.ids(); !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want only node and gpu events %v", got, want)
	}
}

// TestDeadLetterUnblocksSubject: an event its receiver keeps refusing goes
// to the dead-letter table after MaxAttempts, the events after it (its
// subject's included) flow in order, and a replay delivers it once the
// receiver takes it.
func TestDeadLetterUnblocksSubject(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	var poison string
	healed := false
	recv := &receiver{t: t, secret: []byte("s")}
	recv.refuse = func(b []events.Envelope) bool {
		return !healed && slices.ContainsFunc(b, func(e events.Envelope) bool { return e.ID == poison })
	}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	a1 := insert(t, st, events.NodeReady, "node_a")
	poison = insert(t, st, events.NodeCordoned, "node_a")
	a2 := insert(t, st, events.NodeUncordoned, "node_a")
	b1 := insert(t, st, events.NodeReady, "node_b")
	run(t, st, &sinks.Webhook{SinkName: "hook", URL: srv.URL, Secret: recv.secret}, sinks.Config{MaxAttempts: 3})
	eventually(t, "events after the refused one never delivered", func() bool { return len(recv.ids()) >= 3 })
	if got := recv.ids(); !slices.Equal(got, []string{a1, a2, b1}) {
		t.Fatalf("delivered %v, want %v", got, []string{a1, a2, b1})
	}
	dls, err := st.DeadLetterList(ctx, &store.DeadLetterListParams{Sink: "hook"})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].Attempts != 3 || dls[0].Entry.Key != "node_a" || dls[0].LastError == "" {
		t.Fatalf("dead letters = %+v", dls)
	}
	if env, err := events.Parse(dls[0].Entry.Payload); err != nil || env.ID != poison {
		t.Fatalf("dead letter holds %s (%v), want %s", dls[0].Entry.Payload, err, poison)
	}
	recv.mu.Lock()
	healed = true
	recv.mu.Unlock()
	if n, err := st.DeadLetterReplay(ctx, "hook", nil); err != nil || n != 1 {
		t.Fatalf("replay = %d, %v", n, err)
	}
	eventually(t, "replayed event not delivered", func() bool { return len(recv.ids()) == 4 })
	if got := recv.ids(); got[3] != poison {
		t.Fatalf("delivered %v, want the replayed event last", got)
	}
	eventually(t, "dead letter kept after its replay", func() bool {
		c, err := st.DeadLetterCounts(ctx)
		return err == nil && c["hook"] == 0
	})
}

func TestFileSinkJSONLines(t *testing.T) {
	st := openStore(t)
	path := filepath.Join(t.TempDir(), "events.jsonl")
	var want []string
	for i := range 3 {
		want = append(want, insert(t, st, events.CommandCreated, "cmd_"+strconv.Itoa(i)))
	}
	run(t, st, &sinks.File{SinkName: "file", Path: path}, sinks.Config{})
	eventually(t, "file sink did not write 3 lines", func() bool {
		f, err := os.Open(path)
		if err != nil {
			return false
		}
		defer f.Close()
		var got []string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			e, err := events.Parse(sc.Bytes())
			if err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			if e.Type != events.CommandCreated || e.Subject != fmt.Sprintf("cmd_%d", len(got)) {
				t.Fatalf("line %d = %+v", len(got), e)
			}
			got = append(got, e.ID)
		}
		return slices.Equal(got, want)
	})
}

// With an hour between polls, an event written after the dispatcher went
// idle is delivered only because the outbox write woke it (Config.Wake, fed
// by the store's OutboxWritten as workers.Run does).
func TestWakeEndsTheIdleWait(t *testing.T) {
	st := openStore(t)
	recv := &receiver{t: t, secret: []byte("s")}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	first := insert(t, st, events.NodeJoined, "node_1")
	written, stop := st.OutboxWritten()
	defer stop()
	d, err := sinks.NewDispatcher(sinks.Config{Holder: "w1", Poll: time.Hour, Wake: written},
		&sinks.Webhook{SinkName: "hook", URL: srv.URL, Secret: recv.secret}, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	eventually(t, "the first event was not delivered", func() bool { return len(recv.ids()) == 1 })
	second := insert(t, st, events.NodeReady, "node_1")
	eventually(t, "an event written while the dispatcher was idle waited for the hour-long poll", func() bool { return len(recv.ids()) == 2 })
	if got := recv.ids(); !slices.Equal(got, []string{first, second}) {
		t.Fatalf("delivered %v", got)
	}
}

// TestTenantSink: a sink of tenant team-a takes the events of its pool
// (poolId) and of its pool's node (nodeId only), and passes over the root
// pool's, the root node's and the deployment's (naming neither); a sink
// of a tenant id that names none takes none.
func TestTenantSink(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	ten, err := st.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-a", ParentID: store.RootTenant})
	if err != nil {
		t.Fatal(err)
	}
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	own, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "a", SiteID: site.ID, TenantID: ten.ID})
	if err != nil {
		t.Fatal(err)
	}
	rootPool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "r", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	for id, pool := range map[string]string{"node_a": own.ID, "node_r": rootPool.ID} {
		if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool, Hostname: id, MachineID: id}); err != nil {
			t.Fatal(err)
		}
	}
	write := func(typ, subject string, data map[string]string) string {
		env, err := events.New(typ, subject, data, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		b, err := env.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.OutboxInsert(ctx, typ, subject, b); err != nil {
			t.Fatal(err)
		}
		return env.ID
	}
	want := []string{
		write(events.NodeReady, "node_a", map[string]string{"nodeId": "node_a"}),
		write(events.NodeReady, "node_a", map[string]string{"nodeId": "node_a", "poolId": own.ID}),
	}
	write(events.NodeReady, "node_r", map[string]string{"nodeId": "node_r"})
	write(events.NodeReady, "node_r", map[string]string{"nodeId": "node_r", "poolId": rootPool.ID})
	write(events.TokenCreated, "tok", map[string]string{"tokenId": "tok"})
	max, err := st.OutboxMaxID(ctx)
	if err != nil {
		t.Fatal(err)
	}

	recv := &receiver{t: t, secret: []byte("s")}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	none := &receiver{t: t, secret: []byte("s")}
	srvNone := httptest.NewServer(none)
	defer srvNone.Close()
	run(t, st, &sinks.Webhook{SinkName: "team-a", URL: srv.URL, Secret: recv.secret}, sinks.Config{Tenant: ten.ID})
	run(t, st, &sinks.Webhook{SinkName: "nobody", URL: srvNone.URL, Secret: none.secret}, sinks.Config{Tenant: "ten_nosuch"})
	eventually(t, "the tenant sinks' cursors did not pass every event", func() bool {
		a, _ := st.OutboxCursor(ctx, "team-a")
		n, _ := st.OutboxCursor(ctx, "nobody")
		return a == max && n == max
	})
	if got := recv.ids(); !slices.Equal(got, want) {
		t.Fatalf("team-a's sink got %v, want its node's and pool's events %v", got, want)
	}
	if got := none.ids(); len(got) != 0 {
		t.Fatalf("the sink of a tenant that does not exist got %v", got)
	}
}

// TestTenantSinkByID: a tenant sink names its tenant by id. Once that
// tenant is deleted, a tenant made later under the root, named as the
// deleted one or named as its id, takes none of the sink's events: the
// sink takes nothing more; nor does a tenant named as an id that names
// no tenant take that sink's. A dead letter of a tenant sink carries the
// tenant id it was for; replayed after the sink was given to another
// tenant, it is not delivered (its replay ends, saying why).
func TestTenantSinkByID(t *testing.T) {
	st := openStore(t)
	ctx := context.Background()
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	tenantWithNode := func(name, node string) *store.Tenant {
		t.Helper()
		ten, err := st.TenantCreate(ctx, &store.TenantCreateParams{Name: name, ParentID: store.RootTenant})
		if err != nil {
			t.Fatal(err)
		}
		pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p-" + node, SiteID: site.ID, TenantID: ten.ID})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: node, PoolID: pool.ID, Hostname: node, MachineID: node}); err != nil {
			t.Fatal(err)
		}
		return ten
	}
	write := func(node string) string {
		env, err := events.New(events.NodeReady, node, map[string]string{"nodeId": node}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		b, err := env.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.OutboxInsert(ctx, events.NodeReady, node, b); err != nil {
			t.Fatal(err)
		}
		return env.ID
	}

	// team-a's sink refuses the event of node_poison: it is dead-lettered.
	a := tenantWithNode("team-a", "node_a")
	tenantWithNode("team-b", "node_b")
	var poison string
	accept := false
	recv := &receiver{t: t, secret: []byte("s")}
	recv.refuse = func(b []events.Envelope) bool {
		return !accept && slices.ContainsFunc(b, func(e events.Envelope) bool { return e.ID == poison })
	}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	first := write("node_a")
	poison = write("node_a")
	write("node_b")
	run(t, st, &sinks.Webhook{SinkName: "team-a", URL: srv.URL, Secret: recv.secret}, sinks.Config{Tenant: a.ID, MaxAttempts: 2})
	var dls []*store.DeadLetter
	eventually(t, "the refused event was never dead-lettered", func() bool {
		dls, _ = st.DeadLetterList(ctx, &store.DeadLetterListParams{Sink: "team-a"})
		return len(dls) == 1
	})
	if dls[0].TenantID != a.ID {
		t.Fatalf("the dead letter is for tenant %q, want the sink's %s", dls[0].TenantID, a.ID)
	}

	// team-a is deleted; its name, and a name spelled as its id, are
	// taken by new tenants, whose nodes' events the sink never gets.
	if _, err := st.TenantDelete(ctx, &store.TenantDeleteParams{ID: a.ID, MoveNodesTo: store.RootTenant}); err != nil {
		t.Fatal(err)
	}
	tenantWithNode("team-a", "node_a2")
	tenantWithNode(a.ID, "node_a3")
	write("node_a2")
	write("node_a3")
	max, err := st.OutboxMaxID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the sink's cursor did not pass every event", func() bool {
		c, _ := st.OutboxCursor(ctx, "team-a")
		return c == max
	})
	if got := recv.ids(); !slices.Equal(got, []string{first}) {
		t.Fatalf("the deleted tenant's sink got %v, want only %s (before the deletion)", got, first)
	}

	// A sink whose id names no tenant never takes the events of a tenant
	// named as that id.
	ghost := &receiver{t: t, secret: []byte("s")}
	srvGhost := httptest.NewServer(ghost)
	defer srvGhost.Close()
	tenantWithNode("ten_ghost", "node_ghost")
	write("node_ghost")
	run(t, st, &sinks.Webhook{SinkName: "ghost", URL: srvGhost.URL, Secret: ghost.secret}, sinks.Config{Tenant: "ten_ghost"})
	if max, err = st.OutboxMaxID(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ghost sink's cursor did not pass every event", func() bool {
		c, _ := st.OutboxCursor(ctx, "ghost")
		return c == max
	})
	if got := ghost.ids(); len(got) != 0 {
		t.Fatalf("the sink of id ten_ghost got the events of a tenant named ten_ghost: %v", got)
	}

	// The sink is given to team-b (another dispatcher, as after a restart
	// with a new configuration): team-a's dead letter is not replayed to it.
	b, err := st.TenantGet(ctx, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	recvB := &receiver{t: t, secret: []byte("s")}
	srvB := httptest.NewServer(recvB)
	defer srvB.Close()
	run(t, st, &sinks.Webhook{SinkName: "team-b", URL: srvB.URL, Secret: recvB.secret}, sinks.Config{Tenant: b.ID})
	if err := st.DeadLetterInsert(ctx, &store.DeadLetter{Sink: "team-b", Entry: dls[0].Entry, Attempts: 2, LastError: "503", TenantID: a.ID}); err != nil {
		t.Fatal(err)
	}
	if n, err := st.DeadLetterReplay(ctx, "team-b", nil); err != nil || n != 1 {
		t.Fatalf("replay = %d, %v", n, err)
	}
	eventually(t, "the replay of another tenant's dead letter never ended", func() bool {
		l, _ := st.DeadLetterList(ctx, &store.DeadLetterListParams{Sink: "team-b"})
		return len(l) == 1 && !l[0].Replay && strings.Contains(l[0].LastError, "not replayed")
	})
	for _, id := range recvB.ids() {
		if id == poison {
			t.Fatalf("team-b's sink got team-a's dead letter %s", poison)
		}
	}
}
