package api_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/reconcilers/sinks"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// deadLetter writes an event and moves it to sink's dead-letter table, as
// a dispatcher does after its last failed attempt; it returns the dead
// letter's id and the event's CloudEvents id.
func (f *fixture) deadLetter(t *testing.T, sink, subject string) (int64, string) {
	t.Helper()
	ctx := context.Background()
	env, err := events.New(events.NodeReady, subject, map[string]string{"nodeId": subject}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	id, err := f.st.OutboxInsert(ctx, env.Type, subject, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.st.DeadLetterInsert(ctx, &store.DeadLetter{Sink: sink, Entry: store.OutboxEntry{ID: id, Topic: env.Type,
		Key: subject, Payload: b, CreatedAt: time.Now()}, Attempts: 10, LastError: "webhook answered 503"}); err != nil {
		t.Fatal(err)
	}
	dls, err := f.st.DeadLetterList(ctx, &store.DeadLetterListParams{Sink: sink, Limit: store.MaxListLimit})
	if err != nil || len(dls) == 0 {
		t.Fatalf("dead letters: %v %v", dls, err)
	}
	return dls[len(dls)-1].ID, env.ID
}

// deadLetters is every dead letter of sink, by id.
func (f *fixture) deadLetters(t *testing.T, sink string) map[int64]*store.DeadLetter {
	t.Helper()
	dls, err := f.st.DeadLetterList(context.Background(), &store.DeadLetterListParams{Sink: sink, Limit: store.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	m := map[int64]*store.DeadLetter{}
	for _, d := range dls {
		m[d.ID] = d
	}
	return m
}

func TestSinksDeadLettersAndReplay(t *testing.T) {
	f := newFixture(t)
	viewer, operator := f.token(store.RoleViewer, 0), f.token(store.RoleOperator, 0)
	a1, ce1 := f.deadLetter(t, "alerts", "node_1")
	a2, _ := f.deadLetter(t, "alerts", "node_2")
	b1, _ := f.deadLetter(t, "archive", "node_1")
	str := func(id int64) string { return strconv.FormatInt(id, 10) }

	// Admin only, both methods.
	for _, tok := range []string{viewer, operator} {
		wantCode(t, f.call("sinks.deadLetters", tok, `{}`, peer), 403, apiv1.CodePermissionDenied, "")
		wantCode(t, f.call("sinks.replay", tok, `{"sink":"alerts","all":true}`, peer), 403, apiv1.CodePermissionDenied, "")
	}

	// The list, oldest first, paged, filtered by sink, each with its
	// event as sinks receive it.
	r := f.call("sinks.deadLetters", f.admin, `{"page":{"limit":2}}`, peer)
	dls, _ := r.Body["deadLetters"].([]any)
	if r.Code != 200 || len(dls) != 2 || r.Body["nextCursor"] != str(a2) {
		t.Fatalf("page 1 = %v", r)
	}
	first := dls[0].(map[string]any)
	ev, _ := first["event"].(map[string]any)
	ce, _ := ev["cloudEvent"].(map[string]any)
	if first["id"] != str(a1) || first["sink"] != "alerts" || first["attempts"] != float64(10) ||
		first["lastError"] != "webhook answered 503" || first["replay"] != nil || first["failTime"] == nil ||
		ev["type"] != events.NodeReady || ev["subject"] != "node_1" || ce["id"] != ce1 || ce["specversion"] != "1.0" {
		t.Fatalf("dead letter = %v", first)
	}
	r = f.call("sinks.deadLetters", f.admin, `{"page":{"limit":2,"cursor":"`+str(a2)+`"}}`, peer)
	if dls, _ := r.Body["deadLetters"].([]any); r.Code != 200 || len(dls) != 1 || dls[0].(map[string]any)["id"] != str(b1) || r.Body["nextCursor"] != nil {
		t.Fatalf("page 2 = %v", r)
	}
	r = f.call("sinks.deadLetters", f.admin, `{"sink":"archive"}`, peer)
	if dls, _ := r.Body["deadLetters"].([]any); r.Code != 200 || len(dls) != 1 || dls[0].(map[string]any)["id"] != str(b1) {
		t.Fatalf("sink archive = %v", r)
	}
	if r := f.call("sinks.deadLetters", f.admin, `{"sink":"nothing-here"}`, peer); r.Code != 200 || r.Body["deadLetters"] != nil {
		t.Fatalf("a sink without dead letters = %v", r)
	}

	// Bad input names its field and marks nothing.
	for _, tc := range []struct{ method, body, field string }{
		{"sinks.deadLetters", `{"page":{"cursor":"x"}}`, "page.cursor"},
		{"sinks.deadLetters", `{"sink":"Bad Sink!"}`, "sink"},
		{"sinks.replay", `{}`, "ids"},
		{"sinks.replay", `{"all":true}`, "sink"},
		{"sinks.replay", `{"sink":"alerts","all":true,"ids":["` + str(a1) + `"]}`, "ids"},
		{"sinks.replay", `{"ids":["abc"]}`, "ids"},
		{"sinks.replay", `{"ids":["-3"]}`, "ids"},
		{"sinks.replay", `{"sink":"../x","ids":["1"]}`, "sink"},
		{"sinks.replay", `{"ids":[` + strings.Repeat(`"1",`, api.MaxReplayIDs) + `"1"]}`, "ids"},
	} {
		wantCode(t, f.call(tc.method, f.admin, tc.body, peer), 400, apiv1.CodeInvalidArgument, tc.field)
	}
	// An id that is not a dead letter (or not of the sink named) is
	// NOT_FOUND naming it, and the others are not marked either.
	r = f.call("sinks.replay", f.admin, fmt.Sprintf(`{"ids":["%d","%d"]}`, a1, b1+100), peer)
	wantCode(t, r, 404, apiv1.CodeNotFound, "ids")
	if msg := r.Body["message"].(string); !strings.Contains(msg, str(b1+100)) || strings.Contains(msg, str(a1)+",") {
		t.Fatalf("message %q", msg)
	}
	wantCode(t, f.call("sinks.replay", f.admin, fmt.Sprintf(`{"sink":"alerts","ids":["%d","%d"]}`, a1, b1), peer), 404, apiv1.CodeNotFound, "ids")
	for _, d := range f.deadLetters(t, "") {
		if d.Replay || d.Attempts != 10 {
			t.Fatalf("a refused replay marked %+v", d)
		}
	}

	// Replay by id: marked, attempts back to 0; the other sink's untouched.
	// Every replay call is audited with its sink.
	if r := f.call("sinks.replay", f.admin, fmt.Sprintf(`{"ids":["%d","%d"]}`, a1, a1), peer); r.Code != 200 || r.Body["replayed"] != "1" {
		t.Fatalf("replay one = %v", r)
	}
	if d := f.deadLetters(t, "alerts"); !d[a1].Replay || d[a1].Attempts != 0 || d[a2].Replay {
		t.Fatalf("after replaying %d: %+v %+v", a1, d[a1], d[a2])
	}
	if r := f.call("sinks.replay", f.admin, `{"sink":"alerts","all":true}`, peer); r.Code != 200 || r.Body["replayed"] != "2" {
		t.Fatalf("replay all = %v", r)
	}
	if d := f.deadLetters(t, "archive"); d[b1].Replay {
		t.Fatalf("replay of alerts marked archive's %+v", d[b1])
	}
	if r := f.call("sinks.replay", f.admin, `{"sink":"quiet","all":true}`, peer); r.Code != 200 || r.Body["replayed"] != nil {
		t.Fatalf("replay all of a sink without dead letters = %v", r)
	}
	// A sink that is not configured: NOT_FOUND, with all or with ids
	// (issue 29).
	for _, body := range []string{`{"sink":"nothing-here","ids":["` + str(a1) + `"]}`, `{"sink":"nothing-here","all":true}`} {
		wantCode(t, f.call("sinks.replay", f.admin, body, peer), 404, apiv1.CodeNotFound, "sink")
	}
	rows, err := f.st.AuditQuery(context.Background(), &store.AuditQueryParams{ActionPrefix: "sinks.replay", Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 || rows[0].Resource != "nothing-here" {
		t.Fatalf("newest sinks.replay audit row: %+v, want the sink as its object", rows)
	}
	outcomes := map[string]int{}
	for _, e := range rows {
		outcomes[e.Outcome]++
	}
	if outcomes["ok"] != 3 || outcomes["denied"] != 2 || outcomes[apiv1.CodeNotFound] != 4 || outcomes[apiv1.CodeInvalidArgument] != 7 {
		t.Fatalf("audit outcomes of sinks.replay: %v", outcomes)
	}

	// The alerts dispatcher delivers the replayed dead letters, which then
	// leave the table; archive's stays.
	sink := &recordingSink{name: "alerts"}
	d, err := sinks.NewDispatcher(sinks.Config{Holder: "api-test", Poll: 10 * time.Millisecond}, sink, f.st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for len(f.deadLetters(t, "alerts")) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("replayed dead letters still there: %v", f.deadLetters(t, "alerts"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := sink.ids(); len(got) < 1 || got[0] != ce1 {
		t.Fatalf("the sink received %v, want the replayed %s first", got, ce1)
	}
	if len(f.deadLetters(t, "archive")) != 1 {
		t.Fatal("archive's dead letter left the table")
	}
}

// recordingSink records the CloudEvents ids it is given.
type recordingSink struct {
	name string
	mu   sync.Mutex
	got  []string
}

func (s *recordingSink) Name() string { return s.name }

func (s *recordingSink) Deliver(_ context.Context, entries []*store.OutboxEntry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range entries {
		env, err := events.Parse(events.FromOutbox(e.ID, e.Topic, e.Key, e.Payload, e.CreatedAt))
		if err != nil {
			return err
		}
		s.got = append(s.got, env.ID)
	}
	return nil
}

func (s *recordingSink) ids() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.got...)
}

// TestTenantDeadLetters: a sink's tenant is its id, and a dead letter
// carries the tenant it was for. A tenant's admin sees the dead letters
// that were for its tenant only, whichever sink holds them (a sink given
// to another tenant keeps the letters of the one before, which its new
// tenant does not see), never a deployment-wide one; a sink whose id
// names no tenant is NOT_FOUND to the admin of a tenant named as that id.
func TestTenantDeadLetters(t *testing.T) {
	st := sqlitetest.Open(t)
	ctx := context.Background()
	tokens, ids := map[string]string{}, map[string]string{}
	for _, name := range []string{"team-a", "team-b"} {
		ten, err := st.TenantCreate(ctx, &store.TenantCreateParams{Name: name, ParentID: store.RootTenant})
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = ten.ID
		if tokens[name], _, err = iam.Create(ctx, st, iam.CreateParams{Role: store.RoleAdmin, TenantID: ten.ID}); err != nil {
			t.Fatal(err)
		}
	}
	// team-b's admin makes a tenant named as the id the ghost sink names.
	b, err := st.TenantGet(ctx, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.TenantCreate(ctx, &store.TenantCreateParams{Name: "ten_ghost", ParentID: b.ID}); err != nil {
		t.Fatal(err)
	}
	srv := api.New(api.Config{Secret: strings.Repeat("s", 32), Sinks: []string{"hook-a", "ghost", "all"},
		SinkTenants: map[string]string{"hook-a": ids["team-a"], "ghost": "ten_ghost"}}, st, nil)
	f := &fixture{t: t, st: st, srv: srv}
	letter := func(sink, subject, tenant string) {
		t.Helper()
		id, err := st.OutboxInsert(ctx, "node.ready", subject, []byte(`{"nodeId":"`+subject+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.DeadLetterInsert(ctx, &store.DeadLetter{Sink: sink, Entry: store.OutboxEntry{ID: id, Topic: "node.ready",
			Key: subject, Payload: []byte(`{"nodeId":"` + subject + `"}`), CreatedAt: time.Now()}, Attempts: 10, LastError: "503", TenantID: tenant}); err != nil {
			t.Fatal(err)
		}
	}
	letter("hook-a", "node_of_a", ids["team-a"])
	letter("hook-a", "node_of_b", ids["team-b"]) // hook-a was team-b's before
	letter("hook-a", "node_before", "")          // made before dead letters carried a tenant
	letter("ghost", "node_ghost", "ten_ghost")
	letter("all", "node_all", "")

	subjects := func(r result) []string {
		t.Helper()
		if r.Code != 200 {
			t.Fatalf("sinks.deadLetters: %d %v", r.Code, r.Body)
		}
		var out []string
		dls, _ := r.Body["deadLetters"].([]any)
		for _, d := range dls {
			out = append(out, d.(map[string]any)["event"].(map[string]any)["subject"].(string))
		}
		return out
	}
	for tenant, want := range map[string]string{"team-a": "node_of_a", "team-b": "node_of_b"} {
		for _, body := range []string{`{}`, `{"sink":"hook-a"}`} {
			if tenant == "team-b" && body != `{}` {
				continue // hook-a is not team-b's sink now
			}
			if got := subjects(f.call("sinks.deadLetters", tokens[tenant], body, peer)); len(got) != 1 || got[0] != want {
				t.Errorf("%s's admin, %s: %v, want [%s]", tenant, body, got, want)
			}
		}
	}
	wantCode(t, f.call("sinks.deadLetters", tokens["team-b"], `{"sink":"hook-a"}`, peer), 404, apiv1.CodeNotFound, "sink")
	wantCode(t, f.call("sinks.deadLetters", tokens["team-b"], `{"sink":"ghost"}`, peer), 404, apiv1.CodeNotFound, "sink")
	wantCode(t, f.call("sinks.replay", tokens["team-b"], `{"sink":"ghost","all":true}`, peer), 404, apiv1.CodeNotFound, "sink")
	// team-a's admin replays hook-a's letters that were team-a's only; the
	// one that was team-b's is NOT_FOUND to it.
	byKey := map[string]string{}
	all, err := st.DeadLetterList(ctx, &store.DeadLetterListParams{Sink: "hook-a"})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range all {
		byKey[d.Entry.Key] = strconv.FormatInt(d.ID, 10)
	}
	wantCode(t, f.call("sinks.replay", tokens["team-a"], `{"sink":"hook-a","ids":["`+byKey["node_of_b"]+`"]}`, peer), 404, apiv1.CodeNotFound, "ids")
	if r := f.call("sinks.replay", tokens["team-a"], `{"sink":"hook-a","all":true}`, peer); r.Code != 200 || r.Body["replayed"] != "1" {
		t.Errorf("team-a replays all of hook-a: %d %v, want 1 replayed", r.Code, r.Body)
	}
	if r := f.call("sinks.replay", tokens["team-a"], `{"sink":"hook-a","ids":["`+byKey["node_of_a"]+`"]}`, peer); r.Code != 200 {
		t.Errorf("team-a replays its own letter: %d %v", r.Code, r.Body)
	}
	after, err := st.DeadLetterList(ctx, &store.DeadLetterListParams{Sink: "hook-a", Replay: true})
	if err != nil || len(after) != 1 || after[0].Entry.Key != "node_of_a" {
		t.Errorf("marked for replay: %v %v, want team-a's letter only", after, err)
	}
	root := f.token(store.RoleAdmin, 0)
	if got := subjects(f.call("sinks.deadLetters", root, `{}`, peer)); len(got) != 5 {
		t.Errorf("the root's admin sees %v, want all five", got)
	}
}
