package jointoken

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"
)

// testCert is a certificate and its key, made for tests only.
type testCert struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// newTestCA makes a self-signed P-256 CA valid around now.
func newTestCA(t testing.TB, now time.Time) testCert {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "test gateway CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	return makeCert(t, tmpl, nil)
}

// newTestLeaf makes a server certificate for dnsName signed by parent, or
// self-signed when parent is nil, valid from now for life.
func newTestLeaf(t testing.TB, parent *testCert, dnsName string, now time.Time, life time.Duration) testCert {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: dnsName},
		DNSNames:    []string{dnsName},
		NotBefore:   now.Add(-time.Minute),
		NotAfter:    now.Add(life),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	return makeCert(t, tmpl, parent)
}

func makeCert(t testing.TB, tmpl *x509.Certificate, parent *testCert) testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = serial
	parentCert, signer := tmpl, crypto.Signer(key)
	if parent != nil {
		parentCert, signer = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parentCert, key.Public(), signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return testCert{cert: cert, key: key}
}
