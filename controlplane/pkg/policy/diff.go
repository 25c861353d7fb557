package policy

import (
	"fmt"
	"reflect"
	"strings"
)

// Diff describes in one line what changed from old to new, for the audit
// row of an apply: the policies added, removed and changed (by name, with
// the statements added, removed or changed by number from 1, and whether
// the binding, description or request block changed), and the change in
// the number of tests. It returns "no change" when the policies and tests
// are the same.
// A nil Document is an empty one.
func Diff(old, new *Document) string {
	if old == nil {
		old = &Document{}
	}
	if new == nil {
		new = &Document{}
	}
	before := make(map[string]*Policy, len(old.Policies))
	for i := range old.Policies {
		before[old.Policies[i].Name] = &old.Policies[i]
	}
	after := make(map[string]bool, len(new.Policies))
	var added, changed, removed []string
	for i := range new.Policies {
		p := &new.Policies[i]
		after[p.Name] = true
		o, ok := before[p.Name]
		switch {
		case !ok:
			added = append(added, p.Name)
		default:
			if c := policyChanges(o, p); c != "" {
				changed = append(changed, p.Name+" ("+c+")")
			}
		}
	}
	for i := range old.Policies {
		if !after[old.Policies[i].Name] {
			removed = append(removed, old.Policies[i].Name)
		}
	}
	var parts []string
	parts = appendList(parts, "added", added)
	parts = appendList(parts, "removed", removed)
	parts = appendList(parts, "changed", changed)
	if len(old.Tests) != len(new.Tests) {
		parts = append(parts, fmt.Sprintf("tests %d → %d", len(old.Tests), len(new.Tests)))
	} else if !reflect.DeepEqual(old.Tests, new.Tests) {
		parts = append(parts, "tests changed")
	}
	if len(parts) == 0 {
		return "no change"
	}
	return strings.Join(parts, "; ")
}

// maxDiffNames is how many names Diff lists in one part before it counts
// the rest.
const maxDiffNames = 20

func appendList(parts []string, what string, names []string) []string {
	if len(names) == 0 {
		return parts
	}
	total, more := len(names), ""
	if total > maxDiffNames {
		more = fmt.Sprintf(" and %d more", total-maxDiffNames)
		names = names[:maxDiffNames]
	}
	return append(parts, fmt.Sprintf("%s %d: %s%s", what, total, strings.Join(names, ", "), more))
}

// policyChanges describes how p differs from o; "" when it does not.
func policyChanges(o, p *Policy) string {
	var c []string
	if !reflect.DeepEqual(o.Bind, p.Bind) {
		c = append(c, "bind changed")
	}
	if o.Description != p.Description {
		c = append(c, "description changed")
	}
	if !reflect.DeepEqual(o.Request, p.Request) {
		c = append(c, "request changed")
	}
	for i := range max(len(o.Statements), len(p.Statements)) {
		switch {
		case i >= len(o.Statements):
			c = append(c, fmt.Sprintf("statement %d added", i+1))
		case i >= len(p.Statements):
			c = append(c, fmt.Sprintf("statement %d removed", i+1))
		case !reflect.DeepEqual(o.Statements[i], p.Statements[i]):
			c = append(c, fmt.Sprintf("statement %d changed", i+1))
		}
	}
	return strings.Join(c, ", ")
}
