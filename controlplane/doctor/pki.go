package doctor

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/jointoken"
)

// Certificate horizons: a CA this close to its end warns (a rotation needs
// time), and so does a serving certificate (the gateway's, the API's, the
// internal one); the fail windows are in lifetimes.go.
const (
	CAWarnWithin          = 90 * 24 * time.Hour
	GatewayCertWarnWithin = 30 * 24 * time.Hour
)

// PKI checks the sealed PKI bundle: present, opening with the deployment
// secret and consistent with its row (each CA's end is CAs'). The embedded
// default makes its bundle on first serve, so a missing one only warns
// there. It also returns the opened bundle (nil when it does not open).
func PKI(ctx context.Context, st interface {
	PKIBundleGet(context.Context) (*store.PKIBundle, error)
}, secret string, embedded bool, now time.Time) (Result, *pki.Bundle) {
	row, err := st.PKIBundleGet(ctx)
	switch {
	case errors.Is(err, store.ErrNotFound) && embedded:
		return result(IDPKI, Warn, "no PKI bundle yet: serve makes it on first start with the gateway role"), nil
	case errors.Is(err, store.ErrNotFound):
		return result(IDPKI, Fail, "no PKI bundle: run better-compute pki init --trust-domain <domain>"), nil
	case err != nil:
		return result(IDPKI, Fail, "cannot read the PKI bundle: "+err.Error()), nil
	}
	b, err := pki.OpenBundle(secret, row.Sealed)
	switch {
	case errors.Is(err, pki.ErrSealOpen):
		return result(IDPKI, Fail, "the PKI bundle does not open with this deployment secret: every process needs the same secret"), nil
	case err != nil:
		return result(IDPKI, Fail, "cannot open the PKI bundle: "+err.Error()), nil
	}
	if b.TrustDomain != row.TrustDomain {
		return result(IDPKI, Fail, "the PKI bundle's trust domain does not match its row: the bundle was replaced by hand",
			fmt.Sprintf("bundle %q, row %q", b.TrustDomain, row.TrustDomain)), b
	}
	// Each CA's end is judged by its own check (CAs).
	detail := "trust domain " + b.TrustDomain
	return result(IDPKI, OK, "PKI bundle opens with the deployment secret", detail), b
}

// GatewayIdentity checks that the gateway role can authenticate daemons and
// be authenticated by them: the node CA roots and trust domain it verifies
// client certificates with, and its serving certificate files, which must be
// readable, match their key, chain to the gateway serving CA, carry that CA
// (daemons holding only a pin look for it in the chain, jointoken.VerifyChain),
// name the public URL's host, and not be near their end.
func GatewayIdentity(b *pki.Bundle, gw GatewayConfig, embedded bool, now time.Time) Result {
	if !gw.Enabled {
		return result(IDGatewayIdentity, OK, "this configuration does not run the gateway role")
	}
	if b == nil {
		if embedded {
			return result(IDGatewayIdentity, Warn, "no PKI bundle yet: serve makes it and the gateway certificate on first start")
		}
		return result(IDGatewayIdentity, Fail, "the gateway cannot authenticate daemons without the PKI bundle (see the pki check)")
	}
	if _, err := pki.NewNodeVerifier(b.NodeCARoots(), b.TrustDomain); err != nil {
		return result(IDGatewayIdentity, Fail, "the bundle cannot verify node certificates: "+err.Error())
	}
	switch {
	case gw.CertFile == "" && gw.KeyFile == "":
		return result(IDGatewayIdentity, Fail, "host.gateway.tlsFiles is not set: run better-compute pki issue-gateway --dns <public host> --out-dir <dir> and set it")
	case gw.CertFile == "" || gw.KeyFile == "":
		return result(IDGatewayIdentity, Fail, "host.gateway.tlsFiles needs both cert and key")
	}
	pair, err := tls.LoadX509KeyPair(gw.CertFile, gw.KeyFile)
	if err != nil {
		if embedded && errors.Is(err, os.ErrNotExist) {
			return result(IDGatewayIdentity, Warn, "no gateway certificate yet: serve issues it on first start", err.Error())
		}
		return result(IDGatewayIdentity, Fail, "cannot load the gateway certificate: "+err.Error())
	}
	var chain []*x509.Certificate
	for _, der := range pair.Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return result(IDGatewayIdentity, Fail, "cannot parse the gateway certificate: "+err.Error(), gw.CertFile)
		}
		chain = append(chain, c)
	}
	leaf := chain[0]
	roots := x509.NewCertPool()
	roots.AddCert(b.GatewayCA.Cert)
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	names := append(append([]string{}, leaf.DNSNames...), ipStrings(leaf)...)
	detail := fmt.Sprintf("trust domain %s; %s names %s, valid until %s", b.TrustDomain, gw.CertFile,
		strings.Join(names, ", "), leaf.NotAfter.UTC().Format(time.RFC3339))
	// Chain to the CA regardless of time; validity is reported below.
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: leaf.NotBefore.Add(time.Second),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return result(IDGatewayIdentity, Fail, "the gateway certificate does not chain to the bundle's gateway serving CA: daemons refuse it; re-issue it with pki issue-gateway", detail)
	}
	if !jointoken.MatchPin(b.GatewayPin(), chain[1:]) {
		return result(IDGatewayIdentity, Fail, "the certificate file lacks the gateway serving CA after the leaf: daemons joining with a pin cannot verify it; use the file pki issue-gateway writes", detail)
	}
	if u, err := url.Parse(gw.PublicURL); err == nil && u.Hostname() != "" {
		if err := leaf.VerifyHostname(u.Hostname()); err != nil {
			return result(IDGatewayIdentity, Fail, fmt.Sprintf("the gateway certificate does not name %s (host.gateway.publicURL): daemons refuse it; re-issue it with pki issue-gateway --dns %s", u.Hostname(), u.Hostname()), detail)
		}
	}
	switch left := leaf.NotAfter.Sub(now); {
	case left <= 0:
		return result(IDGatewayIdentity, Fail, "the gateway certificate has expired: daemons cannot connect; re-issue it with pki issue-gateway", detail)
	case now.Before(leaf.NotBefore):
		return result(IDGatewayIdentity, Fail, "the gateway certificate is not valid yet: check the clock", detail)
	case left < ServingCertFailWithin && embedded:
		return result(IDGatewayIdentity, Fail, fmt.Sprintf("the gateway certificate ends in %s: serve re-issues it 30 days before its end, so it is not running or cannot write %s; restart it", days(left), gw.CertFile), detail)
	case left < ServingCertFailWithin:
		return result(IDGatewayIdentity, Fail, fmt.Sprintf("the gateway certificate ends in %s: re-issue it now with pki issue-gateway (gateways reload it within 60 s)", days(left)), detail)
	case left < GatewayCertWarnWithin && embedded:
		return result(IDGatewayIdentity, Warn, fmt.Sprintf("the gateway certificate ends in %s: a running serve re-issues it within the hour", days(left)), detail)
	case left < GatewayCertWarnWithin:
		return result(IDGatewayIdentity, Warn, fmt.Sprintf("the gateway certificate ends in %s: re-issue it with pki issue-gateway (gateways reload it within 60 s)", days(left)), detail)
	}
	return result(IDGatewayIdentity, OK, "the gateway can authenticate daemons and be verified by them", detail)
}

func ipStrings(c *x509.Certificate) []string {
	var out []string
	for _, ip := range c.IPAddresses {
		out = append(out, ip.String())
	}
	return out
}
