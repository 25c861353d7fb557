package jointoken

import "errors"

// Errors returned by this package. Parse wraps ErrMalformed together with the
// error of the part at fault (ErrVersion, ErrID, ErrSecret or ErrPin), so
// callers can test for either with errors.Is. No error message ever contains
// the secret or any other part of the input.
var (
	// ErrMalformed reports a string that is not a join token.
	ErrMalformed = errors.New("malformed join token")
	// ErrVersion reports a token whose version prefix is not Version.
	ErrVersion = errors.New("unsupported join token version")
	// ErrID reports a token id that is not IDLen characters of a-z and 2-7.
	ErrID = errors.New("invalid join token id")
	// ErrSecret reports a secret that is not SecretSize bytes of canonical
	// unpadded base64url.
	ErrSecret = errors.New("invalid join token secret")
	// ErrPin reports a pin that is not a canonical SHA-256 pin, inside a
	// token or in the "sha256/<base64>" form.
	ErrPin = errors.New("invalid pin")
	// ErrPinMismatch reports a certificate chain in which no certificate
	// carries the pinned public key.
	ErrPinMismatch = errors.New("no certificate in the chain matches the pin")
	// ErrChainUntrusted reports a chain that holds the pinned key but whose
	// leaf does not verify up to it (wrong name, expired, wrong usage).
	ErrChainUntrusted = errors.New("certificate chain does not verify against the pinned key")
)
