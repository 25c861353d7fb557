package manifest

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"aead.dev/minisign"
)

// releaseKey makes a release key and returns it and its pin.
func releaseKey(t *testing.T) (minisign.PrivateKey, string) {
	t.Helper()
	_, priv, pin, err := GenerateKey("")
	if err != nil {
		t.Fatal(err)
	}
	sk, err := ParsePrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	return sk, pin
}

// TestPinStatement: a statement signed by a pinned key verifies and names
// its action and pin; one signed by a key no pin names (the new key
// vouching for itself included) is refused, and so are a tampered
// statement, a manifest's signature over a manifest, and malformed ones.
func TestPinStatement(t *testing.T) {
	t.Parallel()
	oldKey, oldPin := releaseKey(t)
	newKey, newPin := releaseKey(t)
	now := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)

	doc, sig, err := SignPinStatement(PinAdd, newPin, oldKey, now)
	if err != nil {
		t.Fatal(err)
	}
	s, err := VerifyPinStatement(doc, sig, []string{oldPin})
	if err != nil || s.Action != PinAdd || s.Pin != newPin || !s.CreatedAt.Equal(now) || s.Type != PinStatementType {
		t.Fatalf("VerifyPinStatement = %+v, %v; want add %s at %v", s, err, newPin, now)
	}
	// Any pinned key will do, as for manifests.
	if _, err := VerifyPinStatement(doc, sig, []string{newPin, oldPin}); err != nil {
		t.Errorf("with two pins: %v", err)
	}

	// The new key cannot vouch for itself.
	selfDoc, selfSig, err := SignPinStatement(PinAdd, newPin, newKey, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyPinStatement(selfDoc, selfSig, []string{oldPin}); !errors.Is(err, ErrUnpinnedKey) {
		t.Errorf("self-signed statement: %v, want ErrUnpinnedKey", err)
	}
	if _, err := VerifyPinStatement(doc, sig, nil); !errors.Is(err, ErrNoPins) {
		t.Errorf("no pins: %v, want ErrNoPins", err)
	}
	// Tampered: add becomes remove under the same signature.
	bad := bytes.Replace(doc, []byte(`"add"`), []byte(`"remove"`), 1)
	if _, err := VerifyPinStatement(bad, sig, []string{oldPin}); !errors.Is(err, ErrBadSignature) {
		t.Errorf("tampered statement: %v, want ErrBadSignature", err)
	}
	// A release manifest signed by the pinned key is no pin statement,
	// and a pin statement is no manifest.
	mdoc, msig, mpin := signed(t, nil)
	if _, err := VerifyPinStatement(mdoc, msig, []string{mpin}); !errors.Is(err, ErrPinStatement) {
		t.Errorf("a manifest as a pin statement: %v, want ErrPinStatement", err)
	}
	if _, err := Verify(doc, sig, []string{oldPin}, now); err == nil {
		t.Error("a pin statement verified as a manifest")
	}

	// Signing refuses what a machine would refuse.
	for _, c := range []struct{ action, pin string }{{"replace", newPin}, {PinAdd, "sha256/short"}, {PinRemove, ""}} {
		if _, _, err := SignPinStatement(c.action, c.pin, oldKey, now); !errors.Is(err, ErrPinStatement) {
			t.Errorf("SignPinStatement(%q, %q): %v, want ErrPinStatement", c.action, c.pin, err)
		}
	}
	for name, b := range map[string]string{
		"unknown field": `{"type":"` + PinStatementType + `","action":"add","pin":"` + newPin + `","created_at":"2026-12-07T05:00:00Z","extra":1}`,
		"trailing data": `{"type":"` + PinStatementType + `","action":"add","pin":"` + newPin + `","created_at":"2026-12-07T05:00:00Z"} {}`,
		"other type":    `{"type":"x","action":"add","pin":"` + newPin + `","created_at":"2026-12-07T05:00:00Z"}`,
		"no time":       `{"type":"` + PinStatementType + `","action":"add","pin":"` + newPin + `"}`,
		"too large":     strings.Repeat(" ", MaxPinStatementSize+1),
	} {
		if _, err := ParsePinStatement([]byte(b)); !errors.Is(err, ErrPinStatement) {
			t.Errorf("%s: %v, want ErrPinStatement", name, err)
		}
	}
}
