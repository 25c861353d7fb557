package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Catalog maps every action the API decides to the least built-in role that
// may perform it: store.RoleViewer, store.RoleOperator or store.RoleAdmin,
// ranked viewer < operator < admin. The caller builds it from the API's method
// table (every method name, such as "nodes.drain") merged with
// NonMethodActions. The built-in roles are derived from it: role R allows
// every action whose least role ranks at or below R.
type Catalog map[string]string

// Actions that are not API methods but are decided like them: opening a
// shell or a port forward on a node, a shell as root, and a command that
// runs as root.
const (
	ActionNodesShell           = "nodes.shell"
	ActionNodesPortForward     = "nodes.portForward"
	ActionNodesShellAsRoot     = "nodes.shellAsRoot"
	ActionCommandsCreateAsRoot = "commands.createAsRoot"
)

// NonMethodActions returns the actions that are not API methods, with their
// least roles: nodes.shell and nodes.portForward need operator,
// nodes.shellAsRoot and commands.createAsRoot need admin. It returns a new
// map each time; merge it into the method table to make a Catalog.
func NonMethodActions() Catalog {
	return Catalog{
		ActionNodesShell:           store.RoleOperator,
		ActionNodesPortForward:     store.RoleOperator,
		ActionNodesShellAsRoot:     store.RoleAdmin,
		ActionCommandsCreateAsRoot: store.RoleAdmin,
	}
}

// Roles returns the built-in roles, least first: viewer, operator, admin.
func Roles() []string {
	return []string{store.RoleViewer, store.RoleOperator, store.RoleAdmin}
}

// Validate reports a catalog that is empty, names an action that is not a
// valid action name (letters, digits, '.', '_' and '-', up to
// MaxNameLength characters, no '*'), or gives an action a role that is not
// built in.
func (c Catalog) Validate() error {
	if len(c) == 0 {
		return fmt.Errorf("policy catalog is empty")
	}
	for _, a := range slices.Sorted(maps.Keys(c)) {
		if err := checkActionName(a, false); err != nil {
			return fmt.Errorf("policy catalog: action %q: %w", a, err)
		}
		if !iam.ValidRole(c[a]) {
			return fmt.Errorf("policy catalog: action %q: role %q is not admin, operator or viewer", a, c[a])
		}
	}
	return nil
}

// Allows reports whether the built-in role allows action: the action is in
// the catalog and its least role ranks at or below role.
func (c Catalog) Allows(role, action string) bool {
	least, ok := c[action]
	return ok && iam.Allows(role, least)
}

// Actions returns, sorted, the catalog's actions the built-in role allows.
func (c Catalog) Actions(role string) []string {
	var out []string
	for a := range c {
		if c.Allows(role, a) {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}

// BuiltinRoles returns the built-in roles as the policies they amount to,
// least first: a policy named after each role, bound to it, with one allow
// statement listing every action the role allows. They are not part of any
// tenant's Document; they show what a role grants before a tenant's own
// statements add to it or deny from it.
func BuiltinRoles(cat Catalog) []Policy {
	var out []Policy
	for _, role := range Roles() {
		out = append(out, Policy{
			Name:        role,
			Description: "built-in role " + role,
			Bind:        Binding{Roles: []string{role}},
			Statements:  []Statement{{Effect: Allow, Actions: cat.Actions(role)}},
		})
	}
	return out
}

// expand returns, sorted, the catalog's actions that pattern matches: the
// action itself when pattern has no '*', else every action that pattern
// matches with '*' standing for any run of characters (dots included).
func (c Catalog) expand(pattern string) []string {
	if !strings.Contains(pattern, "*") {
		if _, ok := c[pattern]; ok {
			return []string{pattern}
		}
		return nil
	}
	var out []string
	for a := range c {
		if matchPattern(pattern, a) {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}

// matchPattern reports whether s matches pattern, where '*' matches any run
// of characters, the empty one included, and every other character matches
// itself.
func matchPattern(pattern, s string) bool {
	// Greedy match with backtracking to the last star: linear in practice,
	// O(len(pattern)·len(s)) at worst.
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, i
			p++
		case p < len(pattern) && pattern[p] == s[i]:
			p++
			i++
		case star >= 0:
			p = star + 1
			mark++
			i = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// checkActionName checks an action name, or a pattern when star is true.
func checkActionName(a string, star bool) error {
	if a == "" {
		return fmt.Errorf("empty")
	}
	if len(a) > MaxNameLength {
		return fmt.Errorf("longer than %d characters", MaxNameLength)
	}
	for _, r := range a {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		case r == '*' && star:
		default:
			return fmt.Errorf("character %q not allowed (letters, digits, '.', '_', '-'%s)", r, map[bool]string{true: ", '*'"}[star])
		}
	}
	return nil
}
