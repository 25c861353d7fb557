package jointoken

import (
	"crypto/x509"
	"errors"
	"testing"
	"time"
)

func TestVerifyChain(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	ca := newTestCA(t, now)
	other := newTestCA(t, now)
	leaf := newTestLeaf(t, &ca, "gw.example.com", now, time.Hour)
	selfSigned := newTestLeaf(t, nil, "gw.example.com", now, time.Hour)
	pin := Pin(ca.cert)

	tests := []struct {
		name   string
		pin    string
		chain  []*x509.Certificate
		server string
		at     time.Time
		want   error
	}{
		{"leaf and pinned ca", pin, []*x509.Certificate{leaf.cert, ca.cert}, "gw.example.com", now, nil},
		{"pinned leaf itself", Pin(selfSigned.cert), []*x509.Certificate{selfSigned.cert}, "gw.example.com", now, nil},
		{"ca not sent", pin, []*x509.Certificate{leaf.cert}, "gw.example.com", now, ErrPinMismatch},
		{"other ca pinned", Pin(other.cert), []*x509.Certificate{leaf.cert, ca.cert}, "gw.example.com", now, ErrPinMismatch},
		// The attack MatchPin alone would let through: the real CA
		// certificate is public, so a man in the middle can send it beside
		// a leaf of its own.
		{"public ca beside foreign leaf", pin, []*x509.Certificate{selfSigned.cert, ca.cert}, "gw.example.com", now, ErrChainUntrusted},
		{"wrong server name", pin, []*x509.Certificate{leaf.cert, ca.cert}, "evil.example.com", now, ErrChainUntrusted},
		{"expired leaf", pin, []*x509.Certificate{leaf.cert, ca.cert}, "gw.example.com", now.Add(2 * time.Hour), ErrChainUntrusted},
		{"empty chain", pin, nil, "gw.example.com", now, ErrPinMismatch},
		{"nil leaf", pin, []*x509.Certificate{nil, ca.cert}, "gw.example.com", now, ErrPinMismatch},
		{"malformed pin", "sha256/", []*x509.Certificate{leaf.cert, ca.cert}, "gw.example.com", now, ErrPin},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := VerifyChain(tc.pin, tc.chain, tc.server, tc.at)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("VerifyChain: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("VerifyChain error = %v, want %v", err, tc.want)
			}
		})
	}
}
