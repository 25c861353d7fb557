package sinks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/reconcilers/sinks"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
)

// backlogEvents is the backlog BenchmarkWebhookBacklog delivers (issue 18:
// 100,000 events, aim at least 10,000 events/s).
const backlogEvents = 100_000

// BenchmarkWebhookBacklog delivers a backlog of 100,000 node.ready events
// (CloudEvents envelopes in the outbox, 1,000 subjects) from PostgreSQL to
// a webhook on loopback that checks each request's signature and decodes
// its batch, with the dispatcher's default batch (500) and the largest
// (store.MaxListLimit), and prints events per second. The backlog is
// written before the clock starts, with one INSERT … SELECT; the clock
// runs from the dispatcher's start (its lease taken) to the receipt of the
// last event.
//
//	go test -run '^$' -bench WebhookBacklog -benchtime 1x ./controlplane/reconcilers/sinks/
func BenchmarkWebhookBacklog(b *testing.B) {
	for _, batch := range []int{500, store.MaxListLimit} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			for range b.N {
				benchBacklog(b, batch)
			}
		})
	}
}

func benchBacklog(b *testing.B, batch int) {
	b.StopTimer()
	ctx := context.Background()
	url := pgtest.URL(b)
	st, err := postgres.Open(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if err := pgtest.Exec(url)(ctx, `INSERT INTO outbox (topic, key, payload, created_at)
		SELECT 'com.better-compute.node.ready', 'node_' || (g % 1000), jsonb_build_object(
			'specversion', '1.0', 'id', 'evt_bench' || g, 'source', '/better-compute/control-plane',
			'type', 'com.better-compute.node.ready', 'subject', 'node_' || (g % 1000),
			'time', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
			'datacontenttype', 'application/json',
			'data', jsonb_build_object('nodeId', 'node_' || (g % 1000), 'poolId', 'pool_bench',
				'hostname', 'gpu-' || (g % 1000), 'state', 'ready', 'previousState', 'unreachable', 'cordoned', false)),
			now()
		FROM generate_series(1, `+strconv.Itoa(backlogEvents)+`) g`); err != nil {
		b.Fatal(err)
	}

	secret := []byte("bench-webhook-signing-secret")
	var got, posts, bad atomic.Int64
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		ts, _ := strconv.ParseInt(r.Header.Get(sinks.HeaderTimestamp), 10, 64)
		var evs []json.RawMessage
		if err != nil || !sinks.Verify(secret, ts, body, r.Header.Get(sinks.HeaderSignature)) || json.Unmarshal(body, &evs) != nil {
			bad.Add(1)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		posts.Add(1)
		if got.Add(int64(len(evs))) == backlogEvents {
			close(done)
		}
	}))
	defer srv.Close()

	d, err := sinks.NewDispatcher(sinks.Config{Holder: "bench", Batch: batch},
		&sinks.Webhook{SinkName: "bench", URL: srv.URL, Secret: secret}, st, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	b.StartTimer()
	start := time.Now()
	go func() { d.Run(runCtx); close(stopped) }()
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("%d of %d events delivered in 5 minutes (%d requests refused)", got.Load(), backlogEvents, bad.Load())
	}
	took := time.Since(start)
	b.StopTimer()
	cancel()
	<-stopped
	if bad.Load() > 0 || got.Load() != backlogEvents {
		b.Fatalf("%d events delivered, %d requests refused", got.Load(), bad.Load())
	}
	rate := float64(backlogEvents) / took.Seconds()
	b.ReportMetric(rate, "events/s")
	b.ReportMetric(0, "ns/op")
	fmt.Printf("webhook backlog on PostgreSQL: %d events in %v = %.0f events/s (batch %d, %d posts)\n",
		backlogEvents, took.Round(time.Millisecond), rate, batch, posts.Load())
}
