package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/installer"
	"github.com/better-compute/better-compute/tests/testenv"
)

// systemdAnalyze returns systemd-analyze (Debian's systemd package), or
// skips without it; under CI=true its absence is a failure.
func systemdAnalyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("systemd-analyze is not installed (apt-get install systemd): %v", err)
		}
		t.Skipf("systemd-analyze is not installed (apt-get install systemd): %v", err)
	}
	return p
}

// unitRoot makes a throwaway root for systemd-analyze verify --root: the
// host's system units (sysinit.target and the rest a unit is checked
// against) in usr/lib/systemd/system, units (file name → content) beside
// them, and binaries (path in the root → the file copied there).
func unitRoot(t *testing.T, units map[string][]byte, binaries map[string]string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "usr", "lib", "systemd")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", "/usr/lib/systemd/system", dir).CombinedOutput(); err != nil {
		t.Fatalf("copy the host's system units: %v: %s", err, out)
	}
	for name, body := range units {
		if err := os.WriteFile(filepath.Join(dir, "system", name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for dst, src := range binaries {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, dst)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// verifyUnits runs systemd-analyze verify on the named units inside root
// and returns its complaints: a non-zero exit or any output (systemd-analyze
// exits 0 on an unknown key or a bad value, and only warns).
func verifyUnits(t *testing.T, root string, names ...string) string {
	t.Helper()
	args := append([]string{"verify", "--root=" + root, "--man=false"}, names...)
	out, err := exec.Command(systemdAnalyze(t), args...).CombinedOutput()
	if err != nil || len(out) > 0 {
		return strings.TrimSpace(string(out)) + " (" + strings.Join(args, " ") + ": " + errString(err) + ")"
	}
	return ""
}

func errString(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}

// securityRow is one option systemd-analyze security flags (✗).
type securityRow struct {
	Name, Exposure string
}

var exposureRE = regexp.MustCompile(`Overall exposure level for \S+: (\d+\.\d+)`)

// unitSecurity scores the unit file at path with systemd-analyze security
// --offline=true and returns the overall exposure and the flagged options.
func unitSecurity(t *testing.T, path string) (float64, []securityRow) {
	t.Helper()
	out, err := exec.Command(systemdAnalyze(t), "security", "--offline=true", "--no-pager", path).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security %s: %v\n%s", path, err, out)
	}
	m := exposureRE.FindSubmatch(out)
	if m == nil {
		t.Fatalf("systemd-analyze security %s: no overall exposure in\n%s", path, out)
	}
	score, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	var flagged []securityRow
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "✗" {
			flagged = append(flagged, securityRow{Name: f[1], Exposure: f[len(f)-1]})
		}
	}
	return score, flagged
}

// named reports whether unit sets or names (in a comment) the option of a
// flagged row, in one entry: a setting line, or a comment item from its
// "# - " to the next. "SystemCallFilter=~@clock" wants SystemCallFilter=
// and @clock in the same entry, "User=/DynamicUser=" wants User=.
func named(unit, row string) bool {
	key, item, _ := strings.Cut(row, "=")
	item = strings.TrimPrefix(strings.TrimPrefix(item, "~"), "/")
	if item == "" || strings.HasSuffix(item, "=") || item == "…" {
		item = ""
	}
	var entries []string
	for line := range strings.Lines(unit) {
		if strings.HasPrefix(line, "#   ") && len(entries) > 0 {
			entries[len(entries)-1] += line // a comment item goes on
			continue
		}
		entries = append(entries, line)
	}
	for _, e := range entries {
		if strings.Contains(e, key+"=") && strings.Contains(e, item) {
			return true
		}
	}
	return false
}

// TestUnitsAnalyze checks every systemd unit we ship or the install script
// writes with systemd-analyze: verify passes with the real binary at the
// ExecStart path, and security --offline=true scores the sandboxed units
// (unprivileged bcd as the packages and the install script's --unprivileged
// write it, better-compute) at 5.0 or lower and the root units
// (bcd in root mode, bcd-helper) below the 9.6 they scored unhardened;
// every option flagged in a root unit or better-compute.service is set or
// named in a comment there, with the reason.
func TestUnitsAnalyze(t *testing.T) {
	systemdAnalyze(t)
	t.Parallel()
	packaged, err := installer.Units(installer.UnitOptions{BinDir: "/usr/bin", Unprivileged: true})
	if err != nil {
		t.Fatal(err)
	}
	scripted, err := installer.Units(installer.UnitOptions{BinDir: "/usr/local/bin"})
	if err != nil {
		t.Fatal(err)
	}
	scriptedUnprivileged, err := installer.Units(installer.UnitOptions{BinDir: "/usr/local/bin", Unprivileged: true})
	if err != nil {
		t.Fatal(err)
	}
	cpUnit, err := os.ReadFile(filepath.Join(repoRoot(), "packaging", "systemd", "better-compute.service"))
	if err != nil {
		t.Fatal(err)
	}
	bcd, cp := testenv.Binary(t, "bcd"), testenv.Binary(t, "better-compute")
	cases := []struct {
		name     string
		units    map[string][]byte
		binaries map[string]string
		unit     string  // the unit scored
		max      float64 // the highest score accepted
		explain  bool    // every flagged option set or named
	}{
		{"unprivileged bcd.service (deb, rpm)", packaged, map[string]string{"/usr/bin/bcd": bcd}, "bcd.service", 5.0, false},
		{"bcd-helper.service (deb, rpm)", packaged, map[string]string{"/usr/bin/bcd": bcd}, "bcd-helper.service", 9.5, true},
		{"root bcd.service (install script)", scripted, map[string]string{"/usr/local/bin/bcd": bcd}, "bcd.service", 9.5, true},
		{"unprivileged bcd.service (install script --unprivileged)", scriptedUnprivileged, map[string]string{"/usr/local/bin/bcd": bcd}, "bcd.service", 5.0, false},
		{"bcd-helper.service (install script --unprivileged)", scriptedUnprivileged, map[string]string{"/usr/local/bin/bcd": bcd}, "bcd-helper.service", 9.5, true},
		{"better-compute.service (deb, rpm)", map[string][]byte{"better-compute.service": cpUnit},
			map[string]string{"/usr/bin/better-compute": cp}, "better-compute.service", 5.0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := unitRoot(t, c.units, c.binaries)
			if msg := verifyUnits(t, root, c.unit); msg != "" {
				t.Errorf("systemd-analyze verify %s: %s", c.unit, msg)
			}
			path := filepath.Join(root, "usr", "lib", "systemd", "system", c.unit)
			score, flagged := unitSecurity(t, path)
			t.Logf("systemd-analyze security --offline=true %s: %.1f (highest accepted %.1f)", c.name, score, c.max)
			if score > c.max {
				t.Errorf("%s scores %.1f, want %.1f or lower", c.name, score, c.max)
			}
			if !c.explain {
				return
			}
			unit := string(c.units[c.unit])
			for _, row := range flagged {
				if !named(unit, row.Name) {
					t.Errorf("%s: systemd-analyze flags %s (%s) and the unit neither sets it nor says why not", c.name, row.Name, row.Exposure)
				}
			}
		})
	}
}

// TestUnitsAnalyzeFails keeps the checks above honest: a unit with a bad
// value, or an ExecStart binary missing from the root, fails verify.
func TestUnitsAnalyzeFails(t *testing.T) {
	systemdAnalyze(t)
	t.Parallel()
	unit, err := os.ReadFile(filepath.Join(repoRoot(), "packaging", "systemd", "better-compute.service"))
	if err != nil {
		t.Fatal(err)
	}
	bad := strings.Replace(string(unit), "Restart=always", "Restart=sometimes", 1)
	root := unitRoot(t, map[string][]byte{"better-compute.service": []byte(bad)},
		map[string]string{"/usr/bin/better-compute": testenv.Binary(t, "better-compute")})
	if msg := verifyUnits(t, root, "better-compute.service"); !strings.Contains(msg, "sometimes") {
		t.Errorf("verify of Restart=sometimes: %q, want a complaint naming the value", msg)
	}
	root = unitRoot(t, map[string][]byte{"better-compute.service": unit}, nil)
	if msg := verifyUnits(t, root, "better-compute.service"); !strings.Contains(msg, "/usr/bin/better-compute") {
		t.Errorf("verify without the binary: %q, want a complaint naming it", msg)
	}
}
