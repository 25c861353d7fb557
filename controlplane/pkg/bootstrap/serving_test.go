package bootstrap

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
)

func TestNamesFor(t *testing.T) {
	t.Parallel()
	addrs := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.1.2.3"), net.ParseIP("fe80::1"), net.ParseIP("169.254.1.1"),
		net.ParseIP("2001:db8::7"), net.ParseIP("::1"), net.ParseIP("10.1.2.3")}
	n := namesFor([]string{"Compute.Example.com", "192.0.2.10", "compute.example.com"}, "gpu-host-1", addrs)
	if want := []string{"compute.example.com", "localhost", "gpu-host-1"}; !slices.Equal(n.DNS, want) {
		t.Errorf("DNS = %v, want %v", n.DNS, want)
	}
	var ips []string
	for _, ip := range n.IPs {
		ips = append(ips, ip.String())
	}
	if want := []string{"192.0.2.10", "127.0.0.1", "::1", "10.1.2.3", "2001:db8::7"}; !slices.Equal(ips, want) {
		t.Errorf("IPs = %v, want %v (no link-local, no duplicates)", ips, want)
	}
	// A hostname that is no DNS name is left out, not an error.
	if n := namesFor(nil, "bad_host name", nil); slices.Contains(n.DNS, "bad_host name") || len(n.DNS) != 1 {
		t.Errorf("DNS = %v", n.DNS)
	}
	if !n.equal(Names{DNS: []string{"gpu-host-1", "LOCALHOST", "compute.example.com"}, IPs: []net.IP{
		net.ParseIP("2001:db8::7"), net.ParseIP("10.1.2.3"), net.ParseIP("::1"), net.ParseIP("127.0.0.1"), net.ParseIP("192.0.2.10")}}) {
		t.Error("the same names in another order are not equal")
	}
	if n.equal(Names{DNS: n.DNS, IPs: n.IPs[1:]}) {
		t.Error("a missing address compares equal")
	}
}

func TestLocalNamesHoldTheMachine(t *testing.T) {
	t.Parallel()
	n := LocalNames([]string{"gw.example.com"})
	if n.DNS[0] != "gw.example.com" || !slices.Contains(n.DNS, "localhost") {
		t.Fatalf("names %v", n)
	}
	if h, err := os.Hostname(); err == nil && pki.ValidateDNSName(h) == nil && !slices.Contains(n.DNS, h) {
		t.Errorf("the hostname %s is missing from %v", h, n)
	}
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range ifaddrs {
		ip := a.(*net.IPNet).IP
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() {
			continue
		}
		if !slices.ContainsFunc(n.IPs, ip.Equal) {
			t.Errorf("interface address %s is missing from %v", ip, n)
		}
	}
}

func TestEnsureServingCertReissuesForNewNamesWithTheSameKey(t *testing.T) {
	t.Parallel()
	b, err := pki.Init(pki.InitOptions{TrustDomain: "example.com"})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "pki")
	first := Names{DNS: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1).To4()}}
	cert, key, issued, err := EnsureServingCert(b, dir, APICertFile, APIKeyFile, first)
	if err != nil || !issued {
		t.Fatalf("first: issued %v, %v", issued, err)
	}
	leaf1 := leaf(t, cert, key)

	if _, _, issued, err := EnsureServingCert(b, dir, APICertFile, APIKeyFile, first); err != nil || issued {
		t.Fatalf("same names: issued %v, %v; want the certificate kept", issued, err)
	}
	second := Names{DNS: []string{"gw.example.com", "localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1).To4(), net.ParseIP("192.0.2.7")}}
	if _, _, issued, err := EnsureServingCert(b, dir, APICertFile, APIKeyFile, second); err != nil || !issued {
		t.Fatalf("new names: issued %v, %v; want a re-issue", issued, err)
	}
	leaf2 := leaf(t, cert, key)
	if leaf2.SerialNumber.Cmp(leaf1.SerialNumber) == 0 {
		t.Fatal("not re-issued")
	}
	if string(leaf2.RawSubjectPublicKeyInfo) != string(leaf1.RawSubjectPublicKeyInfo) {
		t.Error("the re-issued certificate has a new key: pins of the old one break")
	}
	if err := leaf2.VerifyHostname("192.0.2.7"); err != nil {
		t.Error(err)
	}
	if err := leaf2.VerifyHostname("gw.example.com"); err != nil {
		t.Error(err)
	}
	// A removed name is a change too.
	if _, _, issued, _ := EnsureServingCert(b, dir, APICertFile, APIKeyFile, first); !issued {
		t.Error("a certificate naming more than wanted was kept")
	}
	// Another CA (a new bundle) re-issues; the key still survives.
	other, _ := pki.Init(pki.InitOptions{TrustDomain: "example.com"})
	if _, _, issued, err := EnsureServingCert(other, dir, APICertFile, APIKeyFile, first); err != nil || !issued {
		t.Fatalf("other CA: issued %v, %v", issued, err)
	}
	if l := leaf(t, cert, key); string(l.RawSubjectPublicKeyInfo) != string(leaf1.RawSubjectPublicKeyInfo) || string(l.RawIssuer) != string(other.GatewayCA.Cert.RawSubject) {
		t.Error("want the new CA's certificate on the old key")
	}
	// A key file that holds no key of ours is replaced.
	if err := os.WriteFile(key, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, issued, err := EnsureServingCert(other, dir, APICertFile, APIKeyFile, first); err != nil || !issued {
		t.Fatalf("garbage key: issued %v, %v", issued, err)
	}
	leaf(t, cert, key)
}

func leaf(t *testing.T, cert, key string) *x509.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	return pair.Leaf
}
