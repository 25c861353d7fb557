package tests

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// loopPackages are the packages whose loops take an injected clock
// (controlplane/internal/clock): the gateway, the lease and shard packages,
// the workers and every reconciler and singleton they run. Their tests
// drive time with controlplane/internal/clocktest and wait on signals.
var loopPackages = []string{
	"controlplane/gateway",
	"controlplane/pkg/lease",
	"controlplane/pkg/shard",
	"controlplane/workers",
	"controlplane/reconcilers/liveness",
	"controlplane/remediation",
	"controlplane/reconcilers/rollouts",
	"controlplane/reconcilers/placer",
	"controlplane/reconcilers/reaper",
	"controlplane/reconcilers/sweeper",
	"controlplane/reconcilers/drift",
}

// sleepers are the time functions a test of a loop package must not call:
// a sleep, or a wait on a timer of the real clock (issue 42). A deadline
// guard is context.WithTimeout or t.Context(); the passing of time is a
// fake clock's Advance; a wait for the code under test is a signal.
var sleepers = map[string]bool{"Sleep": true, "After": true, "NewTimer": true, "Tick": true, "NewTicker": true}

// TestNoSleepInLoopTests fails when a _test.go file of a loop package calls
// time.Sleep or waits on a real timer (time.After, NewTimer, Tick,
// NewTicker).
func TestNoSleepInLoopTests(t *testing.T) {
	root := repoRoot()
	var found []string
	for _, pkg := range loopPackages {
		files, err := filepath.Glob(filepath.Join(root, pkg, "*_test.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no test files (%v): is the list above still true?", pkg, err)
		}
		for _, f := range files {
			found = append(found, sleepsIn(t, root, f)...)
		}
	}
	if len(found) > 0 {
		t.Fatalf("tests of loop packages sleep or wait on the real clock; drive time with controlplane/internal/clocktest, "+
			"wait on a signal, and guard deadlines with context.WithTimeout or t.Context():\n  %s", strings.Join(found, "\n  "))
	}
}

// sleepsIn returns file:line: time.F for each banned call in file.
func sleepsIn(t *testing.T, root, file string) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	timeName := ""
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == "time" {
			timeName = "time"
			if imp.Name != nil {
				timeName = imp.Name.Name
			}
		}
	}
	if timeName == "" || timeName == "_" {
		return nil
	}
	rel, _ := filepath.Rel(root, file)
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); ok && id.Name == timeName && sleepers[sel.Sel.Name] {
			out = append(out, fmt.Sprintf("%s:%d: time.%s", rel, fset.Position(sel.Pos()).Line, sel.Sel.Name))
		}
		return true
	})
	return out
}

// TestNoSleepCatchesASleep: the check above sees a sleep, a timer and a
// renamed import, and passes a clean file.
func TestNoSleepCatchesASleep(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bad := write("bad_test.go", "package x\nimport tm \"time\"\nfunc f() { tm.Sleep(1); <-tm.After(1); _ = tm.NewTimer(1) }\n")
	if got := sleepsIn(t, dir, bad); len(got) != 3 {
		t.Fatalf("found %v, want the sleep, the After and the NewTimer", got)
	}
	good := write("good_test.go", "package x\nimport \"time\"\nfunc f() time.Duration { return time.Second }\n")
	if got := sleepsIn(t, dir, good); len(got) != 0 {
		t.Fatalf("found %v in a file without sleeps", got)
	}
}
