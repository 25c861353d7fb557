package tests

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/bcd/plugin"
	"github.com/better-compute/better-compute/installer/manifest"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestInstallScriptPlugins runs an install script made with
// --install-plugins bcx-ipmi: bcx-ipmi is downloaded from the control plane,
// checked against the signed manifest and installed in bcd's plugin
// directory, where bcd's plugin host accepts it; a second run changes
// nothing; a plugin whose digest does not match is refused before anything
// is installed.
func TestInstallScriptPlugins(t *testing.T) {
	t.Parallel()
	e := newInstallEnv(t)
	const version = "0.3.0"
	dir := filepath.Join(e.dist, version)
	copyFile(t, testenv.Binary(t, "bcx-ipmi"), filepath.Join(dir, buildDir("bcx-ipmi"), "bcx-ipmi"), 0o755)
	m := e.release(version, bcdAt(t, version))
	want, ok := m.Find(manifest.KindBinary, "bcx-ipmi", "linux", runtime.GOARCH)
	if !ok {
		t.Fatalf("the release manifest lists no bcx-ipmi for linux/%s", runtime.GOARCH)
	}
	script := e.script(version, "--install-plugins", "bcx-ipmi")
	h := newHost(t)

	code, stdout, stderr := h.run("dash", script, nil, "--token-file", e.token(1))
	if code != 0 {
		t.Fatalf("install: exit %d\n%s%s", code, stdout, stderr)
	}
	pluginDir := filepath.Join(h.root, "usr/lib/bcd/plugins")
	installed := filepath.Join(pluginDir, "bcx-ipmi")
	if !strings.Contains(stdout, "installed "+installed) {
		t.Errorf("the script did not say it installed %s:\n%s", installed, stdout)
	}
	if got := sha256File(t, installed); got != want.SHA256 {
		t.Errorf("installed bcx-ipmi sha256 %s, manifest %s", got, want.SHA256)
	}
	for _, p := range []string{installed, pluginDir, filepath.Dir(pluginDir)} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v %v, want mode 0755", p, fi.Mode(), err)
		}
	}
	if _, err := os.Stat(filepath.Join(h.root, "usr/local/bin/bcx-ipmi")); err == nil {
		t.Error("bcx-ipmi was also installed in /usr/local/bin")
	}
	// bcd's plugin host runs it from there.
	host, err := plugin.New(plugin.Config{Dir: pluginDir})
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	if st := host.List(); len(st) != 1 || st[0].Name != "ipmi" {
		t.Errorf("the plugin host sees %+v, want bcx-ipmi", st)
	}

	code, stdout, stderr = h.run("dash", script, nil)
	if code != 0 || !strings.Contains(stdout, "nothing to change") {
		t.Fatalf("second run: exit %d\n%s%s", code, stdout, stderr)
	}

	// A plugin that is not the one the manifest names is refused, and
	// nothing is installed.
	copyFile(t, testenv.Binary(t, "bcd"), filepath.Join(dir, buildDir("bcx-ipmi"), "bcx-ipmi"), 0o755)
	h2 := newHost(t)
	code, _, stderr = h2.run("dash", script, nil, "--token-file", e.token(1))
	h2.refused(code, stderr, "bcx-ipmi from")
}
