package pki

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"unicode/utf8"
)

// MinSecretLen is the least number of characters (Unicode code points) in
// a deployment secret, from the seed's "a deployment secret of at least 32
// random characters".
const MinSecretLen = 32

// SealOverhead is how many bytes Seal adds to its plaintext: the version
// byte, the salt, the GCM nonce and the GCM tag.
const SealOverhead = 1 + sealSaltSize + 12 + 16

const (
	// sealVersion is the first byte of every sealed value.
	sealVersion byte = 1
	// sealSaltSize is the HKDF salt size in bytes, the hash size as RFC 5869
	// §3.1 suggests.
	sealSaltSize = sha256.Size
	// sealInfo binds derived keys to this use (RFC 5869 §3.2).
	sealInfo = "better-compute pki seal v1"
	// sealKeySize selects AES-256.
	sealKeySize = 32
)

// SecretAAD returns the additional data a named secret (the secrets table:
// BMC credentials "bmc/<node>", ...) is sealed with under the deployment
// secret: "better-compute secret " + name. The api seals with it and the
// gateway opens with it for JoinService.Secret, so a sealed value moved to
// another name does not open.
func SecretAAD(name string) []byte { return []byte("better-compute secret " + name) }

// Seal encrypts plaintext under a key derived from secret and authenticates
// it together with aad, which Open must be given again (it is not stored).
// The output is SealOverhead bytes longer than plaintext; its layout is in
// the package documentation. It fails with ErrSecretTooShort when secret
// has fewer than MinSecretLen characters.
func Seal(secret string, plaintext, aad []byte) ([]byte, error) {
	if err := checkSecret(secret); err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	out := make([]byte, 1+sealSaltSize, SealOverhead+len(plaintext))
	out[0] = sealVersion
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, fmt.Errorf("seal: read salt: %w", err)
	}
	aead, err := sealAEAD(secret, out[1:])
	if err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	return aead.Seal(out, nil, plaintext, sealAdditionalData(out, aad)), nil
}

// Open reverses Seal: it returns the plaintext sealed under secret with the
// same aad. It fails with ErrSecretTooShort for a short secret, ErrSealFormat
// for truncated data or an unknown version, and ErrSealOpen when the data
// does not authenticate (wrong secret, wrong aad or tampered bytes).
func Open(secret string, sealed, aad []byte) ([]byte, error) {
	if err := checkSecret(secret); err != nil {
		return nil, fmt.Errorf("open sealed data: %w", err)
	}
	if len(sealed) < SealOverhead {
		return nil, fmt.Errorf("open sealed data: %w: %d bytes, want at least %d", ErrSealFormat, len(sealed), SealOverhead)
	}
	if sealed[0] != sealVersion {
		return nil, fmt.Errorf("open sealed data: %w: version %d, want %d", ErrSealFormat, sealed[0], sealVersion)
	}
	header := sealed[:1+sealSaltSize]
	aead, err := sealAEAD(secret, header[1:])
	if err != nil {
		return nil, fmt.Errorf("open sealed data: %w", err)
	}
	plaintext, err := aead.Open(nil, nil, sealed[len(header):], sealAdditionalData(header, aad))
	if err != nil {
		return nil, fmt.Errorf("open sealed data: %w", ErrSealOpen)
	}
	return plaintext, nil
}

func checkSecret(secret string) error {
	if n := utf8.RuneCountInString(secret); n < MinSecretLen {
		return fmt.Errorf("%w: %d characters, want at least %d", ErrSecretTooShort, n, MinSecretLen)
	}
	return nil
}

// sealAEAD derives the AES-256 key for one salt and returns AES-GCM with a
// random 96-bit nonce prepended to each ciphertext. The salt is fresh for
// every seal, so each key encrypts one message only.
func sealAEAD(secret string, salt []byte) (cipher.AEAD, error) {
	key, err := hkdf.Key(sha256.New, []byte(secret), salt, sealInfo, sealKeySize)
	if err != nil {
		return nil, fmt.Errorf("derive key: %w", err)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("new cipher: %w", err)
	}
	aead, err := cipher.NewGCMWithRandomNonce(block)
	if err != nil {
		return nil, fmt.Errorf("new gcm: %w", err)
	}
	return aead, nil
}

// sealAdditionalData authenticates the header (version and salt, fixed
// length) ahead of the caller's aad.
func sealAdditionalData(header, aad []byte) []byte {
	ad := make([]byte, 0, 1+sealSaltSize+len(aad))
	ad = append(ad, header[:1+sealSaltSize]...)
	return append(ad, aad...)
}
