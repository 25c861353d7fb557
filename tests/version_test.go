package tests

import (
	"runtime"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/tests/testenv"
)

// Both binaries print the version stamped at build time, the commit and the
// Go version.
func TestVersionStamped(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"better-compute", "bcd"} {
		code, out, errOut := testenv.Run(t, nil, "", testenv.Binary(t, bin), "version")
		if code != 0 || !strings.Contains(out, "0.0.0-e2e") || !strings.Contains(out, runtime.Version()) || !strings.Contains(out, "commit") {
			t.Fatalf("%s version: exit %d, %q %q", bin, code, out, errOut)
		}
	}
}
