package manifest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// signed returns a manifest, its signature and the key's pin.
func signed(t *testing.T, mutate func(*Manifest)) (doc, sig []byte, pin string) {
	t.Helper()
	m, err := Build(writeDist(t, "0.1.0"), BuildOptions{Version: "0.1.0", Now: t0, TTL: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if mutate != nil {
		mutate(m)
	}
	doc, err = m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	_, priv, pin, err := GenerateKey("")
	if err != nil {
		t.Fatal(err)
	}
	sk, err := ParsePrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	sig, err = Sign(doc, sk, t0)
	if err != nil {
		t.Fatal(err)
	}
	return doc, sig, pin
}

func TestSignVerify(t *testing.T) {
	t.Parallel()
	doc, sig, pin := signed(t, nil)
	_, _, otherPin := signed(t, nil)
	now := t0.Add(time.Hour)

	m, err := Verify(doc, sig, []string{pin}, now)
	if err != nil || m.Version != "0.1.0" {
		t.Fatalf("Verify = %v, %v", m, err)
	}
	// Rotation: any pin of several.
	if _, err := Verify(doc, sig, []string{otherPin, pin}, now); err != nil {
		t.Fatalf("second pin: %v", err)
	}
	cases := []struct {
		name string
		doc  []byte
		sig  []byte
		pins []string
		now  time.Time
		want error
	}{
		{"no pins", doc, sig, nil, now, ErrNoPins},
		{"unpinned key", doc, sig, []string{otherPin}, now, ErrUnpinnedKey},
		{"tampered manifest", bytes.Replace(doc, []byte(`"0.1.0"`), []byte(`"0.1.1"`), 1), sig, []string{pin}, now, ErrBadSignature},
		{"garbage signature", doc, []byte("not a signature"), []string{pin}, now, ErrBadSignature},
		{"expired", doc, sig, []string{pin}, t0.Add(25 * time.Hour), ErrExpired},
	}
	for _, c := range cases {
		if _, err := Verify(c.doc, c.sig, c.pins, c.now); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	// The key swapped in the untrusted comment: pinned key, other key's
	// signature, or the reverse, never verifies.
	_, otherSig, _ := signed(t, nil)
	mixed := append(firstLine(sig), restLines(otherSig)...)
	if _, err := Verify(doc, mixed, []string{pin}, now); err == nil {
		t.Error("signature by another key with the pinned key's comment verified")
	}
	for _, bad := range []string{"sha256/short", "sha1/" + pin[7:], pin[:len(pin)-2] + "Z=", pin + "="} {
		if pin[len(pin)-2] == 'Z' {
			bad = strings.Replace(bad, "Z=", "Y=", 1)
		}
		if _, err := Verify(doc, sig, []string{bad}, now); err == nil || !strings.Contains(err.Error(), "invalid release pin") && !errors.Is(err, ErrUnpinnedKey) {
			t.Errorf("pin %q: %v", bad, err)
		}
	}
}

func firstLine(b []byte) []byte { i := bytes.IndexByte(b, '\n'); return append([]byte{}, b[:i+1]...) }
func restLines(b []byte) []byte { i := bytes.IndexByte(b, '\n'); return b[i+1:] }

// TestEncryptedKey is not parallel and runs minisign's scrypt (1 GiB, about
// two seconds a run) only twice: to encrypt and to decrypt.
func TestEncryptedKey(t *testing.T) {
	_, priv, _, err := GenerateKey("correct horse")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParsePrivateKey(priv, ""); err == nil || !strings.Contains(err.Error(), "encrypted") {
		t.Fatalf("encrypted key read without password: %v", err)
	}
	if _, err := ParsePrivateKey(priv, "correct horse"); err != nil {
		t.Fatal(err)
	}
}

// minisignTool returns Debian's minisign or skips the test.
func minisignTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("minisign")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("minisign is not installed (apt-get install minisign); CI must run the interop test")
		}
		t.Skip("minisign is not installed (apt-get install minisign)")
	}
	return p
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestMinisignInterop checks both directions against Debian's minisign:
// it verifies what Sign writes, and Verify accepts what it signs.
func TestMinisignInterop(t *testing.T) {
	t.Parallel()
	tool := minisignTool(t)
	dir := t.TempDir()
	doc, _, _ := signed(t, nil)
	manifestPath := filepath.Join(dir, "manifest.json")
	if err := os.WriteFile(manifestPath, doc, 0o644); err != nil {
		t.Fatal(err)
	}

	// Ours signs, minisign verifies.
	pub, priv, _, err := GenerateKey("")
	if err != nil {
		t.Fatal(err)
	}
	sk, _ := ParsePrivateKey(priv, "")
	sig, err := Sign(doc, sk, t0)
	if err != nil {
		t.Fatal(err)
	}
	pubPath := filepath.Join(dir, "ours.pub")
	sigPath := manifestPath + ".minisig"
	os.WriteFile(pubPath, pub, 0o644)
	os.WriteFile(sigPath, sig, 0o644)
	out := run(t, tool, "-V", "-p", pubPath, "-m", manifestPath)
	if !strings.Contains(out, "Signature and comment signature verified") {
		t.Fatalf("minisign -V: %s", out)
	}

	// minisign makes a key and signs (with our untrusted comment), ours
	// verifies; and ours signs with minisign's key, minisign verifies.
	theirPub, theirKey := filepath.Join(dir, "theirs.pub"), filepath.Join(dir, "theirs.key")
	run(t, tool, "-G", "-W", "-p", theirPub, "-s", theirKey)
	pubBytes, _ := os.ReadFile(theirPub)
	pk, err := ParsePublicKey(pubBytes)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(sigPath)
	run(t, tool, "-S", "-s", theirKey, "-m", manifestPath, "-c", UntrustedComment(pk))
	theirSig, _ := os.ReadFile(sigPath)
	if _, err := Verify(doc, theirSig, []string{Pin(pk)}, t0.Add(time.Hour)); err != nil {
		t.Fatalf("Verify of minisign's signature: %v\n%s", err, theirSig)
	}
	// The pin is what the documented shell pipeline computes.
	line := strings.TrimSpace(strings.Split(strings.TrimSpace(string(pubBytes)), "\n")[1])
	if _, err := exec.LookPath("openssl"); err == nil {
		shellPin := strings.TrimSpace(run(t, "sh", "-c", "printf %s '"+line+"' | base64 -d | openssl dgst -sha256 -binary | base64"))
		if "sha256/"+shellPin != Pin(pk) {
			t.Errorf("shell pin %s, Pin %s", shellPin, Pin(pk))
		}
	}

	theirKeyBytes, _ := os.ReadFile(theirKey)
	theirSK, err := ParsePrivateKey(theirKeyBytes, "")
	if err != nil {
		t.Fatalf("read minisign's unencrypted key: %v", err)
	}
	sig, err = Sign(doc, theirSK, t0)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(sigPath, sig, 0o644)
	run(t, tool, "-V", "-p", theirPub, "-m", manifestPath)
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"version":"0.1.0","created_at":"2026-01-02T03:04:05Z","artifacts":[{"name":"bcd_linux_amd64_v1/bcd","os":"linux","arch":"amd64","sha256":"` + strings.Repeat("a", 64) + `","size":1,"kind":"binary","binary":"bcd"}]}`))
	f.Add([]byte(`{"version":"1.2.3-rc.1+x","created_at":"2026-01-02T03:04:05Z","expires_at":"2026-02-02T03:04:05Z","artifacts":[{"name":"checksums.txt","sha256":"` + strings.Repeat("0", 64) + `","size":0,"kind":"checksums"}]}`))
	f.Add([]byte(`{"artifacts":[{"name":"../x"}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		if err != nil {
			return
		}
		for _, a := range m.Artifacts {
			if !ValidName(a.Name) || strings.Contains(a.Name, "..") && strings.Contains("/"+a.Name+"/", "/../") {
				t.Fatalf("accepted name %q", a.Name)
			}
		}
		out, err := m.Marshal()
		if err != nil {
			t.Fatalf("Marshal of a parsed manifest: %v", err)
		}
		m2, err := Parse(out)
		if err != nil {
			t.Fatalf("Parse of Marshal: %v", err)
		}
		out2, _ := m2.Marshal()
		if !bytes.Equal(out, out2) {
			t.Fatalf("not stable:\n%s\n%s", out, out2)
		}
	})
}
