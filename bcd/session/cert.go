package session

import (
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"time"
)

// newCSR returns a DER PKCS #10 request for key. Its subject is a
// placeholder: the control plane chooses the node's names.
func newCSR(key crypto.Signer) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "bcd"},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("create certificate request: %w", err)
	}
	return der, nil
}

// parseDERs parses DER certificates; what names them in errors.
func parseDERs(what string, ders [][]byte) ([]*x509.Certificate, error) {
	out := make([]*x509.Certificate, 0, len(ders))
	for i, der := range ders {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("%w: %s %d: %w", ErrProtocol, what, i, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// matchKey checks that leaf certifies key's public key.
func matchKey(leaf *x509.Certificate, key crypto.Signer) error {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	pub, ok := key.Public().(equaler)
	if !ok || !pub.Equal(leaf.PublicKey) {
		return errors.New("certificate does not match the node key")
	}
	return nil
}

// checkIssued checks a chain a gateway issued for key: not empty, the
// leaf certifies key, and, when roots are given, the chain verifies to
// them for client authentication at now.
func checkIssued(chain, roots []*x509.Certificate, key crypto.Signer, now time.Time) error {
	if len(chain) == 0 {
		return fmt.Errorf("%w: empty certificate chain", ErrProtocol)
	}
	if err := matchKey(chain[0], key); err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	if len(roots) == 0 {
		return nil
	}
	rp, ip := x509.NewCertPool(), x509.NewCertPool()
	for _, r := range roots {
		rp.AddCert(r)
	}
	for _, c := range chain[1:] {
		ip.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{
		Roots:         rp,
		Intermediates: ip,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return fmt.Errorf("%w: issued certificate does not verify against the node CA roots: %w", ErrProtocol, err)
	}
	return nil
}

// tlsCertificate builds the client certificate TLS presents.
func tlsCertificate(chain []*x509.Certificate, key crypto.Signer) *tls.Certificate {
	c := &tls.Certificate{PrivateKey: key, Leaf: chain[0]}
	for _, x := range chain {
		c.Certificate = append(c.Certificate, x.Raw)
	}
	return c
}

// expiredError is the error for a leaf that expired at notAfter.
func expiredError(notAfter time.Time) error {
	return fmt.Errorf("%w at %s: join this node again with a new join token (bcd join)",
		ErrCertificateExpired, notAfter.UTC().Format(time.RFC3339))
}
