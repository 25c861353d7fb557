package testenv

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// InitPostgresPKI migrates the PostgreSQL database of env, runs pki init
// for trustDomain and pki issue-gateway for localhost and 127.0.0.1, and
// returns the configuration lines that point the gateway at the
// certificate files (to go under host.gateway). With PostgreSQL the
// gateway role refuses to start without them. env must carry the
// deployment secret every process uses.
func InitPostgresPKI(t testing.TB, env []string, trustDomain string) string {
	t.Helper()
	bin := Binary(t, "better-compute")
	dir := t.TempDir()
	for _, args := range [][]string{
		{"migrate"},
		{"pki", "init", "--trust-domain", trustDomain},
		{"pki", "issue-gateway", "--dns", "localhost", "--ip", "127.0.0.1", "--out-dir", dir},
	} {
		if code, stdout, stderr := Run(t, env, "", bin, args...); code != 0 {
			t.Fatalf("better-compute %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
		}
	}
	return fmt.Sprintf("    tlsFiles:\n      cert: %s\n      key: %s\n",
		filepath.Join(dir, "gateway.crt"), filepath.Join(dir, "gateway.key"))
}
