package jointoken

import (
	"crypto"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"strings"
)

// PinPrefix starts every pin in its text form, naming the hash as RFC 7469
// (HTTP Public Key Pinning) §2.4 does.
const PinPrefix = "sha256/"

// pinTextLen is the length of a pin in its text form: the prefix and 44
// characters of padded standard base64.
const pinTextLen = len(PinPrefix) + 44

// Pin returns the pin of cert's public key: "sha256/" followed by the padded
// standard base64 (RFC 4648 §4) of the SHA-256 of the certificate's DER
// SubjectPublicKeyInfo, as in RFC 7469 §2.4. The result is 51 characters.
// Pinning the key rather than the certificate keeps a pin valid when a CA is
// re-issued with the same key.
func Pin(cert *x509.Certificate) string {
	return formatPin(sha256.Sum256(cert.RawSubjectPublicKeyInfo))
}

// PinPublicKey returns the pin of pub, one of the public key types
// x509.MarshalPKIXPublicKey accepts (*ecdsa.PublicKey, ed25519.PublicKey,
// *rsa.PublicKey, *ecdh.PublicKey). It equals Pin of any certificate for
// pub. It fails only for a key type x509 cannot encode.
func PinPublicKey(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("pin public key: %w", err)
	}
	return formatPin(sha256.Sum256(der)), nil
}

// ParsePin parses a pin in its text form ("sha256/" and 44 characters of
// padded standard base64) and returns the 32-byte SHA-256 it holds. It
// accepts only the canonical spelling: no spaces, no other hash, no
// base64url. Errors wrap ErrPin.
func ParsePin(s string) ([]byte, error) {
	sum, err := parsePin(s)
	if err != nil {
		return nil, err
	}
	return sum[:], nil
}

// MatchPin reports whether any certificate in certs has the public key that
// pin names. Nil entries are skipped; an unparsable pin matches nothing.
//
// A match is not a trust decision: CA certificates are public and anyone can
// send one. Use VerifyChain to decide whether to trust a TLS peer.
func MatchPin(pin string, certs []*x509.Certificate) bool {
	want, err := parsePin(pin)
	if err != nil {
		return false
	}
	for _, c := range certs {
		if matchCert(want, c) {
			return true
		}
	}
	return false
}

// matchCert reports whether cert's SubjectPublicKeyInfo hashes to want,
// comparing in constant time.
func matchCert(want [sha256.Size]byte, cert *x509.Certificate) bool {
	if cert == nil {
		return false
	}
	got := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return subtle.ConstantTimeCompare(want[:], got[:]) == 1
}

func formatPin(sum [sha256.Size]byte) string {
	return PinPrefix + base64.StdEncoding.EncodeToString(sum[:])
}

func parsePin(s string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	if !strings.HasPrefix(s, PinPrefix) {
		return sum, fmt.Errorf("%w: want prefix %q", ErrPin, PinPrefix)
	}
	if len(s) != pinTextLen {
		return sum, fmt.Errorf("%w: want %d characters, got %d", ErrPin, pinTextLen, len(s))
	}
	// Decode into a buffer of the full decoded length: 44 characters
	// without padding decode to 33 bytes, more than sum holds.
	enc := s[len(PinPrefix):]
	buf := make([]byte, base64.StdEncoding.DecodedLen(len(enc)))
	n, err := base64.StdEncoding.Strict().Decode(buf, []byte(enc))
	if err == nil && n == sha256.Size {
		copy(sum[:], buf)
	}
	// Re-encoding must give s back: that refuses the newlines the decoder
	// skips and any other second spelling of the same hash.
	if err != nil || n != sha256.Size || formatPin(sum) != s {
		return [sha256.Size]byte{}, fmt.Errorf("%w: want the standard base64 of a 32-byte SHA-256", ErrPin)
	}
	return sum, nil
}
