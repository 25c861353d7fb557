package keyproof

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"testing"
)

func TestSignVerify(t *testing.T) {
	p256, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	nonce := []byte("nonce-0123456789")
	ekm := bytes.Repeat([]byte{7}, ExporterLen)
	for name, key := range map[string]crypto.Signer{"p256": p256, "ed25519": ed} {
		t.Run(name, func(t *testing.T) {
			sig, err := Sign(key, PurposeReattest, nonce, ekm)
			if err != nil {
				t.Fatal(err)
			}
			if err := Verify(key.Public(), PurposeReattest, nonce, ekm, sig); err != nil {
				t.Fatalf("own proof: %v", err)
			}
			otherEKM := bytes.Repeat([]byte{8}, ExporterLen)
			for what, err := range map[string]error{
				"another connection": Verify(key.Public(), PurposeReattest, nonce, otherEKM, sig),
				"another purpose":    Verify(key.Public(), PurposeRejoin, nonce, ekm, sig),
				"another nonce":      Verify(key.Public(), PurposeReattest, []byte("nonce-x"), ekm, sig),
				"another key":        Verify(other.Public(), PurposeReattest, nonce, ekm, sig),
				"no nonce":           Verify(key.Public(), PurposeReattest, nil, ekm, sig),
				"short exporter":     Verify(key.Public(), PurposeReattest, nonce, ekm[:8], sig),
				"bad signature":      Verify(key.Public(), PurposeReattest, nonce, ekm, sig[:len(sig)-1]),
			} {
				if !errors.Is(err, ErrInvalid) {
					t.Errorf("%s: %v, want ErrInvalid", what, err)
				}
			}
		})
	}
	if err := Verify("not a key", PurposeReattest, nonce, ekm, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("unknown key type: %v", err)
	}
}

func TestExporterNeedsTLS13(t *testing.T) {
	if _, err := Exporter(nil); !errors.Is(err, ErrNoExporter) {
		t.Errorf("nil state: %v", err)
	}
}
