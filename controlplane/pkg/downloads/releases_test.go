package downloads

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"
)

func TestVersionsAndManifest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "0.9.0", "bcd_linux_amd64_v1", "bcd"), "bcd 0.9")
	write(t, filepath.Join(dir, "0.10.0", "bcd_linux_arm64_v8.0", "bcd"), "bcd 0.10")
	write(t, filepath.Join(dir, "0.10.0-rc.1", "bcd_linux_amd64_v1", "bcd"), "bcd 0.10 rc")
	targz(t, filepath.Join(dir, "0.2.0", "bcd_0.2.0_linux_amd64.tar.gz"), "bcd", "bcd 0.2")
	write(t, filepath.Join(dir, "0.11.0", "bcd_darwin_arm64", "bcd"), "not for Linux")
	write(t, filepath.Join(dir, "0.12.0", "bcx-ipmi_linux_amd64_v1", "bcx-ipmi"), "a plugin only")
	write(t, filepath.Join(dir, "notes", "bcd_linux_amd64_v1", "bcd"), "not a version")
	write(t, filepath.Join(dir, "0.9.0", "manifest.json"), `{"version":"0.9.0"}`)
	write(t, filepath.Join(dir, "0.9.0", "manifest.json.minisig"), "sig")
	write(t, filepath.Join(dir, "0.10.0", "manifest.json"), `{"version":"0.10.0"}`)
	h, err := New(Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if got, want := h.Versions("bcd"), []string{"0.10.0", "0.10.0-rc.1", "0.9.0", "0.2.0"}; !slices.Equal(got, want) {
		t.Fatalf("Versions(bcd) = %v, want %v", got, want)
	}
	if got := h.Versions("bcx-ipmi"); !slices.Equal(got, []string{"0.12.0"}) {
		t.Fatalf("Versions(bcx-ipmi) = %v", got)
	}
	m, sig, err := h.Manifest("0.9.0")
	if err != nil || string(m) != `{"version":"0.9.0"}` || string(sig) != "sig" {
		t.Fatalf("Manifest(0.9.0) = %q %q %v", m, sig, err)
	}
	if _, _, err := h.Manifest("0.10.0"); !errors.Is(err, ErrNoManifest) {
		t.Fatalf("a manifest without its signature: %v, want ErrNoManifest", err)
	}
	if _, _, err := h.Manifest("0.2.0"); !errors.Is(err, ErrNoManifest) {
		t.Fatalf("no manifest: %v", err)
	}

	// One release in the folder itself, named by metadata.json.
	one := t.TempDir()
	write(t, filepath.Join(one, "metadata.json"), `{"project_name":"better-compute","version":"1.2.3"}`)
	write(t, filepath.Join(one, "bcd_linux_amd64_v1", "bcd"), "bcd 1.2.3")
	h1, err := New(Config{Dir: one})
	if err != nil {
		t.Fatal(err)
	}
	defer h1.Close()
	if got := h1.Versions("bcd"); !slices.Equal(got, []string{"1.2.3"}) {
		t.Fatalf("single release: %v", got)
	}
}

func TestCompareVersions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"0.10.0", "0.9.0", 1}, {"1.0.0", "1.0.0-rc.1", 1}, {"1.0.0-rc.2", "1.0.0-rc.10", -1},
		{"1.0.0-alpha", "1.0.0-alpha.1", -1}, {"1.0.0-1", "1.0.0-alpha", -1}, {"1.0.0+a", "1.0.0+b", 0},
	} {
		if got := compareVersions(tc.a, tc.b); got != tc.want {
			t.Errorf("compareVersions(%s, %s) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := compareVersions(tc.b, tc.a); got != -tc.want {
			t.Errorf("compareVersions(%s, %s) = %d, want %d", tc.b, tc.a, got, -tc.want)
		}
	}
}
