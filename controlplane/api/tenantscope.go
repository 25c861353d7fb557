package api

import (
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
)

// tenantScoped are the API methods that act only within the caller's
// subtree (docs/tenants.md, "Scoped"). A token of a tenant other than the
// root calls these and no other: every other method is deployment-wide and
// refused to it, read or change (tenantDenied): pki.* (a rotation's
// missing nodes, the deployment's CA), gateways.*, processes.list,
// release.pins* (the pins every node applies) and bmc.* (a BMC address is
// one the control plane dials to power-cycle a machine: a tenant's could
// aim it at another tenant's machine).
var tenantScoped = map[string]bool{
	"tenants.create": true, "tenants.list": true, "tenants.get": true, "tenants.suspend": true,
	"tenants.resume": true, "tenants.delete": true,
	"sites.create": true, "sites.list": true,
	"pools.create": true, "pools.list": true, "pools.get": true, "pools.setBudget": true, "pools.move": true,
	"joinTokens.create": true, "joinTokens.list": true, "joinTokens.revoke": true,
	"nodes.list": true, "nodes.get": true, "nodes.cordon": true, "nodes.uncordon": true, "nodes.drain": true,
	"nodes.delete": true, "nodes.gpuReset": true, "nodes.reboot": true, "nodes.add": true,
	"nodes.move": true, "nodes.setGPUCount": true, "nodes.reinstall": true,
	"commands.create": true, "commands.get": true, "commands.list": true, "commands.cancel": true,
	"tunnels.create": true,
	"tokens.create":  true, "tokens.list": true, "tokens.revoke": true,
	"audit.list": true, "events.list": true,
	// Reservations of the subtree's pools (their nodes are the pool's).
	"reservations.create": true, "reservations.list": true, "reservations.get": true, "reservations.cancel": true,
	"reservations.extend": true,
	// The subtree's pools' GPUs (a GPU's stays and history on the subtree's
	// nodes only), remediation cases and breakers, capacity (of a pool
	// named) and fleet summary.
	"gpus.list": true, "gpus.get": true, "remediation.list": true, "remediation.get": true,
	"remediation.pause": true, "remediation.resume": true, "remediation.return": true,
	"remediation.resetBreaker": true, "remediation.breakers": true, "remediation.history": true,
	"remediation.stats": true, "capacity.summary": true, "fleet.summary": true,
	// Rollouts are their pool's tenant's: one targets its pool's nodes only.
	"rollouts.create": true, "rollouts.list": true, "rollouts.get": true, "rollouts.pause": true,
	"rollouts.resume": true, "rollouts.abort": true,
	// Recordings of shells the subtree's tokens opened.
	"recordings.list": true, "recordings.get": true,
	// Dead letters of the sinks of the subtree's tenants (sinks.*.tenant).
	"sinks.deadLetters": true, "sinks.replay": true,
	// Policies of the subtree's tenants; a tenant's bind its own tokens only.
	"policies.apply": true, "policies.get": true, "policies.list": true, "policies.test": true,
	// Access requests of the subtree's tenants; a request lives in its
	// requester's tenant, and its policy binds that tenant's callers only.
	"access.request": true, "access.list": true, "access.approve": true, "access.deny": true, "access.revoke": true,
}

// tenantDenied reports whether p, a token of a tenant other than the root,
// may not call method name: any method not in tenantScoped, read or change.
// A root tenant's token is never denied here.
func tenantDenied(p *iam.Principal, name string) bool {
	return p.TenantID != "" && p.TenantID != store.RootTenant && !tenantScoped[name]
}
