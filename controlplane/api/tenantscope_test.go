package api

import (
	"testing"

	"github.com/better-compute/better-compute/controlplane/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// TestTenantDenied: a child tenant's token calls the scoped methods and
// the unscoped reads, and is refused every unscoped change and the
// recordings; a root token is refused nothing.
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
		p        *iam.Principal
		name     string
		mutating bool
		denied   bool
	}{
		{child, "nodes.drain", true, false},
		{child, "commands.create", true, false},
		{child, "gateways.list", false, false},
		{child, "pki.revoke", true, true},
		{child, "pki.rotationStart", true, true},
		{child, "gateways.drain", true, true},
		{child, "sinks.replay", true, true},
		{child, "recordings.list", false, true},
		{child, "recordings.get", false, true},
		{child, "pki.rotationStatus", false, true},
		{child, "sinks.deadLetters", false, true},
		{root, "pki.revoke", true, false},
		{root, "recordings.get", false, false},
	} {
		if got := tenantDenied(c.p, c.name, c.mutating); got != c.denied {
			t.Errorf("tenant %s calling %s: denied %v, want %v", c.p.TenantID, c.name, got, c.denied)
		}
	}
}
