package tests

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/better-compute/better-compute/installer/manifest"
	"github.com/better-compute/better-compute/tests/testenv"
)

// goreleaserBin returns the cached goreleaser that installer/goreleaser.sh
// installs, or skips: compiling it takes about 13 minutes, which a test run
// never waits for.
func goreleaserBin(t *testing.T) string {
	t.Helper()
	tools := os.Getenv("BETTER_COMPUTE_TOOLS")
	if tools == "" {
		tools = filepath.Join(os.Getenv("HOME"), ".cache", "better-compute", "tools")
	}
	bin := filepath.Join(tools, "bin", "goreleaser")
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "v2.15.1") {
		t.Skipf("goreleaser v2.15.1 is not cached in %s: run installer/goreleaser.sh --install-only once (about 13 minutes) to run this test", bin)
	}
	return bin
}

// snapshotConfig writes .goreleaser.yaml cut down to this machine's
// linux/GOARCH, the builds whose main package exists (bcx-ipmi may not yet),
// and bcd's and bcx-ipmi's archives and packages, with dist set.
func snapshotConfig(t *testing.T, dist string) (string, []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), ".goreleaser.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	var ids []string
	var builds []any
	for _, b := range cfg["builds"].([]any) {
		build := b.(map[string]any)
		id := build["id"].(string)
		if id == "better-compute" { // pure Go and slow to build: not what this test is about
			continue
		}
		main := build["main"].(string)
		cmd := exec.Command("go", "list", main)
		cmd.Dir = repoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Logf("leaving build %s out of the snapshot: %s does not build here: %s", id, main, out)
			continue
		}
		build["goos"] = []string{"linux"}
		build["goarch"] = []string{runtime.GOARCH}
		builds = append(builds, build)
		ids = append(ids, id)
	}
	cfg["builds"] = builds
	keep := func(key string) {
		var out []any
		for _, x := range cfg[key].([]any) {
			if slices.Contains(ids, x.(map[string]any)["id"].(string)) {
				out = append(out, x)
			}
		}
		cfg[key] = out
	}
	keep("archives")
	keep("nfpms")
	cfg["checksum"].(map[string]any)["ids"] = ids
	cfg["dist"] = dist
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "goreleaser.yaml")
	if err := os.WriteFile(p, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, ids
}

// TestInstallFromGoreleaserSnapshot builds a snapshot release with the
// real goreleaser configuration, signs its manifest, serves it through
// downloads.dir and installs from it with the generated script; the
// installed bcd connects.
func TestInstallFromGoreleaserSnapshot(t *testing.T) {
	goreleaserBin(t)
	t.Parallel()
	e := newInstallEnv(t)
	snap := filepath.Join(e.dist, "snapshot")
	cfg, ids := snapshotConfig(t, snap)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(repoRoot(), "installer", "goreleaser.sh"), "--config", cfg)
	cmd.Dir = repoRoot()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("goreleaser: %v\n%s", err, out)
	}
	var md struct {
		Version string `json:"version"`
	}
	b, err := os.ReadFile(filepath.Join(snap, "metadata.json"))
	if err != nil || json.Unmarshal(b, &md) != nil || !manifest.ValidVersion(md.Version) {
		t.Fatalf("metadata.json: %v %s", err, b)
	}
	version := md.Version
	dir := filepath.Join(e.dist, version)
	if err := os.Rename(snap, dir); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		for _, f := range []string{id + "_" + version + "_linux_" + runtime.GOARCH + ".tar.gz", id + "_" + version + "_linux_" + runtime.GOARCH + ".deb",
			id + "_" + version + "_linux_" + runtime.GOARCH + ".rpm", filepath.Join(buildDir(id), id)} {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				t.Errorf("snapshot lacks %s", f)
			}
		}
	}
	sums, _ := os.ReadFile(filepath.Join(dir, "checksums.txt"))
	if strings.Contains(string(sums), ".sig") || !strings.Contains(string(sums), ".deb") {
		t.Errorf("checksums.txt:\n%s", sums)
	}
	e.cli("release", "manifest", "--dist", dir, "--version", version)
	e.cli("release", "sign", "--key", filepath.Join(e.keys, "release.key"), "--in", filepath.Join(dir, "manifest.json"))
	mb, _ := os.ReadFile(filepath.Join(dir, "manifest.json"))
	m, err := manifest.Parse(mb)
	if err != nil {
		t.Fatal(err)
	}
	bin, ok := m.Find(manifest.KindBinary, "bcd", "linux", runtime.GOARCH)
	if !ok {
		t.Fatalf("manifest has no bcd binary:\n%s", mb)
	}

	var extra []string
	if slices.Contains(ids, "bcx-ipmi") {
		extra = append(extra, "--install-plugins", "bcx-ipmi")
	} else {
		t.Log("bcx-ipmi is not buildable here: installing bcd alone")
	}
	script := e.script(version, extra...)
	h := newHost(t)
	code, stdout, stderr := h.run("dash", script, nil, "--token-file", e.token(1))
	if code != 0 {
		t.Fatalf("install: exit %d\n%s%s", code, stdout, stderr)
	}
	if got := sha256File(t, filepath.Join(h.root, "usr/local/bin/bcd")); got != bin.SHA256 {
		t.Errorf("installed bcd %s, manifest %s", got, bin.SHA256)
	}
	if slices.Contains(ids, "bcx-ipmi") {
		if _, err := os.Stat(filepath.Join(h.root, "usr/lib/bcd/plugins/bcx-ipmi")); err != nil {
			t.Error("bcx-ipmi not installed")
		}
	}
	p := testenv.Start(t, nil, filepath.Join(h.root, "usr/local/bin/bcd"), "node", "--data-dir", filepath.Join(h.root, "var/lib/bcd"))
	p.WaitLine(`msg="Starting node agent".* version=`+strings.ReplaceAll(version, ".", `\.`), 30*time.Second)
	p.WaitLine(`msg="Session established"`, 60*time.Second)
}
