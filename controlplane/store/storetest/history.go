package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// testHistoryPrune: retention.history deletes closed reservations and
// finished rollouts that closed before the cutoff, and keeps open ones and
// those that closed after it. The rows are written at an injected time in
// 2001, so the prune does not touch what parallel cases write now.
func testHistoryPrune(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	at := func(day int) *time.Time {
		v := time.Date(2001, 1, day, 0, 0, 0, 0, time.UTC)
		return &v
	}
	cutoff := *at(10)
	pool := fixture(ctx, t, h)
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	reserve := func(day int) *store.Reservation {
		return must(st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: pool.ID, GPUs: 1, Start: t0, End: t0.Add(time.Hour),
			Owner: "team-h", Now: at(day)}))
	}
	cancelledOld, failedOld, cancelledNew, open := reserve(1), reserve(1), reserve(1), reserve(1)
	must(st.ReservationCancel(ctx, &store.ReservationCancelParams{ID: cancelledOld.ID, Now: at(2)}))
	must(st.ReservationTransition(ctx, &store.ReservationTransitionParams{ID: failedOld.ID, From: store.ReservationPending,
		To: store.ReservationFailed, Reason: "no capacity", Now: at(3)}))
	must(st.ReservationCancel(ctx, &store.ReservationCancelParams{ID: cancelledNew.ID, Now: at(20)}))

	if n := must(st.ReservationPrune(ctx, cutoff)); n != 2 {
		t.Fatalf("pruned %d reservations, want the 2 closed before the cutoff", n)
	}
	for _, r := range []*store.Reservation{cancelledOld, failedOld} {
		if _, err := st.ReservationGet(ctx, r.ID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("reservation %s closed before the cutoff: %v, want ErrNotFound", r.ID, err)
		}
	}
	for _, r := range []*store.Reservation{cancelledNew, open} {
		must(st.ReservationGet(ctx, r.ID))
	}

	rollout := func(p *store.Pool, day int) *store.Rollout {
		return must(st.RolloutCreate(ctx, &store.RolloutCreateParams{PoolID: p.ID, Version: "0.2.0", Canary: 1, Wave: "1",
			MaxUnavailable: "1", Timeout: time.Minute, Now: at(day)}))
	}
	pools := []*store.Pool{fixture(ctx, t, h), fixture(ctx, t, h), fixture(ctx, t, h)}
	abortedOld, completedNew, running := rollout(pools[0], 1), rollout(pools[1], 1), rollout(pools[2], 1)
	must(st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: abortedOld.ID, State: store.RolloutAborted, Now: at(2)}))
	must(st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: completedNew.ID, State: store.RolloutCompleted, Now: at(20)}))
	must(st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: running.ID, State: store.RolloutRunning, Now: at(2)}))

	if n := must(st.RolloutPrune(ctx, cutoff)); n != 1 {
		t.Fatalf("pruned %d rollouts, want the 1 finished before the cutoff", n)
	}
	if _, err := st.RolloutGet(ctx, abortedOld.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("rollout aborted before the cutoff: %v, want ErrNotFound", err)
	}
	for _, ro := range []*store.Rollout{completedNew, running} {
		must(st.RolloutGet(ctx, ro.ID))
	}
	// The pruned rollout's pool takes a new rollout; the prune is a no-op
	// the second time.
	rollout(pools[0], 21)
	if n := must(st.RolloutPrune(ctx, cutoff)); n != 0 {
		t.Fatalf("second prune deleted %d rollouts", n)
	}

	// Remediation cases: a returned one closed before the cutoff goes, one
	// returned after it and an escalated (open) one stay.
	remediated := func(node string, day int, to string) *store.Remediation {
		id := "node_hp_" + node + "_" + store.NewID("x")
		addNode(ctx, t, h, pool, id)
		c := must(st.RemediationCreate(ctx, &store.Remediation{NodeID: id, State: store.RemediationDetected, Finding: "xid",
			Resolution: "RESET_GPU", XID: 95, Action: "gpu.reset", CreatedAt: *at(day)}, "remediation:h"))
		return must(st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, From: []string{store.RemediationDetected},
			To: to, Actor: "remediation:h", Now: at(day + 1)}))
	}
	returnedOld := remediated("a", 1, store.RemediationReturned)
	returnedNew := remediated("b", 19, store.RemediationReturned)
	escalated := remediated("c", 1, store.RemediationEscalated)
	if n := must(st.RemediationPrune(ctx, cutoff)); n != 1 {
		t.Fatalf("pruned %d remediation cases, want the 1 closed before the cutoff", n)
	}
	if _, err := st.RemediationGet(ctx, returnedOld.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("case returned before the cutoff: %v, want ErrNotFound", err)
	}
	for _, c := range []*store.Remediation{returnedNew, escalated} {
		must(st.RemediationGet(ctx, c.ID))
	}
}
