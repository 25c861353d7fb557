// Package policy is the one evaluator that decides every API call: a
// tenant's policies, statements allowing or denying actions on resources
// under CEL conditions, checked by the tests in their file before they
// apply (DESIGN.md, "Tenancy and policies"; issue 46; docs/policies.md).
// Its models: AWS IAM (explicit deny wins, NotResource), Teleport roles
// (label selectors), Tailscale's policy file (tests run before apply) and
// Kubernetes CEL admission policies (cost limits).
//
// # Files
//
// A tenant's whole policy set is one YAML file (Document), read strictly
// by Parse within fixed bounds (MaxDocumentSize, MaxDepth, MaxPolicies,
// MaxStatements, MaxTests, ...). Compile checks it against the Catalog of
// actions and compiles it into a Set for the tenant; RunTests decides the
// file's test cases with it; Load does all three. Every error names its
// place in the file, such as "policies[2].statements[0].condition: ...",
// and all of them are reported, joined.
//
// # Evaluation
//
// A call is an Input: the caller (Principal: token id, tenant, built-in
// role, groups), the action, the resource (tenant, site, pool and node, by
// id and name, and the node's labels), the verified source address, the
// time and the request's fields. The statements that apply to it are:
//
//   - the built-in policy of the caller's role: role R allows every action
//     of the Catalog whose least role ranks at or below R (viewer <
//     operator < admin);
//   - every statement of every policy of the caller's tenant that is bound
//     to the caller (by its token id, its role or one of its groups), whose
//     actions match the call's action, whose selector matches the resource
//     (resources: it selects it; notResources: it does not) and whose
//     condition, if any, is true;
//   - the statements of the policies the caller's grants bring (below,
//     "Access requests").
//
// An applying deny statement denies the call, whatever allows it; else any
// applying allow (built-in or statement) allows it; else it is denied
// (implicitly). A condition that fails when evaluated (a missing key, a
// cost past MaxConditionCost, a bad CIDR) makes a deny statement apply
// (fail closed) and an allow statement not apply. The Decision's Reason
// names what decided: `denied by policy "p" statement 2` (statements
// numbered from 1), "allowed by built-in role operator", `no policy allows
// nodes.drain for role viewer`.
//
// # Access requests
//
// A policy with a request block (Request) is requestable
// (docs/access.md): a caller its requesters bind may ask for it for a
// time, one its approvers bind approves, and the approved request is a
// Grant the caller's decisions carry (Input.Grants). A requestable policy
// may have no bind, so that its statements apply only through grants. A
// grant brings its policy's statements to the call while the call's time
// is before the grant's end and the policy's requesters still bind the
// caller: its deny statements apply as stated, its allow statements only
// on the resources the grant's scope selects (when it has one). Deny still
// wins, and the reason names the request: `allowed by policy "p"
// statement 1 (granted by access request acr_…)`; Decision.Grant is its id.
// A file's tests may give their caller grants (TestCaller.Granted).
// Cache never keeps a decision of a caller with grants: its end holds at
// once. DecideWorstCase, for the lockout check, is asked without grants.
//
// Only the caller's own tenant's policies bind it; a Bundle holds every
// tenant's Set and decides by the caller's, a tenant without one getting
// its built-in role alone.
//
// # Worst case
//
// DecideWorstCase (on a Set or a Bundle) decides pessimistically, for
// checks that must hold whatever the call's address, time and fields:
// whether a token could still call policies.apply on its tenant under a
// new document, asked with an Input that has no address and no fields. A
// condition false for such an input (request.sourceIp != "",
// has(request.fields.document)) may be true for every real call, so there
// every statement with a condition is taken as if its condition held when
// it is a deny and as if it failed when it is an allow, without being
// evaluated; bindings, actions and selectors match as in Decide. What it
// allows, Decide allows for the same caller, action and resource at any
// address, time and fields.
//
// # Conditions
//
// A condition is a CEL expression of type bool over three variables:
// request (sourceIp string, "" when unknown; time timestamp; method string,
// the action; fields map(string, dyn)), resource (tenant, tenantName, site,
// siteName, pool, poolName, node, nodeName strings; labels
// map(string, string)) and caller (token, tenant, role strings; groups
// list(string)). They are typed objects, so a misspelt field is refused at
// compile time. The functions are CEL's standard library, the strings
// extension (cel-go ext.Strings) and inCidr(ip, cidr) bool, false for an
// ip that does not parse; a literal cidr that does not parse is refused at
// compile time. A condition is at most MaxConditionLength bytes and its
// estimated worst-case cost, with inputs at their bounds (MaxInputString,
// MaxInputEntries), at most MaxConditionCost; evaluation stops at the same
// cost. Conditions are compiled once per Set, never per decision.
//
// # Scale
//
// A Set indexes its statements by binding (token id, role, group) and by
// exact action, patterns being expanded against the Catalog at compile
// time, so a decision reads only the statements bound to its caller for
// its action, however many policies the tenant has (10,000 in
// tests/bench/policy). Cache keeps allowed read decisions for
// DecisionCacheTTL (10 s), keyed on the token, the verified address, the
// action, the resource and the fields.
package policy
