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
}

func report(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
