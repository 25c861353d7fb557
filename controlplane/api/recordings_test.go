package api_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/recording"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// TestRecordingsGetPages: recordings.get answers a long recording's events
// in order over several calls (at most 64 chunks each) as a viewer; an
// unknown id is NOT_FOUND, a cursor it did not return INVALID_ARGUMENT;
// another deployment secret cannot open the chunks (INTERNAL), and
// recordings.list filters by node.
func TestRecordingsGetPages(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	secret := strings.Repeat("s", 32)
	f := &fixture{t: t, st: st, srv: api.New(api.Config{Secret: secret}, st, nil)}
	viewer, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleViewer})
	if err != nil {
		t.Fatal(err)
	}
	// 150 chunks of one output event each.
	rec, err := recording.Start(ctx, recording.Config{Secret: secret, FlushBytes: 1}, st, recording.Params{NodeID: "node_a", TunnelID: "tun_a"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 150 {
		if err := rec.Output(fmt.Appendf(nil, "line %d\n", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := rec.Close("exit"); err != nil {
		t.Fatal(err)
	}

	var lines []string
	cursor, calls := "", 0
	for {
		r := f.call("recordings.get", viewer, fmt.Sprintf(`{"id":%q,"cursor":%q}`, rec.ID(), cursor), peer)
		if r.Code != 200 {
			t.Fatalf("recordings.get: %d %v", r.Code, r.Body)
		}
		calls++
		events, _ := r.Body["events"].([]any)
		if len(events) > 64 {
			t.Fatalf("one call answered %d events (a chunk each), want at most 64", len(events))
		}
		for _, e := range events {
			ev := e.(map[string]any)
			lines = append(lines, ev["output"].(string))
		}
		cursor, _ = r.Body["nextCursor"].(string)
		if cursor == "" {
			break
		}
	}
	if len(lines) != 150 || calls != 3 {
		t.Fatalf("%d events in %d calls, want 150 in 3", len(lines), calls)
	}
	for i, l := range lines {
		if want := fmt.Appendf(nil, "line %d\n", i); l != b64(want) {
			t.Fatalf("event %d = %q, want %q (base64)", i, l, want)
		}
	}

	wantCode(t, f.call("recordings.get", viewer, `{"id":"rec_none"}`, peer), 404, "NOT_FOUND", "id")
	wantCode(t, f.call("recordings.get", viewer, `{"id":"`+rec.ID()+`","cursor":"x"}`, peer), 400, "INVALID_ARGUMENT", "cursor")
	wantCode(t, f.call("recordings.get", viewer, `{"id":""}`, peer), 400, "INVALID_ARGUMENT", "id")
	other := &fixture{t: t, st: st, srv: api.New(api.Config{Secret: strings.Repeat("t", 32)}, st, nil)}
	wantCode(t, other.call("recordings.get", viewer, `{"id":"`+rec.ID()+`"}`, peer), 500, "INTERNAL", "")

	if r := f.call("recordings.list", viewer, `{"node":"node_a"}`, peer); r.Code != 200 || len(r.Body["recordings"].([]any)) != 1 {
		t.Fatalf("recordings.list node_a: %d %v", r.Code, r.Body)
	}
	if r := f.call("recordings.list", viewer, `{"node":"node_b"}`, peer); r.Code != 200 || r.Body["recordings"] != nil {
		t.Fatalf("recordings.list node_b: %d %v, want none", r.Code, r.Body)
	}
}

// b64 is b as protojson writes bytes.
func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
