package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"
)

// NodeVerifier checks node client certificates against node CA roots
// alone, so a gateway needs no CA private key to authenticate nodes. Build
// it with NewNodeVerifier or Bundle.NodeVerifier; both fields are required.
// A NodeVerifier is safe for concurrent use.
type NodeVerifier struct {
	// Roots are the node CA roots: Bundle.NodeCARoots, or those a gateway
	// reads from a file (ParseCertificatesPEM).
	Roots *x509.CertPool
	// TrustDomain is the SPIFFE trust domain node IDs must belong to.
	TrustDomain string
}

// NewNodeVerifier returns a NodeVerifier trusting roots for trustDomain. It
// fails with ErrTrustDomain for an invalid trust domain and ErrUntrusted
// when roots is empty.
func NewNodeVerifier(roots []*x509.Certificate, trustDomain string) (*NodeVerifier, error) {
	if err := ValidateTrustDomain(trustDomain); err != nil {
		return nil, fmt.Errorf("new node verifier: %w", err)
	}
	if len(roots) == 0 {
		return nil, fmt.Errorf("new node verifier: %w: no roots", ErrUntrusted)
	}
	return &NodeVerifier{Roots: certPool(roots), TrustDomain: trustDomain}, nil
}

// NodeVerifier returns a NodeVerifier for b's trust domain and node CA
// roots (NodeCARoots). Build it once and reuse it: it copies the roots into
// a pool.
func (b *Bundle) NodeVerifier() *NodeVerifier {
	return &NodeVerifier{Roots: certPool(b.NodeCARoots()), TrustDomain: b.TrustDomain}
}

// VerifyNode verifies a node's certificate chain against b's node CA roots;
// see NodeVerifier.Verify. It builds a verifier on each call; a gateway
// verifying many certificates keeps one from Bundle.NodeVerifier.
func (b *Bundle) VerifyNode(chain []*x509.Certificate, now time.Time) (nodeID, serial string, err error) {
	return b.NodeVerifier().Verify(chain, now)
}

// Verify checks a node's client certificate chain, leaf first as the TLS
// peer sent it (tls.ConnectionState.PeerCertificates), at time now (zero:
// the current time), and returns the node id and the serial (FormatSerial)
// of the leaf.
//
// The leaf must chain to Roots through the rest of chain (RFC 5280 path
// validation, as crypto/x509 does it), be an end-entity certificate listing
// ExtKeyUsageClientAuth, and carry exactly one URI SAN, a node SPIFFE ID
// (ParseNodeSPIFFEID) in TrustDomain. It fails with ErrExpired outside the
// leaf's or a CA's validity window, ErrUntrusted for any other chain or
// usage failure, ErrSPIFFEID for a missing, extra or malformed SPIFFE ID
// and ErrWrongTrustDomain for another trust domain. Revocation is not
// checked here: compare the returned serial and node id with the
// revocation feed.
func (v *NodeVerifier) Verify(chain []*x509.Certificate, now time.Time) (nodeID, serial string, err error) {
	nodeID, serial, err = v.verify(chain, now)
	if err != nil {
		return "", "", fmt.Errorf("verify node certificate: %w", err)
	}
	return nodeID, serial, nil
}

func (v *NodeVerifier) verify(chain []*x509.Certificate, now time.Time) (nodeID, serial string, err error) {
	if v.Roots == nil || v.TrustDomain == "" {
		return "", "", fmt.Errorf("%w: verifier has no roots or trust domain", ErrUntrusted)
	}
	if len(chain) == 0 || slices.Contains(chain, nil) {
		return "", "", fmt.Errorf("%w: empty chain or nil certificate", ErrUntrusted)
	}
	leaf := chain[0]
	_, err = leaf.Verify(x509.VerifyOptions{
		Roots:         v.Roots,
		Intermediates: certPool(chain[1:]),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		var invalid x509.CertificateInvalidError
		if errors.As(err, &invalid) && invalid.Reason == x509.Expired {
			return "", "", fmt.Errorf("%w: %w", ErrExpired, err)
		}
		return "", "", fmt.Errorf("%w: %w", ErrUntrusted, err)
	}
	// crypto/x509 lets a leaf without extended key usage act for any
	// purpose; node certificates always list client auth, so demand it.
	if leaf.IsCA || !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		return "", "", fmt.Errorf("%w: not a node client certificate", ErrUntrusted)
	}
	if len(leaf.URIs) != 1 {
		return "", "", fmt.Errorf("%w: %d URI SANs, want 1", ErrSPIFFEID, len(leaf.URIs))
	}
	td, nodeID, err := ParseNodeSPIFFEID(leaf.URIs[0].String())
	if err != nil {
		return "", "", err
	}
	if td != v.TrustDomain {
		return "", "", fmt.Errorf("%w: %q, want %q", ErrWrongTrustDomain, td, v.TrustDomain)
	}
	return nodeID, FormatSerial(leaf.SerialNumber), nil
}

// certPool returns a new pool holding certs.
func certPool(certs []*x509.Certificate) *x509.CertPool {
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool
}
