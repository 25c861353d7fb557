package pki

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/proto/jointoken"
)

// PrepareGatewayCA makes the next gateway serving CA at now (zero:
// time.Now()), valid for validity (zero: DefaultCAValidity), and keeps it in
// NextGatewayCA: nodes are sent its root (GatewayCARoots) and join tokens
// pin it beside the one in force (GatewayPins), but gateways still serve
// from GatewayCA. It fails with ErrRotation while a gateway-CA rotation is
// in progress, and with ErrBundleInvalid for an invalid bundle. DESIGN.md,
// "CA rotation": the prepare phase.
func (b *Bundle) PrepareGatewayCA(now time.Time, validity time.Duration) error {
	return b.prepareNext(kindGateway, "gateway", &b.NextGatewayCA, b.PreviousGatewayCA, now, validity)
}

// ActivateGatewayCA makes NextGatewayCA the CA gateways serve from, and
// keeps the old one, key included, in PreviousGatewayCA: gateways then
// serve a chain that a daemon holding only the old pin still verifies
// (GatewayServingChain), and a rollback can make it the CA in force again.
// It fails with ErrRotation without a prepared CA.
func (b *Bundle) ActivateGatewayCA() error {
	if b.NextGatewayCA == nil {
		return fmt.Errorf("activate gateway CA: %w: no prepared gateway CA", ErrRotation)
	}
	b.PreviousGatewayCA, b.GatewayCA, b.NextGatewayCA = b.GatewayCA, b.NextGatewayCA, nil
	return nil
}

// RetireGatewayCA drops PreviousGatewayCA: gateways serve the new CA's
// chain alone, and a join token that pins only the old CA no longer finds
// its key. It fails with ErrRotation without an activated rotation.
func (b *Bundle) RetireGatewayCA() error {
	if b.PreviousGatewayCA == nil {
		return fmt.Errorf("retire gateway CA: %w: no activated gateway CA rotation", ErrRotation)
	}
	b.PreviousGatewayCA = nil
	return nil
}

// RollbackGatewayCA undoes a gateway-CA rotation that is not retired:
// prepared only, it drops NextGatewayCA; activated, it makes
// PreviousGatewayCA the CA in force again and drops the new one (nodes
// still pin the old key, which they never stopped trusting). It fails with
// ErrRotation when no gateway-CA rotation is in progress.
func (b *Bundle) RollbackGatewayCA() error {
	switch {
	case b.NextGatewayCA != nil:
		b.NextGatewayCA = nil
	case b.PreviousGatewayCA != nil:
		b.GatewayCA, b.PreviousGatewayCA = b.PreviousGatewayCA, nil
	default:
		return fmt.Errorf("roll back gateway CA: %w: no gateway CA rotation in progress", ErrRotation)
	}
	return nil
}

// GatewayCARoots returns the gateway serving CA certificates a node should
// trust: the CA in force first, then a rotation's next or previous one.
// A gateway-CA rotation's Bundle message carries them.
func (b *Bundle) GatewayCARoots() []*x509.Certificate {
	roots := []*x509.Certificate{b.GatewayCA.Cert}
	for _, ca := range []*CA{b.NextGatewayCA, b.PreviousGatewayCA} {
		if ca != nil {
			roots = append(roots, ca.Cert)
		}
	}
	return roots
}

// GatewayPins returns the pins a join token made now carries: the gateway
// CA in force (GatewayPin) and, while a gateway-CA rotation is open, the
// other CA of the rotation.
func (b *Bundle) GatewayPins() []string {
	roots := b.GatewayCARoots()
	pins := make([]string, len(roots))
	for i, c := range roots {
		pins[i] = jointoken.Pin(c)
	}
	return pins
}

// GatewayServingChain returns the certificates a gateway serves after its
// leaf, which GatewayCA issued. Outside an activated gateway-CA rotation
// that is GatewayCA's certificate. While one is activated it is a
// certificate for GatewayCA's key signed by the previous CA's key, then a
// copy of the previous CA's certificate re-signed by its own key with a
// path length of one: a daemon that pins only the old key (a join token
// made before the rotation, a node that did not take the new roots yet)
// finds it and verifies the leaf up to it (jointoken.VerifyChain), and one
// that pins the new key finds that key in the second certificate. The
// certificates are made anew on each call (ECDSA signatures are random):
// call it once per bundle.
func (b *Bundle) GatewayServingChain() ([]*x509.Certificate, error) {
	if b.PreviousGatewayCA == nil {
		return []*x509.Certificate{b.GatewayCA.Cert}, nil
	}
	old, cur := b.PreviousGatewayCA, b.GatewayCA
	anchorTmpl := *old.Cert
	anchorTmpl.MaxPathLen, anchorTmpl.MaxPathLenZero = 1, false
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("gateway serving chain: %w", err)
	}
	anchorTmpl.SerialNumber = serial
	anchorDER, err := x509.CreateCertificate(rand.Reader, &anchorTmpl, &anchorTmpl, old.Key.Public(), old.Key)
	if err != nil {
		return nil, fmt.Errorf("gateway serving chain: re-sign the previous gateway CA: %w", err)
	}
	anchor, err := x509.ParseCertificate(anchorDER)
	if err != nil {
		return nil, fmt.Errorf("gateway serving chain: %w", err)
	}
	crossTmpl := *cur.Cert
	if serial, err = newSerial(); err != nil {
		return nil, fmt.Errorf("gateway serving chain: %w", err)
	}
	crossTmpl.SerialNumber = serial
	crossTmpl.AuthorityKeyId = anchor.SubjectKeyId
	if crossTmpl.NotAfter.After(anchor.NotAfter) {
		crossTmpl.NotAfter = anchor.NotAfter
	}
	crossDER, err := x509.CreateCertificate(rand.Reader, &crossTmpl, anchor, cur.Key.Public(), old.Key)
	if err != nil {
		return nil, fmt.Errorf("gateway serving chain: cross-sign the gateway CA: %w", err)
	}
	cross, err := x509.ParseCertificate(crossDER)
	if err != nil {
		return nil, fmt.Errorf("gateway serving chain: %w", err)
	}
	return []*x509.Certificate{cross, anchor}, nil
}

// ReissueGateway issues, from the gateway CA in force, a serving
// certificate for key with the names of leaf (a gateway certificate
// another gateway CA issued: the one in the files before a gateway-CA
// rotation activated), valid until leaf's end or for DefaultServerTTL when
// leaf ends within the hour. It fails as IssueGateway does.
func (b *Bundle) ReissueGateway(leaf *x509.Certificate, key *ecdsa.PrivateKey, now time.Time) (*x509.Certificate, error) {
	ttl := leaf.NotAfter.Sub(now)
	if ttl < time.Hour {
		ttl = DefaultServerTTL
	}
	certPEM, _, err := b.issueGatewayKey(now, key, leaf.DNSNames, leaf.IPAddresses, ttl)
	if err != nil {
		return nil, err
	}
	certs, err := ParseCertificatesPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("reissue gateway certificate: %w", err)
	}
	return certs[0], nil
}
