// Package manifest builds, signs and verifies release manifests
// (DESIGN.md, "Releases"; docs/releases.md).
//
// A manifest is a JSON document naming a release version and every artifact
// of it (binaries, archives, packages, the checksums file) with its sha256
// and size:
//
//	{"version":"0.1.0","created_at":"2026-01-02T03:04:05Z","expires_at":"...",
//	 "artifacts":[{"name":"bcd_linux_amd64_v1/bcd","os":"linux","arch":"amd64",
//	   "sha256":"<hex>","size":123,"kind":"binary","binary":"bcd"}, ...]}
//
// Names are slash-separated paths relative to the goreleaser dist folder.
//
// It is signed with minisign (Ed25519, the prehashed form of minisign 0.10+)
// into manifest.json.minisig, which interoperates with the minisign tool both
// ways. A verifier trusts keys by pin: "sha256/" and the standard base64 of the
// SHA-256 of the minisign public key bytes (the 42 bytes the second line of a
// minisign .pub file decodes to: algorithm, key id, Ed25519 key). Several pins
// may be trusted at once, so a release key can be rotated. The signature file
// carries its public key in its untrusted comment (Sign writes it; with the
// minisign tool pass -c "$(UntrustedComment)"), and the pin is what makes it
// trusted.
//
// An expired manifest fails Verify with ErrExpired. Only installing and
// upgrading verify manifests: an installed bcd never checks one to start, so
// expiry can never stop a running fleet.
package manifest
