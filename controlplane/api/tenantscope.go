package api

import (
	"slices"
	"strings"

	"github.com/better-compute/better-compute/controlplane/iam"
	"github.com/better-compute/better-compute/controlplane/store"
)

// tenantScoped are the API methods that act only within the caller's
// subtree (docs/tenants.md, "Scoped so far"). A token of a tenant other
// than the root calls these, and the other methods' reads; every other
// change is deployment-wide (pki.*, gateways.*, bmc.*, sinks.*, rollouts,
// remediation, reservations, …) and refused to it, as are the reads that
// name other tenants' nodes or carry their data: recordings (what was
// typed in any tenant's shells), pki.* (a rotation's missing nodes) and
// sinks.* (dead-lettered events) (tenantDenied).
var tenantScoped = map[string]bool{
	"tenants.create": true, "tenants.list": true, "tenants.get": true, "tenants.suspend": true,
	"tenants.resume": true, "tenants.delete": true,
	"sites.create": true, "sites.list": true,
	"pools.create": true, "pools.list": true, "pools.get": true, "pools.setBudget": true, "pools.move": true,
	"joinTokens.create": true, "joinTokens.list": true, "joinTokens.revoke": true,
	"nodes.list": true, "nodes.get": true, "nodes.cordon": true, "nodes.uncordon": true, "nodes.drain": true,
	"nodes.delete": true, "nodes.gpuReset": true, "nodes.reboot": true, "nodes.add": true,
	"nodes.move": true,
	"commands.create": true, "commands.get": true, "commands.list": true, "commands.cancel": true,
	"tunnels.create": true,
	"tokens.create":  true, "tokens.list": true, "tokens.revoke": true,
	"audit.list": true,
}

// tenantDenied reports whether p, a token of a tenant other than the root,
// may not call method name: a change not yet scoped to its subtree
// (mutating), or any method of deniedGroups. A root tenant's token is
// never denied here.
func tenantDenied(p *iam.Principal, name string, mutating bool) bool {
	if p.TenantID == "" || p.TenantID == store.RootTenant || tenantScoped[name] {
		return false
	}
	return mutating || slices.ContainsFunc(deniedGroups, func(g string) bool { return strings.HasPrefix(name, g) })
}

// deniedGroups are the method groups refused whole to a token of a tenant
// other than the root: their reads carry other tenants' data.
var deniedGroups = []string{"recordings.", "pki.", "sinks."}
