package rotation_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rotation"
	"github.com/better-compute/better-compute/controlplane/store"
)

// TestInternalCARotation walks an internal-CA rotation on the processes'
// rows: it activates only once every process with the internal control
// API trusts the new CA (a worker-only process, reporting none, is not
// counted; the threshold does not apply), and retires only once each
// presents a certificate from it.
func TestInternalCARotation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, before, _ := fleet(t, 1)
	oldID := pki.NodeCAID(before.InternalCA.Cert)
	beat := func(id string, trusts []string, presents string) {
		t.Helper()
		if _, err := st.ProcessHeartbeat(ctx, &store.ProcessHeartbeatParams{ID: id, Roles: []string{"api"},
			InternalCAs: trusts, InternalCertCA: presents}); err != nil {
			t.Fatal(err)
		}
	}
	beat("vm-api", []string{oldID}, oldID)
	beat("vm-gw", []string{oldID}, oldID)
	beat("vm-worker", []string{store.NoInternalAPI}, "")
	// A worker of a build before migration 0031 reports nothing, and uses
	// no internal control API: not counted either.
	if _, err := st.ProcessHeartbeat(ctx, &store.ProcessHeartbeatParams{ID: "vm-old-worker", Roles: []string{"controllers"}}); err != nil {
		t.Fatal(err)
	}
	r, err := rotation.New(rotation.Config{Secret: secret, CA: store.RotationCAInternal, Threshold: 0.5}, st)
	if err != nil {
		t.Fatal(err)
	}
	ro, err := r.Start(ctx, rotation.StartParams{Actor: "token:t"})
	if err != nil {
		t.Fatal(err)
	}
	if ro.CA != store.RotationCAInternal || ro.OldCAID != oldID {
		t.Fatalf("rotation %+v", ro)
	}
	b := loadBundle(t, st)
	if b.NextInternalCA == nil || len(b.InternalCARoots()) != 2 || !b.InternalCA.Cert.Equal(before.InternalCA.Cert) {
		t.Fatal("start did not prepare the next internal CA beside the one in force")
	}
	newID := ro.NewCAID
	// One of two processes trusts it: half, the threshold, is not enough.
	beat("vm-api", []string{oldID, newID}, oldID)
	if moved, err := r.Reconcile(ctx, nil); err != nil || moved != "" {
		t.Fatalf("Reconcile with 1 of 2 processes trusting: %q, %v", moved, err)
	}
	stat, err := r.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stat.Live != 2 || stat.Acked != 1 || len(stat.Missing) != 1 || stat.Missing[0] != "vm-gw" || !strings.Contains(stat.Waiting, "vm-gw") {
		t.Fatalf("status at 1 of 2: %+v", stat)
	}
	_, err = r.Advance(ctx, rotation.AdvanceParams{Actor: "token:t"})
	var nr *rotation.NotReadyError
	if !errors.As(err, &nr) {
		t.Fatalf("Advance at 1 of 2: %v, want NotReadyError", err)
	}
	beat("vm-gw", []string{oldID, newID}, oldID)
	if moved, err := r.Reconcile(ctx, nil); err != nil || moved != store.RotationActivated {
		t.Fatalf("Reconcile with every process trusting: %q, %v", moved, err)
	}
	b = loadBundle(t, st)
	if pki.NodeCAID(b.InternalCA.Cert) != newID || b.PreviousInternalCA == nil {
		t.Fatal("activation did not make the new internal CA the one in force")
	}
	// Retires only once both present a certificate from the new CA.
	beat("vm-api", []string{newID, oldID}, newID)
	if moved, err := r.Reconcile(ctx, nil); err != nil || moved != "" {
		t.Fatalf("Reconcile with one process on the old certificate: %q, %v", moved, err)
	}
	if stat, err = r.Status(ctx); err != nil || stat.OffNewCA != 1 || stat.OffNewCAIDs[0] != "vm-gw" {
		t.Fatalf("status with vm-gw on the old certificate: %+v, %v", stat, err)
	}
	beat("vm-gw", []string{newID, oldID}, newID)
	// An api of a build too old to report holds it back, named.
	if _, err := st.ProcessHeartbeat(ctx, &store.ProcessHeartbeatParams{ID: "vm-old-api", Roles: []string{"api"}}); err != nil {
		t.Fatal(err)
	}
	if moved, err := r.Reconcile(ctx, nil); err != nil || moved != "" {
		t.Fatalf("Reconcile with an older build's api registered: %q, %v", moved, err)
	}
	if stat, err = r.Status(ctx); err != nil || stat.Live != 3 || !strings.Contains(stat.Waiting, "vm-old-api") {
		t.Fatalf("status with an older build's api: %+v, %v", stat, err)
	}
	if err := st.ProcessDelete(ctx, "vm-old-api"); err != nil {
		t.Fatal(err)
	}
	if moved, err := r.Reconcile(ctx, nil); err != nil || moved != store.RotationRetired {
		t.Fatalf("Reconcile with every process on the new CA: %q, %v", moved, err)
	}
	b = loadBundle(t, st)
	if len(b.InternalCARoots()) != 1 || pki.NodeCAID(b.InternalCA.Cert) != newID {
		t.Fatal("retire did not leave the new internal CA alone")
	}
	// The node CA and the gateway CA were left alone.
	if !b.NodeCA.Cert.Equal(before.NodeCA.Cert) || !b.GatewayCA.Cert.Equal(before.GatewayCA.Cert) {
		t.Fatal("an internal-CA rotation changed another CA")
	}
}
