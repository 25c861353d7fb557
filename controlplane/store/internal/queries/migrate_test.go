package queries

import (
	"io/fs"
	"os"
	"slices"
	"testing"
)

// The two backends' migration directories, relative to this package.
var backendMigrations = map[string]string{
	"sqlite":   "../../sqlite/migrations",
	"postgres": "../../postgres/migrations",
}

// TestMigrationsMarked: every migration file of both backends begins with a
// line "-- expand" or "-- contract" (issue 40,
// docs/upgrade-control-plane.md), read by the same migrationKind that
// Migrate refuses an unmarked set with; and both backends hold the same
// migrations with the same marks, so a rolling upgrade's rules are the same
// on either engine.
func TestMigrationsMarked(t *testing.T) {
	marks := map[string]map[string]bool{} // backend -> file -> contract
	for backend, dir := range backendMigrations {
		fsys := os.DirFS(dir)
		entries, err := fs.ReadDir(fsys, ".")
		if err != nil {
			t.Fatal(err)
		}
		marks[backend] = map[string]bool{}
		var expand, contract int
		for _, e := range entries {
			b, err := fs.ReadFile(fsys, e.Name())
			if err != nil {
				t.Fatal(err)
			}
			c, err := migrationKind(e.Name(), string(b))
			if err != nil {
				t.Errorf("%s: %v", backend, err)
				continue
			}
			marks[backend][e.Name()] = c
			if c {
				contract++
			} else {
				expand++
			}
		}
		t.Logf("%s: %d expand, %d contract migrations", backend, expand, contract)
		if expand == 0 || contract == 0 {
			t.Errorf("%s: %d expand and %d contract migrations: want some of each (0005 and 0006 drop what they replace)", backend, expand, contract)
		}
	}
	sq, pg := marks["sqlite"], marks["postgres"]
	for _, name := range sortedKeys(sq) {
		c, ok := pg[name]
		switch {
		case !ok:
			t.Errorf("%s is a sqlite migration with no postgres twin", name)
		case c != sq[name]:
			t.Errorf("%s: contract=%v on sqlite, %v on postgres", name, sq[name], c)
		}
	}
	for _, name := range sortedKeys(pg) {
		if _, ok := sq[name]; !ok {
			t.Errorf("%s is a postgres migration with no sqlite twin", name)
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
