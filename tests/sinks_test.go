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

	"github.com/better-compute/better-compute/controlplane/client"
	"github.com/better-compute/better-compute/controlplane/iam"
	"github.com/better-compute/better-compute/controlplane/sinks"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// webhookReceiver is a webhook endpoint that answers 503 to its first
// failFirst requests, then checks each request's signature and records the
// outbox ids it was sent.
type webhookReceiver struct {
	t         *testing.T
	secret    []byte
	failFirst int

	mu       sync.Mutex
	requests int
	bad      []string      // why a request was refused
	got      map[int64]int // outbox id → deliveries accepted
	maxID    int64
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
	var e sinks.Event
	switch {
	case err != nil:
		r.bad = append(r.bad, "read body: "+err.Error())
	case req.Method != http.MethodPost:
		r.bad = append(r.bad, "method "+req.Method)
	case tsErr != nil || time.Since(time.Unix(ts, 0)).Abs() > time.Minute:
		r.bad = append(r.bad, "timestamp "+req.Header.Get(sinks.HeaderTimestamp))
	case !sinks.Verify(r.secret, ts, body, req.Header.Get(sinks.HeaderSignature)):
		r.bad = append(r.bad, fmt.Sprintf("signature %q does not verify over %s", req.Header.Get(sinks.HeaderSignature), body))
	case json.Unmarshal(body, &e) != nil || e.ID == 0:
		r.bad = append(r.bad, "body "+string(body))
	case req.Header.Get(sinks.HeaderEventID) != strconv.FormatInt(e.ID, 10):
		r.bad = append(r.bad, fmt.Sprintf("event id header %q for entry %d", req.Header.Get(sinks.HeaderEventID), e.ID))
	default:
		r.got[e.ID]++
		r.maxID = max(r.maxID, e.ID)
		return
	}
	w.WriteHeader(http.StatusUnauthorized)
}

// seen returns a copy of the deliveries and the highest id delivered.
func (r *webhookReceiver) seen() (map[int64]int, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := make(map[int64]int, len(r.got))
	for id, n := range r.got {
		got[id] = n
	}
	return got, r.maxID
}

// TestWebhookSink runs serve with a webhook sink on PostgreSQL (the api and
// every worker role in one process) against a receiver that fails its first
// three requests, creates commands through the API from eight clients at
// once (each commands.create writes one outbox entry), and checks that every
// outbox entry reaches the receiver at least once with a signature that
// verifies, and that the sink's cursor ends at the newest entry.
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
	recv := &webhookReceiver{t: t, secret: []byte("e2e-webhook-signing-secret"), failFirst: 3, got: map[int64]int{}}
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
			rows, err := st.OutboxList(ctx, 0, store.MaxListLimit)
			if err != nil {
				t.Fatal(err)
			}
			ids = ids[:0]
			for _, e := range rows {
				ids = append(ids, e.ID)
			}
			got, _ := recv.seen()
			missing = slices.DeleteFunc(slices.Clone(ids), func(id int64) bool { return got[id] > 0 })
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
	inserted, commit, held := make(chan int64, 1), make(chan struct{}), make(chan error, 1)
	go func() {
		held <- st.Tx(ctx, func(tx store.Store) error {
			id, err := tx.OutboxInsert(ctx, "e2e.slow-transaction", "held", []byte(`{"held":true}`))
			inserted <- id
			<-commit
			return err
		})
	}()
	heldID := <-inserted
	later := make(chan error, 1)
	go func() { later <- create() }()
	passed := false
	for deadline := time.Now().Add(2 * time.Second); !passed && time.Now().Before(deadline); {
		_, maxID := recv.seen()
		passed = maxID > heldID
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
	if len(ids) != 2*8*10+2 {
		t.Fatalf("%d outbox entries, want %d (one per commands.create and the held one)", len(ids), 2*8*10+2)
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
