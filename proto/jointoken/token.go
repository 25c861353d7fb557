package jointoken

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Layout of a version 1 token; see the package documentation.
const (
	// Version is the prefix of every token this package makes and parses.
	Version = "bct1"
	// IDLen is the length of a token id in characters.
	IDLen = 12
	// SecretSize is the size of a token secret in bytes (256 bits).
	SecretSize = 32
	// Len is the length of a token string in characters: the version, the
	// id, the secret and the pin (43 characters each as unpadded base64url)
	// and three dots.
	Len = len(Version) + 1 + IDLen + 1 + 43 + 1 + 43
	// Version2 is the prefix of a token that pins two gateway serving
	// CAs, made while a gateway-CA rotation is open (WithPin): a version 1
	// token with a second pin appended, Len2 characters.
	Version2 = "bct2"
	// Len2 is the length of a version 2 token in characters.
	Len2 = Len + 1 + 43
)

// separator joins the parts of a token. It is in neither the base32 nor the
// base64url alphabet.
const separator = "."

// idAlphabet is the lower-case RFC 4648 §6 base32 alphabet. Its 32 symbols
// divide 256, so one random byte modulo 32 picks a symbol uniformly.
const idAlphabet = "abcdefghijklmnopqrstuvwxyz234567"

// b64 encodes the secret and the pin inside a token: unpadded base64url
// (RFC 4648 §5), strict so that each value has exactly one spelling.
var b64 = base64.RawURLEncoding.Strict()

// Token is a parsed join token. The zero Token is not a valid token; New
// and Parse return only valid ones. Token is comparable with ==.
//
// String returns the whole token, secret included: log a Token through slog
// (LogValue) or Redacted, never through String.
type Token struct {
	id     string
	secret [SecretSize]byte
	pin    [sha256.Size]byte
	// pin2 is the second pin of a version 2 token, when hasPin2.
	pin2    [sha256.Size]byte
	hasPin2 bool
}

// WithPin returns t pinning the gateway serving CA named by pin as well,
// a version 2 token: a daemon trusts a gateway whose chain verifies up to
// either pin. Tokens made while a gateway-CA rotation is open carry the
// CA in force and the other CA of the rotation. It fails when pin does not
// parse (ErrPin); a pin equal to the first leaves t as it is.
func (t Token) WithPin(pin string) (Token, error) {
	sum, err := parsePin(pin)
	if err != nil {
		return Token{}, fmt.Errorf("join token second pin: %w", err)
	}
	if sum == t.pin {
		return t, nil
	}
	t.pin2, t.hasPin2 = sum, true
	return t, nil
}

// New makes a token with a fresh id and secret, read from r, that pins the
// gateway serving CA named by pin (the "sha256/<base64>" form of Pin). A nil
// r reads from crypto/rand. It fails when pin does not parse (ErrPin) or r
// cannot supply IDLen+SecretSize bytes.
func New(pin string, r io.Reader) (Token, error) {
	sum, err := parsePin(pin)
	if err != nil {
		return Token{}, fmt.Errorf("new join token: %w", err)
	}
	if r == nil {
		r = rand.Reader
	}
	var buf [IDLen + SecretSize]byte
	if _, err := io.ReadFull(r, buf[:]); err != nil {
		return Token{}, fmt.Errorf("new join token: read random bytes: %w", err)
	}
	id := make([]byte, IDLen)
	for i, b := range buf[:IDLen] {
		id[i] = idAlphabet[b%32]
	}
	t := Token{id: string(id), pin: sum}
	copy(t.secret[:], buf[IDLen:])
	return t, nil
}

// Parse parses a token from s after trimming leading and trailing white
// space (a token read from a file keeps its newline). It accepts only the
// canonical spelling of a version 1 token, exactly Len characters, and
// fails with an error wrapping ErrMalformed and, where one part is at
// fault, ErrVersion, ErrID, ErrSecret or ErrPin. Errors never quote s.
func Parse(s string) (Token, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Token{}, fmt.Errorf("%w: empty", ErrMalformed)
	}
	parts := strings.Split(s, separator)
	want := 4
	if parts[0] == Version2 {
		want = 5
	}
	if len(parts) != want {
		return Token{}, fmt.Errorf("%w: want %d parts separated by %q, got %d", ErrMalformed, want, separator, len(parts))
	}
	if parts[0] != Version && parts[0] != Version2 {
		return Token{}, fmt.Errorf("%w: %w: want %q or %q", ErrMalformed, ErrVersion, Version, Version2)
	}
	if !validID(parts[1]) {
		return Token{}, fmt.Errorf("%w: %w: want %d characters of a-z and 2-7", ErrMalformed, ErrID, IDLen)
	}
	t := Token{id: parts[1]}
	if !decodeFixed(t.secret[:], parts[2]) {
		return Token{}, fmt.Errorf("%w: %w: want %d bytes of unpadded base64url", ErrMalformed, ErrSecret, SecretSize)
	}
	if !decodeFixed(t.pin[:], parts[3]) {
		return Token{}, fmt.Errorf("%w: %w: want a %d-byte SHA-256 in unpadded base64url", ErrMalformed, ErrPin, sha256.Size)
	}
	if want == 5 {
		if !decodeFixed(t.pin2[:], parts[4]) || t.pin2 == t.pin {
			return Token{}, fmt.Errorf("%w: %w: want a second, different %d-byte SHA-256 in unpadded base64url", ErrMalformed, ErrPin, sha256.Size)
		}
		t.hasPin2 = true
	}
	return t, nil
}

// String returns the token in its wire form, Len characters, secret
// included; the zero Token gives "". Treat the result as a credential.
func (t Token) String() string {
	if t.IsZero() {
		return ""
	}
	var sb strings.Builder
	sb.Grow(Len2)
	sb.WriteString(t.version())
	sb.WriteString(separator)
	sb.WriteString(t.id)
	sb.WriteString(separator)
	sb.WriteString(b64.EncodeToString(t.secret[:]))
	sb.WriteString(separator)
	sb.WriteString(b64.EncodeToString(t.pin[:]))
	if t.hasPin2 {
		sb.WriteString(separator)
		sb.WriteString(b64.EncodeToString(t.pin2[:]))
	}
	return sb.String()
}

// version is t's version prefix: Version2 with a second pin.
func (t Token) version() string {
	if t.hasPin2 {
		return Version2
	}
	return Version
}

// Redacted returns the token with its secret and pin left out,
// "bct1.<id>.…", fit for logs and error messages.
func (t Token) Redacted() string {
	if t.IsZero() {
		return ""
	}
	return t.version() + separator + t.id + separator + "…"
}

// GoString returns Redacted, so that %#v does not print the secret.
func (t Token) GoString() string { return t.Redacted() }

// LogValue implements slog.LogValuer: a Token logs as its Redacted form.
func (t Token) LogValue() slog.Value { return slog.StringValue(t.Redacted()) }

// IsZero reports whether t is the zero Token.
func (t Token) IsZero() bool { return t.id == "" }

// ID returns the token id: IDLen characters of a-z and 2-7, public, the key
// of the token's row in the store.
func (t Token) ID() string { return t.id }

// Pin returns the pin the token carries, in the "sha256/<base64>" form of
// Pin and ParsePin.
func (t Token) Pin() string { return formatPin(t.pin) }

// Pins returns every pin the token carries: Pin, then the second pin of a
// version 2 token.
func (t Token) Pins() []string {
	if t.hasPin2 {
		return []string{formatPin(t.pin), formatPin(t.pin2)}
	}
	return []string{formatPin(t.pin)}
}

// SecretHash returns the SHA-256 of the token's 32 raw secret bytes (not of
// their text encoding): 32 bytes, what the store keeps instead of the
// secret. A plain hash is enough because the secret is 256 random bits; it
// is not a password.
func (t Token) SecretHash() []byte {
	sum := sha256.Sum256(t.secret[:])
	return sum[:]
}

// MatchSecretHash reports, in constant time, whether hash is the
// SecretHash of t: the check the control plane makes against the stored
// hash of the row named by ID.
func (t Token) MatchSecretHash(hash []byte) bool {
	return !t.IsZero() && subtle.ConstantTimeCompare(t.SecretHash(), hash) == 1
}

// validID reports whether s is IDLen characters of idAlphabet.
func validID(s string) bool {
	if len(s) != IDLen {
		return false
	}
	for i := range len(s) {
		if !strings.ContainsRune(idAlphabet, rune(s[i])) {
			return false
		}
	}
	return true
}

// decodeFixed decodes s, unpadded base64url, into dst and reports whether s
// is the one canonical spelling of exactly len(dst) bytes.
func decodeFixed(dst []byte, s string) bool {
	if len(s) != b64.EncodedLen(len(dst)) {
		return false
	}
	buf := make([]byte, b64.DecodedLen(len(s)))
	n, err := b64.Decode(buf, []byte(s))
	if err != nil || n != len(dst) {
		return false
	}
	// The decoder skips '\r' and '\n'; re-encoding refuses any such second
	// spelling.
	if b64.EncodeToString(buf[:n]) != s {
		return false
	}
	copy(dst, buf[:n])
	return true
}
