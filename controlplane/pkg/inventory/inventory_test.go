package inventory_test

import (
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/inventory"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TestDecodeAndHealth: a stored inventory decodes (unknown fields dropped),
// an empty or broken one is nil, and health names are lower case with an
// unset health "ok".
func TestDecodeAndHealth(t *testing.T) {
	inv := inventory.Decode([]byte(`{"gpus":[{"uuid":"GPU-1"},{"uuid":"GPU-2","health":{"state":"GPU_HEALTH_STATE_FAILED"}}],"fromNewerBcd":1}`))
	if len(inv.GetGpus()) != 2 {
		t.Fatalf("Decode = %v", inv)
	}
	if got := []string{inventory.HealthName(inv.GetGpus()[0].GetHealth()), inventory.HealthName(inv.GetGpus()[1].GetHealth())}; got[0] != "ok" || got[1] != "failed" {
		t.Fatalf("health names %v, want [ok failed]", got)
	}
	if inventory.Decode(nil) != nil || inventory.Decode([]byte("{not json")) != nil {
		t.Fatal("an empty or broken inventory decoded")
	}
	degraded := &sessionv1.GPUHealth{State: sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED}
	if inventory.HealthName(degraded) != "degraded" {
		t.Fatalf("HealthName(degraded) = %q", inventory.HealthName(degraded))
	}
}
