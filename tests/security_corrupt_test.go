package tests

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestCorruptDatabaseRefusedWithHelp (issue 29, item 4): serve on the
// embedded default, stopped, its database file truncated to half (and, in
// a second run, overwritten with junk): serve refuses to start, and says
// which file, how to check it (PRAGMA integrity_check) and how to restore
// it from a backup (sqlite3's .backup), rather than a bare driver error.
func TestCorruptDatabaseRefusedWithHelp(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, backendSQLite)
	// Some rows, so the file has pages past the first.
	d.joinToken(1, time.Hour)
	d.st.Close()
	d.serve.Stop(syscall.SIGTERM, 30*time.Second)
	file := filepath.Join(d.dataDir, backend.EmbeddedFile)
	for _, p := range []string{file + "-wal", file + "-shm"} {
		_ = os.Remove(p)
	}
	orig, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for name, damage := range map[string][]byte{
		"truncated": orig[:len(orig)/2],
		"junk":      []byte(strings.Repeat("not a database ", 512)),
	} {
		if err := os.WriteFile(file, damage, 0o600); err != nil {
			t.Fatal(err)
		}
		code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, "serve", "--config", d.cfgFile)
		out := stdout + stderr
		if code == 0 {
			t.Fatalf("%s: serve started on a damaged database:\n%s", name, out)
		}
		for _, want := range []string{file, "integrity_check", ".backup"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s database: serve exit %d without naming %q:\n%s", name, code, want, out)
			}
		}
	}
}
