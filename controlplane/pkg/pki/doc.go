// Package pki is the machine PKI of a Better Compute deployment: the CA
// bundle, its sealing under the deployment secret, the certificates issued
// from it and the verification of node identities. It is pure crypto with
// no database; the store keeps a sealed bundle as opaque bytes.
//
// # The bundle
//
// Init makes a Bundle for one SPIFFE trust domain with three CAs, each an
// ECDSA P-256 key and a self-signed certificate (DefaultCAValidity, ten
// years, unless InitOptions.Validity says otherwise):
//
//   - the node CA signs node certificates (IssueNode) and is what gateways
//     trust for client certificates (VerifyNode, NodeVerifier);
//   - the gateway serving CA signs the gateways' TLS serving certificates
//     (IssueGateway); join tokens carry the pin of its key (GatewayPin, see
//     package proto/jointoken), so a joining daemon trusts it with nothing
//     else;
//   - the internal CA signs the certificates of the internal control API
//     between control-plane processes (IssueInternal), valid for both sides
//     of mutual TLS.
//
// RotateNodeCA replaces the node CA and keeps the old certificate (never its
// key) among the node CA roots, so certificates it issued keep verifying for
// an overlap window; PruneNodeRoots drops retained roots once they expire.
// A rotation in phases (DESIGN.md, "CA rotation") uses PrepareNodeCA (the
// next CA trusted, not issuing), ActivateNodeCA (it issues; the old one is
// kept, key included, for a rollback), RetireNodeCA (the old root verifies
// re-attestation only, ReattestRoots) and RollbackNodeCA.
//
// Marshal and UnmarshalBundle encode a bundle as JSON holding PEM blocks,
// private keys included. SealBundle and OpenBundle wrap that in Seal and
// Open, the form in which the bundle is stored.
//
// # Sealing
//
// Seal encrypts with AES-256-GCM (NIST SP 800-38D) under a key derived from
// the deployment secret with HKDF-SHA256 (RFC 5869), a fresh random salt for
// each seal and the info string "better-compute pki seal v1". The output is
//
//	version (1 byte, 0x01) | salt (32 bytes) | nonce (12 bytes) | ciphertext | tag (16 bytes)
//
// and the version byte and salt are authenticated with the caller's
// additional data. HKDF does not stretch a weak secret: the deployment
// secret must be random, at least MinSecretLen characters (the seed's "at
// least 32 random characters").
//
// # Node identity
//
// A node certificate names exactly one SPIFFE ID (SPIFFE X.509-SVID
// specification), spiffe://<trust-domain>/node/<node-id>, as its only URI
// SAN, and carries the node id as its common name. Whatever names the CSR
// asks for are ignored: the control plane decides them. Certificates are
// short-lived (DefaultNodeTTL, 24 hours) and daemons renew at RenewAfter,
// two thirds into the certificate's life. Revocation is by serial, which
// FormatSerial spells the same way everywhere.
package pki
