package pki

import (
	"crypto/x509"
	"net"
	"testing"
	"time"
)

// TestBackdateOneHour checks the clock rule (DESIGN.md, "Identity over
// time", Clocks): node and gateway certificates are backdated one hour, so
// a machine whose clock is 59 minutes behind the issuer's accepts a
// certificate issued this instant, and one 61 minutes behind does not; the
// renewal time is still counted from the time of issue.
func TestBackdateOneHour(t *testing.T) {
	t.Parallel()
	// The deployment was made a day before the certificates are issued, so
	// that only the leaves' backdate is under test.
	b, err := Init(InitOptions{TrustDomain: "compute.example.com", Now: testNow.Add(-24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if NodeBackdate != time.Hour || serverBackdate != time.Hour {
		t.Fatalf("backdates: node %s, server %s; want 1h", NodeBackdate, serverBackdate)
	}
	key := newP256(t)
	issued, err := b.IssueNode(newCSR(t, key, nil), "gpu-1", IssueOptions{Now: testNow, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	node, err := x509.ParseCertificate(issued.CertDER)
	if err != nil {
		t.Fatal(err)
	}
	if want := testNow.Add(-time.Hour); !node.NotBefore.Equal(want) {
		t.Errorf("node NotBefore = %s, want %s (an hour before issue)", node.NotBefore, want)
	}
	if issued.RenewAfter.Before(testNow.Add(40*time.Minute)) || !issued.RenewAfter.Before(testNow.Add(50*time.Minute)) {
		t.Errorf("RenewAfter = %s: not counted from the time of issue %s", issued.RenewAfter, testNow)
	}

	gwPEM, _, err := b.issueGateway(testNow, []string{"gw.example.com"}, []net.IP{net.ParseIP("10.0.0.1")}, 0)
	if err != nil {
		t.Fatal(err)
	}
	gw := parseChain(t, gwPEM, b.GatewayCA)
	if want := testNow.Add(-time.Hour); !gw.NotBefore.Equal(want) {
		t.Errorf("gateway NotBefore = %s, want %s (an hour before issue)", gw.NotBefore, want)
	}

	for _, tc := range []struct {
		behind time.Duration
		valid  bool
	}{{0, true}, {59 * time.Minute, true}, {61 * time.Minute, false}} {
		at := testNow.Add(-tc.behind)
		_, nerr := node.Verify(x509.VerifyOptions{
			Roots: certPool([]*x509.Certificate{b.NodeCA.Cert}), CurrentTime: at,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})
		_, gerr := gw.Verify(x509.VerifyOptions{
			DNSName: "gw.example.com", Roots: certPool([]*x509.Certificate{b.GatewayCA.Cert}), CurrentTime: at,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		if (nerr == nil) != tc.valid || (gerr == nil) != tc.valid {
			t.Errorf("clock %s behind: node certificate %v, gateway certificate %v; want valid = %v", tc.behind, nerr, gerr, tc.valid)
		}
	}
}
