package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"aead.dev/minisign"
)

// PinStatementType is the type every pin statement carries, so that a
// signed release manifest is never read as a pin statement nor a pin
// statement as a manifest (a manifest has no type field and a statement
// has no version or artifacts).
const PinStatementType = "better-compute.release-pin/v1"

// Actions of a pin statement.
const (
	// PinAdd adds the pin to the machine's pin file.
	PinAdd = "add"
	// PinRemove removes the pin from the machine's pin file.
	PinRemove = "remove"
)

// MaxPinStatementSize bounds a pin statement document (bytes); a larger
// one is refused unread.
const MaxPinStatementSize = 4 << 10

// ErrPinStatement: a pin statement is malformed (too large, not JSON, an
// unknown type or action, an invalid pin).
var ErrPinStatement = errors.New("invalid release pin statement")

// PinStatement says, signed by a release key that machines already pin, to
// add or remove one pin: how a new release key reaches machines installed
// before it (TUF's root rotation: the new key is vouched for by the old).
type PinStatement struct {
	// Type is PinStatementType.
	Type string `json:"type"`
	// Action is PinAdd or PinRemove.
	Action string `json:"action"`
	// Pin is the pin added or removed (sha256/<base64>, ParsePin).
	Pin string `json:"pin"`
	// CreatedAt is when it was signed (UTC, seconds); a machine applies
	// statements about one pin in this order.
	CreatedAt time.Time `json:"created_at"`
}

// Validate checks the type, action and pin; errors wrap ErrPinStatement.
func (s *PinStatement) Validate() error {
	switch {
	case s.Type != PinStatementType:
		return fmt.Errorf("%w: type %q, want %q", ErrPinStatement, s.Type, PinStatementType)
	case s.Action != PinAdd && s.Action != PinRemove:
		return fmt.Errorf("%w: action %q, want %q or %q", ErrPinStatement, s.Action, PinAdd, PinRemove)
	case s.CreatedAt.IsZero():
		return fmt.Errorf("%w: no created_at", ErrPinStatement)
	}
	if _, err := ParsePin(s.Pin); err != nil {
		return fmt.Errorf("%w: %v", ErrPinStatement, err)
	}
	return nil
}

// ParsePinStatement reads a pin statement: at most MaxPinStatementSize
// bytes of JSON with no unknown field and no trailing data, valid by
// Validate. Errors wrap ErrPinStatement.
func ParsePinStatement(b []byte) (*PinStatement, error) {
	if len(b) > MaxPinStatementSize {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrPinStatement, len(b), MaxPinStatementSize)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var s PinStatement
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPinStatement, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: data after the statement", ErrPinStatement)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// SignPinStatement writes the statement to add (PinAdd) or remove
// (PinRemove) pin, made at now, and signs it with sk (minisign, as Sign
// does: the untrusted comment carries the public key). It returns the
// statement document and its .minisig. Errors wrap ErrPinStatement for an
// invalid action or pin.
func SignPinStatement(action, pin string, sk minisign.PrivateKey, now time.Time) (statement, sig []byte, err error) {
	s := &PinStatement{Type: PinStatementType, Action: action, Pin: pin, CreatedAt: now.UTC().Truncate(time.Second)}
	if err := s.Validate(); err != nil {
		return nil, nil, err
	}
	pk, ok := sk.Public().(minisign.PublicKey)
	if !ok {
		return nil, nil, errors.New("release key has no minisign public key")
	}
	statement, err = json.Marshal(s)
	if err != nil {
		return nil, nil, fmt.Errorf("encode pin statement: %w", err)
	}
	statement = append(statement, '\n')
	r := minisign.NewReader(bytes.NewReader(statement))
	if _, err := io.Copy(io.Discard, r); err != nil {
		return nil, nil, fmt.Errorf("hash pin statement: %w", err)
	}
	trusted := fmt.Sprintf("timestamp:%d\tfile:pin-statement.json\taction:%s\tpin:%s\thashed", now.Unix(), action, pin)
	return statement, append(r.SignWithComments(sk, trusted, UntrustedComment(pk)), '\n'), nil
}

// VerifyPinStatement checks a pin statement and its signature against the
// machine's pins and returns it: the signing key must be one pins names
// (never a key the statement itself introduces), the signature must verify
// and the statement must parse. Errors wrap ErrNoPins, ErrUnpinnedKey,
// ErrBadSignature or ErrPinStatement.
func VerifyPinStatement(statement, sig []byte, pins []string) (*PinStatement, error) {
	if len(statement) > MaxPinStatementSize {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrPinStatement, len(statement), MaxPinStatementSize)
	}
	if err := verifyPinned(statement, sig, pins); err != nil {
		return nil, fmt.Errorf("verify pin statement: %w", err)
	}
	return ParsePinStatement(statement)
}

// PublicKeyOf returns the public key of a release private key; an error
// when it has none.
func PublicKeyOf(sk minisign.PrivateKey) (minisign.PublicKey, error) {
	pk, ok := sk.Public().(minisign.PublicKey)
	if !ok {
		return minisign.PublicKey{}, errors.New("release key has no minisign public key")
	}
	return pk, nil
}
