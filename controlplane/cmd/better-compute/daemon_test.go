package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// TestInstallScriptChecksPlacement runs daemon install-script against an
// in-process API: --pool and --site must exist there.
func TestInstallScriptChecksPlacement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	site, pool := mustSitePool(t, st, "site-a", "pool-a")
	other, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "site-b", Region: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	c := apiCLI(t, st, strings.Repeat("s", 32), mustToken(t, st, store.RoleViewer))
	base := []string{"daemon", "install-script", "--gateway-url", "https://gw.example.com:8443",
		"--base-url", "https://compute.example.com", "--bcd-version", "0.1.0", "--out", "-"}
	with := func(extra ...string) []string { return append(append([]string{}, base...), extra...) }

	c.fails(exitUsage, "--pool nosuchpool: no such pool on the control plane; pools: pool-a ("+pool.ID+")", with("--pool", "nosuchpool")...)
	c.fails(exitUsage, "--site nosite: no such site on the control plane; sites: site-a ("+site.ID+"), site-b ("+other.ID+")", with("--site", "nosite")...)
	c.fails(exitUsage, "--pool pool-a is at site site-a, not --site site-b", with("--pool", "pool-a", "--site", "site-b")...)
	for _, args := range [][]string{{"--pool", "pool-a"}, {"--pool", pool.ID, "--site", "site-a"}, {"--site", site.ID}} {
		out := c.ok(with(args...)...)
		if !strings.Contains(out, "POOL=") || !strings.HasSuffix(out, "main \"$@\" --end-of-install-script\n") {
			t.Errorf("%v: script:\n%s", args, out)
		}
	}
	// Without --pool and --site the token decides and no API is needed.
	offline := cli{t: t, env: map[string]string{config.EnvDataDir: t.TempDir(), "HOME": t.TempDir(), envURL: "http://127.0.0.1:1", envToken: "bcat_x"}}
	if out := offline.ok(base...); !strings.Contains(out, "pool and site: the join token decides") {
		t.Errorf("script without --pool:\n%s", out)
	}
	offline.fails(1, "check --site and --pool on the control plane", with("--pool", "pool-a")...)
	// Flag errors come before any API call.
	offline.fails(exitUsage, "plain HTTP", "daemon", "install-script", "--pool", "pool-a", "--gateway-url", "https://gw.example.com:8443",
		"--base-url", "http://10.1.2.3:3000", "--bcd-version", "0.1.0", "--out", "-")
	offline.fails(exitUsage, "--pinned-pubkey", with("--pinned-pubkey", "sha256/abc")...)
}

// TestReleaseKeygenSignInstallScript: a key from release keygen --out signs
// a manifest with release sign, verifies with release verify and with the
// minisign tool, and install-script takes its pin.
func TestReleaseKeygenSignInstallScript(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	c := cli{t: t, env: map[string]string{config.EnvDataDir: t.TempDir(), "HOME": t.TempDir()}}
	key := filepath.Join(dir, "keys", "release.key")
	out := c.ok("release", "keygen", "--out", key)
	m := regexp.MustCompile(`(?m)^pin:\s+(sha256/\S+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("keygen printed no pin:\n%s", out)
	}
	pin := m[1]
	if got := mode(t, key); got != 0o600 {
		t.Errorf("%s mode %o, want 600", key, got)
	}
	if _, err := os.Stat(key + ".pub"); err != nil {
		t.Fatal(err)
	}
	c.fails(1, "exists; not overwriting", "release", "keygen", "--out", key)
	c.fails(exitUsage, "not both", "release", "keygen", "--out", key+"2", "--out-dir", dir)
	c.fails(exitUsage, "--out FILE", "release", "keygen")

	dist := filepath.Join(dir, "dist")
	for p, body := range map[string]string{"bcd_linux_amd64_v1/bcd": "bcd amd64", "bcd_linux_arm64_v8.0/bcd": "bcd arm64",
		"metadata.json": `{"version":"0.3.0"}`} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dist, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dist, p), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mf := filepath.Join(dist, "manifest.json")
	c.ok("release", "manifest", "--dist", dist, "--version", "0.3.0")
	c.ok("release", "sign", "--key", key, "--in", mf)
	c.ok("release", "verify", "--pins", pin, "--in", mf)
	if mini, err := exec.LookPath("minisign"); err == nil {
		if b, err := exec.Command(mini, "-V", "-p", key+".pub", "-m", mf).CombinedOutput(); err != nil {
			t.Errorf("minisign -V: %v\n%s", err, b)
		}
	} else if os.Getenv("CI") == "true" {
		t.Error("minisign is not installed (apt-get install minisign)")
	}
	script := c.ok("daemon", "install-script", "--gateway-url", "https://gw.example.com:8443", "--base-url", "http://127.0.0.1:3000",
		"--bcd-version", "0.3.0", "--release-manifest", mf, "--release-pins", pin, "--out", "-")
	if !strings.Contains(script, "RELEASE_PINS='"+pin+"'") || !strings.Contains(script, "PINNED=1") {
		t.Errorf("script does not pin the key:\n%s", script)
	}
	// The well-formed pin of another key: the manifest does not verify,
	// which fails the command (exit 1) rather than misusing it (exit 2).
	m = regexp.MustCompile(`(?m)^pin:\s+(sha256/\S+)$`).FindStringSubmatch(c.ok("release", "keygen", "--out", filepath.Join(dir, "other", "release.key")))
	if m == nil || m[1] == pin {
		t.Fatalf("second keygen: pin %v", m)
	}
	c.fails(exitFailure, "signed by a key that is not pinned", "daemon", "install-script", "--gateway-url", "https://gw.example.com:8443",
		"--base-url", "http://127.0.0.1:3000", "--bcd-version", "0.3.0", "--release-manifest", mf, "--release-pins", m[1], "--out", "-")
	c.fails(exitUsage, "--release-manifest is for version 0.3.0", "daemon", "install-script", "--gateway-url", "https://gw.example.com:8443",
		"--base-url", "http://127.0.0.1:3000", "--bcd-version", "0.4.0", "--release-manifest", mf, "--release-pins", pin, "--out", "-")
}
