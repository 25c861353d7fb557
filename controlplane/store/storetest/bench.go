package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// Benchmark measures the operations single-writer correctness rests on:
// lease acquire and renew, and one-row write transactions. Each reports
// ops/s; run with go test -bench . ./controlplane/store/...
func Benchmark(b *testing.B, newHarness NewHarness) {
	ctx := context.Background()
	b.Run("LeaseAcquire", func(b *testing.B) {
		h := newHarness(b)
		// 256 shard leases taken round-robin by one holder: the insert path
		// the first time, then the same-holder re-acquire path.
		b.ResetTimer()
		for i := range b.N {
			if _, ok, err := h.Store.LeaseAcquire(ctx, &store.LeaseAcquireParams{
				Name: fmt.Sprintf("shard:%d", i%256), Holder: "bench", TTL: 15 * time.Second,
			}); err != nil || !ok {
				b.Fatalf("acquire: %v %v", ok, err)
			}
		}
		report(b)
	})
	b.Run("LeaseRenew", func(b *testing.B) {
		h := newHarness(b)
		l, _, err := h.Store.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: "singleton:bench", Holder: "bench", TTL: 15 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			if _, ok, err := h.Store.LeaseRenew(ctx, &store.LeaseRenewParams{Name: l.Name, Holder: "bench", Epoch: l.Epoch, TTL: 15 * time.Second}); err != nil || !ok {
				b.Fatalf("renew: %v %v", ok, err)
			}
		}
		report(b)
	})
	b.Run("WriteTx", func(b *testing.B) {
		h := newHarness(b)
		b.ResetTimer()
		for range b.N {
			if _, err := h.Store.AuditInsert(ctx, &store.AuditEntry{Actor: "bench", Action: "bench.write", Outcome: "ok"}); err != nil {
				b.Fatal(err)
			}
		}
		report(b)
	})
	b.Run("WriteTxParallel", func(b *testing.B) {
		h := newHarness(b)
		b.SetParallelism(4)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := h.Store.AuditInsert(ctx, &store.AuditEntry{Actor: "bench", Action: "bench.write", Outcome: "ok"}); err != nil {
					b.Error(err)
					return
				}
			}
		})
		report(b)
	})
	b.Run("HeartbeatFlush", func(b *testing.B) {
		// One gateway holding 10,000 sessions at 10 s heartbeats hears from
		// 1,000 of them between two flushes: one op is the write of those
		// 1,000, as the gateway's flush makes it (in one transaction).
		const sessions, perFlush = 10000, 1000
		h := newHarness(b)
		ids := seedSessions(ctx, b, h, sessions)
		b.ResetTimer()
		for i := range b.N {
			from := (i * perFlush) % sessions
			if err := h.Store.Tx(ctx, func(tx store.Store) error {
				_, err := tx.SessionHeartbeatBatch(ctx, "gw-bench", ids[from:from+perFlush], nil)
				return err
			}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/flush")
	})
	b.Run("SessionReadback", func(b *testing.B) {
		// The gateway's periodic read-back of the ids of its 10,000 sessions.
		h := newHarness(b)
		seedSessions(ctx, b, h, 10000)
		b.ResetTimer()
		for range b.N {
			if ids, err := h.Store.SessionIDs(ctx, "gw-bench"); err != nil || len(ids) != 10000 {
				b.Fatalf("read back %d ids: %v", len(ids), err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/readback")
	})
}

// seedSessions makes n nodes, each with a session on gateway "gw-bench",
// and returns the session ids.
func seedSessions(ctx context.Context, b *testing.B, h *Harness, n int) []string {
	b.Helper()
	site, err := h.Store.SiteCreate(ctx, &store.SiteCreateParams{Name: "bench", Region: "r"})
	if err != nil {
		b.Fatal(err)
	}
	pool, err := h.Store.PoolCreate(ctx, &store.PoolCreateParams{Name: "bench", SiteID: site.ID})
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, n)
	for i := range n {
		node := fmt.Sprintf("node_bench%05d", i)
		ids[i] = fmt.Sprintf("sess_bench%05d", i)
		if _, err := h.Store.NodeUpsert(ctx, &store.NodeUpsertParams{ID: node, PoolID: pool.ID, Hostname: node, MachineID: "m-" + node,
			Labels: map[string]string{"rack": "r1", "gpu": "h200"}}); err != nil {
			b.Fatal(err)
		}
		if _, _, err := h.Store.SessionOpen(ctx, &store.SessionOpenParams{NodeID: node, SessionID: ids[i], GatewayID: "gw-bench", RemoteAddr: "10.0.0.1:40000"}); err != nil {
			b.Fatal(err)
		}
	}
	return ids
}

func report(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
