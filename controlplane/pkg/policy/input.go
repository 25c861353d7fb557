package policy

import (
	"net/netip"
	"time"
)

// Input is one call to decide.
type Input struct {
	// Principal is the authenticated caller.
	Principal Principal
	// Action is the method called, such as "nodes.drain", or one of the
	// non-method actions (NonMethodActions).
	Action string
	// Resource is what the call acts on; its fields are empty where the
	// call has no such part (tokens.create has no pool).
	Resource Resource
	// SourceIP is the caller's verified address; the zero Addr when
	// unknown.
	SourceIP netip.Addr
	// Time is the call's time, given by the caller: Decide reads no clock.
	Time time.Time
	// Fields are the request's fields (request.fields in conditions):
	// values as encoding/json or YAML decode them (nil, bool, numbers,
	// strings, []any, map[string]any).
	Fields map[string]any
	// Grants are the caller's approved access requests (docs/access.md):
	// each brings its policy's statements to the call while Time is
	// before its End, the policy is requestable in the caller's tenant's
	// set and its requesters still bind the caller.
	Grants []Grant
}

// Grant is an approved access request: the policy it grants its
// requester, on what, until when.
type Grant struct {
	// ID is the access request's id ("acr_…"), named in the reasons of
	// the decisions it makes.
	ID string
	// Policy names the granted policy of the caller's tenant.
	Policy string
	// Scope, when set, limits the grant's allow statements to the
	// resources it selects by id (the request's resource, resolved); its
	// deny statements apply as stated.
	Scope *Selector
	// End is when the grant ends: it holds while Input.Time is before it.
	End time.Time
}

// Principal is a caller: variable caller in conditions.
type Principal struct {
	// Token is the API token's id; empty for a caller without one.
	Token string `cel:"token"`
	// Tenant is the caller's tenant id: whose policies apply.
	Tenant string `cel:"tenant"`
	// Role is the built-in role: admin, operator or viewer.
	Role string `cel:"role"`
	// Groups are the caller's groups (people signed in through OIDC).
	Groups []string `cel:"groups"`
}

// Resource is what a call acts on: variable resource in conditions, and a
// test's resource in a policy file. Ids and names are both given where
// known; a Selector entry matches either.
type Resource struct {
	Tenant     string `yaml:"tenant,omitempty" cel:"tenant"`
	TenantName string `yaml:"tenantName,omitempty" cel:"tenantName"`
	Site       string `yaml:"site,omitempty" cel:"site"`
	SiteName   string `yaml:"siteName,omitempty" cel:"siteName"`
	Pool       string `yaml:"pool,omitempty" cel:"pool"`
	PoolName   string `yaml:"poolName,omitempty" cel:"poolName"`
	Node       string `yaml:"node,omitempty" cel:"node"`
	NodeName   string `yaml:"nodeName,omitempty" cel:"nodeName"`
	// Labels are the node's labels.
	Labels map[string]string `yaml:"labels,omitempty" cel:"labels"`
}

// Decision is the answer for one call.
type Decision struct {
	// Allow is whether the call may proceed.
	Allow bool
	// Reason names what decided, such as `denied by policy "pool-a" statement
	// 2`, "allowed by built-in role operator" or "no policy allows
	// nodes.drain for role viewer". Statements are numbered from 1; a
	// statement a grant brought adds "(granted by access request acr_…)".
	Reason string
	// Grant is the id of the access request whose granted statement
	// decided the call (allowed or denied it); empty otherwise. A
	// decision a grant allowed holds only until the grant's end.
	Grant string
}

// Decider decides calls: a Set and a Bundle are Deciders.
type Decider interface {
	Decide(in Input) Decision
}
