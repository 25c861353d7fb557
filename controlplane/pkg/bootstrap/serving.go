package bootstrap

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/proto/jointoken"
)

// APICertFile and APIKeyFile are the file names of the API serving
// certificate that host.tls mode auto issues into DataDir/pki.
const (
	APICertFile = "api.crt"
	APIKeyFile  = "api.key"
)

// Names are the subject alternative names of a serving certificate.
type Names struct {
	// DNS are the DNS names, the first of them the certificate's common
	// name.
	DNS []string
	// IPs are the IP addresses.
	IPs []net.IP
}

// String lists the names, DNS names first, comma-separated.
func (n Names) String() string {
	out := slices.Clone(n.DNS)
	for _, ip := range n.IPs {
		out = append(out, ip.String())
	}
	return strings.Join(out, ",")
}

// equal reports whether n and o hold the same names, in any order.
func (n Names) equal(o Names) bool {
	return slices.Equal(n.sortedKeys(), o.sortedKeys())
}

// sortedKeys is every name as text, DNS names lower-cased, sorted.
func (n Names) sortedKeys() []string {
	keys := make([]string, 0, len(n.DNS)+len(n.IPs))
	for _, d := range n.DNS {
		keys = append(keys, "dns:"+strings.ToLower(d))
	}
	for _, ip := range n.IPs {
		keys = append(keys, "ip:"+ip.String())
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// LocalNames are the names a serving certificate of this machine holds:
// the public hosts (from host.publicURL and host.gateway.publicURL), then
// localhost, 127.0.0.1, ::1, the machine's hostname (os.Hostname) and every
// address of its network interfaces that is neither loopback nor
// link-local (fe80::/10 and 169.254.0.0/16 need a zone or change with the
// link, and no other machine dials them). A hostname that is not a valid
// DNS name is left out. Errors reading the hostname or the interfaces leave
// those names out: the certificate still names the rest.
func LocalNames(publicHosts []string) Names {
	hostname, _ := os.Hostname()
	var addrs []net.IP
	if ifaddrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range ifaddrs {
			if ipn, ok := a.(*net.IPNet); ok {
				addrs = append(addrs, ipn.IP)
			}
		}
	}
	return namesFor(publicHosts, hostname, addrs)
}

// namesFor builds the names of LocalNames from what it found, without
// duplicates, public hosts first.
func namesFor(publicHosts []string, hostname string, addrs []net.IP) Names {
	var n Names
	seen := map[string]bool{}
	addIP := func(ip net.IP) {
		if v4 := ip.To4(); v4 != nil {
			ip = v4
		}
		if k := ip.String(); !seen["ip:"+k] {
			seen["ip:"+k] = true
			n.IPs = append(n.IPs, ip)
		}
	}
	addDNS := func(name string) {
		name = strings.TrimSuffix(strings.ToLower(name), ".")
		if name == "" || seen["dns:"+name] || pki.ValidateDNSName(name) != nil {
			return
		}
		seen["dns:"+name] = true
		n.DNS = append(n.DNS, name)
	}
	for _, h := range publicHosts {
		if ip := net.ParseIP(strings.Trim(h, "[]")); ip != nil {
			addIP(ip)
		} else {
			addDNS(h)
		}
	}
	addDNS("localhost")
	addIP(net.IPv4(127, 0, 0, 1))
	addIP(net.IPv6loopback)
	addDNS(hostname)
	for _, ip := range addrs {
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() || ip.IsMulticast() {
			continue
		}
		addIP(ip)
	}
	return n
}

// EnsureServingCert makes sure dir/certName and dir/keyName hold a serving
// certificate from b's gateway serving CA for exactly names, not within 30
// days of its end. Otherwise it issues one, keeping the key already in
// dir/keyName when that file holds one (so pins of the key survive a
// re-issue; delete the key file to rotate it), and reports issued. The
// files are written as WriteGatewayCert does (mode 0600, atomically).
func EnsureServingCert(b *pki.Bundle, dir, certName, keyName string, names Names) (certFile, keyFile string, issued bool, err error) {
	return ensureServingCertAt(b, dir, certName, keyName, names, time.Now())
}

// ensureServingCertAt is EnsureServingCert judging the certificate's end by
// now.
func ensureServingCertAt(b *pki.Bundle, dir, certName, keyName string, names Names, now time.Time) (certFile, keyFile string, issued bool, err error) {
	certFile, keyFile = filepath.Join(dir, certName), filepath.Join(dir, keyName)
	if certUsable(b, certFile, keyFile, names, now) {
		return certFile, keyFile, false, nil
	}
	var certPEM, keyPEM []byte
	oldKey, rerr := os.ReadFile(keyFile)
	if rerr == nil {
		certPEM, keyPEM, err = b.IssueGatewayWithKey(oldKey, names.DNS, names.IPs, 0)
	}
	if rerr != nil || err != nil {
		if rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			return "", "", false, fmt.Errorf("read %s: %w", keyFile, rerr)
		}
		// No key yet, or one that is not ours: a fresh one.
		certPEM, keyPEM, err = b.IssueGateway(names.DNS, names.IPs, 0)
	}
	if err != nil {
		return "", "", false, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", false, fmt.Errorf("create %s: %w", dir, err)
	}
	if err := writeFile(keyFile, keyPEM); err != nil {
		return "", "", false, err
	}
	if err := writeFile(certFile, certPEM); err != nil {
		return "", "", false, err
	}
	return certFile, keyFile, true, nil
}

// certUsable reports whether the files hold a key pair issued by b's
// gateway serving CA for exactly names that is not about to expire.
func certUsable(b *pki.Bundle, certFile, keyFile string, names Names, now time.Time) bool {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil || pair.Leaf == nil {
		return false
	}
	chain := make([]*x509.Certificate, 0, len(pair.Certificate))
	for _, der := range pair.Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return false
		}
		chain = append(chain, c)
	}
	if !jointoken.MatchPin(b.GatewayPin(), chain) || !bytes.Equal(pair.Leaf.RawIssuer, b.GatewayCA.Cert.RawSubject) {
		return false
	}
	if !names.equal(Names{DNS: pair.Leaf.DNSNames, IPs: pair.Leaf.IPAddresses}) {
		return false
	}
	return pair.Leaf.NotAfter.Sub(now) > renewBefore
}
