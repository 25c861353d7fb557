package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// streamFixture is an API serving real HTTP on a loopback port.
type streamFixture struct {
	*fixture
	base string
	stop func() error // cancels Run and returns its error
}

func newStreamFixture(t *testing.T, heartbeat time.Duration) *streamFixture {
	t.Helper()
	st := sqlitetest.Open(t)
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Secret: strings.Repeat("s", 32), EventHeartbeat: heartbeat}, st, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() { cancel(); runErr = <-done })
		return runErr
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatal(err)
	}
	f := &fixture{t: t, st: st, srv: srv}
	f.admin = f.token(store.RoleAdmin, 0)
	return &streamFixture{fixture: f, base: "http://" + srv.Addr().String() + "/api", stop: stop}
}

// emit writes n node events to the outbox, subjects node_<from>...
func (f *streamFixture) emit(n, from int, typ string) []int64 {
	f.t.Helper()
	var ids []int64
	for i := range n {
		env, err := events.New(typ, fmt.Sprintf("node_%d", from+i), map[string]int{"i": from + i}, time.Now())
		if err != nil {
			f.t.Fatal(err)
		}
		b, _ := env.Marshal()
		id, err := f.st.OutboxInsert(context.Background(), env.Type, env.Subject, b)
		if err != nil {
			f.t.Fatal(err)
		}
		ids = append(ids, id)
	}
	f.srv.Feed().Notify()
	return ids
}

type sse struct {
	id, event, data string
	comment         bool
}

// stream is one open event stream.
type stream struct {
	resp *http.Response
	sc   *bufio.Scanner
}

func (f *streamFixture) open(ctx context.Context, token, query string, headers ...string) (*http.Response, *stream) {
	f.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.base+api.EventsWatchPath+query, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { resp.Body.Close() })
	return resp, &stream{resp: resp, sc: bufio.NewScanner(resp.Body)}
}

// next reads one event or comment block.
func (s *stream) next(t *testing.T) sse {
	t.Helper()
	var e sse
	for s.sc.Scan() {
		line := s.sc.Text()
		switch {
		case line == "":
			if e.id != "" || e.event != "" || e.data != "" || e.comment {
				return e
			}
		case strings.HasPrefix(line, ":"):
			e.comment = true
		case strings.HasPrefix(line, "id: "):
			e.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			e.event = line[7:]
		case strings.HasPrefix(line, "data: "):
			e.data = line[6:]
		}
	}
	t.Fatalf("stream ended: %v", s.sc.Err())
	return e
}

// nextEvent skips comments.
func (s *stream) nextEvent(t *testing.T) sse {
	t.Helper()
	for {
		if e := s.next(t); !e.comment || e.id != "" {
			return e
		}
	}
}

// TestEventsWatch: a viewer's stream starts at the newest event, carries
// new ones as id/type/CloudEvents data, resumes after Last-Event-ID (and
// ?after=) without losing or repeating any, filters by type prefix, sends
// heartbeats, and answers a resume id older than retention with 410 GONE.
func TestEventsWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newStreamFixture(t, 200*time.Millisecond)
	viewer := f.token(store.RoleViewer, 0)
	old := f.emit(2, 0, "com.better-compute.node.ready")

	resp, s := f.open(ctx, viewer, "")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("watch = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if first := s.next(t); !first.comment {
		t.Fatalf("first block %+v, want the opening comment", first)
	}
	ids := f.emit(3, 10, "com.better-compute.node.ready")
	for i, want := range ids {
		e := s.nextEvent(t)
		env, err := events.Parse([]byte(e.data))
		if e.id != strconv.FormatInt(want, 10) || e.event != "com.better-compute.node.ready" || err != nil ||
			env.Subject != fmt.Sprintf("node_%d", 10+i) {
			t.Fatalf("event %d = %+v (%v), want id %d", i, e, err, want)
		}
	}
	// Idle: a heartbeat comment.
	if e := s.next(t); !e.comment || e.id != "" {
		t.Fatalf("idle stream sent %+v, want a heartbeat", e)
	}
	// Dropped: events written meanwhile arrive on the resumed stream, in
	// order, none twice.
	resp.Body.Close()
	missed := f.emit(4, 20, "com.better-compute.node.cordoned")
	_, s = f.open(ctx, viewer, "", "Last-Event-ID", strconv.FormatInt(ids[2], 10))
	for _, want := range missed {
		if e := s.nextEvent(t); e.id != strconv.FormatInt(want, 10) {
			t.Fatalf("resumed stream gave %+v, want id %d", e, want)
		}
	}
	// ?after= resumes too, with a type filter.
	_, s = f.open(ctx, viewer, "?after="+strconv.FormatInt(old[0], 10)+"&types=node.cordoned")
	for _, want := range missed {
		if e := s.nextEvent(t); e.id != strconv.FormatInt(want, 10) || e.event != "com.better-compute.node.cordoned" {
			t.Fatalf("filtered stream gave %+v, want id %d", e, want)
		}
	}
	// Retention pruned everything so far: a resume before it is 410.
	if _, err := f.st.OutboxPrune(ctx, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	resp, _ = f.open(ctx, viewer, "", "Last-Event-ID", strconv.FormatInt(ids[0], 10))
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if msg, _ := body["message"].(string); resp.StatusCode != http.StatusGone || body["code"] != apiv1.CodeGone ||
		!strings.Contains(msg, "pruned") {
		t.Fatalf("resume before retention = %d %v", resp.StatusCode, body)
	}
	// At the pruned mark itself nothing was lost.
	resp, s = f.open(ctx, viewer, "", "Last-Event-ID", strconv.FormatInt(missed[3], 10))
	if resp.StatusCode != 200 {
		t.Fatalf("resume at the pruned mark = %d", resp.StatusCode)
	}
	later := f.emit(1, 30, "com.better-compute.node.ready")
	if e := s.nextEvent(t); e.id != strconv.FormatInt(later[0], 10) {
		t.Fatalf("after the pruned mark: %+v, want id %d", e, later[0])
	}
}

// TestEventsWatchRefusals: no token 401, bad ids and filters 400, an id
// from the future 400.
func TestEventsWatchRefusals(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newStreamFixture(t, 0)
	viewer := f.token(store.RoleViewer, 0)
	for _, tc := range []struct {
		token, query string
		headers      []string
		status       int
	}{
		{"", "", nil, 401},
		{"bcat_nope", "", nil, 401},
		{viewer, "?after=x", nil, 400},
		{viewer, "?after=-1", nil, 400},
		{viewer, "", []string{"Last-Event-ID", "12 "}, 400},
		{viewer, "?after=999", nil, 400},
		{viewer, "?types=,", nil, 400},
	} {
		resp, _ := f.open(ctx, tc.token, tc.query, tc.headers...)
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		if resp.StatusCode != tc.status || body["message"] == "" {
			t.Errorf("%q %q %v: %d %v, want %d", tc.token, tc.query, tc.headers, resp.StatusCode, body, tc.status)
		}
	}
}

// TestEventsList: filters, newest first, cursor paging, the envelope.
func TestEventsList(t *testing.T) {
	f := newStreamFixture(t, 0)
	viewer := f.token(store.RoleViewer, 0)
	a := f.emit(3, 0, "com.better-compute.node.ready")
	b := f.emit(2, 0, "com.better-compute.command.created")
	r := f.call("events.list", viewer, `{"typePrefix":"node.","page":{"limit":2}}`, peer)
	evs, _ := r.Body["events"].([]any)
	if r.Code != 200 || len(evs) != 2 || evs[0].(map[string]any)["id"] != strconv.FormatInt(a[2], 10) {
		t.Fatalf("page 1 = %v", r)
	}
	ce := evs[0].(map[string]any)["cloudEvent"].(map[string]any)
	if ce["specversion"] != "1.0" || ce["type"] != "com.better-compute.node.ready" || ce["subject"] != "node_2" {
		t.Fatalf("cloudEvent = %v", ce)
	}
	r = f.call("events.list", viewer, `{"typePrefix":"node.","page":{"limit":2,"cursor":"`+r.Body["nextCursor"].(string)+`"}}`, peer)
	if evs, _ := r.Body["events"].([]any); r.Code != 200 || len(evs) != 1 || r.Body["nextCursor"] != nil {
		t.Fatalf("page 2 = %v", r)
	}
	r = f.call("events.list", viewer, `{"subject":"node_1"}`, peer)
	if evs, _ := r.Body["events"].([]any); len(evs) != 2 || evs[0].(map[string]any)["id"] != strconv.FormatInt(b[1], 10) {
		t.Fatalf("subject = %v", r)
	}
	since := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if r := f.call("events.list", viewer, `{"since":"`+since+`"}`, peer); r.Code != 200 || r.Body["events"] != nil {
		t.Fatalf("since later = %v", r)
	}
	wantCode(t, f.call("events.list", viewer, `{"page":{"cursor":"x"}}`, peer), 400, apiv1.CodeInvalidArgument, "page.cursor")
	wantCode(t, f.call("events.list", viewer, `{"subject":"`+strings.Repeat("s", 300)+`"}`, peer), 400, apiv1.CodeInvalidArgument, "subject")
	wantCode(t, f.call("events.list", viewer, `{"since":"2026-01-02T00:00:00Z","until":"2026-01-01T00:00:00Z"}`, peer), 400, apiv1.CodeInvalidArgument, "until")
}

// TestEventsWatchEndsOnShutdown: an open stream does not hold the server's
// shutdown for its grace (5 s): it ends when shutdown begins.
func TestEventsWatchEndsOnShutdown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newStreamFixture(t, 0)
	_, s := f.open(ctx, f.token(store.RoleViewer, 0), "")
	if first := s.next(t); !first.comment {
		t.Fatalf("first block %+v", first)
	}
	start := time.Now()
	if err := f.stop(); err != nil {
		t.Fatal(err)
	}
	for s.sc.Scan() {
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("shutdown with an open stream took %v", d)
	}
}
