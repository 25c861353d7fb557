// Package sessiontest provides an in-process gateway for testing the node
// side of the session protocol (package bcd/session) and everything built
// on it, in the manner of net/http/httptest: a real gRPC server on
// 127.0.0.1 over real TLS 1.3, with CAs made in memory. It implements just
// enough of JoinService and SessionService to exercise a client and lets a
// test drive each session (send Drain, Revoked, Command; drop it; refuse
// connections with a retry hint).
//
// It is test code: it never persists anything and trusts any join token it
// was told about.
package sessiontest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/better-compute/better-compute/proto/jointoken"
)

// PKI is an in-memory set of CAs: a gateway serving CA and a node CA for
// one trust domain.
type PKI struct {
	// TrustDomain is the SPIFFE trust domain, "test.example".
	TrustDomain string
	// GatewayCA signs gateways' serving certificates; tokens pin its key.
	GatewayCA *x509.Certificate
	// NodeCA signs node certificates.
	NodeCA *x509.Certificate

	gatewayKey *ecdsa.PrivateKey
	nodeKey    *ecdsa.PrivateKey
}

// NewPKI makes a PKI with fresh P-256 keys, failing t on error.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	p := &PKI{TrustDomain: "test.example"}
	p.GatewayCA, p.gatewayKey = newCA(t, "test gateway CA")
	p.NodeCA, p.nodeKey = newCA(t, "test node CA")
	return p
}

// Pin returns the pin of the gateway serving CA, "sha256/...".
func (p *PKI) Pin() string { return jointoken.Pin(p.GatewayCA) }

// NodeCAPool returns a pool holding the node CA.
func (p *PKI) NodeCAPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.NodeCA)
	return pool
}

// GatewayCAPool returns a pool holding the gateway serving CA.
func (p *PKI) GatewayCAPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.GatewayCA)
	return pool
}

// NewToken returns a fresh join token pinning this PKI's gateway CA.
func (p *PKI) NewToken(t testing.TB) string {
	t.Helper()
	tok, err := jointoken.New(p.Pin(), nil)
	if err != nil {
		t.Fatalf("new join token: %v", err)
	}
	return tok.String()
}

// ServerCertificate issues a serving certificate for 127.0.0.1 and
// "localhost", valid from a day ago (as for a gateway serving for a while,
// so that a node whose injected clock runs hours behind still accepts it)
// for two days; its chain holds the leaf and the gateway CA, as a real
// gateway sends it.
func (p *PKI) ServerCertificate(t testing.TB) tls.Certificate {
	t.Helper()
	key := NewKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-caAge),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.GatewayCA, &key.PublicKey, p.gatewayKey)
	if err != nil {
		t.Fatalf("issue server certificate: %v", err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der, p.GatewayCA.Raw}, PrivateKey: key, Leaf: leaf}
}

// IssueNode issues a node certificate for the key of the DER CSR, with the
// SPIFFE id of nodeID, valid from notBefore to notAfter.
func (p *PKI) IssueNode(csrDER []byte, nodeID string, notBefore, notAfter time.Time) (*x509.Certificate, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("parse csr: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("csr signature: %w", err)
	}
	return p.issueNode(csr.PublicKey, nodeID, notBefore, notAfter)
}

func (p *PKI) issueNode(pub crypto.PublicKey, nodeID string, notBefore, notAfter time.Time) (*x509.Certificate, error) {
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: nodeID},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{p.SPIFFEID(nodeID)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.NodeCA, pub, p.nodeKey)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// NodeCertificate issues a certificate for key and nodeID directly,
// without a Join, valid from notBefore to notAfter (for expired or
// short-lived certificates).
func (p *PKI) NodeCertificate(t testing.TB, key *ecdsa.PrivateKey, nodeID string, notBefore, notAfter time.Time) *x509.Certificate {
	t.Helper()
	c, err := p.issueNode(&key.PublicKey, nodeID, notBefore, notAfter)
	if err != nil {
		t.Fatalf("issue node certificate: %v", err)
	}
	return c
}

// SPIFFEID returns spiffe://<TrustDomain>/node/<nodeID>.
func (p *PKI) SPIFFEID(nodeID string) *url.URL {
	return &url.URL{Scheme: "spiffe", Host: p.TrustDomain, Path: "/node/" + nodeID}
}

// NewKey returns a fresh ECDSA P-256 key, failing t on error.
func NewKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("generate key: %v", err)
	}
	return k
}

// caAge is how long before NewPKI its CAs and the serving certificate
// became valid: a deployment running for a day.
const caAge = 24 * time.Hour

func newCA(t testing.TB, cn string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key := NewKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-caAge),
		NotAfter:              now.Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("create CA: %v", err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("parse CA: %v", err)
	}
	return c, key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatalf("serial: %v", err)
	}
	return sn
}
