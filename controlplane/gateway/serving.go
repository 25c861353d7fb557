package gateway

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
)

// servingCert is the certificate handshakes present while one bundle is in
// force, and the files' certificate it was made from.
type servingCert struct {
	file, cert *tls.Certificate
}

// servingCertificate is the handshakes' GetCertificate. Outside a
// gateway-CA rotation it is the certificate in the files (certreload). Once
// a rotation activated (t.gwRotated), a certificate from the bundle's gateway serving CA
// whose leaf another gateway CA of the deployment issued is re-issued in
// memory from the CA in force, for the same key and names, and served with
// the chain the phase calls for (pki.Bundle.GatewayServingChain): a node
// that pins the old CA still verifies it until the rotation retires. No
// restart, no file written (pki issue-gateway, or the embedded default's
// hourly check, replaces the files).
func (g *Gateway) servingCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	file, err := g.certs.GetCertificate(hello)
	if err != nil || file == nil {
		return file, err
	}
	t := g.current()
	if sc := t.serving.Load(); sc != nil && sc.file == file {
		return sc.cert, nil
	}
	cert, reissued, err := file, false, error(nil)
	if t.gwRotated {
		cert, reissued, err = servingFor(t.bundle, file, g.cfg.Clock.Now())
	}
	if err != nil {
		g.log.Warn("Serving certificate not re-issued from the gateway CA in force; serving the files' certificate",
			"serving_ca", pki.NodeCAID(t.bundle.GatewayCA.Cert), logkey.Err, err)
		cert = file
	} else if reissued {
		g.log.Info("Serving certificate re-issued from the gateway CA in force", "serving_ca", pki.NodeCAID(t.bundle.GatewayCA.Cert),
			"chain", len(cert.Certificate), "not_after", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	t.serving.Store(&servingCert{file: file, cert: cert})
	return cert, nil
}

// servingFor is the certificate to serve for the files' certificate file
// under bundle b, and whether its leaf was re-issued. A certificate that
// no gateway CA of the deployment issued (its issuer is not the gateway
// CA's name) is served as it is, and so is one from the CA in force
// outside an activated rotation.
func servingFor(b *pki.Bundle, file *tls.Certificate, now time.Time) (*tls.Certificate, bool, error) {
	leaf := file.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(file.Certificate[0]); err != nil {
			return nil, false, fmt.Errorf("parse serving certificate: %w", err)
		}
	}
	if !bytes.Equal(leaf.RawIssuer, b.GatewayCA.Cert.RawSubject) {
		return file, false, nil
	}
	fromCurrent := leaf.CheckSignatureFrom(b.GatewayCA.Cert) == nil
	if fromCurrent && b.PreviousGatewayCA == nil {
		return file, false, nil
	}
	if b.NextGatewayCA != nil && !fromCurrent {
		return file, false, nil // propagating: the files are from the CA in force or an operator's choice
	}
	reissued := false
	if !fromCurrent {
		key, ok := file.PrivateKey.(*ecdsa.PrivateKey)
		if !ok {
			return nil, false, fmt.Errorf("serving key is %T, want an ECDSA key to re-issue", file.PrivateKey)
		}
		var err error
		if leaf, err = b.ReissueGateway(leaf, key, now); err != nil {
			return nil, false, err
		}
		reissued = true
	}
	tail, err := b.GatewayServingChain()
	if err != nil {
		return nil, false, err
	}
	out := &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: file.PrivateKey, Leaf: leaf}
	for _, c := range tail {
		out.Certificate = append(out.Certificate, c.Raw)
	}
	return out, reissued, nil
}
