package tests

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"go.yaml.in/yaml/v3"

	"github.com/better-compute/better-compute/tests/testenv"
)

// nfpmKeys maps the keys of a .goreleaser.yaml nfpms entry to nfpm's own
// (nil: goreleaser's alone, handled by nfpmConfig). A key in neither fails
// the test, so the entry and this mapping cannot drift apart silently.
var nfpmKeys = map[string]string{
	"vendor": "vendor", "homepage": "homepage", "maintainer": "maintainer", "description": "description",
	"license": "license", "contents": "contents", "scripts": "scripts", "dependencies": "depends",
	"recommends": "recommends", "suggests": "suggests", "conflicts": "conflicts", "replaces": "replaces",
	"provides": "provides", "section": "section", "priority": "priority",
}

// goreleaserOnly are the nfpms keys nfpmConfig reads itself, or that only
// name files and formats for goreleaser.
var goreleaserOnly = []string{"id", "ids", "package_name", "file_name_template", "formats", "bindir", "mtime"}

// nfpmConfig turns the .goreleaser.yaml nfpms entry id into an nfpm
// configuration (nfpm's YAML), so that the test packages exactly what a
// release does: the same contents, scripts and metadata, with the binaries
// of the entry's builds taken from bins (build id → binary built here),
// version and arch given, and goreleaser's template timestamps fixed.
func nfpmConfig(t *testing.T, id, version string, bins map[string]string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), ".goreleaser.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Builds []goreleaserBuild `yaml:"builds"`
		NFPMs  []map[string]any  `yaml:"nfpms"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(cfg.NFPMs, func(e map[string]any) bool { return e["id"] == id })
	if i < 0 {
		t.Fatalf(".goreleaser.yaml has no nfpms entry %q", id)
	}
	entry := cfg.NFPMs[i]
	out := map[string]any{"name": entry["package_name"], "version": version, "arch": runtime.GOARCH, "platform": "linux",
		"mtime": "2026-01-01T00:00:00Z"}
	for k, v := range entry {
		if to, ok := nfpmKeys[k]; ok {
			out[to] = v
		} else if !slices.Contains(goreleaserOnly, k) {
			t.Fatalf(".goreleaser.yaml nfpms %s: key %q is not mapped to nfpm's configuration in tests/service_test.go", id, k)
		}
	}
	var contents []any
	for _, c := range asList(entry["contents"]) {
		c := c.(map[string]any)
		if src, ok := c["src"].(string); ok {
			c["src"] = filepath.Join(repoRoot(), src)
		}
		if fi, ok := c["file_info"].(map[string]any); ok {
			delete(fi, "mtime") // a goreleaser template; the package mtime applies
		}
		contents = append(contents, c)
	}
	bindir, _ := entry["bindir"].(string)
	for _, bid := range asList(entry["ids"]) {
		j := slices.IndexFunc(cfg.Builds, func(b goreleaserBuild) bool { return b.ID == bid })
		if j < 0 || bins[bid.(string)] == "" {
			t.Fatalf("nfpms %s packages build %v, which the test has no binary for", id, bid)
		}
		contents = append(contents, map[string]any{"src": bins[bid.(string)], "dst": filepath.Join(bindir, cfg.Builds[j].Binary),
			"file_info": map[string]any{"mode": 0o755}})
	}
	out["contents"] = contents
	if s, ok := entry["scripts"].(map[string]any); ok {
		for k, v := range s {
			s[k] = filepath.Join(repoRoot(), v.(string))
		}
	}
	y, err := yaml.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return y
}

// goreleaserBuild is what nfpmConfig reads of a .goreleaser.yaml build.
type goreleaserBuild struct {
	ID     string `yaml:"id"`
	Binary string `yaml:"binary"`
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// buildDeb builds the deb of the .goreleaser.yaml nfpms entry id with nfpm
// (the Go module: no goreleaser build needed) and returns its path.
func buildDeb(t *testing.T, id string, bins map[string]string) string {
	t.Helper()
	conf, err := nfpm.Parse(bytes.NewReader(nfpmConfig(t, id, "0.0.0-e2e", bins)))
	if err != nil {
		t.Fatalf("nfpm configuration of %s: %v", id, err)
	}
	info, err := conf.Get("deb")
	if err != nil {
		t.Fatal(err)
	}
	if err := nfpm.Validate(info); err != nil {
		t.Fatalf("nfpm configuration of %s: %v", id, err)
	}
	pkgr, err := nfpm.Get("deb")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), id+".deb")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pkgr.Package(info, f); err != nil {
		t.Fatalf("nfpm deb: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

// need returns the path of program, or skips without it; under CI=true its
// absence is a failure.
func need(t *testing.T, program, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(program)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed (apt-get install %s)", program, pkg)
		}
		t.Skipf("%s is not installed (apt-get install %s)", program, pkg)
	}
	return p
}

// unitValue returns the value of key= in unit (the last one).
func unitValue(t *testing.T, unit, key string) string {
	t.Helper()
	var v string
	for line := range strings.Lines(unit) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), key+"="); ok {
			v = rest
		}
	}
	if v == "" {
		t.Fatalf("unit has no %s=", key)
	}
	return v
}

// replaceLine replaces the one line of config that is exactly old
// (indentation aside) with new, keeping its indentation.
func replaceLine(t *testing.T, config, old, new string) string {
	t.Helper()
	re := regexp.MustCompile(`(?m)^(\s*)` + regexp.QuoteMeta(old) + `$`)
	if n := len(re.FindAllString(config, -1)); n != 1 {
		t.Fatalf("the packaged config.yaml has %d lines %q, want 1", n, old)
	}
	return re.ReplaceAllString(config, "${1}"+strings.ReplaceAll(new, "$", "$$"))
}

// TestServiceDeb builds the better-compute deb from .goreleaser.yaml's
// package definition with nfpm, unpacks it with dpkg -x into a throwaway
// root, checks it holds the binary, the unit, the system user and the
// default configuration (a conffile), and starts serve from the unit's
// ExecStart line, rewritten into that root, with NOTIFY_SOCKET pointed at a
// socket the test listens on (no systemd runs as PID 1 here): READY=1
// arrives once the API answers, and SIGTERM brings STOPPING=1 and exit 0.
func TestServiceDeb(t *testing.T) {
	dpkg := need(t, "dpkg-deb", "dpkg")
	t.Parallel()
	bin := testenv.Binary(t, "better-compute")
	deb := buildDeb(t, "better-compute", map[string]string{"better-compute": bin})
	root := t.TempDir()
	if out, err := exec.Command(dpkg, "-x", deb, root).CombinedOutput(); err != nil {
		t.Fatalf("dpkg -x: %v: %s", err, out)
	}
	ctrl := t.TempDir()
	if out, err := exec.Command(dpkg, "-e", deb, ctrl).CombinedOutput(); err != nil {
		t.Fatalf("dpkg -e: %v: %s", err, out)
	}

	// What the package holds, byte for byte what the repository ships.
	for dst, src := range map[string]string{
		"usr/lib/systemd/system/better-compute.service":  "packaging/systemd/better-compute.service",
		"usr/lib/sysusers.d/better-compute.conf":         "packaging/sysusers.d/better-compute.conf",
		"usr/share/better-compute/systemd/low-port.conf": "packaging/systemd/low-port.conf",
		"etc/better-compute/config.yaml":                 "packaging/better-compute/config.yaml",
		"usr/bin/better-compute":                         bin,
	} {
		got, err := os.ReadFile(filepath.Join(root, dst))
		if err != nil {
			t.Errorf("the deb lacks /%s: %v", dst, err)
			continue
		}
		if !filepath.IsAbs(src) {
			src = filepath.Join(repoRoot(), src)
		}
		if want, _ := os.ReadFile(src); !bytes.Equal(got, want) {
			t.Errorf("/%s in the deb differs from %s", dst, src)
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "usr/bin/better-compute")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("/usr/bin/better-compute: %v %v, want mode 0755", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(root, "etc/better-compute/config.yaml")); err != nil || fi.Mode().Perm()&0o007 != 0 {
		t.Errorf("/etc/better-compute/config.yaml: %v %v, want no access for others (it may hold secrets)", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(ctrl, "conffiles")); !strings.Contains(string(b), "/etc/better-compute/config.yaml") {
		t.Errorf("conffiles %q: the default config must be a conffile, kept on upgrade", b)
	}
	for _, script := range []string{"postinst", "prerm", "postrm"} {
		b, err := os.ReadFile(filepath.Join(ctrl, script))
		if err != nil {
			t.Errorf("the deb has no %s: %v", script, err)
		}
		if script == "postinst" && (!strings.Contains(string(b), "systemd-sysusers") || !strings.Contains(string(b), "daemon-reload")) {
			t.Errorf("postinst makes no user or does not reload systemd:\n%s", b)
		}
	}

	// The sysusers.d entry makes the service's user.
	if sysusers, err := exec.LookPath("systemd-sysusers"); err == nil {
		if out, err := exec.Command(sysusers, "--root="+root).CombinedOutput(); err != nil {
			t.Fatalf("systemd-sysusers --root: %v: %s", err, out)
		}
		passwd, _ := os.ReadFile(filepath.Join(root, "etc", "passwd"))
		if !regexp.MustCompile(`(?m)^better-compute:x:\d+:\d+:[^:]*:/var/lib/better-compute:/usr/sbin/nologin$`).Match(passwd) {
			t.Errorf("systemd-sysusers made no better-compute user:\n%s", passwd)
		}
	} else if os.Getenv("CI") == "true" {
		t.Fatal("systemd-sysusers is not installed (apt-get install systemd)")
	}

	// The packaged unit verifies against the packaged binary.
	unitBytes, _ := os.ReadFile(filepath.Join(root, "usr/lib/systemd/system/better-compute.service"))
	unit := string(unitBytes)
	if _, err := exec.LookPath("systemd-analyze"); err == nil || os.Getenv("CI") == "true" {
		vroot := unitRoot(t, map[string][]byte{"better-compute.service": unitBytes},
			map[string]string{"/usr/bin/better-compute": filepath.Join(root, "usr/bin/better-compute")})
		if msg := verifyUnits(t, vroot, "better-compute.service"); msg != "" {
			t.Errorf("systemd-analyze verify of the packaged unit: %s", msg)
		}
	}
	for _, want := range []string{"Type=notify", "User=better-compute", "StateDirectory=better-compute", "StateDirectoryMode=0700",
		"ConfigurationDirectory=better-compute"} {
		if !strings.Contains(unit, "\n"+want+"\n") {
			t.Errorf("the unit lacks %s", want)
		}
	}

	// serve from ExecStart, rewritten into the root; the packaged config
	// with a temporary dataDir and free loopback ports.
	argv := strings.Fields(unitValue(t, unit, "ExecStart"))
	if argv[0] != "/usr/bin/better-compute" {
		t.Fatalf("ExecStart runs %s, want /usr/bin/better-compute", argv[0])
	}
	argv[0] = filepath.Join(root, argv[0])
	i := slices.Index(argv, "--config")
	if i < 0 || i+1 >= len(argv) || argv[i+1] != "/etc/better-compute/config.yaml" {
		t.Fatalf("ExecStart %q does not read /etc/better-compute/config.yaml", argv)
	}
	shipped, _ := os.ReadFile(filepath.Join(root, "etc/better-compute/config.yaml"))
	dataDir := filepath.Join(t.TempDir(), "state")
	config := replaceLine(t, string(shipped), "dataDir: /var/lib/better-compute", "dataDir: "+dataDir)
	config = replaceLine(t, config, "listen: 0.0.0.0:3000", "listen: 127.0.0.1:0")
	config = replaceLine(t, config, "listen: 0.0.0.0:8443", "listen: 127.0.0.1:0")
	argv[i+1] = testenv.WriteFile(t, "config.yaml", config)

	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msgs := make(chan string, 64)
	go func() {
		buf := make([]byte, 64*1024)
		for {
			n, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	watchdog, err := time.ParseDuration(unitValue(t, unit, "WatchdogSec"))
	if err != nil {
		t.Fatalf("WatchdogSec: %v", err)
	}
	// What systemd would set for a Type=notify unit with WatchdogSec.
	env := []string{"NOTIFY_SOCKET=" + sock, fmt.Sprintf("WATCHDOG_USEC=%d", watchdog.Microseconds())}
	p := testenv.Start(t, env, argv[0], argv[1:]...)
	await := func(prefix string, timeout time.Duration) string {
		t.Helper()
		deadline := time.After(timeout)
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					t.Fatal("notify socket closed")
				}
				t.Logf("sd_notify: %q", m)
				if strings.HasPrefix(m, prefix) {
					return m
				}
				if strings.HasPrefix(m, "STOPPING=1") {
					t.Fatalf("STOPPING=1 while waiting for %s", prefix)
				}
			case <-p.Done():
				t.Fatalf("serve exited (%d) before sending %s", p.Wait(0), prefix)
			case <-deadline:
				t.Fatalf("no %s within %v", prefix, timeout)
			}
		}
	}
	ready := await("READY=1", 90*time.Second)
	m := regexp.MustCompile(`API on (\S+?);`).FindStringSubmatch(ready)
	if m == nil {
		t.Fatalf("READY=1 without the API's address: %q", ready)
	}
	api := "http://" + m[1]
	if code, body := testenv.Get(t, api+"/readyz"); code != 200 {
		t.Fatalf("GET /readyz after READY=1: %d %s", code, body)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "state.db")); err != nil {
		t.Errorf("no embedded database in the configured dataDir: %v", err)
	}
	p.Signal(syscall.SIGTERM)
	await("STOPPING=1", 30*time.Second)
	if code := p.Wait(60 * time.Second); code != 0 {
		t.Fatalf("serve exited %d after SIGTERM, want 0", code)
	}
}

// TestServicePackagingScripts lints the package scripts with shellcheck.
func TestServicePackagingScripts(t *testing.T) {
	sc := need(t, "shellcheck", "shellcheck")
	t.Parallel()
	scripts, err := filepath.Glob(filepath.Join(repoRoot(), "packaging", "nfpm", "*.sh"))
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no package scripts: %v", err)
	}
	out, err := exec.Command(sc, append([]string{"-s", "sh"}, scripts...)...).CombinedOutput()
	if err != nil {
		t.Errorf("shellcheck: %v\n%s", err, out)
	}
}

// TestNfpmNotInBinaries: nfpm, which the tests use to build packages, is
// linked into no product binary.
func TestNfpmNotInBinaries(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"./controlplane/cmd/better-compute", "./bcd/cmd/bcd", "./plugins/ipmi/cmd/bcx-ipmi"} {
		cmd := exec.Command("go", "list", "-deps", bin)
		cmd.Dir = repoRoot()
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", bin, err)
		}
		for line := range strings.Lines(string(out)) {
			if strings.HasPrefix(line, "github.com/goreleaser/") {
				t.Errorf("%s links %s", bin, strings.TrimSpace(line))
			}
		}
	}
}
