package pki

import "errors"

// Errors returned by this package, wrapped with the operation that failed;
// match them with errors.Is.
var (
	// ErrSecretTooShort reports a deployment secret shorter than
	// MinSecretLen characters.
	ErrSecretTooShort = errors.New("deployment secret too short")
	// ErrSealFormat reports sealed data that is truncated or has an unknown
	// version byte.
	ErrSealFormat = errors.New("sealed data malformed")
	// ErrSealOpen reports sealed data that does not authenticate: a wrong
	// secret, wrong additional data, or tampered bytes. AES-GCM cannot tell
	// these apart.
	ErrSealOpen = errors.New("cannot open sealed data: wrong secret or tampered data")

	// ErrTrustDomain reports a name that is not a SPIFFE trust domain name.
	ErrTrustDomain = errors.New("invalid trust domain")
	// ErrNodeID reports a node id that does not match NodeIDPattern.
	ErrNodeID = errors.New("invalid node id")
	// ErrName reports an invalid DNS name, IP address or internal name for a
	// serving certificate, or a gateway certificate without any name.
	ErrName = errors.New("invalid certificate name")
	// ErrTTL reports a negative certificate lifetime or CA validity.
	ErrTTL = errors.New("invalid lifetime")
	// ErrCAExpired reports a CA whose validity ends before the certificate
	// asked for could be valid at all.
	ErrCAExpired = errors.New("certificate authority expired")
	// ErrBundleInvalid reports a bundle that is incomplete or inconsistent:
	// a missing CA, a key that does not match its certificate, an unknown
	// encoding version.
	ErrBundleInvalid = errors.New("invalid pki bundle")

	// ErrCSRInvalid reports a certificate signing request that does not
	// parse or whose signature does not verify.
	ErrCSRInvalid = errors.New("invalid certificate signing request")
	// ErrKeyType reports a CSR public key other than ECDSA P-256 or Ed25519.
	ErrKeyType = errors.New("unsupported public key type")

	// ErrUntrusted reports a node certificate that does not chain to the
	// node CA roots, is not a client certificate, or is a CA certificate.
	ErrUntrusted = errors.New("certificate not trusted")
	// ErrExpired reports a node certificate outside its validity window at
	// the time of verification (expired or not yet valid).
	ErrExpired = errors.New("certificate expired or not yet valid")
	// ErrWrongTrustDomain reports a node certificate whose SPIFFE ID names
	// another trust domain.
	ErrWrongTrustDomain = errors.New("certificate from another trust domain")
	// ErrSPIFFEID reports a certificate or string without exactly one
	// well-formed node SPIFFE ID.
	ErrSPIFFEID = errors.New("invalid node SPIFFE ID")
)
