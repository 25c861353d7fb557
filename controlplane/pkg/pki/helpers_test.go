package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"testing"
	"time"
)

// testNow is the fixed clock of these tests.
var testNow = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

// testSecret is a deployment secret of exactly MinSecretLen characters.
const testSecret = "0123456789abcdef0123456789abcdef"

// newTestBundle makes a bundle for td at testNow.
func newTestBundle(t testing.TB, td string) *Bundle {
	t.Helper()
	b, err := Init(InitOptions{TrustDomain: td, Now: testNow})
	if err != nil {
		t.Fatalf("Init(%q): %v", td, err)
	}
	return b
}

func newP256(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func newEd25519(t testing.TB) ed25519.PrivateKey {
	t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// newCSR returns a DER CSR for key; a nil tmpl asks for nothing.
func newCSR(t testing.TB, key crypto.Signer, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	if tmpl == nil {
		tmpl = &x509.CertificateRequest{Subject: pkix.Name{CommonName: "bcd"}}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// issueNode issues a node certificate for a fresh P-256 key at testNow and
// returns it parsed.
func issueNode(t testing.TB, b *Bundle, nodeID string, opts IssueOptions) (*Issued, *x509.Certificate) {
	t.Helper()
	if opts.Now.IsZero() {
		opts.Now = testNow
	}
	issued, err := b.IssueNode(newCSR(t, newP256(t), nil), nodeID, opts)
	if err != nil {
		t.Fatalf("IssueNode(%q): %v", nodeID, err)
	}
	cert, err := x509.ParseCertificate(issued.CertDER)
	if err != nil {
		t.Fatal(err)
	}
	return issued, cert
}

// signWithCA signs tmpl for a fresh P-256 key with ca directly, to make
// certificates IssueNode never would.
func signWithCA(t testing.TB, ca *CA, tmpl *x509.Certificate) *x509.Certificate {
	t.Helper()
	serial, err := newSerial()
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, newP256(t).Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
