package gateway

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/proto/jointoken"
)

// TestServingForGatewayRotation: the files' certificate is served as it
// is outside a rotation and while one propagates; once activated it is
// re-issued from the new CA for the same key with a chain both pins verify;
// once retired, with the new CA's chain alone.
func TestServingForGatewayRotation(t *testing.T) {
	t.Parallel()
	b, err := pki.Init(pki.InitOptions{TrustDomain: "td.example"})
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := b.IssueGateway([]string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	file, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	oldPin := b.GatewayPin()
	chainOf := func(c *tls.Certificate) []*x509.Certificate {
		t.Helper()
		var out []*x509.Certificate
		for _, der := range c.Certificate {
			x, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, x)
		}
		return out
	}
	for _, phase := range []string{"none", "propagating"} {
		if phase == "propagating" {
			if err := b.PrepareGatewayCA(now, 0); err != nil {
				t.Fatal(err)
			}
		}
		got, reissued, err := servingFor(b, &file, now)
		if err != nil || reissued || got != &file {
			t.Fatalf("%s: servingFor = reissued %v, %v; want the files' certificate", phase, reissued, err)
		}
	}
	newPin := b.GatewayPins()[1]
	if err := b.ActivateGatewayCA(); err != nil {
		t.Fatal(err)
	}
	got, reissued, err := servingFor(b, &file, now)
	if err != nil || !reissued {
		t.Fatalf("activated: reissued %v, %v", reissued, err)
	}
	chain := chainOf(got)
	if chain[0].CheckSignatureFrom(b.GatewayCA.Cert) != nil || !chain[0].PublicKey.(interface{ Equal(crypto.PublicKey) bool }).Equal(file.Leaf.PublicKey) {
		t.Fatal("activated: the leaf is not the files' key under the new CA")
	}
	for _, pin := range []string{oldPin, newPin} {
		if err := jointoken.VerifyChain(pin, chain, "localhost", now); err != nil {
			t.Errorf("activated, pin %s: %v", pin, err)
		}
	}
	if err := b.RetireGatewayCA(); err != nil {
		t.Fatal(err)
	}
	got, _, err = servingFor(b, &file, now)
	if err != nil {
		t.Fatal(err)
	}
	chain = chainOf(got)
	if len(chain) != 2 || jointoken.VerifyChain(newPin, chain, "localhost", now) != nil || jointoken.VerifyChain(oldPin, chain, "localhost", now) == nil {
		t.Fatalf("retired: a chain of %d that the new pin alone should verify", len(chain))
	}
}
