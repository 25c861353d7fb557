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
	agent := string(root["bcd.service"])
	for _, want := range []string{"Type=notify", "WatchdogSec=", "RestartPreventExitStatus=3 4 5", "KillMode=mixed", "ExecStart=/usr/local/bin/bcd node --data-dir /var/lib/bcd"} {
		if !strings.Contains(agent, want) {
			t.Errorf("root bcd.service lacks %q", want)
		}
	}
	for _, not := range []string{"User=", "ProtectSystem=", "NoNewPrivileges="} {
		if strings.Contains(agent, not) {
			t.Errorf("root bcd.service sets %q, which breaks root commands", not)
		}
	}
	unpriv, err := Units(UnitOptions{BinDir: "/usr/local/bin", Unprivileged: true})
	if err != nil {
		t.Fatal(err)
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

func keys(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
