package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/x509"
	"fmt"
	"strings"
	"time"
)

// PrepareInternalCA makes the next internal CA at now (zero: time.Now()),
// valid for validity (zero: DefaultCAValidity), and keeps it in
// NextInternalCA: every control-plane process trusts it beside the one in
// force (InternalCARoots), none presents a certificate from it yet. It
// fails with ErrRotation while an internal-CA rotation is in progress, and
// with ErrBundleInvalid for an invalid bundle. DESIGN.md, "CA rotation":
// the prepare phase.
func (b *Bundle) PrepareInternalCA(now time.Time, validity time.Duration) error {
	return b.prepareNext(kindInternal, "internal", &b.NextInternalCA, b.PreviousInternalCA, now, validity)
}

// ActivateInternalCA makes NextInternalCA the CA in force, whose
// certificates processes present from then on (ReissueInternal), and keeps
// the old one, key included, in PreviousInternalCA: still trusted, so a
// process that has not re-issued yet is still accepted, and the CA in force
// again on a rollback. It fails with ErrRotation without a prepared CA.
func (b *Bundle) ActivateInternalCA() error {
	if b.NextInternalCA == nil {
		return fmt.Errorf("activate internal CA: %w: no prepared internal CA", ErrRotation)
	}
	b.PreviousInternalCA, b.InternalCA, b.NextInternalCA = b.InternalCA, b.NextInternalCA, nil
	return nil
}

// RetireInternalCA drops PreviousInternalCA and its key: a certificate it
// issued is no longer accepted on new connections of the internal control
// API. Nothing of it is kept: a process whose files still hold one is
// recognised by the issuer's name (FromOtherInternalCA), so the bundle
// stays readable by builds that know no internal-CA rotation. It fails
// with ErrRotation without an activated internal-CA rotation.
func (b *Bundle) RetireInternalCA() error {
	if b.PreviousInternalCA == nil {
		return fmt.Errorf("retire internal CA: %w: no activated internal CA rotation", ErrRotation)
	}
	b.PreviousInternalCA = nil
	return nil
}

// RollbackInternalCA undoes an internal-CA rotation that is not retired:
// prepared only, it drops NextInternalCA (it issued nothing); activated, it
// makes PreviousInternalCA the CA in force again and drops the new one:
// each process presents its files' certificate again at its next bundle
// read (re-issued from the old CA when the files came from the new one),
// and until then a handshake with a process that already dropped the new
// CA fails. It fails with ErrRotation when no internal-CA rotation is in
// progress.
func (b *Bundle) RollbackInternalCA() error {
	switch {
	case b.NextInternalCA != nil:
		b.NextInternalCA = nil
	case b.PreviousInternalCA != nil:
		b.InternalCA, b.PreviousInternalCA = b.PreviousInternalCA, nil
	default:
		return fmt.Errorf("roll back internal CA: %w: no internal CA rotation in progress", ErrRotation)
	}
	return nil
}

// InternalCARoots returns the internal CA certificates a peer on the
// internal control API may chain to: the CA in force first, then a
// rotation's next or previous one.
func (b *Bundle) InternalCARoots() []*x509.Certificate {
	roots := []*x509.Certificate{b.InternalCA.Cert}
	for _, ca := range []*CA{b.NextInternalCA, b.PreviousInternalCA} {
		if ca != nil {
			roots = append(roots, ca.Cert)
		}
	}
	return roots
}

// FromOtherInternalCA reports whether leaf was issued by an internal CA of
// the bundle's trust domain other than the one in force: a rotation's next
// or previous one, one it retired or rolled back. Every internal CA of a
// trust domain has the same name ("<trust domain> internal CA"), and a
// retired one's certificate is not kept, so the name is the test, as for
// the gateway serving CA; another deployment of the same trust domain
// passes it too, and doctor's host.gateway.internal check says so. Such a
// certificate is re-issued (ReissueInternal).
func (b *Bundle) FromOtherInternalCA(leaf *x509.Certificate) bool {
	return bytes.Equal(leaf.RawIssuer, b.InternalCA.Cert.RawSubject) && leaf.CheckSignatureFrom(b.InternalCA.Cert) != nil
}

// ReissueInternal issues, from the internal CA in force, an internal
// certificate for key with the name, DNS names and IP addresses of leaf (an
// internal certificate another internal CA of the deployment issued: the
// one in the files before an internal-CA rotation activated), valid until
// leaf's end, or for DefaultServerTTL when leaf ends within the hour. It
// returns the certificate (leaf first, then the CA in force) and fails with
// ErrTTL when leaf has expired at now (an expired file stays expired: pki
// issue-internal renews it), ErrName when leaf names no internal SPIFFE ID
// of the bundle's trust domain, and as IssueInternal does otherwise.
func (b *Bundle) ReissueInternal(leaf *x509.Certificate, key *ecdsa.PrivateKey, now time.Time) ([]*x509.Certificate, error) {
	prefix := InternalSPIFFEID(b.TrustDomain, "")
	if len(leaf.URIs) != 1 || !strings.HasPrefix(leaf.URIs[0].String(), prefix) {
		return nil, fmt.Errorf("reissue internal certificate: %w: %q names no internal SPIFFE ID of %s", ErrName, leaf.Subject.CommonName, b.TrustDomain)
	}
	if !now.Before(leaf.NotAfter) {
		return nil, fmt.Errorf("reissue internal certificate: %w: %q expired at %s", ErrTTL, leaf.Subject.CommonName, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	name := strings.TrimPrefix(leaf.URIs[0].String(), prefix)
	ttl := leaf.NotAfter.Sub(now)
	if ttl < time.Hour {
		ttl = DefaultServerTTL
	}
	certPEM, _, err := b.issueInternalKey(now, key, name, leaf.DNSNames, leaf.IPAddresses, ttl)
	if err != nil {
		return nil, err
	}
	certs, err := ParseCertificatesPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("reissue internal certificate: %w", err)
	}
	return certs, nil
}
