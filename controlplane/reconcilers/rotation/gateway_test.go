package rotation_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/reconcilers/rotation"
	"github.com/better-compute/better-compute/controlplane/store"
)

// TestGatewayCARotation walks a gateway-CA rotation: it activates at the
// threshold of acks, refuses to retire while a join token made before
// start can still be used, naming it, and --force revokes that token with
// an audit row.
func TestGatewayCARotation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, before, ids := fleet(t, 4)
	pools, err := st.PoolList(ctx, &store.ListParams{Limit: 10})
	if err != nil || len(pools) == 0 {
		t.Fatalf("pools: %v", err)
	}
	mk := func(id string, uses int) {
		t.Helper()
		if _, err := st.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{ID: id, SecretHash: []byte(id), PoolID: pools[0].ID,
			MaxUses: uses, ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	mk("oldpintoken1", 2)
	r, err := rotation.New(rotation.Config{Secret: secret, CA: store.RotationCAGateway, Threshold: 0.75}, st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rotation.New(rotation.Config{Secret: secret, CA: "release"}, st); !errors.Is(err, rotation.ErrCA) {
		t.Fatalf("a CA that does not rotate in phases: %v, want ErrCA", err)
	}
	ro, err := r.Start(ctx, rotation.StartParams{Actor: "token:t"})
	if err != nil {
		t.Fatal(err)
	}
	if ro.CA != store.RotationCAGateway {
		t.Fatalf("rotation CA %q", ro.CA)
	}
	b := loadBundle(t, st)
	if b.NextGatewayCA == nil || len(b.GatewayPins()) != 2 || b.GatewayPin() != before.GatewayPin() {
		t.Fatal("start did not prepare the next gateway CA beside the one in force")
	}
	// The node CA has its own rotations.
	nodeRot, err := rotation.New(rotation.Config{Secret: secret}, st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodeRot.Status(ctx); !errors.Is(err, rotation.ErrNoRotation) {
		t.Fatalf("node CA status: %v", err)
	}
	if err := st.PKIRotationAck(ctx, ro.ID, ids[:2], nil); err != nil {
		t.Fatal(err)
	}
	if moved, err := r.Reconcile(ctx, nil); err != nil || moved != "" {
		t.Fatalf("Reconcile at 2 of 4 acks: %q, %v", moved, err)
	}
	if err := st.PKIRotationAck(ctx, ro.ID, ids[2:3], nil); err != nil {
		t.Fatal(err)
	}
	if moved, err := r.Reconcile(ctx, nil); err != nil || moved != store.RotationActivated {
		t.Fatalf("Reconcile at 3 of 4 acks: %q, %v", moved, err)
	}
	b = loadBundle(t, st)
	if b.PreviousGatewayCA == nil || b.GatewayPin() == before.GatewayPin() {
		t.Fatal("activation did not make the new gateway CA the one in force")
	}
	if err := st.PKIRotationAck(ctx, ro.ID, ids[3:], nil); err != nil {
		t.Fatal(err)
	}
	mk("newpintoken1", 1) // made after start: pins both
	if moved, err := r.Reconcile(ctx, nil); err != nil || moved != "" {
		t.Fatalf("Reconcile with an old-pin token live: %q, %v", moved, err)
	}
	_, err = r.Advance(ctx, rotation.AdvanceParams{Actor: "token:t"})
	var nr *rotation.NotReadyError
	if !errors.As(err, &nr) || !strings.Contains(err.Error(), "oldpintoken1") || strings.Contains(err.Error(), "newpintoken1") {
		t.Fatalf("Advance with an old-pin token live: %v, want a refusal naming oldpintoken1 only", err)
	}
	stat, err := r.Advance(ctx, rotation.AdvanceParams{Actor: "token:t", Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if stat.Rotation.Phase != store.RotationRetired {
		t.Fatalf("phase %s", stat.Rotation.Phase)
	}
	tok, err := st.JoinTokenGet(ctx, "oldpintoken1")
	if err != nil || tok.RevokedAt == nil {
		t.Fatalf("old-pin token not revoked: %v", err)
	}
	if tok, err := st.JoinTokenGet(ctx, "newpintoken1"); err != nil || tok.RevokedAt != nil {
		t.Fatalf("two-pin token revoked: %v", err)
	}
	entries, err := st.AuditList(ctx, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range entries {
		found = found || (e.Action == rotation.AuditTokenRevoked && e.Resource == "join-token/oldpintoken1" && e.Actor == "token:t")
	}
	if !found {
		t.Fatal("no audit row for the revoked token")
	}
	b = loadBundle(t, st)
	if b.PreviousGatewayCA != nil || len(b.GatewayPins()) != 1 {
		t.Fatal("retire left the old gateway CA in the bundle")
	}
}
