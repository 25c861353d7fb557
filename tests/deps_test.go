package tests

import (
	"bufio"
	"bytes"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/better-compute/better-compute"

// imports maps each package of the module (tests included) to the
// packages of the module it imports directly, from go list.
func moduleImports(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...")
	cmd.Dir = repoRoot()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	m := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		var ours []string
		for _, imp := range f[1:] {
			if imp == module || strings.HasPrefix(imp, module+"/") {
				ours = append(ours, strings.TrimPrefix(imp, module+"/"))
			}
		}
		m[strings.TrimPrefix(f[0], module+"/")] = ours
	}
	return m
}

func under(pkg, dir string) bool { return pkg == dir || strings.HasPrefix(pkg, dir+"/") }

// TestLayering keeps the dependency rules of the layout (DESIGN.md,
// "Repository layout"; issue 17): each rule names who may not import what.
func TestLayering(t *testing.T) {
	imports := moduleImports(t)
	roles := []string{"controlplane/api", "controlplane/gateway", "controlplane/workers", "controlplane/reconcilers/liveness",
		"controlplane/reconcilers/sweeper", "controlplane/reconcilers/sinks", "controlplane/reconcilers/reaper", "controlplane/serve", "controlplane/pkg/admission"}
	rules := []struct {
		what string
		from func(string) bool
		bans func(string) bool
	}{
		{"bcd never imports the control plane", func(p string) bool { return under(p, "bcd") || under(p, "plugins") },
			func(p string) bool { return under(p, "controlplane") }},
		{"only controlplane/pkg/sim imports bcd", func(p string) bool { return under(p, "controlplane") && p != "controlplane/pkg/sim" },
			func(p string) bool { return under(p, "bcd") }},
		{"the store imports no role", func(p string) bool { return under(p, "controlplane/store") },
			func(p string) bool { return slices.ContainsFunc(roles, func(r string) bool { return under(p, r) }) }},
		{"proto imports nothing of ours but proto", func(p string) bool { return under(p, "proto") },
			func(p string) bool { return !under(p, "proto") }},
		{"api does not import gateway", func(p string) bool { return under(p, "controlplane/api") },
			func(p string) bool { return under(p, "controlplane/gateway") }},
		// The API stores a command's spec in the session-protocol form;
		// the gateway forwards it and knows nothing of the API's messages.
		{"gateway does not import proto/api/v1", func(p string) bool { return under(p, "controlplane/gateway") },
			func(p string) bool { return under(p, "proto/api/v1") }},
	}
	for pkg, deps := range imports {
		for _, r := range rules {
			if !r.from(pkg) {
				continue
			}
			for _, d := range deps {
				if r.bans(d) {
					t.Errorf("%s: %s imports %s", r.what, pkg, d)
				}
			}
		}
	}
}

// TestWireNamesCLIImportsNoAPIServer: of the CLI's files only serve.go
// and dev.go, which run the server, import controlplane/api; the rest talk
// to it through controlplane/pkg/client and take its error codes, join-token
// limits, name rule and serial form from proto/api/v1, the names both ends
// share (issue 31). Test files are left out: they start a real API server
// in the process to run the commands against.
func TestWireNamesCLIImportsNoAPIServer(t *testing.T) {
	dir := filepath.Join(repoRoot(), "controlplane", "cmd", "better-compute")
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	for _, f := range files {
		base := filepath.Base(f)
		if strings.HasSuffix(base, "_test.go") || base == "serve.go" || base == "dev.go" {
			continue
		}
		parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatalf("parse %s: %v", f, err)
		}
		for _, imp := range parsed.Imports {
			if imp.Path.Value == `"`+module+`/controlplane/api"` {
				t.Errorf("controlplane/cmd/better-compute/%s imports controlplane/api: take the shared names from proto/api/v1 and call the server through controlplane/pkg/client", base)
			}
		}
	}
}

// TestNoTestPackageInBinaries: no package of ours made for tests (a name
// ending in "test", tests/..., or one importing "testing") is linked into
// a product binary.
func TestNoTestPackageInBinaries(t *testing.T) {
	for _, bin := range []string{"./controlplane/cmd/better-compute", "./bcd/cmd/bcd", "./plugins/ipmi/cmd/bcx-ipmi"} {
		cmd := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`, bin)
		cmd.Dir = repoRoot()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", bin, err)
		}
		for line := range strings.Lines(string(out)) {
			f := strings.Fields(line)
			if !strings.HasPrefix(f[0], module+"/") {
				continue
			}
			pkg := strings.TrimPrefix(f[0], module+"/")
			if strings.HasSuffix(pkg, "test") || under(pkg, "tests") || slices.Contains(f[1:], "testing") {
				t.Errorf("%s links %s, a package for tests", bin, pkg)
			}
		}
	}
}

// TestGoModTidy fails when go mod tidy would change go.mod or go.sum: a
// requirement no package needs, a direct requirement marked indirect (or
// the reverse), or a missing checksum (issue 17). Run `go mod tidy` and
// commit the result.
func TestGoModTidy(t *testing.T) {
	cmd := exec.Command("go", "mod", "tidy", "-diff")
	cmd.Dir = repoRoot()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go mod tidy -diff: %v: go.mod or go.sum is not tidy (run go mod tidy):\n%s", err, out)
	}
	// The layout tidy keeps: direct requirements first, in a block of their
	// own, then the indirect ones.
	mod, err := os.ReadFile(filepath.Join(repoRoot(), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	var blocks [][]string
	in := false
	for _, line := range strings.Split(string(mod), "\n") {
		switch {
		case line == "require (":
			in = true
			blocks = append(blocks, nil)
		case in && line == ")":
			in = false
		case in:
			blocks[len(blocks)-1] = append(blocks[len(blocks)-1], strings.TrimSpace(line))
		case strings.HasPrefix(line, "require "):
			blocks = append(blocks, []string{strings.TrimPrefix(line, "require ")})
		}
	}
	if len(blocks) == 0 || len(blocks) > 2 {
		t.Fatalf("go.mod has %d require blocks, want the direct requirements and then the indirect ones", len(blocks))
	}
	for i, b := range blocks {
		for _, req := range b {
			if indirect := strings.HasSuffix(req, "// indirect"); indirect != (i == 1) {
				t.Errorf("go.mod require block %d: %q (the first block holds the direct requirements, the second the indirect ones)", i+1, req)
			}
		}
	}
}
