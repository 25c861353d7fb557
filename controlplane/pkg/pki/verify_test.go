package pki

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net/url"
	"testing"
	"time"
)

func TestVerifyNode(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "compute.example.com")
	issued, cert := issueNode(t, b, "node-1", IssueOptions{})

	for name, chain := range map[string][]*x509.Certificate{
		"leaf":         {cert},
		"leaf and CA":  {cert, b.NodeCA.Cert},
		"extra unused": {cert, b.GatewayCA.Cert},
	} {
		nodeID, serial, err := b.VerifyNode(chain, testNow)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if nodeID != "node-1" || serial != issued.Serial {
			t.Fatalf("%s: VerifyNode = %q, %q; want node-1, %q", name, nodeID, serial, issued.Serial)
		}
	}
	// The last second of validity still counts; the next does not.
	if _, _, err := b.VerifyNode([]*x509.Certificate{cert}, issued.NotAfter); err != nil {
		t.Fatalf("at NotAfter: %v", err)
	}
	if _, _, err := b.VerifyNode([]*x509.Certificate{cert}, issued.NotAfter.Add(time.Second)); !errors.Is(err, ErrExpired) {
		t.Fatalf("expired: error = %v, want ErrExpired", err)
	}
	if _, _, err := b.VerifyNode([]*x509.Certificate{cert}, issued.NotBefore.Add(-time.Second)); !errors.Is(err, ErrExpired) {
		t.Fatalf("not yet valid: error = %v, want ErrExpired", err)
	}
}

func TestVerifyNodeRefuses(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "compute.example.com")
	other := newTestBundle(t, "compute.example.com")
	_, foreign := issueNode(t, other, "node-1", IssueOptions{})
	gatewayPEM, _, err := b.issueGateway(testNow, []string{"gw.example.com"}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	gateway, err := ParseCertificatesPEM(gatewayPEM)
	if err != nil {
		t.Fatal(err)
	}
	internalPEM, _, err := b.issueInternal(testNow, "api-1", nil, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	internal, err := ParseCertificatesPEM(internalPEM)
	if err != nil {
		t.Fatal(err)
	}

	// Certificates the node CA signed but IssueNode never would make.
	nodeTmpl := func(uris ...string) *x509.Certificate {
		tmpl := &x509.Certificate{
			Subject:     pkix.Name{CommonName: "node-1"},
			NotBefore:   testNow.Add(-time.Hour),
			NotAfter:    testNow.Add(time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		for _, s := range uris {
			u, err := url.Parse(s)
			if err != nil {
				t.Fatal(err)
			}
			tmpl.URIs = append(tmpl.URIs, u)
		}
		return tmpl
	}
	good := "spiffe://compute.example.com/node/node-1"
	serverOnly := nodeTmpl(good)
	serverOnly.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	noEKU := nodeTmpl(good)
	noEKU.ExtKeyUsage = nil

	tests := []struct {
		name  string
		chain []*x509.Certificate
		want  error
	}{
		{"another bundle's CA", []*x509.Certificate{foreign}, ErrUntrusted},
		{"another CA sent along", []*x509.Certificate{foreign, other.NodeCA.Cert}, ErrUntrusted},
		{"gateway serving cert", gateway, ErrUntrusted},
		{"internal cert", internal, ErrUntrusted},
		{"node CA itself", []*x509.Certificate{b.NodeCA.Cert}, ErrUntrusted},
		{"server auth only", []*x509.Certificate{signWithCA(t, b.NodeCA, serverOnly)}, ErrUntrusted},
		{"no extended key usage", []*x509.Certificate{signWithCA(t, b.NodeCA, noEKU)}, ErrUntrusted},
		{"no URI", []*x509.Certificate{signWithCA(t, b.NodeCA, nodeTmpl())}, ErrSPIFFEID},
		{"two URIs", []*x509.Certificate{signWithCA(t, b.NodeCA, nodeTmpl(good, "spiffe://compute.example.com/node/node-2"))}, ErrSPIFFEID},
		{"not a node path", []*x509.Certificate{signWithCA(t, b.NodeCA, nodeTmpl("spiffe://compute.example.com/gateway/gw-1"))}, ErrSPIFFEID},
		{"nested node path", []*x509.Certificate{signWithCA(t, b.NodeCA, nodeTmpl("spiffe://compute.example.com/node/a/b"))}, ErrSPIFFEID},
		{"other scheme", []*x509.Certificate{signWithCA(t, b.NodeCA, nodeTmpl("https://compute.example.com/node/node-1"))}, ErrSPIFFEID},
		{"wrong trust domain", []*x509.Certificate{signWithCA(t, b.NodeCA, nodeTmpl("spiffe://evil.example.com/node/node-1"))}, ErrWrongTrustDomain},
		{"empty chain", nil, ErrUntrusted},
		{"nil leaf", []*x509.Certificate{nil}, ErrUntrusted},
	}
	for _, tc := range tests {
		if _, _, err := b.VerifyNode(tc.chain, testNow); !errors.Is(err, tc.want) {
			t.Errorf("%s: error = %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestVerifyNodeWrongTrustDomain(t *testing.T) {
	t.Parallel()
	a := newTestBundle(t, "a.example")
	_, cert := issueNode(t, a, "node-1", IssueOptions{})
	// A verifier that trusts a's roots but serves another trust domain,
	// as a gateway configured with the wrong trust domain would.
	v, err := NewNodeVerifier(a.NodeCARoots(), "b.example")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.Verify([]*x509.Certificate{cert}, testNow); !errors.Is(err, ErrWrongTrustDomain) {
		t.Fatalf("error = %v, want ErrWrongTrustDomain", err)
	}
}

func TestNodeVerifierFromRootsOnly(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "compute.example.com")
	issued, cert := issueNode(t, b, "node-9", IssueOptions{})

	// A gateway that holds only the roots file, no CA key.
	roots, err := ParseCertificatesPEM(EncodeCertificatesPEM(b.NodeCARoots()...))
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewNodeVerifier(roots, "compute.example.com")
	if err != nil {
		t.Fatal(err)
	}
	nodeID, serial, err := v.Verify([]*x509.Certificate{cert}, testNow)
	if err != nil || nodeID != "node-9" || serial != issued.Serial {
		t.Fatalf("Verify = %q, %q, %v; want node-9, %q", nodeID, serial, err, issued.Serial)
	}

	if _, err := NewNodeVerifier(nil, "td"); !errors.Is(err, ErrUntrusted) {
		t.Errorf("no roots: error = %v, want ErrUntrusted", err)
	}
	if _, err := NewNodeVerifier(roots, "spiffe://td"); !errors.Is(err, ErrTrustDomain) {
		t.Errorf("bad trust domain: error = %v, want ErrTrustDomain", err)
	}
	if _, _, err := (&NodeVerifier{}).Verify([]*x509.Certificate{cert}, testNow); !errors.Is(err, ErrUntrusted) {
		t.Errorf("zero NodeVerifier: error = %v, want ErrUntrusted", err)
	}
	if _, err := ParseCertificatesPEM([]byte("nothing")); err == nil {
		t.Error("ParseCertificatesPEM without PEM succeeded")
	}
}
