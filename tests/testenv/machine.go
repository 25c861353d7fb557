package testenv

import (
	"crypto/rand"
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

// Machine is a host for a real bcd: its own hostname, /etc/machine-id and
// boot id, and its own data dir. Every bcd on the test host would otherwise report
// the same hostname and machine id, and the control plane would rightly
// take each join for a re-join of one reinstalled node. bcd runs under
// unshare(1) in new UTS and mount namespaces (mapped to root in a new user
// namespace when the test is not root), where the hostname is set, the
// machine's IDFile is bound over /etc/machine-id and its BootIDFile over
// /proc/sys/kernel/random/boot_id. Every bcd on the test host would
// otherwise also share the kernel's one boot id, and a bcd started again
// could not tell (nor show the control plane) a reboot of its machine from
// a restart: Boot gives the machine a new boot id, as booting it does.
type Machine struct {
	t testing.TB
	// Name is the hostname.
	Name string
	// DataDir is bcd's --data-dir.
	DataDir string
	// IDFile holds the machine id bound over /etc/machine-id.
	IDFile string
	// BootIDFile holds the machine's boot id, bound over
	// /proc/sys/kernel/random/boot_id; empty: the kernel's own.
	BootIDFile string
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
// has /etc/machine-id) and the boot id file (when there is one) and
// executes the command, keeping unshare's pid.
const machineShell = `hostname "$1" && { [ ! -e /etc/machine-id ] || mount --bind "$2" /etc/machine-id; } && ` +
	`{ [ -z "$3" ] || mount --bind "$3" /proc/sys/kernel/random/boot_id; } && shift 3 && exec "$@"`

// NewMachine makes a machine named name (a valid hostname) with a machine
// id and a boot id of its own, in a fresh temporary folder. Without the
// namespaces the test is skipped, except under CI=true, where that is a
// failure.
func NewMachine(t testing.TB, name string) *Machine {
	t.Helper()
	if err := unshareProbe(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("real bcd machines need UTS and mount namespaces: %v", err)
		}
		t.Skipf("real bcd machines need UTS and mount namespaces: %v", err)
	}
	dir := t.TempDir()
	PassThrough(t, dir)
	sum := sha256.Sum256([]byte(name + dir))
	m := &Machine{t: t, Name: name, DataDir: filepath.Join(dir, "bcd"), IDFile: filepath.Join(dir, "machine-id"),
		BootIDFile: filepath.Join(dir, "boot_id")}
	if err := os.WriteFile(m.IDFile, []byte(hex.EncodeToString(sum[:16])+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m.Boot()
	return m
}

// Clone returns a copy of m as a cloned virtual machine is: the same
// hostname and machine id, a data dir of its own, empty, and a boot of its
// own.
func (m *Machine) Clone() *Machine {
	dir := m.t.TempDir()
	PassThrough(m.t, dir)
	c := &Machine{t: m.t, Name: m.Name, DataDir: filepath.Join(dir, "bcd"), IDFile: m.IDFile, BCD: m.BCD}
	if m.BootIDFile != "" {
		c.BootIDFile = filepath.Join(m.t.TempDir(), "boot_id")
		c.Boot()
	}
	return c
}

// PassThrough lets every user search dir and the test's temporary folder
// above it (mode 0711: no listing), as /var/lib is on a real machine, so
// that bcd's command user (bcd-cmd) reaches its HOME in the data dir.
func PassThrough(t testing.TB, dir string) {
	t.Helper()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
}

// Boot gives m a new boot id, as booting the machine does: a bcd started
// on m from now on reads it. (A boot script may do the same with
// `cat /proc/sys/kernel/random/uuid >BootIDFile`.) m must have a
// BootIDFile.
func (m *Machine) Boot() {
	m.t.Helper()
	if m.BootIDFile == "" {
		m.t.Fatalf("machine %s has no boot id file", m.Name)
	}
	if err := os.WriteFile(m.BootIDFile, []byte(NewBootID()+"\n"), 0o644); err != nil {
		m.t.Fatal(err)
	}
}

// NewBootID returns a random boot id in the kernel's form (a version 4
// UUID, lower case).
func NewBootID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Argv returns the program and arguments that run bcd with args on m.
func (m *Machine) Argv(args ...string) (string, []string) {
	bcd := m.BCD
	if bcd == "" {
		bcd = Binary(m.t, "bcd")
	}
	a := append(unshareArgs(), "--", "sh", "-c", machineShell, "machine", m.Name, m.IDFile, m.BootIDFile, bcd)
	return "unshare", append(a, args...)
}

// NewMachineAt returns the machine named name whose data dir and machine id
// file are already there (set BootIDFile for its boot id, else it has the
// kernel's).
func NewMachineAt(t testing.TB, name, dataDir, idFile string) *Machine {
	return &Machine{t: t, Name: name, DataDir: dataDir, IDFile: idFile}
}
