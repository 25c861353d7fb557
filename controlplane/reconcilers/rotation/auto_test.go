package rotation_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rotation"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// TestRotationDueAndActivateBy: a node CA is due at half its life (counted
// from when it was made, not from its backdated NotBefore), and a rotation
// away from it must activate at five sixths, or sooner where less than a
// node certificate's life plus the margin would be left; after a rollback
// the reconciler waits half the time left to that deadline.
func TestRotationDueAndActivateBy(t *testing.T) {
	t.Parallel()
	made := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	b, err := pki.Init(pki.InitOptions{TrustDomain: "td.example", Now: made, NodeValidity: 12 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ca := b.NodeCA.Cert
	if got := pki.CAMadeAt(ca); !got.Equal(made) {
		t.Fatalf("CAMadeAt = %s, want %s", got, made)
	}
	if got := ca.NotAfter.Sub(made); got != 12*time.Minute {
		t.Fatalf("node CA life %s, want 12m", got)
	}
	if got := b.GatewayCA.Cert.NotAfter.Sub(made); got != pki.DefaultCAValidity {
		t.Fatalf("gateway CA life %s, want the default", got)
	}
	if got := rotation.Due(ca, time.Minute, nil); !got.Equal(made.Add(6 * time.Minute)) {
		t.Fatalf("Due = %s, want half the life", got)
	}
	if got := rotation.ActivateBy(ca, time.Minute); !got.Equal(made.Add(10 * time.Minute)) {
		t.Fatalf("ActivateBy with 1m certificates = %s, want five sixths", got)
	}
	by := rotation.ActivateBy(ca, 5*time.Minute)
	if want := ca.NotAfter.Add(-5*time.Minute - rotation.ActivateMargin); !by.Equal(want) {
		t.Fatalf("ActivateBy with 5m certificates = %s, want %s (a full certificate and the margin before the end)", by, want)
	}
	rolledBack := made.Add(6 * time.Minute)
	if got, want := rotation.Due(ca, time.Minute, &rolledBack), rolledBack.Add(2*time.Minute); !got.Equal(want) {
		t.Fatalf("Due after a rollback = %s, want %s (half the 4m to the deadline)", got, want)
	}
	// Half the time to the deadline (25 s with 5m certificates) is less
	// than the least hold: a twelfth of this short CA's life (1m), at most
	// ten minutes.
	if got, want := rotation.Due(ca, 5*time.Minute, &rolledBack), rolledBack.Add(time.Minute); !got.Equal(want) || by.Sub(rolledBack)/2 >= time.Minute {
		t.Fatalf("Due after a rollback close to the deadline = %s, want %s", got, want)
	}
	// So does a rollback past the deadline.
	if got := rotation.RollbackHold(ca); got != time.Minute {
		t.Fatalf("RollbackHold of a 12m CA = %s, want 1m", got)
	}
	late := made.Add(11 * time.Minute)
	if got, want := rotation.Due(ca, time.Minute, &late), late.Add(time.Minute); !got.Equal(want) {
		t.Fatalf("Due after a rollback past the deadline = %s, want %s (the least hold)", got, want)
	}
	long, err := pki.Init(pki.InitOptions{TrustDomain: "td.example", Now: made})
	if err != nil {
		t.Fatal(err)
	}
	late = rotation.ActivateBy(long.NodeCA.Cert, time.Hour).Add(time.Hour)
	if got, want := rotation.Due(long.NodeCA.Cert, time.Hour, &late), late.Add(rotation.MaxRollbackHold); !got.Equal(want) {
		t.Fatalf("Due after a rollback past a ten-year CA's deadline = %s, want %s (ten minutes on)", got, want)
	}
}

// TestRotationAutoRotate: with AutoRotate the reconciler starts a rotation
// once the node CA in force has passed half its life, as the reconciler (the
// rotation's starter and the audit row's actor), again after an operator's
// rollback only once half the time to the deadline passed, and activates
// it, forced,
// at the old CA's deadline although no live node acknowledged; without
// AutoRotate it does neither.
func TestRotationAutoRotate(t *testing.T) {
	t.Parallel()
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
	// One live node that never acknowledges.
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_000", PoolID: pool.ID, Hostname: "n", CertSerial: "s"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.SessionOpen(ctx, &store.SessionOpenParams{NodeID: "node_000", SessionID: "sess", GatewayID: "gw"}); err != nil {
		t.Fatal(err)
	}
	made := pki.CAMadeAt(b.NodeCA.Cert)
	var now time.Time
	clock := func() time.Time { return now }
	manual, err := rotation.New(rotation.Config{Secret: secret, NodeCertTTL: time.Minute, Now: clock}, st)
	if err != nil {
		t.Fatal(err)
	}
	auto, err := rotation.New(rotation.Config{Secret: secret, NodeCertTTL: time.Minute, AutoRotate: true,
		CAValidity: 12 * time.Minute, Now: clock}, st)
	if err != nil {
		t.Fatal(err)
	}
	reconcile := func(r *rotation.Rotator, at time.Duration, want string) {
		t.Helper()
		now = made.Add(at)
		if moved, err := r.Reconcile(ctx, nil); err != nil || moved != want {
			t.Fatalf("Reconcile at %s of the CA's life: %q, %v, want %q", at, moved, err, want)
		}
	}
	reconcile(auto, 6*time.Minute-time.Second, "")
	reconcile(manual, 11*time.Minute, "")
	reconcile(auto, 6*time.Minute, store.RotationPropagating)
	if reason := newestReason(t, st); !strings.Contains(reason, "passed half its life") || strings.Contains(reason, "rolled back") {
		t.Fatalf("the audit reason of the first start: %q, want half its life passed", reason)
	}
	// An operator rolls it back at 7m: the reconciler waits half the time
	// from then to the deadline (10m) before it starts again.
	now = made.Add(7 * time.Minute)
	if _, err := auto.Rollback(ctx, "token:t", "not now"); err != nil {
		t.Fatal(err)
	}
	reconcile(auto, 8*time.Minute+29*time.Second, "")
	reconcile(auto, 8*time.Minute+30*time.Second, store.RotationPropagating)
	if reason := newestReason(t, st); !strings.Contains(reason, "rolled back") || !strings.Contains(reason, "waited until") {
		t.Fatalf("the audit reason of the start after a rollback: %q, want it to say the reconciler waited after the rollback", reason)
	}
	ro, err := st.PKIRotationLatest(ctx, store.RotationCANode)
	if err != nil || ro.StartedBy != rotation.ActorReconciler || ro.OldCAID != pki.NodeCAID(b.NodeCA.Cert) {
		t.Fatalf("the started rotation: %+v, %v, want started by the reconciler from the CA in force", ro, err)
	}
	wantAudit(t, st, rotation.AuditStarted, false)
	next := loadBundle(t, st).NextNodeCA.Cert
	if got := next.NotAfter.Sub(pki.CAMadeAt(next)); got != 12*time.Minute {
		t.Fatalf("the next node CA lives %s, want the configured 12m", got)
	}

	reconcile(manual, 10*time.Minute, "") // only AutoRotate activates below the threshold
	reconcile(auto, 10*time.Minute-time.Second, "")
	reconcile(auto, 10*time.Minute, store.RotationActivated)
	wantAudit(t, st, rotation.AuditActivated, true)
	if b := loadBundle(t, st); pki.NodeCAID(b.NodeCA.Cert) != ro.NewCAID {
		t.Fatalf("after the forced activation the issuer is %s, want %s", pki.NodeCAID(b.NodeCA.Cert), ro.NewCAID)
	}
}

// newestReason is the reason of the newest audit row.
func newestReason(t *testing.T, st store.Store) string {
	t.Helper()
	audits, err := st.AuditQuery(context.Background(), &store.AuditQueryParams{})
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(audits[0].Details, &d); err != nil {
		t.Fatal(err)
	}
	return d.Reason
}

// wantAudit checks the newest audit row: action by the reconciler, forced
// or not.
func wantAudit(t *testing.T, st store.Store, action string, forced bool) {
	t.Helper()
	audits, err := st.AuditQuery(context.Background(), &store.AuditQueryParams{})
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Forced bool   `json:"forced"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(audits[0].Details, &d); err != nil {
		t.Fatal(err)
	}
	if audits[0].Action != action || audits[0].Actor != rotation.ActorReconciler || d.Forced != forced || d.Reason == "" {
		t.Fatalf("newest audit row %s by %s (forced %v, reason %q), want %s by the reconciler, forced %v, with a reason",
			audits[0].Action, audits[0].Actor, d.Forced, d.Reason, action, forced)
	}
}
