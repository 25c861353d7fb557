package tests

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/bcd/upgrade"
	"github.com/better-compute/better-compute/installer/manifest"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestReleasePinsSign (issue 35, item 2, the signing step): with the real
// binary, a statement adding a new key's pin signed by the old key applies
// to a pin file that pins the old key, and is refused by one that pins
// neither; the new key cannot sign its own addition.
func TestReleasePinsSign(t *testing.T) {
	t.Parallel()
	bc := testenv.Binary(t, "better-compute")
	dir := t.TempDir()
	keygen := func(name string) string {
		t.Helper()
		code, out, stderr := testenv.Run(t, nil, "", bc, "release", "keygen", "--out", filepath.Join(dir, name))
		m := regexp.MustCompile(`pin:\s+(sha256/\S+)`).FindStringSubmatch(out)
		if code != 0 || m == nil {
			t.Fatalf("release keygen: exit %d\n%s%s", code, out, stderr)
		}
		return m[1]
	}
	oldPin, newPin, otherPin := keygen("old.key"), keygen("new.key"), keygen("other.key")
	stmt := filepath.Join(dir, "add-new.json")

	// The new key vouching for itself: a usage error, nothing written.
	code, out, stderr := testenv.Run(t, nil, "", bc, "release", "pins", "sign", "--key", filepath.Join(dir, "new.key"), "--add", newPin, "--out", stmt)
	if code != exitUsage || !strings.Contains(stderr, "cannot vouch for itself") {
		t.Fatalf("self-signed addition: exit %d\n%s%s", code, out, stderr)
	}
	if _, err := os.Stat(stmt); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused statement was written: %v", err)
	}

	code, out, stderr = testenv.Run(t, nil, "", bc, "release", "pins", "sign", "--key", filepath.Join(dir, "old.key"), "--add", newPin, "--out", stmt)
	if code != 0 || !strings.Contains(out, "add "+newPin+", signed by "+oldPin) {
		t.Fatalf("release pins sign: exit %d\n%s%s", code, out, stderr)
	}
	doc, err := os.ReadFile(stmt)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := os.ReadFile(stmt + ".minisig")
	if err != nil {
		t.Fatal(err)
	}

	// A machine that pins only another key refuses it, unchanged.
	otherFile := filepath.Join(dir, "pins-other")
	if err := os.WriteFile(otherFile, []byte(otherPin+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := upgrade.ApplyPinStatement(otherFile, doc, sig); !errors.Is(err, manifest.ErrUnpinnedKey) {
		t.Errorf("applied where the signer is not pinned: %v", err)
	}
	if pins, _ := upgrade.ReadPins(otherFile); len(pins) != 1 {
		t.Errorf("pins after the refusal: %v", pins)
	}
	// A machine that pins the old key gets the new one.
	oldFile := filepath.Join(dir, "pins-old")
	if err := os.WriteFile(oldFile, []byte(oldPin+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c, err := upgrade.ApplyPinStatement(oldFile, doc, sig); err != nil || !c.Changed {
		t.Fatalf("apply: %+v, %v", c, err)
	}
	if pins, err := upgrade.ReadPins(oldFile); err != nil || len(pins) != 2 || pins[1] != newPin {
		t.Errorf("pins after the statement: %v, %v; want %s and %s", pins, err, oldPin, newPin)
	}
}
