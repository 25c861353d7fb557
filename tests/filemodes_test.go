package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/tests/testenv"
)

// TestDataDirModes starts the embedded default's serve in a data directory
// that already existed with mode 0755: while it runs the directory is 0700
// and the database (state.db, -wal, -shm), the secret, the first admin
// token and the gateway key are 0600. The directory and the files but the
// key loosened again to 0755 and 0644 (an earlier build, a copy), a restart
// makes them 0700 and 0600 again.
func TestDataDirModes(t *testing.T) {
	t.Parallel()
	bin := testenv.Binary(t, "better-compute")
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // past the umask
		t.Fatal(err)
	}
	gwAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cfgFile := testenv.WriteFile(t, "better-compute.yaml",
		fmt.Sprintf("host:\n  listen: 127.0.0.1:%d\n  gateway:\n    listen: %s\n", freePort(t), gwAddr))
	env := []string{"BETTER_COMPUTE_DATA_DIR=" + dir}
	secrets := []string{"state.db", "state.db-wal", "state.db-shm", "secret", "admin-token", filepath.Join("pki", "gateway.key")}
	check := func(when string) {
		t.Helper()
		want := map[string]os.FileMode{dir: 0o700}
		for _, f := range secrets {
			want[filepath.Join(dir, f)] = 0o600
		}
		for path, mode := range want {
			fi, err := os.Stat(path)
			if err != nil {
				t.Errorf("%s: %v", when, err)
				continue
			}
			if fi.Mode().Perm() != mode {
				t.Errorf("%s: %s has mode %o, want %o", when, path, fi.Mode().Perm(), mode)
			}
		}
	}
	start := func() *testenv.Proc {
		t.Helper()
		p := testenv.Start(t, env, bin, "serve", "--config", cfgFile)
		p.WaitLine(`msg="API listening"`, 60*time.Second)
		p.WaitLine(`msg="Gateway listening" .*addr=`+regexp.QuoteMeta(gwAddr), 60*time.Second)
		return p
	}

	serve := start()
	check("first start in a 0755 directory")
	serve.Signal(syscall.SIGTERM)
	if code := serve.Wait(30 * time.Second); code != 0 {
		t.Fatalf("serve exited %d after SIGTERM, want 0", code)
	}

	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// All but the gateway key, which the embedded default keeps while its
	// certificate is usable (the 0700 directory covers it).
	for _, f := range secrets[:5] {
		if err := os.Chmod(filepath.Join(dir, f), 0o644); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	start()
	check("restart after the files were loosened to 0644")
}
