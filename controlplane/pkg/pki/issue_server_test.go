package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"testing"
	"time"
)

// parseChain parses a PEM chain and checks it is the leaf then ca.
func parseChain(t *testing.T, certPEM []byte, ca *CA) *x509.Certificate {
	t.Helper()
	certs, err := ParseCertificatesPEM(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	if len(certs) != 2 || !certs[1].Equal(ca.Cert) {
		t.Fatalf("chain has %d certificates, want the leaf and its CA", len(certs))
	}
	return certs[0]
}

func TestIssueGateway(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "compute.example.com")
	certPEM, keyPEM, err := b.issueGateway(testNow, []string{"gw.example.com", "*.gw.example.com"}, []net.IP{net.ParseIP("10.1.2.3")}, 0)
	if err != nil {
		t.Fatal(err)
	}
	leaf := parseChain(t, certPEM, b.GatewayCA)
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("key does not match certificate: %v", err)
	}
	if len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth || leaf.IsCA {
		t.Fatalf("ExtKeyUsage = %v, IsCA = %v; want server auth only", leaf.ExtKeyUsage, leaf.IsCA)
	}
	if leaf.Subject.CommonName != "gw.example.com" {
		t.Fatalf("CommonName = %q", leaf.Subject.CommonName)
	}
	if got := leaf.NotAfter.Sub(testNow); got != DefaultServerTTL {
		t.Fatalf("lifetime %s, want %s", got, DefaultServerTTL)
	}
	for _, name := range []string{"gw.example.com", "eu-1.gw.example.com", "10.1.2.3"} {
		_, err := leaf.Verify(x509.VerifyOptions{
			DNSName:     name,
			Roots:       certPool([]*x509.Certificate{b.GatewayCA.Cert}),
			CurrentTime: testNow,
			KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		if err != nil {
			t.Errorf("verify for %s against the gateway CA: %v", name, err)
		}
	}
	refused := []struct {
		name, dns string
		roots     *x509.CertPool
	}{
		{"other name", "evil.example.com", certPool([]*x509.Certificate{b.GatewayCA.Cert})},
		{"node CA", "gw.example.com", certPool([]*x509.Certificate{b.NodeCA.Cert})},
	}
	for _, tc := range refused {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: tc.dns, Roots: tc.roots, CurrentTime: testNow}); err == nil {
			t.Errorf("%s: verified, want an error", tc.name)
		}
	}

	// The exported form uses the wall clock.
	if _, _, err := b.IssueGateway(nil, []net.IP{net.ParseIP("::1")}, time.Hour); err != nil {
		t.Fatalf("IssueGateway with an IP only: %v", err)
	}
}

func TestIssueGatewayRefuses(t *testing.T) {
	t.Parallel()
	b, err := Init(InitOptions{TrustDomain: "td", Now: testNow, Validity: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		dns  []string
		ips  []net.IP
		ttl  time.Duration
		at   time.Time
		want error
	}{
		{"no names", nil, nil, 0, testNow, ErrName},
		{"bad DNS name", []string{"gw_1.example.com"}, nil, 0, testNow, ErrName},
		{"upper case", []string{"GW.example.com"}, nil, 0, testNow, ErrName},
		{"bad IP", []string{"gw"}, []net.IP{{1, 2, 3}}, 0, testNow, ErrName},
		{"negative ttl", []string{"gw"}, nil, -time.Hour, testNow, ErrTTL},
		{"CA expired", []string{"gw"}, nil, 0, testNow.Add(49 * time.Hour), ErrCAExpired},
	}
	for _, tc := range tests {
		if _, _, err := b.issueGateway(tc.at, tc.dns, tc.ips, tc.ttl); !errors.Is(err, tc.want) {
			t.Errorf("%s: error = %v, want %v", tc.name, err, tc.want)
		}
	}
	// A lifetime past the CA's end is cut to it.
	certPEM, _, err := b.issueGateway(testNow, []string{"gw"}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if leaf := parseChain(t, certPEM, b.GatewayCA); !leaf.NotAfter.Equal(b.GatewayCA.Cert.NotAfter) {
		t.Fatalf("NotAfter = %s, want the CA's %s", leaf.NotAfter, b.GatewayCA.Cert.NotAfter)
	}
}

func TestIssueInternal(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "compute.example.com")
	certPEM, keyPEM, err := b.issueInternal(testNow, "api-1", []string{"api-1.internal"}, []net.IP{net.ParseIP("10.0.0.5")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf := parseChain(t, certPEM, b.InternalCA)
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("key does not match certificate: %v", err)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://compute.example.com/internal/api-1" || leaf.Subject.CommonName != "api-1" {
		t.Fatalf("URIs = %v, CN = %q", leaf.URIs, leaf.Subject.CommonName)
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		_, err := leaf.Verify(x509.VerifyOptions{
			DNSName:     "api-1.internal",
			Roots:       certPool([]*x509.Certificate{b.InternalCA.Cert}),
			CurrentTime: testNow,
			KeyUsages:   []x509.ExtKeyUsage{usage},
		})
		if err != nil {
			t.Errorf("verify for usage %v: %v", usage, err)
		}
	}
	// An internal certificate is no node identity.
	if _, _, err := b.VerifyNode([]*x509.Certificate{leaf}, testNow); !errors.Is(err, ErrUntrusted) {
		t.Errorf("VerifyNode(internal) = %v, want ErrUntrusted", err)
	}

	if _, _, err := b.IssueInternal("workers-1", nil, nil, 0); err != nil {
		t.Fatalf("client-only internal certificate: %v", err)
	}
	for _, name := range []string{"", "API", "a.b", "-x"} {
		if _, _, err := b.IssueInternal(name, nil, nil, 0); !errors.Is(err, ErrName) {
			t.Errorf("name %q: error = %v, want ErrName", name, err)
		}
	}
	if _, _, err := b.issueInternal(testNow, "api", []string{"bad name"}, nil, 0); !errors.Is(err, ErrName) {
		t.Errorf("bad DNS name: error = %v, want ErrName", err)
	}
}
