package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net/url"
	"time"
)

// DefaultCAValidity is how long a CA certificate is valid unless
// InitOptions.Validity says otherwise: ten years of 365 days.
const DefaultCAValidity = 10 * 365 * 24 * time.Hour

// caBackdate moves a CA's NotBefore into the past so that hosts whose
// clocks run somewhat behind still accept it.
const caBackdate = time.Hour

// CA is one certificate authority of a Bundle: an ECDSA P-256 key and its
// self-signed certificate.
type CA struct {
	// Cert is the CA's self-signed certificate.
	Cert *x509.Certificate
	// Key is the CA's private key; its public half is Cert's.
	Key *ecdsa.PrivateKey
}

// caKind names a CA's role in its certificate's subject.
type caKind string

const (
	kindNode     caKind = "node"
	kindGateway  caKind = "gateway serving"
	kindInternal caKind = "internal"
)

// newCA makes a CA for td valid from now−caBackdate to now+validity, with
// path length zero: it signs end-entity certificates only.
func newCA(kind caKind, td string, now time.Time, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("new %s CA: generate key: %w", kind, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("new %s CA: %w", kind, err)
	}
	now = now.UTC().Truncate(time.Second)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization: []string{"Better Compute"},
			CommonName:   fmt.Sprintf("%s %s CA", td, kind),
		},
		// The trust domain's own SPIFFE ID, as SPIFFE X.509-SVID §5.1
		// allows for signing certificates.
		URIs:                  []*url.URL{{Scheme: "spiffe", Host: td}},
		NotBefore:             now.Add(-caBackdate),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("new %s CA: create certificate: %w", kind, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("new %s CA: parse certificate: %w", kind, err)
	}
	return &CA{Cert: cert, Key: key}, nil
}

// validate checks that ca is complete, a CA certificate, and that its key
// is a P-256 key matching the certificate. Errors wrap ErrBundleInvalid.
func (ca *CA) validate(kind caKind) error {
	switch {
	case ca == nil || ca.Cert == nil || ca.Key == nil:
		return fmt.Errorf("%w: %s CA missing", ErrBundleInvalid, kind)
	case !ca.Cert.IsCA || !ca.Cert.BasicConstraintsValid:
		return fmt.Errorf("%w: %s CA certificate is not a CA", ErrBundleInvalid, kind)
	case ca.Key.Curve != elliptic.P256():
		return fmt.Errorf("%w: %s CA key is not P-256", ErrBundleInvalid, kind)
	case !ca.Key.PublicKey.Equal(ca.Cert.PublicKey):
		return fmt.Errorf("%w: %s CA key does not match its certificate", ErrBundleInvalid, kind)
	}
	return nil
}

// lifetime returns the validity window of a certificate asked for at now
// with ttl, backdated by backdate, truncated to whole seconds (X.509 times
// carry no fraction) and clamped to end with ca's certificate. It fails with
// ErrCAExpired when nothing of the window is left.
func (ca *CA) lifetime(now time.Time, backdate, ttl time.Duration) (notBefore, notAfter time.Time, err error) {
	now = now.UTC().Truncate(time.Second)
	notBefore, notAfter = now.Add(-backdate), now.Add(ttl)
	if caEnd := ca.Cert.NotAfter; notAfter.After(caEnd) {
		notAfter = caEnd
	}
	if !notAfter.After(now) {
		return time.Time{}, time.Time{}, fmt.Errorf("%w: valid until %s", ErrCAExpired, ca.Cert.NotAfter.Format(time.RFC3339))
	}
	return notBefore, notAfter, nil
}
