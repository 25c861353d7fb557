package rotation_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rotation"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

const secret = "0123456789abcdef0123456789abcdef"

// fleet is a store with a bundle and n nodes, each with a session and a
// certificate from the bundle's node CA valid for a day.
func fleet(t *testing.T, n int) (store.Store, *pki.Bundle, []string) {
	t.Helper()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	b, err := bootstrap.InitBundle(ctx, st, secret, "td.example")
	if err != nil {
		t.Fatal(err)
	}
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	notAfter := time.Now().Add(24 * time.Hour).UTC()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("node_%03d", i)
		if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: id, CertSerial: "s" + id,
			CertNotAfter: &notAfter, CertCAID: pki.NodeCAID(b.NodeCA.Cert)}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := st.SessionOpen(ctx, &store.SessionOpenParams{NodeID: id, SessionID: "sess_" + id, GatewayID: "gw"}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return st, b, ids
}

func loadBundle(t *testing.T, st store.Store) *pki.Bundle {
	t.Helper()
	b, err := bootstrap.LoadBundle(context.Background(), st, secret)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRotationAdvancesOnProof walks a rotation through its phases: it
// activates only at the threshold of acks (or forced), retires only when
// no node is left on the old CA (or forced), with the bundle, an event and
// an audit row at each step.
func TestRotationAdvancesOnProof(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, before, ids := fleet(t, 10)
	r, err := rotation.New(rotation.Config{Secret: secret, Threshold: 0.9}, st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Status(ctx); !errors.Is(err, rotation.ErrNoRotation) {
		t.Fatalf("Status before any rotation: %v, want ErrNoRotation", err)
	}
	if _, err := r.Start(ctx, rotation.StartParams{Actor: "token:t", Threshold: 1.5}); !errors.Is(err, rotation.ErrThreshold) {
		t.Fatalf("Start with threshold 1.5: %v, want ErrThreshold", err)
	}
	ro, err := r.Start(ctx, rotation.StartParams{Actor: "token:t"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Start(ctx, rotation.StartParams{Actor: "token:t"}); !errors.Is(err, rotation.ErrInProgress) {
		t.Fatalf("second Start: %v, want ErrInProgress", err)
	}
	b := loadBundle(t, st)
	if !b.NodeCA.Cert.Equal(before.NodeCA.Cert) || b.NextNodeCA == nil || pki.NodeCAID(b.NextNodeCA.Cert) != ro.NewCAID {
		t.Fatal("propagating: the old CA must issue with the new one prepared")
	}

	// 8 of 10 acked: below 90 %.
	if err := st.PKIRotationAck(ctx, ro.ID, ids[:8], nil); err != nil {
		t.Fatal(err)
	}
	s, err := r.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Live != 10 || s.Acked != 8 || len(s.Missing) != 2 || s.Ready {
		t.Fatalf("status = %+v", s)
	}
	var nr *rotation.NotReadyError
	if _, err := r.Advance(ctx, rotation.AdvanceParams{Actor: "token:t"}); !errors.As(err, &nr) || nr.Phase != store.RotationPropagating {
		t.Fatalf("Advance below the threshold: %v, want a NotReadyError", err)
	}
	if err := st.PKIRotationAck(ctx, ro.ID, ids[8:9], nil); err != nil {
		t.Fatal(err)
	}
	s, err = r.Advance(ctx, rotation.AdvanceParams{Actor: "token:t"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Rotation.Phase != store.RotationActivated {
		t.Fatalf("phase %s, want activated", s.Rotation.Phase)
	}
	b = loadBundle(t, st)
	if pki.NodeCAID(b.NodeCA.Cert) != ro.NewCAID || b.PreviousNodeCA == nil {
		t.Fatal("activated: the new CA must issue with the old one kept")
	}

	// Every node is still on the old CA: retiring needs force.
	if _, err := r.Advance(ctx, rotation.AdvanceParams{Actor: "token:t"}); !errors.As(err, &nr) || nr.Phase != store.RotationActivated {
		t.Fatalf("Advance with nodes on the old CA: %v, want a NotReadyError", err)
	}
	notAfter := time.Now().Add(24 * time.Hour)
	for _, id := range ids {
		if err := st.NodeSetCertificate(ctx, &store.NodeSetCertificateParams{ID: id, Serial: "r" + id, NotAfter: notAfter, CAID: ro.NewCAID}); err != nil {
			t.Fatal(err)
		}
	}
	s, err = r.Advance(ctx, rotation.AdvanceParams{Actor: "token:t"})
	if err != nil || s.Rotation.Phase != store.RotationRetired {
		t.Fatalf("Advance with every node on the new CA: %v, %+v", err, s)
	}
	b = loadBundle(t, st)
	if b.PreviousNodeCA != nil || len(b.RetiredNodeRoots) != 1 || len(b.NodeCARoots()) != 1 {
		t.Fatal("retired: the old CA must be out of the serving roots and kept for re-attestation")
	}
	if _, err := r.Rollback(ctx, "token:t", ""); !errors.Is(err, rotation.ErrNoRotation) {
		t.Fatalf("Rollback after retired: %v, want ErrNoRotation", err)
	}
	audits, err := st.AuditQuery(ctx, &store.AuditQueryParams{})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, a := range audits {
		actions = append(actions, a.Action)
	}
	want := []string{rotation.AuditRetired, rotation.AuditActivated, rotation.AuditStarted}
	if fmt.Sprint(actions[:3]) != fmt.Sprint(want) {
		t.Fatalf("audit actions %q, want %q first", actions, want)
	}
}

// TestRotationForceAndRollback: a forced advance is marked forced, and a
// rollback from activated makes the old CA issue again.
func TestRotationForceAndRollback(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, before, _ := fleet(t, 3)
	r, err := rotation.New(rotation.Config{Secret: secret}, st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Rollback(ctx, "token:t", ""); !errors.Is(err, rotation.ErrNoRotation) {
		t.Fatalf("Rollback with none: %v, want ErrNoRotation", err)
	}
	if _, err := r.Start(ctx, rotation.StartParams{Actor: "token:t"}); err != nil {
		t.Fatal(err)
	}
	s, err := r.Advance(ctx, rotation.AdvanceParams{Actor: "token:t", Force: true})
	if err != nil || s.Rotation.Phase != store.RotationActivated {
		t.Fatalf("forced advance: %v", err)
	}
	ro, err := r.Rollback(ctx, "token:t", "test")
	if err != nil || ro.Phase != store.RotationRolledBack {
		t.Fatalf("rollback: %v", err)
	}
	b := loadBundle(t, st)
	if !b.NodeCA.Cert.Equal(before.NodeCA.Cert) || b.PreviousNodeCA != nil || b.NextNodeCA != nil || len(b.NodeCARoots()) != 2 {
		t.Fatal("rolled back: the old CA must issue, the new one's root still trusted")
	}
	// A new rotation can start after a rollback, and roll back from propagating.
	if _, err := r.Start(ctx, rotation.StartParams{Actor: "token:t"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Rollback(ctx, "token:t", ""); err != nil {
		t.Fatal(err)
	}
	if b := loadBundle(t, st); b.NextNodeCA != nil {
		t.Fatal("rollback from propagating left the next CA")
	}
	entries, err := st.OutboxList(ctx, 0, store.MaxListLimit)
	if err != nil {
		t.Fatal(err)
	}
	forced := false
	for _, e := range entries {
		if e.Topic == events.PKIRotationActivated {
			forced = strings.Contains(string(e.Payload), `"forced":true`)
		}
	}
	if !forced {
		t.Fatal("the forced activation's event does not say forced")
	}
}

// TestRotationReconcile: the reconciler activates at the threshold, not
// before, and retires once every node is on the new CA, with no operator.
func TestRotationReconcile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, _, ids := fleet(t, 4)
	r, err := rotation.New(rotation.Config{Secret: secret, Threshold: 0.75}, st)
	if err != nil {
		t.Fatal(err)
	}
	if moved, err := r.Reconcile(ctx, nil); err != nil || moved != "" {
		t.Fatalf("Reconcile with no rotation: %q, %v", moved, err)
	}
	ro, err := r.Start(ctx, rotation.StartParams{Actor: "token:t"})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PKIRotationAck(ctx, ro.ID, ids[:2], nil); err != nil {
		t.Fatal(err)
	}
	if moved, err := r.Reconcile(ctx, nil); err != nil || moved != "" {
		t.Fatalf("Reconcile at 2 of 4 acks (threshold 75 %%): %q, %v", moved, err)
	}
	if err := st.PKIRotationAck(ctx, ro.ID, ids[2:3], nil); err != nil {
		t.Fatal(err)
	}
	if moved, err := r.Reconcile(ctx, nil); err != nil || moved != store.RotationActivated {
		t.Fatalf("Reconcile at 3 of 4 acks: %q, %v, want activated", moved, err)
	}
	if moved, err := r.Reconcile(ctx, nil); err != nil || moved != "" {
		t.Fatalf("Reconcile with every node on the old CA: %q, %v", moved, err)
	}
	for _, id := range ids {
		if err := st.NodeSetCertificate(ctx, &store.NodeSetCertificateParams{ID: id, Serial: "n" + id, NotAfter: time.Now().Add(time.Hour), CAID: ro.NewCAID}); err != nil {
			t.Fatal(err)
		}
	}
	if moved, err := r.Reconcile(ctx, nil); err != nil || moved != store.RotationRetired {
		t.Fatalf("Reconcile with every node on the new CA: %q, %v, want retired", moved, err)
	}
	audits, err := st.AuditQuery(ctx, &store.AuditQueryParams{})
	if err != nil {
		t.Fatal(err)
	}
	if audits[0].Action != rotation.AuditRetired || audits[0].Actor != rotation.ActorReconciler {
		t.Fatalf("newest audit row %s by %s, want %s by the reconciler", audits[0].Action, audits[0].Actor, rotation.AuditRetired)
	}
}

// TestRotationNoLiveNodeIsNoProof: with no live session (every gateway
// down, or no node yet) the reconciler does not activate a rotation, and
// advance refuses saying what is missing; --force still moves it on.
func TestRotationNoLiveNodeIsNoProof(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, _, _ := fleet(t, 0)
	r, err := rotation.New(rotation.Config{Secret: secret}, st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Start(ctx, rotation.StartParams{Actor: "token:t"}); err != nil {
		t.Fatal(err)
	}
	if moved, err := r.Reconcile(ctx, nil); err != nil || moved != "" {
		t.Fatalf("Reconcile with no live node: %q, %v, want no move", moved, err)
	}
	var nr *rotation.NotReadyError
	if _, err := r.Advance(ctx, rotation.AdvanceParams{Actor: "token:t"}); !errors.As(err, &nr) {
		t.Fatalf("Advance with no live node: %v, want NotReadyError", err)
	}
	if st, err := r.Advance(ctx, rotation.AdvanceParams{Actor: "token:t", Force: true}); err != nil || st.Rotation.Phase != store.RotationActivated {
		t.Fatalf("Advance --force: %v, %v, want activated", st, err)
	}
}
