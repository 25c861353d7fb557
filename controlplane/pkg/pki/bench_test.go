package pki

import (
	"crypto/x509"
	"testing"
)

// BenchmarkIssueNode measures IssueNode for a P-256 CSR (parse, signature
// check, sign) and reports issues/s on one goroutine.
func BenchmarkIssueNode(b *testing.B) {
	bundle := newTestBundle(b, "compute.example.com")
	csr := newCSR(b, newP256(b), nil)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bundle.IssueNode(csr, "node-1", IssueOptions{Now: testNow}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "issues/s")
}

// BenchmarkVerifyNode measures a gateway's NodeVerifier.Verify of one node
// certificate and reports verifies/s on one goroutine.
func BenchmarkVerifyNode(b *testing.B) {
	bundle := newTestBundle(b, "compute.example.com")
	_, cert := issueNode(b, bundle, "node-1", IssueOptions{})
	v := bundle.NodeVerifier()
	chain := []*x509.Certificate{cert}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := v.Verify(chain, testNow); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "verifies/s")
}
