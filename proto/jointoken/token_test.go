package jointoken

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// testPin is a fixed, well-formed pin: the SHA-256 of the empty string.
var testPin = func() string {
	sum := sha256.Sum256(nil)
	return formatPin(sum)
}()

func TestNewParseRoundTrip(t *testing.T) {
	t.Parallel()
	pin := Pin(newTestCA(t, time.Now()).cert)
	tok, err := New(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := tok.String()
	if len(s) != Len {
		t.Fatalf("len(String()) = %d, want %d: %q", len(s), Len, s)
	}
	if strings.ContainsAny(s, " \t\r\n'\"$`\\") {
		t.Fatalf("token %q holds a character unsafe for files or env vars", s)
	}
	if !validID(tok.ID()) {
		t.Fatalf("ID() = %q, want %d characters of a-z2-7", tok.ID(), IDLen)
	}
	if tok.Pin() != pin {
		t.Fatalf("Pin() = %q, want %q", tok.Pin(), pin)
	}
	for _, in := range []string{s, s + "\n", "  " + s + "\r\n", "\t" + s} {
		got, err := Parse(in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", in, err)
		}
		if got != tok {
			t.Fatalf("Parse(%q) = %#v, want the token made", in, got)
		}
		if got.String() != s {
			t.Fatalf("re-serialised %q, want %q", got.String(), s)
		}
	}

	hash := tok.SecretHash()
	if len(hash) != sha256.Size {
		t.Fatalf("len(SecretHash()) = %d, want %d", len(hash), sha256.Size)
	}
	if !tok.MatchSecretHash(hash) {
		t.Fatal("MatchSecretHash(own hash) = false")
	}
	other, err := New(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	if other.ID() == tok.ID() || bytes.Equal(other.SecretHash(), hash) {
		t.Fatal("two tokens share an id or a secret")
	}
	if other.MatchSecretHash(hash) || tok.MatchSecretHash(nil) || (Token{}).MatchSecretHash(hash) {
		t.Fatal("MatchSecretHash accepted a hash that is not the token's")
	}
}

// TestNewGolden pins the wire format: the same random bytes must always give
// the same token. The expected value was computed independently (Python
// base64/hashlib): id bytes i*7 mod 32 into a-z2-7, secret bytes 12..43.
func TestNewGolden(t *testing.T) {
	t.Parallel()
	random := make([]byte, IDLen+SecretSize)
	for i := range random {
		random[i] = byte(i * 7)
	}
	tok, err := New(testPin, bytes.NewReader(random))
	if err != nil {
		t.Fatal(err)
	}
	const want = "bct1.ahov4dkry7gn.VFtiaXB3foWMk5qhqK-2vcTL0tng5-71_AMKERgfJi0." +
		"47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU" // SHA-256 of ""
	if got := tok.String(); got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	if sum := sha256.Sum256(random[IDLen:]); !bytes.Equal(tok.SecretHash(), sum[:]) {
		t.Fatal("SecretHash is not the SHA-256 of the raw secret bytes")
	}
}

func TestNewErrors(t *testing.T) {
	t.Parallel()
	if _, err := New("sha256/short", nil); !errors.Is(err, ErrPin) {
		t.Fatalf("New(bad pin) error = %v, want ErrPin", err)
	}
	short := bytes.NewReader(make([]byte, IDLen+SecretSize-1))
	if _, err := New(testPin, short); err == nil {
		t.Fatal("New with a short reader succeeded")
	}
	boom := errors.New("boom")
	if _, err := New(testPin, iotest.ErrReader(boom)); !errors.Is(err, boom) {
		t.Fatalf("New error = %v, want it to wrap the reader's error", err)
	}
}

func TestParseMalformed(t *testing.T) {
	t.Parallel()
	tok, err := New(testPin, nil)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(tok.String(), ".")
	version, id, secret, pin := parts[0], parts[1], parts[2], parts[3]
	join := func(p ...string) string { return strings.Join(p, ".") }

	tests := []struct {
		name string
		in   string
		part error // nil: only ErrMalformed
	}{
		{"empty", "", nil},
		{"white space", " \n\t", nil},
		{"three parts", join(version, id, secret), nil},
		{"five parts", join(version, id, secret, pin, "x"), nil},
		{"inner space", join(version, id, secret) + ". " + pin, ErrPin},
		{"pin text form", join(version, id, secret, testPin), ErrPin},
		{"version 3", join("bct3", id, secret, pin), ErrVersion},
		{"version 2 with one pin", join("bct2", id, secret, pin), ErrMalformed},
		{"version upper", join("BCT1", id, secret, pin), ErrVersion},
		{"no version", join("", id, secret, pin), ErrVersion},
		{"id upper", join(version, strings.ToUpper(id), secret, pin), ErrID},
		{"id digit 1", join(version, "1"+id[1:], secret, pin), ErrID},
		{"id short", join(version, id[1:], secret, pin), ErrID},
		{"id long", join(version, id+"a", secret, pin), ErrID},
		{"id empty", join(version, "", secret, pin), ErrID},
		{"secret short", join(version, id, secret[1:], pin), ErrSecret},
		{"secret padded", join(version, id, secret+"=", pin), ErrSecret},
		{"secret std alphabet", join(version, id, "+"+secret[1:], pin), ErrSecret},
		{"secret noncanonical", join(version, id, secret[:42]+nonCanonicalURL(secret[42]), pin), ErrSecret},
		{"secret newline", join(version, id, secret[:20]+"\n"+secret[21:], pin), ErrSecret},
		{"secret empty", join(version, id, "", pin), ErrSecret},
		{"pin short", join(version, id, secret, pin[1:]), ErrPin},
		{"pin noncanonical", join(version, id, secret, pin[:42]+nonCanonicalURL(pin[42])), ErrPin},
		{"pin unicode", join(version, id, secret, "é"+pin[2:]), ErrPin},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse(tc.in)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse error = %v, want ErrMalformed", err)
			}
			if tc.part != nil && !errors.Is(err, tc.part) {
				t.Fatalf("Parse error = %v, want %v", err, tc.part)
			}
			if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), secret[:20]) {
				t.Fatalf("error %q quotes the secret", err)
			}
		})
	}
}

// nonCanonicalURL is nonCanonicalLast for the base64url alphabet.
func nonCanonicalURL(c byte) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	return string(alphabet[strings.IndexByte(alphabet, c)^1])
}

func TestRedaction(t *testing.T) {
	t.Parallel()
	tok, err := New(testPin, nil)
	if err != nil {
		t.Fatal(err)
	}
	secret := strings.Split(tok.String(), ".")[2]

	var logs bytes.Buffer
	slog.New(slog.NewTextHandler(&logs, nil)).Info("Join token", "token", tok)
	for name, out := range map[string]string{
		"slog":       logs.String(),
		"%#v":        fmt.Sprintf("%#v", tok),
		"%#v struct": fmt.Sprintf("%#v", struct{ T Token }{tok}),
		"Redacted":   tok.Redacted(),
	} {
		if strings.Contains(out, secret) {
			t.Errorf("%s output %q holds the secret", name, out)
		}
		if !strings.Contains(out, tok.ID()) {
			t.Errorf("%s output %q lacks the token id", name, out)
		}
	}
	if (Token{}).String() != "" || (Token{}).Redacted() != "" || !(Token{}).IsZero() {
		t.Fatal("the zero Token does not render as empty")
	}
}

func FuzzParse(f *testing.F) {
	tok, err := New(testPin, nil)
	if err != nil {
		f.Fatal(err)
	}
	s := tok.String()
	f.Add(s)
	f.Add(s + "\n")
	f.Add(strings.ToUpper(s))
	f.Add("bct1....")
	f.Add("bct1.aaaaaaaaaaaa." + strings.Repeat("A", 43) + "." + strings.Repeat("_", 43))
	f.Add("")
	f.Fuzz(func(t *testing.T, in string) {
		tok, err := Parse(in)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse error %v does not wrap ErrMalformed", err)
			}
			if tok != (Token{}) {
				t.Fatal("Parse returned a token beside an error")
			}
			return
		}
		out := tok.String()
		if out != strings.TrimSpace(in) {
			t.Fatalf("Parse(%q).String() = %q, not the canonical input", in, out)
		}
		again, err := Parse(out)
		if err != nil || again != tok {
			t.Fatalf("re-parse of %q: %#v, %v", out, again, err)
		}
		if _, err := ParsePin(tok.Pin()); err != nil {
			t.Fatalf("parsed token carries an unparsable pin: %v", err)
		}
	})
}

func TestTokenTwoPins(t *testing.T) {
	ca1, ca2 := newTestCA(t, time.Now()), newTestCA(t, time.Now())
	tok, err := New(Pin(ca1.cert), nil)
	if err != nil {
		t.Fatal(err)
	}
	two, err := tok.WithPin(Pin(ca2.cert))
	if err != nil {
		t.Fatal(err)
	}
	s := two.String()
	if len(s) != Len2 || !strings.HasPrefix(s, Version2+".") {
		t.Fatalf("two-pin token %d characters, prefix %q", len(s), s[:5])
	}
	back, err := Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	if back != two || back.ID() != tok.ID() || !slices.Equal(back.Pins(), []string{Pin(ca1.cert), Pin(ca2.cert)}) {
		t.Fatalf("round trip: %v", back.Pins())
	}
	if !back.MatchSecretHash(tok.SecretHash()) {
		t.Fatal("second pin changed the secret")
	}
	same, err := tok.WithPin(Pin(ca1.cert))
	if err != nil || same.String() != tok.String() {
		t.Fatalf("same pin twice: %v", err)
	}
	if _, err := Parse(s[:Len]); err == nil {
		t.Fatal("a bct2 token without its second pin parsed")
	}
	if _, err := Parse(tok.String() + "." + strings.Split(s, ".")[4]); !errors.Is(err, ErrVersion) && !errors.Is(err, ErrMalformed) {
		t.Fatalf("bct1 with five parts: %v", err)
	}
}
