package api

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// docsSection is the text of docs/api.md from the heading title to the
// next heading of its level.
func docsSection(t *testing.T, title string) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## "+title+"\n")
	if !ok {
		t.Fatalf("docs/api.md has no section %q", title)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	return sec
}

// TestRolesDocumented: the table of docs/api.md, "Methods and roles",
// names every method of api.proto once, with its role, and no other.
func TestRolesDocumented(t *testing.T) {
	t.Parallel()
	row := regexp.MustCompile("(?m)^\\| (.*) \\| (viewer|operator|admin) \\|$")
	name := regexp.MustCompile("`([a-zA-Z]+\\.[a-zA-Z]+)`")
	documented := map[string]string{}
	for _, r := range row.FindAllStringSubmatch(docsSection(t, "Methods and roles"), -1) {
		for _, m := range name.FindAllStringSubmatch(r[1], -1) {
			if prev, ok := documented[m[1]]; ok {
				t.Errorf("docs/api.md lists %s twice (%s, %s)", m[1], prev, r[2])
			}
			documented[m[1]] = r[2]
		}
	}
	for _, m := range apiv1.Methods {
		switch role, ok := documented[m.Name]; {
		case !ok:
			t.Errorf("docs/api.md, \"Methods and roles\": no row names %s (role %s)", m.Name, m.Role)
		case role != m.Role:
			t.Errorf("docs/api.md gives %s the role %s; api.proto says %s", m.Name, role, m.Role)
		}
		delete(documented, m.Name)
	}
	for n := range documented {
		t.Errorf("docs/api.md lists %s, which api.proto does not declare", n)
	}
}

// TestErrorCodesDocumented: the error table of docs/api.md gives every
// code the API answers with the HTTP status it is sent with.
func TestErrorCodesDocumented(t *testing.T) {
	t.Parallel()
	sec := docsSection(t, "Errors")
	for _, code := range []string{apiv1.CodeInvalidArgument, apiv1.CodeUnauthenticated, apiv1.CodePermissionDenied, apiv1.CodeNotFound,
		apiv1.CodeMethodNotAllowed, apiv1.CodeConflict, apiv1.CodeGone, apiv1.CodeResourceExhausted, apiv1.CodeUnavailable, apiv1.CodeInternal} {
		want := fmt.Sprintf("| `%s` | %d |", code, (&Error{Code: code}).status())
		if !strings.Contains(sec, want) {
			t.Errorf("docs/api.md, \"Errors\": no row starting %s", want)
		}
	}
}
