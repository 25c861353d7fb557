package pki

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	mathrand "math/rand/v2"
	"net/url"
	"time"
)

// DefaultNodeTTL is the lifetime of a node certificate unless
// IssueOptions.TTL says otherwise. Node certificates are short-lived and
// renewed (DESIGN.md, PKI).
const DefaultNodeTTL = 24 * time.Hour

// NodeBackdate is how far before the time of issue a node certificate's
// NotBefore lies, so that a node whose clock runs up to an hour behind
// still finds its fresh certificate valid by its own clock (DESIGN.md,
// "Identity over time", Clocks). Renewal is counted from the time of issue,
// not from this backdated NotBefore (Issued.RenewAfter).
const NodeBackdate = time.Hour

// IssueOptions configures IssueNode.
type IssueOptions struct {
	// Now is the time of issue. Defaults to time.Now().
	Now time.Time
	// TTL is how long after Now the certificate stays valid; it is cut
	// short where the node CA expires sooner. Defaults to DefaultNodeTTL.
	TTL time.Duration
}

// Issued describes a certificate IssueNode made.
type Issued struct {
	// CertDER is the DER certificate.
	CertDER []byte
	// Serial is the serial number as FormatSerial spells it: 32 lower-case
	// hex digits. Revocation names certificates by it.
	Serial string
	// SPIFFEID is the certificate's only URI SAN,
	// spiffe://<trust-domain>/node/<node-id>.
	SPIFFEID string
	// NotBefore is the start of validity: the time of issue less
	// NodeBackdate, in whole seconds, UTC.
	NotBefore time.Time
	// NotAfter is the end of validity: the time of issue plus the TTL, or
	// the node CA's end if sooner, in whole seconds, UTC.
	NotAfter time.Time
	// RenewAfter is when the node should renew: two thirds of the way from
	// the time of issue (not the backdated NotBefore) to NotAfter, plus a
	// uniformly random share of the next sixth (RenewAfterAt), so that
	// nodes joined in the same second renew spread over hours.
	RenewAfter time.Time
	// KeySHA256 is KeySHA256 of the certified public key.
	KeySHA256 string
	// CAID is the issuing node CA's id (NodeCAID), which a rotation
	// compares to tell which nodes are on which CA.
	CAID string
	// CutShort reports a NotAfter cut short to the node CA's end: the CA
	// had less than the TTL left. With pki.autoRotate the rotation
	// reconciler activates the next CA before that can happen; a
	// certificate cut short says it did not (docs/pki.md, "Rotating the
	// node CA").
	CutShort bool
}

// RenewAfterAt is when a certificate issued at issuedAt and valid until
// notAfter should be renewed: at two thirds of that span plus a share u of
// the following sixth, u in [0, 1) (a random number: the jitter). A node
// then renews at 2/3 to 5/6 of its certificate's life, and at least a sixth
// of the life is left for retries (DESIGN.md, "Renewal never runs out").
func RenewAfterAt(issuedAt, notAfter time.Time, u float64) time.Time {
	life := notAfter.Sub(issuedAt)
	if life <= 0 {
		return notAfter
	}
	u = min(max(u, 0), 1)
	return issuedAt.Add(life*2/3 + time.Duration(float64(life/6)*u))
}

// KeySHA256 is the lower-case hex SHA-256 of the DER SubjectPublicKeyInfo
// of pub (RFC 5280 §4.1.2.7): how the control plane names a node's key. It
// fails for a key type crypto/x509 cannot marshal.
func KeySHA256(pub any) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("key hash: %w", err)
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:]), nil
}

// IssueNode issues the certificate of node nodeID from the node CA for the
// public key in csrDER, a DER PKCS #10 certificate request (RFC 2986).
//
// The CSR must parse and its signature verify (it proves possession of the
// key), and its key must be ECDSA P-256 or Ed25519. Everything else the CSR
// asks for, subject and SANs included, is ignored. The certificate has
// CommonName nodeID, one URI SAN NodeSPIFFEID(trust domain, nodeID),
// ExtKeyUsageClientAuth only, KeyUsageDigitalSignature, a random 128-bit
// serial, and validity from now − NodeBackdate to now + TTL.
//
// It fails with ErrNodeID for a bad node id, ErrCSRInvalid for a CSR that
// does not parse or verify, ErrKeyType for another key type, ErrTTL for a
// negative TTL and ErrCAExpired when the node CA has expired.
func (b *Bundle) IssueNode(csrDER []byte, nodeID string, opts IssueOptions) (*Issued, error) {
	if err := ValidateNodeID(nodeID); err != nil {
		return nil, fmt.Errorf("issue node certificate: %w", err)
	}
	if err := b.NodeCA.validate(kindNode); err != nil {
		return nil, fmt.Errorf("issue node certificate: %w", err)
	}
	pub, err := checkCSR(csrDER)
	if err != nil {
		return nil, fmt.Errorf("issue node certificate for %s: %w", nodeID, err)
	}
	ttl, err := defaultTTL(opts.TTL, DefaultNodeTTL)
	if err != nil {
		return nil, fmt.Errorf("issue node certificate for %s: %w", nodeID, err)
	}
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	notBefore, notAfter, err := b.NodeCA.lifetime(now, NodeBackdate, ttl)
	if err != nil {
		return nil, fmt.Errorf("issue node certificate for %s: node CA: %w", nodeID, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("issue node certificate for %s: %w", nodeID, err)
	}
	id := NodeSPIFFEID(b.TrustDomain, nodeID)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: nodeID},
		URIs:                  []*url.URL{{Scheme: "spiffe", Host: b.TrustDomain, Path: nodePathPrefix + nodeID}},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, b.NodeCA.Cert, pub, b.NodeCA.Key)
	if err != nil {
		return nil, fmt.Errorf("issue node certificate for %s: create certificate: %w", nodeID, err)
	}
	keyHash, err := KeySHA256(pub)
	if err != nil {
		return nil, fmt.Errorf("issue node certificate for %s: %w", nodeID, err)
	}
	return &Issued{
		CertDER:    der,
		Serial:     FormatSerial(serial),
		SPIFFEID:   id,
		CAID:       NodeCAID(b.NodeCA.Cert),
		NotBefore:  notBefore,
		NotAfter:   notAfter,
		RenewAfter: RenewAfterAt(now.UTC().Truncate(time.Second), notAfter, mathrand.Float64()),
		KeySHA256:  keyHash,
		CutShort:   notAfter.Before(now.UTC().Truncate(time.Second).Add(ttl)),
	}, nil
}

// checkCSR parses a DER CSR, checks its key type and then its signature,
// and returns its public key.
func checkCSR(der []byte) (any, error) {
	if len(der) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrCSRInvalid)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCSRInvalid, err)
	}
	switch pub := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if pub.Curve != elliptic.P256() {
			return nil, fmt.Errorf("%w: ECDSA on %s, want P-256", ErrKeyType, pub.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	case nil:
		return nil, fmt.Errorf("%w: %s, want ECDSA P-256 or Ed25519", ErrKeyType, csr.PublicKeyAlgorithm)
	default:
		return nil, fmt.Errorf("%w: %T, want ECDSA P-256 or Ed25519", ErrKeyType, pub)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: signature: %w", ErrCSRInvalid, err)
	}
	return csr.PublicKey, nil
}

// defaultTTL returns ttl, or def when ttl is zero; a negative ttl fails
// with ErrTTL.
func defaultTTL(ttl, def time.Duration) (time.Duration, error) {
	switch {
	case ttl < 0:
		return 0, fmt.Errorf("%w: ttl %s is negative", ErrTTL, ttl)
	case ttl == 0:
		return def, nil
	}
	return ttl, nil
}
