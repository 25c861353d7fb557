package control

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/better-compute/better-compute/controlplane/internal/certreload"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
)

// ErrPeer reports a peer certificate that is not an internal identity of
// the deployment.
var ErrPeer = errors.New("peer is not an internal control-plane identity")

// Identity is what both sides of the internal API need: their own
// certificate and the internal CA that vouches for the other side.
type Identity struct {
	// Certs serves this process's internal certificate (leaf, then the
	// internal CA), hot-reloaded.
	Certs *certreload.Reloader
	// Roots are the internal CA certificates peers must chain to
	// (pki.Bundle.InternalCA).
	Roots *x509.CertPool
	// TrustDomain is the deployment's SPIFFE trust domain; a peer must name
	// spiffe://<TrustDomain>/internal/<name>.
	TrustDomain string
}

// NewIdentity reads the certificate files (pki issue-internal writes them)
// and takes the internal CA and trust domain from bundle. It fails when the
// files do not hold a key pair or the bundle has no internal CA.
func NewIdentity(bundle *pki.Bundle, certFile, keyFile string, log *slog.Logger) (*Identity, error) {
	if bundle == nil || bundle.InternalCA == nil || bundle.InternalCA.Cert == nil {
		return nil, errors.New("internal control API: the PKI bundle has no internal CA")
	}
	if certFile == "" || keyFile == "" {
		return nil, errors.New("internal control API: the certificate and key files are required (better-compute pki issue-internal writes them)")
	}
	certs, err := certreload.New(certFile, keyFile, log)
	if err != nil {
		return nil, fmt.Errorf("internal control API: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(bundle.InternalCA.Cert)
	return &Identity{Certs: certs, Roots: roots, TrustDomain: bundle.TrustDomain}, nil
}

// verifyPeer checks that the verified chain's leaf names an internal SPIFFE
// ID of td: exactly one URI SAN spiffe://td/internal/<name>.
func verifyPeer(td string, cs tls.ConnectionState) error {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return fmt.Errorf("%w: no verified certificate", ErrPeer)
	}
	leaf := cs.VerifiedChains[0][0]
	if len(leaf.URIs) != 1 {
		return fmt.Errorf("%w: certificate %q names %d URIs, want one internal SPIFFE ID", ErrPeer, leaf.Subject.CommonName, len(leaf.URIs))
	}
	id := leaf.URIs[0].String()
	prefix := pki.InternalSPIFFEID(td, "")
	if !strings.HasPrefix(id, prefix) || len(id) == len(prefix) {
		return fmt.Errorf("%w: certificate names %s, want %s<name>", ErrPeer, id, prefix)
	}
	return nil
}

// serverTLS is the listener's configuration: TLS 1.3, this identity's
// certificate, a client certificate from the internal CA required.
func (id *Identity) serverTLS() *tls.Config {
	return &tls.Config{
		MinVersion:       tls.VersionTLS13,
		GetCertificate:   id.Certs.GetCertificate,
		ClientAuth:       tls.RequireAndVerifyClientCert,
		ClientCAs:        id.Roots,
		VerifyConnection: func(cs tls.ConnectionState) error { return verifyPeer(id.TrustDomain, cs) },
	}
}

// clientTLS is the dialer's configuration: TLS 1.3, this identity's
// certificate offered, the server verified against the internal CA for
// serverName (the host of the gateway's internal address).
func (id *Identity) clientTLS(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: serverName,
		RootCAs:    id.Roots,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return id.Certs.Current(), nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error { return verifyPeer(id.TrustDomain, cs) },
	}
}
