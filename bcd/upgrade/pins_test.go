package upgrade

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"aead.dev/minisign"

	"github.com/better-compute/better-compute/installer/manifest"
)

func pinKey(t *testing.T) (minisign.PrivateKey, string) {
	t.Helper()
	_, priv, pin, err := manifest.GenerateKey("")
	if err != nil {
		t.Fatal(err)
	}
	sk, err := manifest.ParsePrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	return sk, pin
}

// TestApplyPinStatement: a statement signed by the pinned key adds the new
// pin (file mode kept, ReadPins sees both), applying it again changes
// nothing, a statement signed by an unpinned key leaves the file as it was,
// the old key's removal by the new key drops it, a replayed older add does
// not bring it back, and the last pin cannot be removed.
func TestApplyPinStatement(t *testing.T) {
	t.Parallel()
	oldKey, oldPin := pinKey(t)
	newKey, newPin := pinKey(t)
	strangerKey, _ := pinKey(t)
	path := filepath.Join(t.TempDir(), "release-pins")
	if err := os.WriteFile(path, []byte("# pinned by the install script\n"+oldPin+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)
	sign := func(action, pin string, sk minisign.PrivateKey, at time.Time) ([]byte, []byte) {
		t.Helper()
		doc, sig, err := manifest.SignPinStatement(action, pin, sk, at)
		if err != nil {
			t.Fatal(err)
		}
		return doc, sig
	}
	pinsNow := func() []string {
		t.Helper()
		pins, err := ReadPins(path)
		if err != nil {
			t.Fatal(err)
		}
		return pins
	}

	// An unpinned key's statement is refused and changes nothing.
	before, _ := os.ReadFile(path)
	doc, sig := sign(manifest.PinAdd, newPin, strangerKey, t0)
	if _, err := ApplyPinStatement(path, doc, sig); !errors.Is(err, manifest.ErrUnpinnedKey) {
		t.Fatalf("stranger's statement: %v, want ErrUnpinnedKey", err)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Fatalf("a refused statement changed the file:\n%s", after)
	}

	addDoc, addSig := sign(manifest.PinAdd, newPin, oldKey, t0)
	c, err := ApplyPinStatement(path, addDoc, addSig)
	if err != nil || !c.Changed {
		t.Fatalf("add: %+v, %v", c, err)
	}
	if got := pinsNow(); len(got) != 2 || got[0] != oldPin || got[1] != newPin {
		t.Fatalf("pins after add = %v", got)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
		t.Errorf("mode after add = %v, want 0644", fi.Mode().Perm())
	}
	// The same statement again: stale, nothing added twice.
	if c, err := ApplyPinStatement(path, addDoc, addSig); err != nil || c.Changed || !c.Stale {
		t.Errorf("add again: %+v, %v; want stale", c, err)
	}

	// The new key removes the old one.
	doc, sig = sign(manifest.PinRemove, oldPin, newKey, t0.Add(time.Hour))
	if c, err := ApplyPinStatement(path, doc, sig); err != nil || !c.Changed {
		t.Fatalf("remove: %+v, %v", c, err)
	}
	if got := pinsNow(); len(got) != 1 || got[0] != newPin {
		t.Fatalf("pins after remove = %v", got)
	}
	// An older statement adding the old pin, replayed (signed by the new
	// key so that it verifies): ignored.
	doc, sig = sign(manifest.PinAdd, oldPin, newKey, t0.Add(30*time.Minute))
	if c, err := ApplyPinStatement(path, doc, sig); err != nil || c.Changed || !c.Stale {
		t.Errorf("replayed older add: %+v, %v; want stale", c, err)
	}
	// The last pin stays.
	doc, sig = sign(manifest.PinRemove, newPin, newKey, t0.Add(2*time.Hour))
	if _, err := ApplyPinStatement(path, doc, sig); !errors.Is(err, ErrLastPin) {
		t.Errorf("removing the last pin: %v, want ErrLastPin", err)
	}
	if got := pinsNow(); len(got) != 1 || got[0] != newPin {
		t.Fatalf("pins after the refused removal = %v", got)
	}
	if b, _ := os.ReadFile(path); !strings.HasPrefix(string(b), "# pinned by the install script\n") {
		t.Errorf("the file's own lines were not kept:\n%s", b)
	}
}
