package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// writeDist lays out a small goreleaser dist folder.
func writeDist(t *testing.T, version string) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"bcd_linux_amd64_v1/bcd":                 "bcd amd64",
		"bcd_linux_arm64_v8.0/bcd":               "bcd arm64",
		"bcx-ipmi_linux_amd64_v1/bcx-ipmi":       "ipmi amd64",
		"bcd_" + version + "_linux_amd64.tar.gz": "archive",
		"bcd_" + version + "_linux_amd64.deb":    "deb",
		"bcd_" + version + "_linux_amd64.rpm":    "rpm",
		"checksums.txt":                          "sums",
		"metadata.json":                          `{"project_name":"better-compute","version":"` + version + `"}`,
		"artifacts.json":                         "[]",
		"config.yaml":                            "version: 2",
		"notes.txt":                              "not an artifact",
		"bcd_linux_amd64_v1/extra/deep":          "skipped",
	}
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "bcd_linux_amd64_v1", "passwd")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestBuild(t *testing.T) {
	t.Parallel()
	dir := writeDist(t, "0.1.0")
	m, err := Build(dir, BuildOptions{Version: "0.1.0", Now: t0, TTL: 720 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range m.Artifacts {
		names = append(names, a.Name+":"+a.Kind+":"+a.Binary+":"+a.OS+"/"+a.Arch)
	}
	want := []string{
		"bcd_0.1.0_linux_amd64.deb:package:bcd:linux/amd64",
		"bcd_0.1.0_linux_amd64.rpm:package:bcd:linux/amd64",
		"bcd_0.1.0_linux_amd64.tar.gz:archive:bcd:linux/amd64",
		"bcd_linux_amd64_v1/bcd:binary:bcd:linux/amd64",
		"bcd_linux_arm64_v8.0/bcd:binary:bcd:linux/arm64",
		"bcx-ipmi_linux_amd64_v1/bcx-ipmi:binary:bcx-ipmi:linux/amd64",
		"checksums.txt:checksums::/",
	}
	if strings.Join(names, "\n") != strings.Join(want, "\n") {
		t.Fatalf("artifacts:\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
	a, ok := m.Find(KindBinary, "bcd", "linux", "amd64")
	sum := sha256.Sum256([]byte("bcd amd64"))
	if !ok || a.Size != 9 || a.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("Find = %+v %v", a, ok)
	}
	if m.ExpiresAt == nil || !m.ExpiresAt.Equal(t0.Add(720*time.Hour)) || !m.CreatedAt.Equal(t0) {
		t.Fatalf("times: %v %v", m.CreatedAt, m.ExpiresAt)
	}
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(b)
	if err != nil || len(back.Artifacts) != len(m.Artifacts) {
		t.Fatalf("round trip: %v", err)
	}
}

func TestBuildRefuses(t *testing.T) {
	t.Parallel()
	dir := writeDist(t, "0.1.0")
	if _, err := Build(dir, BuildOptions{Version: "0.2.0"}); err == nil || !strings.Contains(err.Error(), "holds version 0.1.0") {
		t.Errorf("version mismatch: %v", err)
	}
	if _, err := Build(dir, BuildOptions{Version: "v0.1.0"}); err == nil {
		t.Error("leading v accepted")
	}
	if _, err := Build(t.TempDir(), BuildOptions{Version: "0.1.0"}); err == nil || !strings.Contains(err.Error(), "no release artifacts") {
		t.Errorf("empty folder: %v", err)
	}
	if _, err := Build(filepath.Join(dir, "missing"), BuildOptions{Version: "0.1.0"}); err == nil {
		t.Error("missing folder accepted")
	}
}

func TestParseRefuses(t *testing.T) {
	t.Parallel()
	good := `{"version":"0.1.0","created_at":"2026-01-02T03:04:05Z","artifacts":[{"name":"bcd_linux_amd64_v1/bcd","os":"linux","arch":"amd64","sha256":"` + strings.Repeat("a", 64) + `","size":1,"kind":"binary","binary":"bcd"}]}`
	if _, err := Parse([]byte(good)); err != nil {
		t.Fatalf("good manifest: %v", err)
	}
	// An unknown field (a later release's) is read and ignored.
	if _, err := Parse([]byte(strings.Replace(good, `"version"`, `"future":1,"version"`, 1))); err != nil {
		t.Fatalf("unknown field: %v", err)
	}
	for name, doc := range map[string]string{
		"trailing":    good + "{}",
		"no version":  strings.Replace(good, `"0.1.0"`, `""`, 1),
		"v version":   strings.Replace(good, `"0.1.0"`, `"v0.1.0"`, 1),
		"dotdot name": strings.Replace(good, `bcd_linux_amd64_v1/bcd`, `../bcd`, 1),
		"abs name":    strings.Replace(good, `bcd_linux_amd64_v1/bcd`, `/bcd`, 1),
		"bad sha":     strings.Replace(good, strings.Repeat("a", 64), strings.Repeat("A", 64), 1),
		"neg size":    strings.Replace(good, `"size":1`, `"size":-1`, 1),
		"no created":  strings.Replace(good, `"created_at":"2026-01-02T03:04:05Z",`, ``, 1),
		"expires":     strings.Replace(good, `"created_at"`, `"expires_at":"2025-01-01T00:00:00Z","created_at"`, 1),
		"no binary":   strings.Replace(good, `,"binary":"bcd"`, ``, 1),
		"wrong type":  strings.Replace(good, `"size":1`, `"size":"1"`, 1),
		"duplicate":   strings.Replace(good, `]}`, `,{"name":"bcd_linux_amd64_v1/bcd","sha256":"`+strings.Repeat("b", 64)+`","size":1,"kind":"archive"}]}`, 1),
		"no artifact": `{"version":"0.1.0","created_at":"2026-01-02T03:04:05Z","artifacts":[]}`,
	} {
		if _, err := Parse([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := Parse(make([]byte, MaxSize+1)); err == nil {
		t.Error("oversized accepted")
	}
}

func TestExpired(t *testing.T) {
	t.Parallel()
	exp := t0.Add(time.Hour)
	m := &Manifest{ExpiresAt: &exp}
	if m.Expired(t0) || !m.Expired(exp) {
		t.Fatal("Expired")
	}
	if (&Manifest{}).Expired(t0.Add(1000 * time.Hour)) {
		t.Fatal("a manifest without expiry expired")
	}
	if !errors.Is(ErrExpired, ErrExpired) {
		t.Fatal()
	}
}
