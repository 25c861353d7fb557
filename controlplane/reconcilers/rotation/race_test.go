package rotation_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rotation"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// shortCA is a store with a bundle whose node CA lives 12 minutes and one
// live node, on a certificate from that CA to its end, that never
// acknowledges; it returns the CA's making time.
func shortCA(t *testing.T) (store.Store, time.Time) {
	t.Helper()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	b, err := bootstrap.InitBundleWith(ctx, st, secret, pki.InitOptions{TrustDomain: "td.example", NodeValidity: 12 * time.Minute})
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
	made := pki.CAMadeAt(b.NodeCA.Cert)
	notAfter := made.Add(12 * time.Minute)
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_000", PoolID: pool.ID, Hostname: "n", CertSerial: "s",
		CertNotAfter: &notAfter, CertCAID: pki.NodeCAID(b.NodeCA.Cert)}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.SessionOpen(ctx, &store.SessionOpenParams{NodeID: "node_000", SessionID: "sess", GatewayID: "gw"}); err != nil {
		t.Fatal(err)
	}
	return st, made
}

// hookStore runs hook once, before the next transaction it runs: after
// the reconciler judged the open rotation and read the old CA, before its
// advance's transaction.
type hookStore struct {
	store.Store
	hook func()
}

func (h *hookStore) Tx(ctx context.Context, fn func(store.Store) error) error {
	if hook := h.hook; hook != nil {
		h.hook = nil
		hook()
	}
	return h.Store.Tx(ctx, fn)
}

// TestRotationForcedActivationRace: the reconciler decides to force a
// propagating rotation past the old CA's deadline to activated, and an
// operator's advance activates it before the reconciler's transaction:
// the reconciler moves nothing (it never forces activated on to
// retired), and the old root stays trusted. Advance with a stale rotation
// or phase fails with ErrChanged and moves nothing.
func TestRotationForcedActivationRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, made := shortCA(t)
	var now time.Time
	clock := func() time.Time { return now }
	operator, err := rotation.New(rotation.Config{Secret: secret, NodeCertTTL: time.Minute, Now: clock}, st)
	if err != nil {
		t.Fatal(err)
	}
	hs := &hookStore{Store: st}
	auto, err := rotation.New(rotation.Config{Secret: secret, NodeCertTTL: time.Minute, AutoRotate: true,
		CAValidity: 12 * time.Minute, Now: clock}, hs)
	if err != nil {
		t.Fatal(err)
	}
	now = made.Add(6 * time.Minute)
	ro, err := operator.Start(ctx, rotation.StartParams{Actor: "token:t"})
	if err != nil {
		t.Fatal(err)
	}
	// Past the deadline (10m), nothing acknowledged: the reconciler forces
	// an activation, but the operator's forced advance comes first.
	now = made.Add(10 * time.Minute)
	hs.hook = func() {
		if _, err := operator.Advance(ctx, rotation.AdvanceParams{Actor: "token:t", Force: true, Reason: "now"}); err != nil {
			t.Errorf("the operator's advance: %v", err)
		}
	}
	if moved, err := auto.Reconcile(ctx, nil); err != nil || moved != "" {
		t.Fatalf("Reconcile after the operator activated meanwhile: %q, %v, want no move", moved, err)
	}
	if hs.hook != nil {
		t.Fatal("the hook did not run: the test no longer puts the operator between the reconciler's read and its advance")
	}
	latest, err := st.PKIRotationLatest(ctx, store.RotationCANode)
	if err != nil || latest.ID != ro.ID || latest.Phase != store.RotationActivated {
		t.Fatalf("latest rotation %+v, %v; want %s activated (not retired)", latest, err, ro.ID)
	}
	if b := loadBundle(t, st); b.PreviousNodeCA == nil || pki.NodeCAID(b.PreviousNodeCA.Cert) != ro.OldCAID {
		t.Fatal("the old node CA left the bundle's roots while the fleet is still on it")
	}
	// The next pass sees activated with the node on the old CA: nothing
	// to do until the retire grace, and nothing forced.
	if moved, err := auto.Reconcile(ctx, nil); err != nil || moved != "" {
		t.Fatalf("the next Reconcile: %q, %v, want no move", moved, err)
	}

	for name, p := range map[string]rotation.AdvanceParams{
		"stale phase":    {ID: ro.ID, From: store.RotationPropagating},
		"other rotation": {ID: "rot_other", From: store.RotationActivated},
		"phase only":     {From: store.RotationPropagating},
	} {
		p.Actor, p.Force = rotation.ActorReconciler, true
		if _, err := operator.Advance(ctx, p); !errors.Is(err, rotation.ErrChanged) {
			t.Errorf("Advance with a %s: %v, want ErrChanged", name, err)
		}
	}
	if latest, err := st.PKIRotationLatest(ctx, store.RotationCANode); err != nil || latest.Phase != store.RotationActivated {
		t.Fatalf("after the refused advances: %+v, %v, want still activated", latest, err)
	}
	// The expected rotation and phase move it.
	s, err := operator.Advance(ctx, rotation.AdvanceParams{Actor: "token:t", Force: true, ID: ro.ID, From: store.RotationActivated})
	if err != nil || s.Rotation.Phase != store.RotationRetired {
		t.Fatalf("Advance from the expected phase: %v, %v, want retired", s, err)
	}
}

// TestRotationReconcileFenced: the reconciler's writes are fenced by its
// lease: with a fence whose lease another worker took over it starts
// nothing (store.ErrFenced); with the lease it holds it starts the
// rotation that is due.
func TestRotationReconcileFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, made := shortCA(t)
	now := made.Add(6 * time.Minute)
	auto, err := rotation.New(rotation.Config{Secret: secret, NodeCertTTL: time.Minute, AutoRotate: true,
		CAValidity: 12 * time.Minute, Now: func() time.Time { return now }}, st)
	if err != nil {
		t.Fatal(err)
	}
	l, ok, err := st.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: rotation.LeaseName, Holder: "w1", TTL: time.Minute})
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	stale := store.Fence{Lease: l.Name, Holder: "w0", Epoch: l.Epoch - 1}
	if moved, err := auto.Reconcile(ctx, &stale); !errors.Is(err, store.ErrFenced) || moved != "" {
		t.Fatalf("Reconcile with a lost lease: %q, %v, want store.ErrFenced", moved, err)
	}
	if _, err := st.PKIRotationLatest(ctx, store.RotationCANode); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a rotation after the fenced Reconcile: %v, want none", err)
	}
	held := store.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch}
	if moved, err := auto.Reconcile(ctx, &held); err != nil || moved != store.RotationPropagating {
		t.Fatalf("Reconcile holding the lease: %q, %v, want propagating", moved, err)
	}
	ro, err := st.PKIRotationLatest(ctx, store.RotationCANode)
	if err != nil {
		t.Fatal(err)
	}
	// Past the deadline the forced activation is fenced as well.
	now = made.Add(10 * time.Minute)
	if moved, err := auto.Reconcile(ctx, &stale); !errors.Is(err, store.ErrFenced) || moved != "" {
		t.Fatalf("forced activation with a lost lease: %q, %v, want store.ErrFenced", moved, err)
	}
	if moved, err := auto.Reconcile(ctx, &held); err != nil || moved != store.RotationActivated {
		t.Fatalf("forced activation holding the lease: %q, %v, want activated", moved, err)
	}
	if latest, err := st.PKIRotationLatest(ctx, store.RotationCANode); err != nil || latest.ID != ro.ID {
		t.Fatalf("latest %+v, %v", latest, err)
	}
}
