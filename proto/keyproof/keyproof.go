// Package keyproof defines how a node proves on one TLS connection that it
// holds a key (session.proto, KeyProof): the bytes it signs, the TLS
// exporter that binds them to the connection, and the check a gateway
// makes. bcd signs with Sign; the gateway checks with Verify. Both sides
// take the exporter from their own end of the connection (Exporter), so a
// proof captured on one connection and replayed on another fails.
//
// The signed message is SHA-256 over
//
//	purpose || 0x00 || nonce || exporter
//
// where purpose is PurposeReattest or PurposeRejoin, nonce the gateway's
// Challenge nonce and exporter ExporterLen bytes of the RFC 8446 §7.5
// exporter with label ExporterLabel and no context. ECDSA P-256 keys sign
// the digest (ASN.1 signature); Ed25519 keys sign the message itself.
package keyproof

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
)

// Purpose says what a proof is for; a proof made for one purpose never
// passes for another.
type Purpose string

// The purposes of session.proto.
const (
	// PurposeReattest is JoinService.Reattest's.
	PurposeReattest Purpose = "better-compute reattest v1"
	// PurposeRejoin is JoinRequest.proof's.
	PurposeRejoin Purpose = "better-compute rejoin v1"
)

// ExporterLabel is the TLS exporter label of a key proof.
const ExporterLabel = "EXPORTER-better-compute-key-proof"

// ExporterLen is how many exporter bytes a proof binds.
const ExporterLen = 32

// MaxNonceLen is the longest nonce a proof may carry.
const MaxNonceLen = 64

// Errors of this package; match them with errors.Is.
var (
	// ErrInvalid reports a proof that does not verify.
	ErrInvalid = errors.New("key proof invalid")
	// ErrNoExporter reports a connection without TLS 1.3 keying material.
	ErrNoExporter = errors.New("no TLS exporter on this connection")
)

// Exporter returns the keying material of cs a proof binds. It fails with
// ErrNoExporter before TLS 1.3's handshake completed.
func Exporter(cs *tls.ConnectionState) ([]byte, error) {
	if cs == nil || !cs.HandshakeComplete || cs.Version < tls.VersionTLS13 {
		return nil, ErrNoExporter
	}
	ekm, err := cs.ExportKeyingMaterial(ExporterLabel, nil, ExporterLen)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoExporter, err)
	}
	return ekm, nil
}

// message is what a proof signs, before hashing.
func message(p Purpose, nonce, exporter []byte) []byte {
	m := make([]byte, 0, len(p)+1+len(nonce)+len(exporter))
	m = append(m, p...)
	m = append(m, 0)
	m = append(m, nonce...)
	return append(m, exporter...)
}

// Sign signs a proof for purpose p over nonce and exporter with key, an
// ECDSA P-256 or Ed25519 private key.
func Sign(key crypto.Signer, p Purpose, nonce, exporter []byte) ([]byte, error) {
	m := message(p, nonce, exporter)
	if _, ok := key.Public().(ed25519.PublicKey); ok {
		return key.Sign(rand.Reader, m, crypto.Hash(0))
	}
	sum := sha256.Sum256(m)
	sig, err := key.Sign(rand.Reader, sum[:], crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("sign key proof: %w", err)
	}
	return sig, nil
}

// Verify checks sig as a proof for purpose p over nonce and exporter by
// pub. It fails with ErrInvalid for a bad signature, an empty or too long
// nonce, a short exporter or another key type.
func Verify(pub crypto.PublicKey, p Purpose, nonce, exporter, sig []byte) error {
	if len(nonce) == 0 || len(nonce) > MaxNonceLen || len(exporter) != ExporterLen {
		return fmt.Errorf("%w: nonce of %d bytes, exporter of %d", ErrInvalid, len(nonce), len(exporter))
	}
	m := message(p, nonce, exporter)
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		sum := sha256.Sum256(m)
		if ecdsa.VerifyASN1(k, sum[:], sig) {
			return nil
		}
	case ed25519.PublicKey:
		if len(k) == ed25519.PublicKeySize && ed25519.Verify(k, m, sig) {
			return nil
		}
	default:
		return fmt.Errorf("%w: key type %T", ErrInvalid, pub)
	}
	return fmt.Errorf("%w: signature does not verify", ErrInvalid)
}
