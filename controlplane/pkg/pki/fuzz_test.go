package pki

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"testing"
)

// FuzzIssueNodeCSR feeds arbitrary bytes to IssueNode as a CSR: it must
// never panic, fail only with ErrCSRInvalid or ErrKeyType, and whatever it
// accepts must be a node certificate VerifyNode accepts.
func FuzzIssueNodeCSR(f *testing.F) {
	b := newTestBundle(f, "compute.example.com")
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		f.Fatal(err)
	}
	p256 := newCSR(f, newP256(f), nil)
	f.Add(p256)
	f.Add(newCSR(f, newEd25519(f), nil))
	f.Add(newCSR(f, rsaKey, nil))
	f.Add(p256[:len(p256)/2])
	f.Add(b.NodeCA.Cert.Raw)
	f.Add([]byte{})
	f.Add([]byte{0x30, 0x80})
	f.Fuzz(func(t *testing.T, csr []byte) {
		issued, err := b.IssueNode(csr, "node-1", IssueOptions{Now: testNow})
		if err != nil {
			if !errors.Is(err, ErrCSRInvalid) && !errors.Is(err, ErrKeyType) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		cert, err := x509.ParseCertificate(issued.CertDER)
		if err != nil {
			t.Fatalf("issued certificate does not parse: %v", err)
		}
		nodeID, serial, err := b.VerifyNode([]*x509.Certificate{cert}, testNow)
		if err != nil || nodeID != "node-1" || serial != issued.Serial {
			t.Fatalf("VerifyNode = %q, %q, %v", nodeID, serial, err)
		}
	})
}
