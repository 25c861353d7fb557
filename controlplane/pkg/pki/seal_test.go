package pki

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestSealOpenRoundTrip(t *testing.T) {
	t.Parallel()
	aad := []byte("context")
	for _, size := range []int{0, 1, 31, 32, 4096} {
		plaintext := bytes.Repeat([]byte{0xa5}, size)
		sealed, err := Seal(testSecret, plaintext, aad)
		if err != nil {
			t.Fatalf("Seal(%d bytes): %v", size, err)
		}
		if len(sealed) != size+SealOverhead || sealed[0] != sealVersion {
			t.Fatalf("sealed %d bytes into %d starting %#x, want %d starting 0x01", size, len(sealed), sealed[0], size+SealOverhead)
		}
		// Short plaintexts may turn up in random bytes by chance.
		if size >= 16 && bytes.Contains(sealed, plaintext) {
			t.Fatal("sealed output contains the plaintext")
		}
		got, err := Open(testSecret, sealed, aad)
		if err != nil {
			t.Fatalf("Open(%d bytes): %v", size, err)
		}
		if !bytes.Equal(got, plaintext) {
			t.Fatalf("Open = %x, want %x", got, plaintext)
		}
	}
}

func TestSealIsRandomised(t *testing.T) {
	t.Parallel()
	a, err := Seal(testSecret, []byte("same"), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Seal(testSecret, []byte("same"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a, b) || bytes.Equal(a[1:1+sealSaltSize], b[1:1+sealSaltSize]) {
		t.Fatal("two seals of the same plaintext share their bytes or salt")
	}
}

func TestOpenWrongSecretOrAAD(t *testing.T) {
	t.Parallel()
	sealed, err := Seal(testSecret, []byte("bundle"), []byte("aad"))
	if err != nil {
		t.Fatal(err)
	}
	other := strings.Replace(testSecret, "0", "1", 1)
	if _, err := Open(other, sealed, []byte("aad")); !errors.Is(err, ErrSealOpen) {
		t.Fatalf("Open with a wrong secret: error = %v, want ErrSealOpen", err)
	}
	if _, err := Open(testSecret, sealed, []byte("other")); !errors.Is(err, ErrSealOpen) {
		t.Fatalf("Open with wrong aad: error = %v, want ErrSealOpen", err)
	}
	if _, err := Open(testSecret, sealed, nil); !errors.Is(err, ErrSealOpen) {
		t.Fatalf("Open without aad: error = %v, want ErrSealOpen", err)
	}
}

func TestSecretTooShort(t *testing.T) {
	t.Parallel()
	short := testSecret[:MinSecretLen-1]
	if _, err := Seal(short, []byte("x"), nil); !errors.Is(err, ErrSecretTooShort) {
		t.Fatalf("Seal with %d characters: error = %v, want ErrSecretTooShort", len(short), err)
	}
	if _, err := Open(short, make([]byte, 100), nil); !errors.Is(err, ErrSecretTooShort) {
		t.Fatalf("Open with %d characters: error = %v, want ErrSecretTooShort", len(short), err)
	}
	if _, err := Seal("", nil, nil); !errors.Is(err, ErrSecretTooShort) {
		t.Fatalf("Seal with an empty secret: error = %v, want ErrSecretTooShort", err)
	}
	// The rule counts characters, not bytes: 31 two-byte characters are
	// too few, 32 are enough.
	if _, err := Seal(strings.Repeat("é", MinSecretLen-1), nil, nil); !errors.Is(err, ErrSecretTooShort) {
		t.Fatalf("Seal with 31 characters in 62 bytes: error = %v, want ErrSecretTooShort", err)
	}
	if _, err := Seal(strings.Repeat("é", MinSecretLen), nil, nil); err != nil {
		t.Fatalf("Seal with 32 two-byte characters: %v", err)
	}
}

func TestOpenTampered(t *testing.T) {
	t.Parallel()
	plaintext := []byte("the node CA key")
	sealed, err := Seal(testSecret, plaintext, nil)
	if err != nil {
		t.Fatal(err)
	}
	regions := map[string]struct {
		at   int
		want error
	}{
		"version":    {0, ErrSealFormat},
		"salt":       {1, ErrSealOpen},
		"nonce":      {1 + sealSaltSize, ErrSealOpen},
		"ciphertext": {1 + sealSaltSize + 12, ErrSealOpen},
		"tag":        {len(sealed) - 1, ErrSealOpen},
	}
	for name, r := range regions {
		tampered := bytes.Clone(sealed)
		tampered[r.at] ^= 0x01
		if _, err := Open(testSecret, tampered, nil); !errors.Is(err, r.want) {
			t.Errorf("%s flipped: error = %v, want %v", name, err, r.want)
		}
	}
	for _, n := range []int{0, 1, SealOverhead - 1} {
		if _, err := Open(testSecret, sealed[:n], nil); !errors.Is(err, ErrSealFormat) {
			t.Errorf("truncated to %d bytes: error = %v, want ErrSealFormat", n, err)
		}
	}
	if _, err := Open(testSecret, sealed[:len(sealed)-1], nil); !errors.Is(err, ErrSealOpen) {
		t.Errorf("tag cut short: error = %v, want ErrSealOpen", err)
	}
	if _, err := Open(testSecret, append(bytes.Clone(sealed), 0), nil); !errors.Is(err, ErrSealOpen) {
		t.Errorf("byte appended: error = %v, want ErrSealOpen", err)
	}
}
