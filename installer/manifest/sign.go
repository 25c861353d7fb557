package manifest

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"aead.dev/minisign"
)

// Errors of Verify, matched with errors.Is.
var (
	// ErrNoPins: Verify was given no pins, so it trusts no key.
	ErrNoPins = errors.New("no release key pins given")
	// ErrBadSignature: the signature is unreadable or does not match.
	ErrBadSignature = errors.New("release manifest signature does not verify")
	// ErrUnpinnedKey: the manifest is signed by a key no pin names.
	ErrUnpinnedKey = errors.New("release manifest is signed by a key that is not pinned")
	// ErrExpired: the manifest's expires_at has passed. Only installs and
	// upgrades refuse it; a running bcd never checks.
	ErrExpired = errors.New("release manifest has expired")
)

// pinPrefix starts every pin.
const pinPrefix = "sha256/"

// commentPrefix starts the untrusted comment of a signature that carries its
// public key.
const commentPrefix = "better-compute release key "

// GenerateKey makes a minisign key pair and returns the public key file
// (minisign's .pub format), the private key file (unencrypted, or encrypted
// with password when it is not empty, minisign's format either way) and the
// public key's pin.
func GenerateKey(password string) (pub, priv []byte, pin string, err error) {
	pk, sk, err := minisign.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, "", fmt.Errorf("generate release key: %w", err)
	}
	pub, _ = pk.MarshalText()
	pub = append(pub, '\n')
	if password != "" {
		priv, err = minisign.EncryptKey(password, sk)
	} else {
		priv, err = sk.MarshalText()
	}
	if err != nil {
		return nil, nil, "", fmt.Errorf("encode release key: %w", err)
	}
	return pub, append(priv, '\n'), Pin(pk), nil
}

// ParsePrivateKey reads a minisign private key file, decrypting it with
// password when it is encrypted.
func ParsePrivateKey(b []byte, password string) (minisign.PrivateKey, error) {
	var sk minisign.PrivateKey
	if minisign.IsEncrypted(b) {
		if password == "" {
			return sk, errors.New("release key is encrypted and no password was given")
		}
		k, err := minisign.DecryptKey(password, bytes.TrimSpace(b))
		if err != nil {
			return sk, fmt.Errorf("decrypt release key: %w", err)
		}
		return k, nil
	}
	if err := sk.UnmarshalText(bytes.TrimSpace(b)); err != nil {
		return sk, fmt.Errorf("read release key: %w", err)
	}
	return sk, nil
}

// ParsePublicKey reads a minisign public key: a .pub file or its base64 line.
func ParsePublicKey(b []byte) (minisign.PublicKey, error) {
	var pk minisign.PublicKey
	if err := pk.UnmarshalText(bytes.TrimSpace(b)); err != nil {
		return pk, fmt.Errorf("read release public key: %w", err)
	}
	return pk, nil
}

// Pin returns the pin of a public key: "sha256/" and the standard base64 of
// the SHA-256 of its 42 minisign bytes (algorithm, key id, Ed25519 key), the
// same as
//
//	tail -n 1 key.pub | base64 -d | openssl dgst -sha256 -binary | base64
func Pin(pk minisign.PublicKey) string {
	raw, _ := base64.StdEncoding.DecodeString(pk.String())
	sum := sha256.Sum256(raw)
	return pinPrefix + base64.StdEncoding.EncodeToString(sum[:])
}

// ParsePin checks a pin's form and returns its 32-byte digest.
func ParsePin(pin string) ([]byte, error) {
	b64, ok := strings.CutPrefix(pin, pinPrefix)
	if !ok {
		return nil, fmt.Errorf("invalid release pin %q: want sha256/<base64 of the SHA-256 of the public key>", pin)
	}
	sum, err := base64.StdEncoding.Strict().DecodeString(b64)
	if err != nil || len(sum) != sha256.Size {
		return nil, fmt.Errorf("invalid release pin %q: want sha256/ and 44 characters of standard base64", pin)
	}
	return sum, nil
}

// UntrustedComment is the untrusted comment a signature by pk carries so that
// Verify finds the key: pass it to the minisign tool as -c.
func UntrustedComment(pk minisign.PublicKey) string { return commentPrefix + pk.String() }

// Sign signs a manifest with minisign's prehashed Ed25519 (the default of
// minisign 0.10 and later) and returns the .minisig file. The trusted
// comment records the time and the manifest's version; the untrusted comment
// carries the public key.
func Sign(manifest []byte, sk minisign.PrivateKey, now time.Time) ([]byte, error) {
	m, err := Parse(manifest)
	if err != nil {
		return nil, err
	}
	pk, ok := sk.Public().(minisign.PublicKey)
	if !ok {
		return nil, errors.New("release key has no minisign public key")
	}
	r := minisign.NewReader(bytes.NewReader(manifest))
	if _, err := io.Copy(io.Discard, r); err != nil {
		return nil, fmt.Errorf("hash manifest: %w", err)
	}
	trusted := fmt.Sprintf("timestamp:%d\tfile:manifest.json\tversion:%s\thashed", now.Unix(), m.Version)
	return append(r.SignWithComments(sk, trusted, UntrustedComment(pk)), '\n'), nil
}

// Verify checks a manifest and its minisign signature against pins and
// returns the manifest: the public key the signature carries must match one
// of the pins (any one: several are trusted during a key rotation), the
// signature must verify, the manifest must be valid and, at now, not
// expired. Errors wrap ErrNoPins, ErrUnpinnedKey, ErrBadSignature or
// ErrExpired, or describe an invalid manifest or pin.
func Verify(manifest, sig []byte, pins []string, now time.Time) (*Manifest, error) {
	if err := verifyPinned(manifest, sig, pins); err != nil {
		return nil, err
	}
	m, err := Parse(manifest)
	if err != nil {
		return nil, err
	}
	if m.Expired(now) {
		return m, fmt.Errorf("%w (expires_at %s)", ErrExpired, m.ExpiresAt.Format(time.RFC3339))
	}
	return m, nil
}

// verifyPinned checks that sig is a minisign signature of doc by a key one
// of pins names. Errors wrap ErrNoPins, ErrUnpinnedKey or ErrBadSignature,
// or describe an invalid pin.
func verifyPinned(doc, sig []byte, pins []string) error {
	if len(pins) == 0 {
		return ErrNoPins
	}
	digests := make([][]byte, 0, len(pins))
	for _, p := range pins {
		d, err := ParsePin(p)
		if err != nil {
			return err
		}
		digests = append(digests, d)
	}
	var s minisign.Signature
	if err := s.UnmarshalText(bytes.TrimRight(sig, "\r\n")); err != nil {
		return fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	pk, err := signatureKey(s)
	if err != nil {
		return err
	}
	pin := Pin(pk)
	want, _ := ParsePin(pin)
	pinned := false
	for _, d := range digests {
		pinned = pinned || subtle.ConstantTimeCompare(d, want) == 1
	}
	if !pinned {
		return fmt.Errorf("%w (its pin is %s)", ErrUnpinnedKey, pin)
	}
	if !minisign.Verify(pk, doc, sig) {
		return ErrBadSignature
	}
	return nil
}

// signatureKey returns the public key the signature's untrusted comment
// carries, which must have the signature's key id.
func signatureKey(s minisign.Signature) (minisign.PublicKey, error) {
	var pk minisign.PublicKey
	fields := strings.Fields(s.UntrustedComment)
	if len(fields) == 0 {
		return pk, fmt.Errorf("%w: the signature carries no public key (sign with better-compute release sign, or minisign -c %q)", ErrBadSignature, commentPrefix+"<public key>")
	}
	if err := pk.UnmarshalText([]byte(fields[len(fields)-1])); err != nil {
		return pk, fmt.Errorf("%w: the signature carries no public key (sign with better-compute release sign, or minisign -c %q)", ErrBadSignature, commentPrefix+"<public key>")
	}
	if pk.ID() != s.KeyID {
		return pk, fmt.Errorf("%w: the public key the signature carries has another key id", ErrBadSignature)
	}
	return pk, nil
}
