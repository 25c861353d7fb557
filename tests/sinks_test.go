package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/reconcilers/sinks"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// webhookReceiver is a webhook endpoint that answers 503 to its first
// failFirst requests, then checks each request's signature and records the
// CloudEvents ids of the batches it was sent.
type webhookReceiver struct {
	t         *testing.T
	secret    []byte
	failFirst int

	mu       sync.Mutex
	requests int
	bad      []string       // why a request was refused
	got      map[string]int // CloudEvents id → deliveries accepted
	last     string         // the id of the last event delivered
}

func (r *webhookReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	if r.requests <= r.failFirst {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	ts, tsErr := strconv.ParseInt(req.Header.Get(sinks.HeaderTimestamp), 10, 64)
	var batch []json.RawMessage
	switch {
	case err != nil:
		r.bad = append(r.bad, "read body: "+err.Error())
	case req.Method != http.MethodPost:
		r.bad = append(r.bad, "method "+req.Method)
	case tsErr != nil || time.Since(time.Unix(ts, 0)).Abs() > time.Minute:
		r.bad = append(r.bad, "timestamp "+req.Header.Get(sinks.HeaderTimestamp))
	case !sinks.Verify(r.secret, ts, body, req.Header.Get(sinks.HeaderSignature)):
		r.bad = append(r.bad, fmt.Sprintf("signature %q does not verify over %s", req.Header.Get(sinks.HeaderSignature), body))
	case req.Header.Get("Content-Type") != events.BatchContentType:
		r.bad = append(r.bad, "content type "+req.Header.Get("Content-Type"))
	case json.Unmarshal(body, &batch) != nil || len(batch) == 0:
		r.bad = append(r.bad, "body "+string(body))
	default:
		for _, m := range batch {
			e, err := events.Parse(m)
			if err != nil {
				r.bad = append(r.bad, err.Error())
				break
			}
			r.got[e.ID]++
			r.last = e.ID
		}
		return
	}
	w.WriteHeader(http.StatusUnauthorized)
}

// seen returns a copy of the deliveries and the last id delivered.
func (r *webhookReceiver) seen() (map[string]int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := make(map[string]int, len(r.got))
	for id, n := range r.got {
		got[id] = n
	}
	return got, r.last
}

// eventID is an outbox entry's CloudEvents id.
func eventID(t *testing.T, e *store.OutboxEntry) string {
	t.Helper()
	env, err := events.Parse(events.FromOutbox(e.ID, e.Topic, e.Key, e.Payload, e.CreatedAt))
	if err != nil {
		t.Fatalf("outbox entry %d: %v", e.ID, err)
	}
	return env.ID
}

// TestWebhookSink runs serve with a webhook sink on PostgreSQL (the api and
// every worker role in one process) against a receiver that fails its first
// three requests, creates commands through the API from eight clients at
// once (each commands.create of four nodes writes four command.created
// events), and checks that every outbox entry reaches the receiver at least
// once as a CloudEvents batch with a signature that verifies, and that the
// sink's cursor ends at the newest entry.
//
// One entry is written by a transaction the test holds open while the API
// commits later ones, as a slow API transaction would: on PostgreSQL ids
// are taken at insert and rows appear at commit, so a dispatcher that reads
// past a gap skips that entry for good.
func TestWebhookSink(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := testenv.Binary(t, "better-compute")
	url := pgtest.URL(t)
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + url, "BETTER_COMPUTE_SECRET=" + testSecret}
	if code, stdout, stderr := testenv.Run(t, env, "", bin, "migrate"); code != 0 {
		t.Fatalf("migrate: exit %d\n%s%s", code, stdout, stderr)
	}
	recv := &webhookReceiver{t: t, secret: []byte("e2e-webhook-signing-secret"), failFirst: 3, got: map[string]int{}}
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)
	cfg := fmt.Sprintf("host:\n  listen: 127.0.0.1:0\nsinks:\n  webhooks:\n    - name: hook\n      url: %s/hook\n      secret: %s\n",
		srv.URL, recv.secret)
	p, api := startServeConfig(t, env, cfg, "--roles", "api,controllers,scheduler,sinks,iam", "--no-migrate")

	st, err := backend.Open(ctx, url, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "e2e", Region: "default"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "default", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for i := range 4 {
		n, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{PoolID: pool.ID, Hostname: fmt.Sprintf("hook-%d", i),
			MachineID: fmt.Sprintf("m-%d", i), ID: store.NewID("node")})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n.ID)
	}
	secret, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleAdmin, Description: "e2e webhook"})
	if err != nil {
		t.Fatal(err)
	}
	c := &client.Client{BaseURL: api + "/api", Token: secret}
	create := func() error {
		return c.Call(ctx, "commands.create", &apiv1.CreateCommandsRequest{NodeIds: nodes, Kind: "exec",
			Exec: &apiv1.ExecSpec{Argv: []string{"true"}}}, &apiv1.CreateCommandsResponse{})
	}

	// Eight clients create commands at once, ten calls each, while the
	// receiver refuses the first requests; all of it arrives.
	burst := func() {
		var wg sync.WaitGroup
		errs := make(chan error, 8*10)
		for range 8 {
			wg.Go(func() {
				for range 10 {
					if err := create(); err != nil {
						errs <- err
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("commands.create: %v", err)
		}
	}
	burst()
	waitDelivered := func() []int64 {
		t.Helper()
		var ids, missing []int64
		eventually(t, 30*time.Second, func() bool {
			ids, missing = ids[:0], missing[:0]
			got, _ := recv.seen()
			for after := int64(0); ; {
				rows, err := st.OutboxList(ctx, after, store.MaxListLimit)
				if err != nil {
					t.Fatal(err)
				}
				if len(rows) == 0 {
					break
				}
				for _, e := range rows {
					ids = append(ids, e.ID)
					if got[eventID(t, e)] == 0 {
						missing = append(missing, e.ID)
					}
				}
				after = rows[len(rows)-1].ID
			}
			return len(missing) == 0
		}, func() string {
			cursor, _ := st.OutboxCursor(ctx, "hook")
			return fmt.Sprintf("entries %v never delivered (sink cursor at %d)", missing, cursor)
		})
		return ids
	}
	waitDelivered()

	// An entry's transaction stays open while the API commits later
	// entries, then commits; another burst follows.
	inserted, commit, held := make(chan *store.OutboxEntry, 1), make(chan struct{}), make(chan error, 1)
	go func() {
		held <- st.Tx(ctx, func(tx store.Store) error {
			id, err := tx.OutboxInsert(ctx, "e2e.slow-transaction", "held", []byte(`{"held":true}`))
			inserted <- &store.OutboxEntry{ID: id, Topic: "e2e.slow-transaction", Key: "held", Payload: []byte(`{"held":true}`)}
			<-commit
			return err
		})
	}()
	heldEntry := <-inserted
	heldID := heldEntry.ID
	_, before := recv.seen()
	later := make(chan error, 1)
	go func() { later <- create() }()
	passed := false
	for deadline := time.Now().Add(2 * time.Second); !passed && time.Now().Before(deadline); {
		_, last := recv.seen()
		passed = last != before
		time.Sleep(50 * time.Millisecond)
	}
	close(commit)
	if err := <-held; err != nil {
		t.Fatalf("the held transaction: %v", err)
	}
	if err := <-later; err != nil {
		t.Fatalf("commands.create: %v", err)
	}
	t.Logf("entry %d held open: the receiver got a later entry before it committed: %v", heldID, passed)
	burst()
	ids := waitDelivered()
	created := 0
	for after := int64(0); ; {
		rows, err := st.OutboxList(ctx, after, store.MaxListLimit)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			break
		}
		for _, e := range rows {
			if e.Topic == events.CommandCreated {
				created++
			}
		}
		after = rows[len(rows)-1].ID
	}
	if want := (2*8*10 + 1) * len(nodes); created != want {
		t.Fatalf("%d command.created events, want %d (one per command)", created, want)
	}
	eventually(t, 10*time.Second, func() bool {
		cursor, err := st.OutboxCursor(ctx, "hook")
		return err == nil && cursor == slices.Max(ids)
	}, func() string { return "the sink's cursor did not reach the newest entry" })

	got, _ := recv.seen()
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.bad) > 0 {
		t.Fatalf("%d requests refused by the receiver, the first: %s", len(recv.bad), recv.bad[0])
	}
	dups := 0
	for _, n := range got {
		dups += n - 1
	}
	p.WaitLine(`msg="Sink delivery failed; retrying".* sink=hook`, time.Second)
	t.Logf("webhook: %d entries delivered in %d requests (first %d refused with 503, %d duplicate deliveries)",
		len(got), recv.requests, recv.failFirst, dups)
}
