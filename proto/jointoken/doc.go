// Package jointoken defines the wire format of a Better Compute join token,
// shared by the control plane, which makes tokens, and bcd, which parses them.
//
// A join token is one line of 105 printable ASCII characters with no spaces
// (149 for a version 2 token, which carries a second pin: see WithPin),
// safe to keep in a file, an environment variable or a shell argument:
//
//	bct1.<id>.<secret>.<pin>
//
//	bct1    the format version (4 characters). A new layout gets a new prefix.
//	id      12 characters of the lower-case RFC 4648 base32 alphabet
//	        (a-z, 2-7): 60 random bits. Public; the control plane looks the
//	        token's row up by it.
//	secret  32 random bytes, unpadded base64url (RFC 4648 §5), 43 characters.
//	        The control plane stores only its SHA-256 (Token.SecretHash).
//	pin     the SHA-256 of the DER SubjectPublicKeyInfo of the gateway serving
//	        CA, unpadded base64url, 43 characters.
//
// Every part has a fixed length and a canonical encoding, so a token has one
// spelling only: Parse(s).String() == strings.TrimSpace(s) for every s that
// parses.
//
// The pin lets a daemon that has nothing else trust the gateway it joins
// through, the way a k3s secure token carries the hash of its cluster CA.
// Outside the token a pin is written RFC 7469 style, as
// "sha256/<standard base64 of the SHA-256 of the DER SubjectPublicKeyInfo>"
// (Pin, PinPublicKey, ParsePin); inside the token the same 32 bytes are
// re-encoded as base64url because standard base64 may contain '/', '+' and '='.
//
// A daemon decides whether to trust a gateway's TLS chain with VerifyChain,
// which treats the pinned certificate as the only trust anchor. MatchPin only
// says whether a pinned key appears somewhere in a chain: a CA certificate is
// public, so anyone can send it, and a match alone proves nothing.
package jointoken
