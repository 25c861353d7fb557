package sqlite

import (
	"io/fs"
	"strings"
	"testing"
)

// TestMigrationsMarked: every migration file begins with a line "-- expand"
// or "-- contract" (issue 40, docs/upgrade-control-plane.md); Migrate
// refuses a set with an unmarked one.
func TestMigrationsMarked(t *testing.T) {
	entries, err := fs.ReadDir(migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	var expand, contract int
	for _, e := range entries {
		b, err := fs.ReadFile(migrations, "migrations/"+e.Name())
		if err != nil {
			t.Fatal(err)
		}
		switch first, _, _ := strings.Cut(string(b), "\n"); first {
		case "-- expand":
			expand++
		case "-- contract":
			contract++
		default:
			t.Errorf("%s: first line %q, want \"-- expand\" or \"-- contract\"", e.Name(), first)
		}
	}
	t.Logf("%d expand, %d contract migrations", expand, contract)
	if expand == 0 || contract == 0 {
		t.Errorf("%d expand and %d contract migrations: want some of each (0005 and 0006 drop what they replace)", expand, contract)
	}
}
