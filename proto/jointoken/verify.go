package jointoken

import (
	"crypto/x509"
	"fmt"
	"time"
)

// VerifyChain decides whether a daemon that holds only a pin may trust the
// TLS certificate chain a gateway presented. chain is the peer's chain as
// sent, leaf first (tls.ConnectionState.PeerCertificates). Every certificate
// in chain whose public key matches pin becomes a trust anchor; the leaf
// must then verify up to one of them through the other certificates of the
// chain, for serverName (a DNS name or an IP address), at time now, for
// server authentication (RFC 5280 path validation as crypto/x509 does it).
// The pinned certificate may be the leaf itself.
//
// It fails with ErrPin for a malformed pin, ErrPinMismatch when no
// certificate matches, and ErrChainUntrusted (wrapping the x509 error) when
// the leaf does not verify. A daemon joining through a gateway uses it as
//
//	tls.Config{
//		InsecureSkipVerify: true, // replaced by the pin check below
//		VerifyConnection: func(cs tls.ConnectionState) error {
//			return jointoken.VerifyChain(tok.Pin(), cs.PeerCertificates, cs.ServerName, time.Now())
//		},
//	}
func VerifyChain(pin string, chain []*x509.Certificate, serverName string, now time.Time) error {
	want, err := parsePin(pin)
	if err != nil {
		return fmt.Errorf("verify pinned chain: %w", err)
	}
	if len(chain) == 0 || chain[0] == nil {
		return fmt.Errorf("verify pinned chain: %w: no certificates", ErrPinMismatch)
	}
	roots := x509.NewCertPool()
	intermediates := x509.NewCertPool()
	found := false
	for _, c := range chain {
		switch {
		case c == nil:
		case matchCert(want, c):
			roots.AddCert(c)
			found = true
		default:
			intermediates.AddCert(c)
		}
	}
	if !found {
		return fmt.Errorf("verify pinned chain: %w", ErrPinMismatch)
	}
	_, err = chain[0].Verify(x509.VerifyOptions{
		DNSName:       serverName,
		Roots:         roots,
		Intermediates: intermediates,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("verify pinned chain: %w: %w", ErrChainUntrusted, err)
	}
	return nil
}
