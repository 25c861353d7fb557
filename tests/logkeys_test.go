package tests

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// Log attribute keys: one spelling of each per binary, defined once in the
// binary's logkey package (STYLE.md, "Log attribute keys are constants,
// spelled one way per binary"; issue 17).
//
// TestLogKeys reads every non-test Go file of bcd/, plugins/ and
// controlplane/ and finds the keys of slog calls: the key arguments of
// Debug, Info, Warn, Error (and their Context forms), Log and With, and the
// first argument of slog.String, slog.Any and the other Attr constructors. A
// key fails when it is a stray spelling (strayKeys), or when it spells a
// key the binary's logkey package defines without going through it (a
// string literal "err", or a local constant with that value, where
// logkey.Err is meant).

// strayKeys are spellings that the logkey packages settle on another
// spelling for.
var strayKeys = map[string]string{
	"error": "err", "errors": "err", "e": "err",
	"node": "node_id", "nodeID": "node_id", "nodeId": "node_id", "node-id": "node_id", "nodeid": "node_id",
	"command": "command_id", "commandID": "command_id", "cmd": "command_id",
	"session": "session_id", "sessionID": "session_id",
}

// logBinaries maps each binary's source roots to its logkey package.
var logBinaries = []struct {
	name   string
	roots  []string
	logkey string
}{
	{"bcd", []string{"bcd"}, "bcd/internal/logkey"},
	{"plugins (bcx-*)", []string{"plugins"}, "plugins/internal/logkey"},
	{"better-compute", []string{"controlplane"}, "controlplane/internal/logkey"},
}

// slogMethods maps a logging method to the index of its first key/value
// argument.
var slogMethods = map[string]int{
	"Debug": 1, "Info": 1, "Warn": 1, "Error": 1,
	"DebugContext": 2, "InfoContext": 2, "WarnContext": 2, "ErrorContext": 2,
	"Log": 3, "With": 0,
}

// slogAttrs are the slog functions whose first argument is a key.
var slogAttrs = map[string]bool{"String": true, "Int": true, "Int64": true, "Uint64": true, "Float64": true, "Bool": true,
	"Time": true, "Duration": true, "Any": true, "Group": true}

func TestLogKeys(t *testing.T) {
	root := repoRoot()
	for _, bin := range logBinaries {
		t.Run(bin.name, func(t *testing.T) {
			keys := stringConsts(t, filepath.Join(root, bin.logkey))
			if len(keys) == 0 {
				t.Fatalf("%s defines no keys", bin.logkey)
			}
			byValue := map[string]string{}
			for name, v := range keys {
				if other, ok := byValue[v]; ok {
					t.Errorf("%s: %s and %s both spell %q", bin.logkey, name, other, v)
				}
				byValue[v] = name
				if want, stray := strayKeys[v]; stray {
					t.Errorf("%s.%s = %q, a stray spelling of %q", bin.logkey, name, v, want)
				}
			}
			var bad []string
			for _, r := range bin.roots {
				bad = append(bad, scanLogKeys(t, root, filepath.Join(root, r), bin.logkey, byValue)...)
			}
			sort.Strings(bad)
			for _, b := range bad {
				t.Error(b)
			}
		})
	}
}

// TestLogKeysScanner checks the scanner on a file with every kind of key.
func TestLogKeysScanner(t *testing.T) {
	src := `package p
import (
	"log/slog"
	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"google.golang.org/grpc/status"
)
const attrErr = "err"
const attrPool = "pool"
func f(log *slog.Logger, err error) {
	log.Info("A", logkey.Err, err, attrPool, 1)
	log.Warn("B", "error", err)
	log.ErrorContext(nil, "C", "node", 1, slog.String("err", ""))
	log.With(attrErr, err).Info("D", logkey.NodeID, 2)
	_ = status.Error(0, "node")
}
`
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	got := scanLogKeys(t, dir, dir, "controlplane/internal/logkey", map[string]string{"err": "Err", "node_id": "NodeID"})
	want := []string{
		`p.go:11: key "error" is a stray spelling of "err"`,
		`p.go:12: key "node" is a stray spelling of "node_id"`,
		`p.go:12: key "err" is spelled out: use logkey.Err`,
		`p.go:13: key "err" is the local constant attrErr: use logkey.Err`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("findings:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// stringConsts returns the string constants (name to value) of the
// package in dir.
func stringConsts(t *testing.T, dir string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	out := map[string]string{}
	entries, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(entries) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	for _, path := range entries {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for name, v := range fileConsts(f) {
			out[name] = v
		}
	}
	return out
}

// fileConsts returns a file's top-level string constants given as
// literals.
func fileConsts(f *ast.File) map[string]string {
	out := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if i < len(vs.Values) {
					if v, ok := stringLit(vs.Values[i]); ok {
						out[n.Name] = v
					}
				}
			}
		}
	}
	return out
}

func stringLit(e ast.Expr) (string, bool) {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return "", false
	}
	v, err := strconv.Unquote(lit.Value)
	return v, err == nil
}

// scanLogKeys returns a finding for each bad key of a slog call in the
// non-test Go files under dir (paths relative to root). byValue maps the
// logkey package's values to their names.
func scanLogKeys(t *testing.T, root, dir, logkeyPkg string, byValue map[string]string) []string {
	t.Helper()
	var out []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
			strings.HasSuffix(path, ".pb.go") {
			return err
		}
		if filepath.ToSlash(filepath.Dir(path)) == filepath.ToSlash(filepath.Join(root, logkeyPkg)) {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		consts := fileConsts(f)
		// Constants of the file's package declared in its other files.
		if more, err := filepath.Glob(filepath.Join(filepath.Dir(path), "*.go")); err == nil {
			for _, p := range more {
				if p == path || strings.HasSuffix(p, "_test.go") {
					continue
				}
				if g, err := parser.ParseFile(token.NewFileSet(), p, nil, 0); err == nil {
					for n, v := range fileConsts(g) {
						consts[n] = v
					}
				}
			}
		}
		imports := map[string]string{} // local name to import path
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			name := p[strings.LastIndex(p, "/")+1:]
			if imp.Name != nil {
				name = imp.Name.Name
			}
			imports[name] = p
		}
		check := func(key ast.Expr) {
			line := fset.Position(key.Pos()).Line
			var v string
			switch k := key.(type) {
			case *ast.BasicLit:
				s, ok := stringLit(k)
				if !ok {
					return
				}
				v = s
				if name, ok := byValue[v]; ok {
					out = append(out, rel+":"+strconv.Itoa(line)+": key \""+v+"\" is spelled out: use logkey."+name)
					return
				}
			case *ast.Ident:
				s, ok := consts[k.Name]
				if !ok {
					return
				}
				v = s
				if name, ok := byValue[v]; ok {
					out = append(out, rel+":"+strconv.Itoa(line)+": key \""+v+"\" is the local constant "+k.Name+": use logkey."+name)
					return
				}
			default:
				return
			}
			if want, stray := strayKeys[v]; stray {
				out = append(out, rel+":"+strconv.Itoa(line)+": key \""+v+"\" is a stray spelling of \""+want+"\"")
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if pkg, ok := sel.X.(*ast.Ident); ok && imports[pkg.Name] != "" {
				// A package's function: slog's attribute constructors;
				// others (status.Error) are not logging.
				if imports[pkg.Name] == "log/slog" && slogAttrs[sel.Sel.Name] && len(call.Args) > 0 {
					check(call.Args[0])
				}
				if imports[pkg.Name] != "log/slog" {
					return true
				}
			}
			first, ok := slogMethods[sel.Sel.Name]
			if !ok {
				return true
			}
			for i := first; i < len(call.Args); i++ {
				if attr, ok := call.Args[i].(*ast.CallExpr); ok {
					if s, ok := attr.Fun.(*ast.SelectorExpr); ok {
						if p, ok := s.X.(*ast.Ident); ok && imports[p.Name] == "log/slog" {
							continue // an Attr, checked above
						}
					}
				}
				check(call.Args[i])
				i++ // skip the value
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
