package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"net/url"
	"testing"
	"time"
)

func TestIssueNode(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "compute.example.com")
	keys := map[string]crypto.Signer{"P-256": newP256(t), "Ed25519": newEd25519(t)}
	for name, key := range keys {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			issued, err := b.IssueNode(newCSR(t, key, nil), "gpu-node-01", IssueOptions{Now: testNow.Add(500 * time.Millisecond)})
			if err != nil {
				t.Fatal(err)
			}
			cert, err := x509.ParseCertificate(issued.CertDER)
			if err != nil {
				t.Fatal(err)
			}
			if err := cert.CheckSignatureFrom(b.NodeCA.Cert); err != nil {
				t.Fatalf("not signed by the node CA: %v", err)
			}
			if !cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(key.Public()) {
				t.Fatal("certificate key is not the CSR's")
			}
			checkNodeCert(t, cert, "gpu-node-01", "spiffe://compute.example.com/node/gpu-node-01")
			if issued.SPIFFEID != "spiffe://compute.example.com/node/gpu-node-01" {
				t.Fatalf("SPIFFEID = %q", issued.SPIFFEID)
			}
			if issued.Serial != FormatSerial(cert.SerialNumber) || len(issued.Serial) != 32 {
				t.Fatalf("Serial = %q, certificate serial %x", issued.Serial, cert.SerialNumber)
			}
			if cert.SerialNumber.BitLen() > serialBits || cert.SerialNumber.Sign() <= 0 {
				t.Fatalf("serial %x is not a positive 128-bit number", cert.SerialNumber)
			}
			wantBefore, wantAfter := testNow.Add(-NodeBackdate), testNow.Add(DefaultNodeTTL)
			if !issued.NotBefore.Equal(wantBefore) || !cert.NotBefore.Equal(wantBefore) {
				t.Fatalf("NotBefore = %s (cert %s), want %s", issued.NotBefore, cert.NotBefore, wantBefore)
			}
			if !issued.NotAfter.Equal(wantAfter) || !cert.NotAfter.Equal(wantAfter) {
				t.Fatalf("NotAfter = %s (cert %s), want %s", issued.NotAfter, cert.NotAfter, wantAfter)
			}
			// Counted from the time of issue, not the backdated NotBefore,
			// and jittered over [2/3, 5/6] of the life.
			life := wantAfter.Sub(testNow)
			if lo, hi := testNow.Add(life*2/3), testNow.Add(life*5/6); issued.RenewAfter.Before(lo) || !issued.RenewAfter.Before(hi) {
				t.Fatalf("RenewAfter = %s, want in [%s, %s)", issued.RenewAfter, lo, hi)
			}
		})
	}
}

// checkNodeCert checks the fields every node certificate has.
func checkNodeCert(t *testing.T, cert *x509.Certificate, nodeID, spiffeID string) {
	t.Helper()
	if cert.Subject.CommonName != nodeID || len(cert.Subject.Organization) != 0 {
		t.Errorf("subject = %q, want CN=%s only", cert.Subject, nodeID)
	}
	if len(cert.URIs) != 1 || cert.URIs[0].String() != spiffeID {
		t.Errorf("URIs = %v, want [%s]", cert.URIs, spiffeID)
	}
	if len(cert.DNSNames)+len(cert.IPAddresses)+len(cert.EmailAddresses) != 0 {
		t.Errorf("certificate has other SANs: %v %v %v", cert.DNSNames, cert.IPAddresses, cert.EmailAddresses)
	}
	if len(cert.ExtKeyUsage) != 1 || cert.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth || len(cert.UnknownExtKeyUsage) != 0 {
		t.Errorf("ExtKeyUsage = %v, want client auth only", cert.ExtKeyUsage)
	}
	if cert.KeyUsage != x509.KeyUsageDigitalSignature {
		t.Errorf("KeyUsage = %b, want digital signature only", cert.KeyUsage)
	}
	if cert.IsCA || !cert.BasicConstraintsValid {
		t.Errorf("IsCA = %v, BasicConstraintsValid = %v", cert.IsCA, cert.BasicConstraintsValid)
	}
}

func TestIssueNodeIgnoresRequestedNames(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "compute.example.com")
	evil, err := url.Parse("spiffe://evil/node/x")
	if err != nil {
		t.Fatal(err)
	}
	csr := newCSR(t, newP256(t), &x509.CertificateRequest{
		Subject:        pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		URIs:           []*url.URL{evil},
		DNSNames:       []string{"gw.example.com", "*.example.com"},
		IPAddresses:    []net.IP{net.ParseIP("10.0.0.1")},
		EmailAddresses: []string{"root@example.com"},
	})
	issued, err := b.IssueNode(csr, "node-7", IssueOptions{Now: testNow})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(issued.CertDER)
	if err != nil {
		t.Fatal(err)
	}
	checkNodeCert(t, cert, "node-7", "spiffe://compute.example.com/node/node-7")
	nodeID, _, err := b.VerifyNode([]*x509.Certificate{cert}, testNow)
	if err != nil || nodeID != "node-7" {
		t.Fatalf("VerifyNode = %q, %v; want node-7", nodeID, err)
	}
}

func TestIssueNodeRefusesKeys(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "td")
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for name, key := range map[string]crypto.Signer{"RSA": rsaKey, "P-384": p384} {
		if _, err := b.IssueNode(newCSR(t, key, nil), "node-1", IssueOptions{Now: testNow}); !errors.Is(err, ErrKeyType) {
			t.Errorf("%s CSR: error = %v, want ErrKeyType", name, err)
		}
	}
}

func TestIssueNodeRefusesBadCSR(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "td")
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: "aaaaaaaa"}}
	tests := map[string][]byte{
		"empty":         nil,
		"garbage":       []byte("-----BEGIN CERTIFICATE REQUEST-----"),
		"PEM not DER":   []byte("-----BEGIN CERTIFICATE REQUEST-----\nMIIB\n-----END CERTIFICATE REQUEST-----\n"),
		"a certificate": b.NodeCA.Cert.Raw,
	}
	// A CSR whose signed content was changed after signing: the subject
	// differs, so the signature no longer verifies.
	for name, key := range map[string]crypto.Signer{"P-256": newP256(t), "Ed25519": newEd25519(t)} {
		der := newCSR(t, key, tmpl)
		if bytes.Count(der, []byte("aaaaaaaa")) != 1 {
			t.Fatal("subject not found in the CSR")
		}
		tests["bad signature "+name] = bytes.Replace(der, []byte("aaaaaaaa"), []byte("bbbbbbbb"), 1)
		tests["truncated "+name] = der[:len(der)-1]
	}
	for name, der := range tests {
		if _, err := b.IssueNode(der, "node-1", IssueOptions{Now: testNow}); !errors.Is(err, ErrCSRInvalid) {
			t.Errorf("%s: error = %v, want ErrCSRInvalid", name, err)
		}
	}
}

func TestIssueNodeOptions(t *testing.T) {
	t.Parallel()
	b, err := Init(InitOptions{TrustDomain: "td", Now: testNow, Validity: 48 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	csr := newCSR(t, newP256(t), nil)

	issued, err := b.IssueNode(csr, "n", IssueOptions{Now: testNow, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if want := testNow.Add(time.Hour); !issued.NotAfter.Equal(want) {
		t.Errorf("TTL 1h: NotAfter = %s, want %s", issued.NotAfter, want)
	}
	if issued.CutShort {
		t.Errorf("TTL 1h: CutShort for a certificate of its full life")
	}
	if lo, hi := testNow.Add(40*time.Minute), testNow.Add(50*time.Minute); issued.RenewAfter.Before(lo) || !issued.RenewAfter.Before(hi) {
		t.Errorf("TTL 1h: RenewAfter = %s, want in [%s, %s)", issued.RenewAfter, lo, hi)
	}
	pub, err := x509.ParseCertificate(issued.CertDER)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := KeySHA256(pub.PublicKey); err != nil || h != issued.KeySHA256 || len(h) != 64 {
		t.Errorf("KeySHA256 = %q, certificate key hashes to %q (%v)", issued.KeySHA256, h, err)
	}

	// A TTL past the CA's end is cut to it.
	late := testNow.Add(40 * time.Hour)
	issued, err = b.IssueNode(csr, "n", IssueOptions{Now: late})
	if err != nil {
		t.Fatal(err)
	}
	if !issued.NotAfter.Equal(b.NodeCA.Cert.NotAfter) {
		t.Errorf("NotAfter = %s, want the CA's %s", issued.NotAfter, b.NodeCA.Cert.NotAfter)
	}
	if !issued.CutShort {
		t.Errorf("a certificate cut to the CA's end does not say CutShort")
	}
	if !issued.RenewAfter.Before(issued.NotAfter) || !issued.RenewAfter.After(late) {
		t.Errorf("RenewAfter = %s, not within the shortened life", issued.RenewAfter)
	}

	if _, err := b.IssueNode(csr, "n", IssueOptions{Now: testNow.Add(49 * time.Hour)}); !errors.Is(err, ErrCAExpired) {
		t.Errorf("after the CA expired: error = %v, want ErrCAExpired", err)
	}
	if _, err := b.IssueNode(csr, "n", IssueOptions{Now: testNow, TTL: -time.Second}); !errors.Is(err, ErrTTL) {
		t.Errorf("negative TTL: error = %v, want ErrTTL", err)
	}
	issued, err = b.IssueNode(csr, "n", IssueOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(issued.NotAfter); d > DefaultNodeTTL || d < DefaultNodeTTL-time.Minute {
		t.Errorf("zero options: NotAfter %s is not 24 h from now", issued.NotAfter)
	}

	seen := map[string]bool{}
	for range 20 {
		issued, err := b.IssueNode(csr, "n", IssueOptions{Now: testNow})
		if err != nil {
			t.Fatal(err)
		}
		if seen[issued.Serial] {
			t.Fatalf("serial %s issued twice", issued.Serial)
		}
		seen[issued.Serial] = true
	}
}

func TestIssueNodeRefusesNodeIDs(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "td")
	csr := newCSR(t, newP256(t), nil)
	for _, id := range []string{"", "-a", "_a", "Node", "a.b", "a/b", "a b", "é", "a\n", string(make([]byte, 64))} {
		if _, err := b.IssueNode(csr, id, IssueOptions{Now: testNow}); !errors.Is(err, ErrNodeID) {
			t.Errorf("node id %q: error = %v, want ErrNodeID", id, err)
		}
	}
	for _, id := range []string{"a", "0", "gpu-01_b", "a" + string(bytes.Repeat([]byte("z"), 62))} {
		if _, err := b.IssueNode(csr, id, IssueOptions{Now: testNow}); err != nil {
			t.Errorf("node id %q: %v", id, err)
		}
	}
}

// TestRenewAfterAt checks the renewal rule at its ends and its spread: the
// 10,000 renewals of nodes joined in one second fall over a sixth of the
// life, none in the last sixth.
func TestRenewAfterAt(t *testing.T) {
	issued := testNow
	notAfter := issued.Add(24 * time.Hour)
	if got := RenewAfterAt(issued, notAfter, 0); !got.Equal(issued.Add(16 * time.Hour)) {
		t.Errorf("u=0: %s, want 16 h after issue", got)
	}
	if got := RenewAfterAt(issued, notAfter, 0.999999); !got.Before(issued.Add(20*time.Hour)) || got.Before(issued.Add(19*time.Hour)) {
		t.Errorf("u→1: %s, want just under 20 h after issue", got)
	}
	if got := RenewAfterAt(issued, issued, 0.5); !got.Equal(issued) {
		t.Errorf("empty life: %s, want the expiry", got)
	}
	perMinute := map[int64]int{}
	for i := range 10000 {
		ra := RenewAfterAt(issued, notAfter, float64(i)/10000)
		perMinute[ra.Unix()/60]++
	}
	busiest := 0
	for _, n := range perMinute {
		busiest = max(busiest, n)
	}
	// 10,000 over 240 minutes: about 42 a minute.
	if busiest > 60 {
		t.Errorf("busiest minute has %d of 10,000 renewals", busiest)
	}
}
