package installer

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/installer/manifest"
)

var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// release makes a signed manifest of a dist with bcd and bcx-ipmi for
// amd64 and arm64, and returns it with its signature and pin.
func release(t *testing.T, version string, ttl time.Duration) (doc, sig []byte, pin string) {
	t.Helper()
	dist := t.TempDir()
	for _, p := range []string{"bcd_linux_amd64_v1/bcd", "bcd_linux_arm64_v8.0/bcd", "bcx-ipmi_linux_amd64_v1/bcx-ipmi", "bcx-ipmi_linux_arm64_v8.0/bcx-ipmi"} {
		f := filepath.Join(dist, p)
		os.MkdirAll(filepath.Dir(f), 0o755)
		os.WriteFile(f, []byte(p), 0o755)
	}
	m, err := manifest.Build(dist, manifest.BuildOptions{Version: version, Now: now, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	doc, _ = m.Marshal()
	_, priv, pin, err := manifest.GenerateKey("")
	if err != nil {
		t.Fatal(err)
	}
	sk, _ := manifest.ParsePrivateKey(priv, "")
	sig, err = manifest.Sign(doc, sk, now)
	if err != nil {
		t.Fatal(err)
	}
	return doc, sig, pin
}

func baseOptions() Options {
	return Options{Pool: "pool_abc", Site: "site_xyz", GatewayURL: "https://gw.eu-1.example.com:8443",
		BaseURL: "https://compute.example.com", Version: "0.1.0", Now: now}
}

func TestGenerateShellcheck(t *testing.T) {
	t.Parallel()
	doc, sig, pin := release(t, "0.1.0", 0)
	variants := map[string]Options{}
	variants["unpinned"] = baseOptions()
	o := baseOptions()
	o.Manifest, o.Signature, o.Pins, o.Plugins, o.Unprivileged = doc, sig, []string{pin}, []string{"bcx-ipmi"}, true
	variants["pinned-unprivileged-ipmi"] = o
	o = baseOptions()
	o.BaseURL = "http://10.0.0.5:3000/prefix"
	o.Manifest, o.Signature, o.Pins = doc, sig, []string{pin}
	variants["pinned-http"] = o
	for name, opts := range variants {
		script, err := Generate(opts)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		path := filepath.Join(t.TempDir(), "install.sh")
		if err := os.WriteFile(path, script, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, sh := range []string{"dash", "bash"} {
			if out, err := exec.Command(sh, "-n", path).CombinedOutput(); err != nil {
				t.Errorf("%s: %s -n: %v\n%s", name, sh, err, out)
			}
		}
		if _, err := exec.LookPath("shellcheck"); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatal("shellcheck is not installed (apt-get install shellcheck)")
			}
			t.Log("shellcheck is not installed; skipping lint")
			continue
		}
		if out, err := exec.Command("shellcheck", "-s", "sh", path).CombinedOutput(); err != nil {
			t.Errorf("%s: shellcheck: %v\n%s", name, err, out)
		}
	}
}

func TestGeneratePins(t *testing.T) {
	t.Parallel()
	doc, sig, pin := release(t, "0.1.0", 0)
	o := baseOptions()
	o.Manifest, o.Signature, o.Pins, o.Plugins = doc, sig, []string{pin}, []string{"bcx-ipmi"}
	script, err := Generate(o)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := manifest.Parse(doc)
	for _, prog := range []string{"bcd", "bcx-ipmi"} {
		for _, arch := range Arches {
			a, _ := m.Find(manifest.KindBinary, prog, "linux", arch)
			if !strings.Contains(string(script), "'"+prog+"/"+arch+"') echo '"+a.SHA256+"'") {
				t.Errorf("script does not pin %s/%s", prog, arch)
			}
		}
	}
	for _, want := range []string{"PINNED=1", "DOWNLOADS_URL='https://compute.example.com/api/downloads'", "RELEASE_PINS='" + pin + "'", "HTTPS_ONLY=1"} {
		if !strings.Contains(string(script), want) {
			t.Errorf("script lacks %s", want)
		}
	}
}

func TestGenerateRefuses(t *testing.T) {
	t.Parallel()
	doc, sig, pin := release(t, "0.1.0", 0)
	_, otherSig, otherPin := release(t, "0.1.0", 0)
	expDoc, expSig, expPin := release(t, "0.1.0", time.Hour)
	noArm := func() Options { // a manifest without bcx-ipmi
		o := baseOptions()
		o.Manifest, o.Signature, o.Pins, o.Plugins = doc, sig, []string{pin}, []string{"bcx-ipmi"}
		return o
	}
	_ = noArm
	cases := []struct {
		name   string
		mutate func(*Options)
		want   string
	}{
		{"no pool", func(o *Options) { o.Pool = "" }, "--pool is required"},
		{"shell in pool", func(o *Options) { o.Pool = "p'; rm -rf /; '" }, "--pool"},
		{"newline in site", func(o *Options) { o.Site = "a\nb" }, "--site"},
		{"http gateway", func(o *Options) { o.GatewayURL = "http://gw:8443" }, "https"},
		{"gateway path", func(o *Options) { o.GatewayURL = "https://gw:8443/x" }, "no path"},
		{"gateway user", func(o *Options) { o.GatewayURL = "https://u:p@gw:8443" }, "credentials"},
		{"bad port", func(o *Options) { o.GatewayURL = "https://gw:99999" }, ""},
		{"no base", func(o *Options) { o.BaseURL = "" }, "--base-url is required"},
		{"base query", func(o *Options) { o.BaseURL = "https://c.example.com/?x=$(id)" }, "query"},
		{"base ftp", func(o *Options) { o.BaseURL = "ftp://c.example.com" }, "https"},
		{"base quote", func(o *Options) { o.BaseURL = "https://c.example.com/a'b" }, "path"},
		{"http unpinned", func(o *Options) { o.BaseURL = "http://c.example.com" }, "must be https"},
		{"no version", func(o *Options) { o.Version = "" }, "--bcd-version is required"},
		{"v version", func(o *Options) { o.Version = "v0.1.0" }, "--bcd-version"},
		{"unknown plugin", func(o *Options) { o.Plugins = []string{"bcx-nope"} }, "known plugins"},
		{"manifest without pins", func(o *Options) { o.Manifest, o.Signature = doc, sig }, "needs --release-pins"},
		{"pins without manifest", func(o *Options) { o.Pins = []string{pin} }, "needs --release-manifest"},
		{"no signature", func(o *Options) { o.Manifest, o.Pins = doc, []string{pin} }, "signature"},
		{"bad pin", func(o *Options) { o.Manifest, o.Signature, o.Pins = doc, sig, []string{"sha256/xx"} }, "invalid release pin"},
		{"unpinned key", func(o *Options) { o.Manifest, o.Signature, o.Pins = doc, sig, []string{otherPin} }, "not pinned"},
		{"other signature", func(o *Options) { o.Manifest, o.Signature, o.Pins = doc, otherSig, []string{pin} }, "not pinned"},
		{"expired", func(o *Options) {
			o.Manifest, o.Signature, o.Pins, o.Now = expDoc, expSig, []string{expPin}, now.Add(2*time.Hour)
		}, "expired"},
		{"other version", func(o *Options) { o.Manifest, o.Signature, o.Pins, o.Version = doc, sig, []string{pin}, "0.2.0" }, "not --bcd-version 0.2.0"},
	}
	for _, c := range cases {
		o := baseOptions()
		c.mutate(&o)
		_, err := Generate(o)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error is not one line: %q", c.name, err)
		}
	}
}

func TestShellQuote(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "a", "it's", "'", `"$(id)"`, "a b\tc"} {
		out, err := exec.Command("sh", "-c", "printf %s "+shellQuote(s)).Output()
		if err != nil || string(out) != s {
			t.Errorf("shellQuote(%q) -> %q (%v)", s, out, err)
		}
	}
}
