package api

import (
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// TestTenantDenied: a child tenant's token calls the scoped methods and is
// refused every other, read or change; a root token is refused nothing.
func TestTenantDenied(t *testing.T) {
	known := map[string]bool{}
	for _, m := range apiv1.Methods {
		known[m.Name] = true
	}
	for name := range tenantScoped {
		if !known[name] {
			t.Errorf("tenantScoped names %s, which api.proto does not", name)
		}
	}
	root := &iam.Principal{TenantID: store.RootTenant}
	child := &iam.Principal{TenantID: "ten_child"}
	for _, c := range []struct {
		p      *iam.Principal
		name   string
		denied bool
	}{
		{child, "nodes.drain", false},
		{child, "commands.create", false},
		{child, "gateways.list", true},
		{child, "events.list", false},
		{child, "nodes.move", false},
		{child, "reservations.list", false},
		{child, "capacity.summary", false},
		{child, "gpus.list", false},
		{child, "gpus.get", false},
		{child, "remediation.stats", false},
		{child, "fleet.summary", false},
		{child, "pki.revoke", true},
		{child, "pki.rotationStart", true},
		{child, "gateways.drain", true},
		{child, "sinks.replay", false},
		{child, "reservations.create", false},
		{child, "rollouts.create", false},
		{child, "recordings.list", false},
		{child, "recordings.get", false},
		{child, "pki.rotationStatus", true},
		{child, "rollouts.list", false},
		{child, "rollouts.abort", false},
		{child, "remediation.breakers", false},
		{child, "remediation.history", false},
		{child, "remediation.resetBreaker", false},
		{child, "nodes.setGPUCount", false},
		{child, "nodes.reinstall", false},
		{child, "bmc.setCredentials", true},
		{child, "release.pinsAdd", true},
		{child, "processes.list", true},
		{child, "sinks.deadLetters", false},
		{root, "pki.revoke", false},
		{root, "recordings.get", false},
	} {
		if !known[c.name] {
			t.Fatalf("case %s: api.proto has no such method", c.name)
		}
		if got := tenantDenied(c.p, c.name); got != c.denied {
			t.Errorf("tenant %s calling %s: denied %v, want %v", c.p.TenantID, c.name, got, c.denied)
		}
	}
}
