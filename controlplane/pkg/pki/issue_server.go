package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net"
	"net/url"
	"time"
)

// DefaultServerTTL is the lifetime of a gateway or internal certificate
// when the ttl argument is zero: one year of 365 days. These certificates
// are issued by an operator (`pki issue-gateway`), so they live long;
// doctor reports them before they expire.
const DefaultServerTTL = 365 * 24 * time.Hour

// serverBackdate is how far before the time of issue a serving
// certificate's NotBefore lies, for clients whose clocks run up to an hour
// behind; the same as NodeBackdate (DESIGN.md, "Identity over time",
// Clocks).
const serverBackdate = NodeBackdate

// IssueGateway issues a gateway's TLS serving certificate from the gateway
// serving CA for the given DNS names (wildcards such as "*.gw.example.com"
// allowed) and IP addresses, at least one name in all, valid for ttl (zero:
// DefaultServerTTL; cut short where the CA expires sooner), with
// ExtKeyUsageServerAuth and a fresh ECDSA P-256 key.
//
// certPEM holds the leaf and then the gateway serving CA certificate: a TLS
// server sends both, so that a joining daemon finds the pinned CA in the
// chain (jointoken.VerifyChain). keyPEM is the leaf's PKCS #8 "PRIVATE KEY"
// block. It fails with ErrName for a missing or invalid name, ErrTTL for a
// negative ttl and ErrCAExpired when the CA has expired.
func (b *Bundle) IssueGateway(dns []string, ips []net.IP, ttl time.Duration) (certPEM, keyPEM []byte, err error) {
	return b.issueGateway(time.Now(), dns, ips, ttl)
}

// IssueGatewayWithKey is IssueGateway for the key in keyPEM (a PKCS #8
// "PRIVATE KEY" block holding an ECDSA key, as IssueGateway writes it)
// instead of a fresh one: a certificate re-issued for new names keeps its
// public key, so pins of that key (curl's --pinnedpubkey) stay valid. It
// returns the same keyPEM. It fails as IssueGateway does, and when keyPEM
// holds no ECDSA key.
func (b *Bundle) IssueGatewayWithKey(keyPEM []byte, dns []string, ips []net.IP, ttl time.Duration) (certPEM, outKeyPEM []byte, err error) {
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("issue gateway certificate: %w", err)
	}
	return b.issueGatewayKey(time.Now(), key, dns, ips, ttl)
}

func (b *Bundle) issueGateway(now time.Time, dns []string, ips []net.IP, ttl time.Duration) (certPEM, keyPEM []byte, err error) {
	return b.issueGatewayKey(now, nil, dns, ips, ttl)
}

// issueGatewayKey issues a gateway certificate for key, or for a fresh key
// when key is nil.
func (b *Bundle) issueGatewayKey(now time.Time, key *ecdsa.PrivateKey, dns []string, ips []net.IP, ttl time.Duration) (certPEM, keyPEM []byte, err error) {
	if len(dns) == 0 && len(ips) == 0 {
		return nil, nil, fmt.Errorf("issue gateway certificate: %w: no DNS name or IP address", ErrName)
	}
	if err := b.GatewayCA.validate(kindGateway); err != nil {
		return nil, nil, fmt.Errorf("issue gateway certificate: %w", err)
	}
	var cn string
	if len(dns) > 0 {
		cn = dns[0]
	} else {
		cn = ips[0].String()
	}
	certPEM, keyPEM, err = issueServer(b.GatewayCA, serverParams{
		now:     now,
		ttl:     ttl,
		subject: pkix.Name{Organization: []string{"Better Compute"}, CommonName: cn},
		dns:     dns,
		ips:     ips,
		usages:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		key:     key,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("issue gateway certificate: %w", err)
	}
	return certPEM, keyPEM, nil
}

// IssueInternal issues the certificate of control-plane process name for
// the internal control API (mutual TLS between processes) from the internal
// CA: CommonName name, URI SAN InternalSPIFFEID(trust domain, name), the
// given DNS names and IP addresses (none is fine for a client-only
// process), ExtKeyUsageServerAuth and ExtKeyUsageClientAuth, a fresh ECDSA
// P-256 key, valid for ttl (zero: DefaultServerTTL). name follows
// NodeIDPattern. certPEM holds the leaf and then the internal CA
// certificate; keyPEM is a PKCS #8 "PRIVATE KEY" block. It fails with
// ErrName for an invalid name, DNS name or IP, ErrTTL for a negative ttl
// and ErrCAExpired when the CA has expired.
func (b *Bundle) IssueInternal(name string, dns []string, ips []net.IP, ttl time.Duration) (certPEM, keyPEM []byte, err error) {
	return b.issueInternal(time.Now(), name, dns, ips, ttl)
}

func (b *Bundle) issueInternal(now time.Time, name string, dns []string, ips []net.IP, ttl time.Duration) (certPEM, keyPEM []byte, err error) {
	return b.issueInternalKey(now, nil, name, dns, ips, ttl)
}

// issueInternalKey issues an internal certificate for key, or for a fresh
// key when key is nil.
func (b *Bundle) issueInternalKey(now time.Time, key *ecdsa.PrivateKey, name string, dns []string, ips []net.IP, ttl time.Duration) (certPEM, keyPEM []byte, err error) {
	if !nodeIDRegexp.MatchString(name) {
		return nil, nil, fmt.Errorf("issue internal certificate: %w: name %q does not match %s", ErrName, name, NodeIDPattern)
	}
	if err := b.InternalCA.validate(kindInternal); err != nil {
		return nil, nil, fmt.Errorf("issue internal certificate: %w", err)
	}
	certPEM, keyPEM, err = issueServer(b.InternalCA, serverParams{
		now:      now,
		ttl:      ttl,
		subject:  pkix.Name{Organization: []string{"Better Compute"}, CommonName: name},
		dns:      dns,
		ips:      ips,
		usages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		spiffeID: &url.URL{Scheme: "spiffe", Host: b.TrustDomain, Path: internalPath + name},
		key:      key,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("issue internal certificate %s: %w", name, err)
	}
	return certPEM, keyPEM, nil
}

// serverParams describes a serving certificate for issueServer.
type serverParams struct {
	now      time.Time
	ttl      time.Duration
	subject  pkix.Name
	dns      []string
	ips      []net.IP
	usages   []x509.ExtKeyUsage
	spiffeID *url.URL          // nil: no URI SAN
	key      *ecdsa.PrivateKey // nil: a fresh P-256 key
}

// issueServer makes a key and a certificate for it signed by ca, and
// returns the PEM chain (leaf, then ca) and the PEM key.
func issueServer(ca *CA, p serverParams) (certPEM, keyPEM []byte, err error) {
	for _, name := range p.dns {
		if err := ValidateDNSName(name); err != nil {
			return nil, nil, err
		}
	}
	for _, ip := range p.ips {
		if len(ip) != net.IPv4len && len(ip) != net.IPv6len {
			return nil, nil, fmt.Errorf("%w: IP address %v", ErrName, ip)
		}
	}
	ttl, err := defaultTTL(p.ttl, DefaultServerTTL)
	if err != nil {
		return nil, nil, err
	}
	notBefore, notAfter, err := ca.lifetime(p.now, serverBackdate, ttl)
	if err != nil {
		return nil, nil, err
	}
	key := p.key
	if key == nil {
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return nil, nil, fmt.Errorf("generate key: %w", err)
		}
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               p.subject,
		DNSNames:              p.dns,
		IPAddresses:           p.ips,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           p.usages,
		BasicConstraintsValid: true,
	}
	if p.spiffeID != nil {
		tmpl.URIs = []*url.URL{p.spiffeID}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("create certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parse certificate: %w", err)
	}
	keyPEM, err = encodeKeyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return EncodeCertificatesPEM(leaf, ca.Cert), keyPEM, nil
}
