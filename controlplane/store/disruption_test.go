package store_test

import (
	"testing"

	"github.com/better-compute/better-compute/controlplane/store"
)

// TestAdmission: DisruptionAdmit's rule, as the fleet page previews it (the
// conformance suite checks the same rule through the store).
func TestAdmission(t *testing.T) {
	free := &store.PoolBudget{Budget: 1, OutOfService: 0, RemediationConcurrency: 2}
	full := &store.PoolBudget{Budget: 1, OutOfService: 1, RemediationConcurrency: 2}
	busy := &store.PoolBudget{Budget: 5, OutOfService: 2, Remediating: 2, RemediationConcurrency: 2}
	for _, tc := range []struct {
		name                        string
		b                           *store.PoolBudget
		held, holder, state, reason string
		owner, wantRefusal          string
		wantSlot                    bool
	}{
		{"drain in service, a free slot", free, "", "", store.NodeReady, store.DisruptionDraining, "operator", "", true},
		{"drain in service, budget full", full, "", "", store.NodeReady, store.DisruptionDraining, "operator", store.RefusalBudget, false},
		{"drain of a node out by its state", full, "", "", store.NodeUnreachable, store.DisruptionDraining, "operator", "", false},
		{"held by another owner", free, store.DisruptionUpgrading, "rollout:r", store.NodeReady, store.DisruptionDraining, "operator", store.RefusalHeld, false},
		{"the same hold again", full, store.DisruptionDraining, "operator", store.NodeDraining, store.DisruptionDraining, "operator", "", false},
		{"quarantine with the budget full", full, "", "", store.NodeReady, store.DisruptionQuarantined, "remediation:c", "", true},
		{"quarantine takes over a rollout's hold", full, store.DisruptionUpgrading, "rollout:r", store.NodeReady, store.DisruptionQuarantined, "remediation:c", "", false},
		{"remediating a node in service", free, "", "", store.NodeReady, store.DisruptionRemediating, "remediation:c", store.RefusalBudget, false},
		{"remediating past the concurrency", busy, store.DisruptionDraining, "remediation:c", store.NodeReady, store.DisruptionRemediating, "remediation:c", store.RefusalConcurrency, false},
	} {
		refusal, slot := store.Admission(tc.b, tc.held, tc.holder, tc.state, tc.reason, tc.owner)
		if refusal != tc.wantRefusal || slot != tc.wantSlot {
			t.Errorf("%s: refusal %q slot %v, want %q %v", tc.name, refusal, slot, tc.wantRefusal, tc.wantSlot)
		}
	}
}
