package installer

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite packaging/systemd from the unit templates")

// TestPackagedUnits keeps packaging/systemd equal to the units the install
// script writes (one source): go test ./installer -run TestPackagedUnits -update
func TestPackagedUnits(t *testing.T) {
	units, err := Units(UnitOptions{BinDir: "/usr/bin", Unprivileged: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("..", "packaging", "systemd")
	for name, want := range units {
		p := filepath.Join(dir, name)
		if *update {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatalf("%v (run go test ./installer -run TestPackagedUnits -update)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from its template (run go test ./installer -run TestPackagedUnits -update)", p)
		}
	}
}

func TestUnits(t *testing.T) {
	root, err := Units(UnitOptions{BinDir: "/usr/local/bin"})
	if err != nil {
		t.Fatal(err)
	}
	if len(root) != 1 {
		t.Fatalf("root mode has units %v, want bcd.service only", keys(root))
	}
	agent := settings(root["bcd.service"])
	for _, want := range []string{"Type=notify", "WatchdogSec=", "RestartPreventExitStatus=3 4 5", "KillMode=mixed", "ExecStart=/usr/local/bin/bcd node --data-dir /var/lib/bcd"} {
		if !strings.Contains(agent, want) {
			t.Errorf("root bcd.service lacks %q", want)
		}
	}
	// The root units share the hardening that leaves root commands whole,
	// and none of the settings that would break them.
	unpriv, err := Units(UnitOptions{BinDir: "/usr/local/bin", Unprivileged: true})
	if err != nil {
		t.Fatal(err)
	}
	helper := settings(unpriv["bcd-helper.service"])
	for name, unit := range map[string]string{"root bcd.service": agent, "bcd-helper.service": helper} {
		for _, want := range []string{"LockPersonality=yes", "RestrictRealtime=yes", "SystemCallArchitectures=native",
			"SystemCallFilter=~@obsolete @cpu-emulation", "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK AF_PACKET",
			"CapabilityBoundingSet=~CAP_WAKE_ALARM"} {
			if !strings.Contains(unit, want) {
				t.Errorf("%s lacks %q", name, want)
			}
		}
		for _, not := range []string{"User=", "ProtectSystem=", "NoNewPrivileges=", "PrivateTmp=", "PrivateDevices=", "ProtectKernelModules=",
			"MemoryDenyWriteExecute=", "RestrictNamespaces=", "ProtectClock=", "ProtectHostname=", "SystemCallFilter=@", "SystemCallFilter=~@module"} {
			if strings.Contains(unit, "\n"+not) {
				t.Errorf("%s sets %q, which breaks root commands", name, not)
			}
		}
	}
	agent = string(unpriv["bcd.service"])
	for _, want := range []string{"User=bcd", "NoNewPrivileges=yes", "ProtectSystem=strict", "ReadWritePaths=/var/lib/bcd", "PrivateTmp=yes", "--unprivileged", "bcd-helper.service"} {
		if !strings.Contains(agent, want) {
			t.Errorf("unprivileged bcd.service lacks %q", want)
		}
	}
	if !strings.Contains(string(unpriv["bcd-helper.service"]), "ExecStart=/usr/local/bin/bcd helper") {
		t.Errorf("bcd-helper.service: %s", unpriv["bcd-helper.service"])
	}
}

// settings returns unit's lines without its comments, each after a
// newline.
func settings(unit []byte) string {
	var b strings.Builder
	for line := range strings.Lines(string(unit)) {
		if !strings.HasPrefix(line, "#") {
			b.WriteString("\n" + strings.TrimSuffix(line, "\n"))
		}
	}
	return b.String()
}

func keys(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
