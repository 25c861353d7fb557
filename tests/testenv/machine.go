package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Machine is a host for a real bcd: its own hostname and /etc/machine-id
// and its own data dir. Every bcd on the test host would otherwise report
// the same hostname and machine id, and the control plane would rightly
// take each join for a re-join of one reinstalled node. bcd runs under
// unshare(1) in new UTS and mount namespaces (mapped to root in a new user
// namespace when the test is not root), where the hostname is set and the
// machine's IDFile is bound over /etc/machine-id.
type Machine struct {
	t testing.TB
	// Name is the hostname.
	Name string
	// DataDir is bcd's --data-dir.
	DataDir string
	// IDFile holds the machine id bound over /etc/machine-id.
	IDFile string
	// BCD is the bcd binary Argv runs. Defaults to Binary(t, "bcd"); a
	// variant such as BinaryTags(t, "bcd", "nvmlmock") may be set.
	BCD string
}

// unshareProbe checks once that unshare can make the namespaces here.
var unshareProbe = sync.OnceValue(func() error {
	args := append(unshareArgs(), "true")
	if out, err := exec.Command("unshare", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("unshare %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
})

func unshareArgs() []string {
	args := []string{"--uts", "--mount", "--propagation", "private"}
	if os.Geteuid() != 0 {
		args = append(args, "--map-root-user")
	}
	return args
}

// machineShell sets the hostname, binds the machine id file (when the host
// has /etc/machine-id) and executes the command, keeping unshare's pid.
const machineShell = `hostname "$1" && { [ ! -e /etc/machine-id ] || mount --bind "$2" /etc/machine-id; } && shift 2 && exec "$@"`

// NewMachine makes a machine named name (a valid hostname) with a machine
// id of its own, in a fresh temporary folder. Without the namespaces the
// test is skipped, except under CI=true, where that is a failure.
func NewMachine(t testing.TB, name string) *Machine {
	t.Helper()
	if err := unshareProbe(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("real bcd machines need UTS and mount namespaces: %v", err)
		}
		t.Skipf("real bcd machines need UTS and mount namespaces: %v", err)
	}
	dir := t.TempDir()
	sum := sha256.Sum256([]byte(name + dir))
	m := &Machine{t: t, Name: name, DataDir: filepath.Join(dir, "bcd"), IDFile: filepath.Join(dir, "machine-id")}
	if err := os.WriteFile(m.IDFile, []byte(hex.EncodeToString(sum[:16])+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return m
}

// Clone returns a copy of m as a cloned virtual machine is: the same
// hostname and machine id, and a data dir of its own, empty.
func (m *Machine) Clone() *Machine {
	return &Machine{t: m.t, Name: m.Name, DataDir: filepath.Join(m.t.TempDir(), "bcd"), IDFile: m.IDFile, BCD: m.BCD}
}

// Argv returns the program and arguments that run bcd with args on m.
func (m *Machine) Argv(args ...string) (string, []string) {
	bcd := m.BCD
	if bcd == "" {
		bcd = Binary(m.t, "bcd")
	}
	a := append(unshareArgs(), "--", "sh", "-c", machineShell, "machine", m.Name, m.IDFile, bcd)
	return "unshare", append(a, args...)
}

// NewMachineAt returns the machine named name whose data dir and machine id
// file are already there.
func NewMachineAt(t testing.TB, name, dataDir, idFile string) *Machine {
	return &Machine{t: t, Name: name, DataDir: dataDir, IDFile: idFile}
}
