package sinks_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/sinks"
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

func run(t *testing.T, st store.Store, sink sinks.Sink) {
	t.Helper()
	d, err := sinks.NewDispatcher(sinks.Config{Holder: "w1", Poll: 20 * time.Millisecond, RetryBase: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond},
		sink, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func TestWebhookAtLeastOnceWithSignatures(t *testing.T) {
	st := openStore(t)
	secret := []byte("webhook-secret")
	var mu sync.Mutex
	attempts := 0
	got := map[int64]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ts, _ := strconv.ParseInt(r.Header.Get(sinks.HeaderTimestamp), 10, 64)
		if !sinks.Verify(secret, ts, body, r.Header.Get(sinks.HeaderSignature)) {
			t.Errorf("bad signature on %s", body)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		attempts++
		if attempts <= 3 { // the receiver fails the first attempts
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		var e sinks.Event
		if err := json.Unmarshal(body, &e); err != nil {
			t.Error(err)
		}
		got[e.ID]++
	}))
	defer srv.Close()
	var ids []int64
	for i := range 5 {
		id, err := st.OutboxInsert(context.Background(), "node.joined", "node_"+strconv.Itoa(i), []byte(`{"n":`+strconv.Itoa(i)+`}`))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	run(t, st, &sinks.Webhook{SinkName: "hook", URL: srv.URL, Secret: secret})
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n == len(ids) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("delivered %d of %d entries", n, len(ids))
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, id := range ids {
		if got[id] < 1 {
			t.Fatalf("entry %d never delivered", id)
		}
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		if c, _ := st.OutboxCursor(context.Background(), "hook"); c == ids[len(ids)-1] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("cursor did not reach the last entry")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestFileSinkJSONLines(t *testing.T) {
	st := openStore(t)
	path := filepath.Join(t.TempDir(), "events.jsonl")
	for i := range 3 {
		if _, err := st.OutboxInsert(context.Background(), "command.created", "b"+strconv.Itoa(i), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	run(t, st, &sinks.File{SinkName: "file", Path: path})
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := os.Open(path)
		if err == nil {
			var lines []sinks.Event
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				var e sinks.Event
				if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
					t.Fatalf("line %q: %v", sc.Text(), err)
				}
				lines = append(lines, e)
			}
			f.Close()
			if len(lines) == 3 && lines[0].Topic == "command.created" && lines[2].Key == "b2" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("file sink did not write 3 lines")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
