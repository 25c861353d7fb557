package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

// testPKIRotations: one open rotation per CA, phase moves only from the
// phase named (ErrConflict otherwise) with their events, and acks counted
// among live nodes (those with a session) with the missing listed.
func testPKIRotations(ctx context.Context, t *testing.T, h *Harness) {
	_, err := h.Store.PKIRotationLatest(ctx, store.RotationCANode)
	wantErr(t, err, store.ErrNotFound)
	ro := must(h.Store.PKIRotationCreate(ctx, &store.PKIRotationCreateParams{CA: store.RotationCANode, OldCAID: "old",
		NewCAID: "new", Threshold: 0.99, StartedBy: "token:t1"}))
	if ro.Phase != store.RotationPropagating || ro.Threshold != 0.99 || ro.ActivatedAt != nil {
		t.Fatalf("rotation = %+v", ro)
	}
	_, err = h.Store.PKIRotationCreate(ctx, &store.PKIRotationCreateParams{CA: store.RotationCANode, OldCAID: "old", NewCAID: "n2", Threshold: 1})
	wantErr(t, err, store.ErrConflict)
	if l := must(h.Store.PKIRotationLatest(ctx, store.RotationCANode)); l.ID != ro.ID {
		t.Fatalf("latest = %s, want %s", l.ID, ro.ID)
	}

	pool := fixture(ctx, t, h)
	var ids []string
	for i := range 3 {
		id := fmt.Sprintf("node_rot%d", i)
		addNode(ctx, t, h, pool, id)
		ids = append(ids, id)
	}
	for _, id := range ids[:2] {
		if _, _, err := h.Store.SessionOpen(ctx, &store.SessionOpenParams{NodeID: id, SessionID: "sess_" + id, GatewayID: "gw-1"}); err != nil {
			t.Fatal(err)
		}
	}
	counts := must(h.Store.PKIRotationAckCounts(ctx, ro.ID, 10))
	if counts.Live != 2 || counts.Acked != 0 || !slices.Equal(counts.Missing, ids[:2]) {
		t.Fatalf("counts before acks = %+v", counts)
	}
	// The node without a session acks too; a deleted node is skipped.
	check(t, h.Store.PKIRotationAck(ctx, ro.ID, []string{ids[0], ids[2], "node_gone"}, nil))
	check(t, h.Store.PKIRotationAck(ctx, ro.ID, []string{ids[0]}, nil))
	counts = must(h.Store.PKIRotationAckCounts(ctx, ro.ID, 10))
	if counts.Live != 2 || counts.Acked != 1 || !slices.Equal(counts.Missing, ids[1:2]) {
		t.Fatalf("counts after acks = %+v", counts)
	}

	_, err = h.Store.PKIRotationSetPhase(ctx, &store.PKIRotationSetPhaseParams{ID: ro.ID, From: store.RotationActivated, To: store.RotationRetired})
	wantErr(t, err, store.ErrConflict)
	_, err = h.Store.PKIRotationSetPhase(ctx, &store.PKIRotationSetPhaseParams{ID: "rot_none", From: store.RotationActivated, To: store.RotationRetired})
	wantErr(t, err, store.ErrNotFound)
	act := must(h.Store.PKIRotationSetPhase(ctx, &store.PKIRotationSetPhaseParams{ID: ro.ID, From: store.RotationPropagating,
		To: store.RotationActivated, Actor: "reconciler", Reason: "threshold"}))
	if act.Phase != store.RotationActivated || act.ActivatedAt == nil {
		t.Fatalf("activated = %+v", act)
	}
	ret := must(h.Store.PKIRotationSetPhase(ctx, &store.PKIRotationSetPhaseParams{ID: ro.ID, From: store.RotationActivated,
		To: store.RotationRetired, Forced: true}))
	if ret.Phase != store.RotationRetired || ret.RetiredAt == nil {
		t.Fatalf("retired = %+v", ret)
	}
	// Closed, the CA can rotate again.
	next := must(h.Store.PKIRotationCreate(ctx, &store.PKIRotationCreateParams{CA: store.RotationCANode, OldCAID: "new", NewCAID: "n3", Threshold: 1}))
	must(h.Store.PKIRotationSetPhase(ctx, &store.PKIRotationSetPhaseParams{ID: next.ID, From: store.RotationPropagating, To: store.RotationRolledBack}))

	// Which valid certificates are off the new CA.
	future := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	past := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)
	must(h.Store.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_ca1", PoolID: pool.ID, Hostname: "ca1", CertSerial: "c1",
		CertNotAfter: &future, CertCAID: "old"}))
	must(h.Store.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_ca2", PoolID: pool.ID, Hostname: "ca2", CertSerial: "c2",
		CertNotAfter: &past, CertCAID: "old"}))
	if n, ids := mustCount(h.Store.NodeCertsOffCA(ctx, "new", nil, 10)); n != 1 || !slices.Equal(ids, []string{"node_ca1"}) {
		t.Fatalf("off the new CA: %d %q, want node_ca1 (node_ca2's certificate expired)", n, ids)
	}
	check(t, h.Store.NodeSetCertificate(ctx, &store.NodeSetCertificateParams{ID: "node_ca1", Serial: "c3", NotAfter: future, CAID: "new"}))
	// A refresh without a CA id keeps the node's.
	must(h.Store.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_ca1", PoolID: pool.ID, Hostname: "ca1", CertSerial: "c3", CertNotAfter: &future}))
	if n, _ := mustCount(h.Store.NodeCertsOffCA(ctx, "new", nil, 10)); n != 0 {
		t.Fatalf("off the new CA after renewal: %d, want 0", n)
	}

	var got []string
	for _, e := range must(h.Store.OutboxList(ctx, 0, store.MaxListLimit)) {
		if e.Key == ro.ID || e.Key == next.ID {
			got = append(got, e.Topic)
		}
	}
	want := []string{events.PKIRotationStarted, events.PKIRotationActivated, events.PKIRotationRetired,
		events.PKIRotationStarted, events.PKIRotationRolledBack}
	if !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

// mustCount returns NodeCertsOffCA's count and ids, or fails the test.
func mustCount(n int, ids []string, err error) (int, []string) {
	must(0, err)
	return n, ids
}

// producePKIRotationEvents writes every pki.rotation-* event: one rotation
// started, activated and retired, another started and rolled back.
func producePKIRotationEvents(ctx context.Context, t *testing.T, h *Harness) {
	t.Helper()
	ro := must(h.Store.PKIRotationCreate(ctx, &store.PKIRotationCreateParams{CA: store.RotationCANode, OldCAID: "ev-old", NewCAID: "ev-new", Threshold: 1}))
	must(h.Store.PKIRotationSetPhase(ctx, &store.PKIRotationSetPhaseParams{ID: ro.ID, From: store.RotationPropagating, To: store.RotationActivated}))
	must(h.Store.PKIRotationSetPhase(ctx, &store.PKIRotationSetPhaseParams{ID: ro.ID, From: store.RotationActivated, To: store.RotationRetired}))
	next := must(h.Store.PKIRotationCreate(ctx, &store.PKIRotationCreateParams{CA: store.RotationCANode, OldCAID: "ev-new", NewCAID: "ev-3", Threshold: 1}))
	must(h.Store.PKIRotationSetPhase(ctx, &store.PKIRotationSetPhaseParams{ID: next.ID, From: store.RotationPropagating, To: store.RotationRolledBack}))
}
