package jointoken

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPin(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t, time.Now())

	pin := Pin(ca.cert)
	want := sha256.Sum256(ca.cert.RawSubjectPublicKeyInfo)
	if pin != "sha256/"+base64.StdEncoding.EncodeToString(want[:]) {
		t.Fatalf("Pin = %q, want sha256/ and the std base64 of the SPKI hash", pin)
	}
	if len(pin) != 51 {
		t.Fatalf("len(Pin) = %d, want 51", len(pin))
	}
	fromKey, err := PinPublicKey(ca.key.Public())
	if err != nil {
		t.Fatal(err)
	}
	if fromKey != pin {
		t.Fatalf("PinPublicKey = %q, want Pin(cert) %q", fromKey, pin)
	}
	sum, err := ParsePin(pin)
	if err != nil {
		t.Fatal(err)
	}
	if string(sum) != string(want[:]) {
		t.Fatalf("ParsePin = %x, want %x", sum, want)
	}

	edPub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := PinPublicKey(edPub); err != nil {
		t.Fatalf("PinPublicKey(ed25519): %v", err)
	}
	if _, err := PinPublicKey(struct{}{}); err == nil {
		t.Fatal("PinPublicKey(struct{}{}) succeeded, want an error")
	}
}

func TestParsePinMalformed(t *testing.T) {
	t.Parallel()
	good := Pin(newTestCA(t, time.Now()).cert)
	b64 := strings.TrimPrefix(good, PinPrefix)
	sum, _ := ParsePin(good)
	tests := map[string]string{
		"empty":          "",
		"no prefix":      b64,
		"sha512 prefix":  "sha512/" + b64,
		"upper prefix":   "SHA256/" + b64,
		"leading space":  " " + good,
		"trailing nl":    good + "\n",
		"no padding":     PinPrefix + strings.TrimRight(b64, "="),
		"base64url":      PinPrefix + base64.URLEncoding.EncodeToString(append([]byte{0xfb, 0xff}, sum[2:]...)),
		"short hash":     PinPrefix + base64.StdEncoding.EncodeToString(sum[:31]),
		"long hash":      PinPrefix + base64.StdEncoding.EncodeToString(append(sum, 0)),
		"inner newline":  PinPrefix + b64[:20] + "\n" + b64[21:],
		"44 data chars":  PinPrefix + strings.Repeat("A", 44),
		"noncanonical":   PinPrefix + b64[:42] + nonCanonicalLast(b64[42]) + "=",
		"not base64":     PinPrefix + strings.Repeat("!", 43) + "=",
		"prefix only":    PinPrefix,
		"double prefix":  PinPrefix + good,
		"space in hash":  PinPrefix + b64[:10] + " " + b64[11:],
		"unicode inside": PinPrefix + "é" + b64[2:],
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := ParsePin(in); !errors.Is(err, ErrPin) {
				t.Fatalf("ParsePin(%q) error = %v, want ErrPin", in, err)
			}
		})
	}
}

// nonCanonicalLast returns another base64 character that decodes to the
// same significant bits as c, differing only in a bit the encoding drops:
// the last of the 43 data characters of a 32-byte value carries 4 of its
// bits and 2 spare ones, which strict decoding requires to be zero.
func nonCanonicalLast(c byte) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	i := strings.IndexByte(alphabet, c)
	return string(alphabet[i^1])
}

func TestMatchPin(t *testing.T) {
	t.Parallel()
	now := time.Now()
	ca := newTestCA(t, now)
	other := newTestCA(t, now)
	leaf := newTestLeaf(t, &ca, "gw.example.com", now, time.Hour)
	pin := Pin(ca.cert)

	tests := []struct {
		name  string
		pin   string
		chain []*x509.Certificate
		want  bool
	}{
		{"ca in chain", pin, []*x509.Certificate{leaf.cert, ca.cert}, true},
		{"leaf only", pin, []*x509.Certificate{leaf.cert}, false},
		{"other ca", pin, []*x509.Certificate{leaf.cert, other.cert}, false},
		{"nil entries", pin, []*x509.Certificate{nil, ca.cert}, true},
		{"empty chain", pin, nil, false},
		{"bad pin", "sha256/x", []*x509.Certificate{ca.cert}, false},
	}
	for _, tc := range tests {
		if got := MatchPin(tc.pin, tc.chain); got != tc.want {
			t.Errorf("%s: MatchPin = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func FuzzParsePin(f *testing.F) {
	f.Add(Pin(newTestCA(f, time.Now()).cert))
	f.Add("sha256/" + strings.Repeat("A", 43) + "=")
	f.Add("sha256/" + strings.Repeat("A", 44))
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		sum, err := ParsePin(s)
		if err != nil {
			if !errors.Is(err, ErrPin) {
				t.Fatalf("ParsePin error %v does not wrap ErrPin", err)
			}
			return
		}
		if len(sum) != sha256.Size {
			t.Fatalf("ParsePin returned %d bytes", len(sum))
		}
		if back := PinPrefix + base64.StdEncoding.EncodeToString(sum); back != s {
			t.Fatalf("ParsePin(%q) re-encodes as %q", s, back)
		}
	})
}
