package tests

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	eventsv1 "github.com/better-compute/better-compute/proto/events/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// The wire-name checks of issue 31: proto/ owns every name that crosses a
// wire or a table (event types, command kinds, capabilities, the API's
// error codes), each declared once with a registry, and the code and the
// docs are held to those registries.

// TestWireNamesEventsDoc checks docs/events.md's type table against the
// registry in proto/events/v1: one row per type, in its order, each with
// the data struct controlplane/pkg/events names for it, and every field of
// every data struct under its heading.
func TestWireNamesEventsDoc(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(), "docs", "events.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	var rows []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(com\\.better-compute\\.[^`]+)` \\|").FindAllStringSubmatch(doc, -1) {
		rows = append(rows, m[1])
	}
	if !slices.Equal(rows, eventsv1.Types) {
		t.Errorf("docs/events.md lists the types\n  %q\nproto/events/v1 registers\n  %q", rows, eventsv1.Types)
	}
	var named []string
	for _, info := range events.Types {
		named = append(named, info.Type)
	}
	if !slices.Equal(named, eventsv1.Types) {
		t.Errorf("controlplane/pkg/events.Types names\n  %q\nproto/events/v1 registers\n  %q", named, eventsv1.Types)
	}
	seen := map[string]bool{}
	for _, info := range events.Types {
		dt := reflect.TypeOf(info.Data)
		if !strings.Contains(doc, "| `"+info.Type+"` | "+dt.Name()+" |") {
			t.Errorf("docs/events.md has no row for %s with data %s", info.Type, dt.Name())
		}
		if seen[dt.Name()] {
			continue
		}
		seen[dt.Name()] = true
		i := strings.Index(doc, "### "+dt.Name()+"\n")
		if i < 0 {
			t.Errorf("docs/events.md has no section ### %s", dt.Name())
			continue
		}
		section := doc[i+4:]
		if j := strings.Index(section, "\n### "); j >= 0 {
			section = section[:j]
		}
		for f := range dt.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !strings.Contains(section, "| `"+name+"` |") {
				t.Errorf("docs/events.md, %s: no row for field %s", dt.Name(), name)
			}
		}
	}
}

// TestWireNamesCapabilitiesMatchProto checks the capability registry
// (sessionv1.Capabilities) against the list in session.proto's file
// comment, the protocol's source of truth.
func TestWireNamesCapabilitiesMatchProto(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(), "proto", "session", "v1", "session.proto"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "// Capabilities (Hello.capabilities, Welcome.capabilities) in this version:")
	end := strings.Index(text, "// Capability strings are lower-case")
	if start < 0 || end < start {
		t.Fatal("session.proto: the capability list in the file comment is not found")
	}
	var listed []string
	for _, m := range regexp.MustCompile(`(?m)^//   - "([^"]+)":`).FindAllStringSubmatch(text[start:end], -1) {
		listed = append(listed, m[1])
	}
	if !slices.Equal(listed, sessionv1.Capabilities) {
		t.Errorf("session.proto lists the capabilities\n  %q\nsessionv1.Capabilities\n  %q", listed, sessionv1.Capabilities)
	}
}

// wireLiteralAllowed lists the string literals outside proto/ that equal a
// registered wire name and are not that name: file (from the repository
// root) and literal, with the reason. Everything else spells a wire name
// through its constant in proto/.
var wireLiteralAllowed = map[[2]string]string{
	{"bcd/bmc/controller.go", "boot"}:                                                     "the BMC controller's action name, not the capability",
	{"bcd/bmc/controller.go", "power"}:                                                    "a log key",
	{"bcd/executor/node.go", "reboot"}:                                                    "a program argument: systemctl reboot",
	{"bcd/helper/server.go", "reboot"}:                                                    "a program argument: systemctl reboot",
	{"bcd/helper/helper.go", "exec"}:                                                      "the root helper's own operation name (bcd to bcd-helper socket)",
	{"bcd/helper/helper.go", "reboot"}:                                                    "the root helper's own operation name (bcd to bcd-helper socket)",
	{"bcd/helper/upgrade.go", "upgrade"}:                                                  "the root helper's own operation name (bcd to bcd-helper socket)",
	{"bcd/helper/upgrade.go", "rollback"}:                                                 "the root helper's upgrade step name",
	{"bcd/upgrade/state.go", "upgrade"}:                                                   "a directory name under bcd's state directory",
	{"controlplane/pkg/admission/admission.go", "node.reattested"}:                        "an audit action, named like the event's topic",
	{"controlplane/cmd/better-compute/pkirotate.go", "rollback"}:                          "the CLI subcommand pki rotate node-ca rollback, not the command kind",
	{"controlplane/store/internal/queries/remediation.go", "remediation.breaker-tripped"}: "an audit action, named like the event's topic",
	{"controlplane/api/bmc.go", "boot"}:                                                   "a request field name (protojson)",
	{"controlplane/api/bmc.go", "exec"}:                                                   "a request field name (protojson)",
	{"controlplane/api/bmc.go", "power"}:                                                  "a request field name (protojson)",
	{"controlplane/api/commands.go", "boot"}:                                              "a request field name (protojson)",
	{"controlplane/api/commands.go", "exec"}:                                              "a request field name (protojson)",
	{"controlplane/api/commands.go", "power"}:                                             "a request field name (protojson)",
	{"controlplane/api/commands.go", "upgrade"}:                                           "a request field name (protojson)",
	{"controlplane/api/upgrade.go", "exec"}:                                               "a request field name (protojson)",
	{"controlplane/store/internal/queries/commands.go", "boot"}:                           "a request field name (protojson) in a refusal",
	{"controlplane/store/internal/queries/commands.go", "exec"}:                           "a request field name (protojson) in a refusal",
	{"controlplane/store/internal/queries/commands.go", "power"}:                          "a request field name (protojson) in a refusal",
	{"controlplane/store/internal/queries/commands.go", "upgrade"}:                        "a request field name (protojson) in a refusal",
	{"controlplane/api/methods.go", "resume"}:                                             "the rollouts.resume verb, not the capability",
	{"controlplane/cmd/better-compute/bmc.go", "power"}:                                   "a JSON field of a BMC result",
	{"controlplane/cmd/better-compute/nodes.go", "drain"}:                                 "a CLI subcommand name",
	{"controlplane/pkg/watch/actions.go", "drain"}:                                        "a fleet page action's name (POST /watch/actions/drain)",
	{"controlplane/pkg/watch/actions.go", "reboot"}:                                       "a fleet page action's name (POST /watch/actions/reboot)",
	{"controlplane/pkg/watch/actions.go", "power"}:                                        "a request field name (protojson) of commands.create",
	{"controlplane/pkg/watch/preview.go", "drain"}:                                        "a fleet page action's name",
	{"controlplane/pkg/watch/preview.go", "reboot"}:                                       "a fleet page action's name",
	{"controlplane/cmd/better-compute/gateways.go", "drain"}:                              "a CLI subcommand name (gateways drain)",
	{"controlplane/cmd/better-compute/rollouts.go", "drain"}:                              "a CLI flag name",
	{"controlplane/cmd/better-compute/rollouts.go", "resume"}:                             "a CLI subcommand name",
	{"controlplane/cmd/better-compute/reservations.go", "UNAVAILABLE"}:                    "a table column heading",
	{"controlplane/cmd/better-compute/upgrade.go", "upgrade"}:                             "a CLI flag group name",
	{"controlplane/cmd/better-compute/remediation.go", "reboot"}:                          "the --reboot flag of remediation return, named like the action",
	{"controlplane/pkg/sim/faultspec.go", "reboot"}:                                       "the one function that parses the simulator's fault specification strings",
}

// TestWireNamesNoLiterals fails when a Go file outside proto/ (test files
// left out) has a string literal equal to a registered command kind, event
// type, capability or API error code, unless wireLiteralAllowed lists it
// with a reason: the names are spelled through their constants, so a
// renamed or retired name cannot live on in a literal.
func TestWireNamesNoLiterals(t *testing.T) {
	registered := map[string]string{}
	for _, k := range sessionv1.Kinds() {
		registered[k] = "command kind"
	}
	for _, c := range sessionv1.Capabilities {
		registered[c] = cmpOr(registered[c], "capability")
	}
	for _, typ := range eventsv1.Types {
		registered[typ] = "event type"
		// The outbox topic: the type without its prefix ("node.joined").
		registered[strings.TrimPrefix(typ, eventsv1.TypePrefix)] = cmpOr(registered[strings.TrimPrefix(typ, eventsv1.TypePrefix)], "event type")
	}
	for _, c := range apiv1.ErrorCodes {
		registered[c] = "API error code"
	}
	root := repoRoot()
	used := map[[2]string]bool{}
	var files int
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			// Packages made for tests (storetest, pgtest, tests/...) are
			// left out like _test.go files: they assert the names.
			if rel == "proto" || rel == "tests" || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" ||
				d.Name() == "node_modules" || strings.HasSuffix(d.Name(), "test") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		files++
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("parse %s: %w", rel, err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ImportSpec:
				return false
			case *ast.BasicLit:
				if n.Kind != token.STRING {
					return true
				}
				v, err := strconv.Unquote(n.Value)
				if err != nil {
					return true
				}
				what, ok := registered[v]
				if !ok {
					return true
				}
				key := [2]string{filepath.ToSlash(rel), v}
				if _, ok := wireLiteralAllowed[key]; ok {
					used[key] = true
					return true
				}
				t.Errorf("%s: string literal %q is a registered %s: use its constant in proto/ (or add it to wireLiteralAllowed with the reason)", rel, v, what)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("only %d Go files found under %s", files, root)
	}
	for key := range wireLiteralAllowed {
		if !used[key] {
			t.Errorf("wireLiteralAllowed lists %q in %s, which no longer has it: remove the entry", key[1], key[0])
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
