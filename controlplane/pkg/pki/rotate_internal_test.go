package pki

import (
	"crypto/ecdsa"
	"crypto/x509"
	"errors"
	"net"
	"testing"
	"time"
)

// verifiesAgainst reports whether chain (leaf first) verifies for client
// and server use up to one of roots.
func verifiesAgainst(chain []*x509.Certificate, roots []*x509.Certificate, now time.Time) error {
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
	return err
}

func TestInternalCARotation(t *testing.T) {
	t.Parallel()
	b, err := Init(InitOptions{TrustDomain: "compute.example"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	certPEM, keyPEM, err := b.issueInternal(now, "gw-1", []string{"gw-1.internal"}, []net.IP{net.IPv4(10, 0, 0, 11)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	oldChain := mustCerts(t, certPEM)
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	oldRoot := b.InternalCA.Cert
	if err := b.ActivateInternalCA(); !errors.Is(err, ErrRotation) {
		t.Fatalf("activate without prepare: %v", err)
	}
	if err := b.PrepareInternalCA(now, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.PrepareInternalCA(now, 0); !errors.Is(err, ErrRotation) {
		t.Fatalf("second prepare: %v", err)
	}
	b = roundTrip(t, b)
	if roots := b.InternalCARoots(); len(roots) != 2 || !roots[0].Equal(oldRoot) {
		t.Fatalf("roots while propagating: %d, first in force %v", len(roots), roots[0].Equal(oldRoot))
	}
	newRoot := b.NextInternalCA.Cert
	if err := b.ActivateInternalCA(); err != nil {
		t.Fatal(err)
	}
	b = roundTrip(t, b)
	chain, err := b.ReissueInternal(oldChain[0], key, now)
	if err != nil {
		t.Fatal(err)
	}
	leaf := chain[0]
	if !leaf.PublicKey.(*ecdsa.PublicKey).Equal(key.Public()) {
		t.Error("re-issued certificate is not for the file's key")
	}
	if leaf.URIs[0].String() != oldChain[0].URIs[0].String() || leaf.DNSNames[0] != "gw-1.internal" || !leaf.IPAddresses[0].Equal(net.IPv4(10, 0, 0, 11)) {
		t.Errorf("re-issued certificate names %v %v %v", leaf.URIs, leaf.DNSNames, leaf.IPAddresses)
	}
	if !chain[1].Equal(newRoot) {
		t.Error("re-issued chain does not end in the new CA")
	}
	// Activated: both the old file's chain and the re-issued one verify.
	for name, c := range map[string][]*x509.Certificate{"old": oldChain, "re-issued": chain} {
		if err := verifiesAgainst(c, b.InternalCARoots(), now); err != nil {
			t.Errorf("activated, %s certificate: %v", name, err)
		}
	}
	if err := b.RetireInternalCA(); err != nil {
		t.Fatal(err)
	}
	if err := verifiesAgainst(chain, b.InternalCARoots(), now); err != nil {
		t.Errorf("retired, re-issued certificate: %v", err)
	}
	if err := verifiesAgainst(oldChain, b.InternalCARoots(), now); err == nil {
		t.Error("retired, the old CA's certificate still verifies")
	}
	// A file from the retired CA is still known as this trust domain's
	// (by its issuer's name: nothing of the retired CA is kept), and
	// re-issued; one from another trust domain's internal CA is not.
	b = roundTrip(t, b)
	if !b.FromOtherInternalCA(oldChain[0]) || b.FromOtherInternalCA(leaf) {
		t.Error("FromOtherInternalCA: want true for the retired CA's certificate, false for the CA in force's")
	}
	other, err := Init(InitOptions{TrustDomain: "elsewhere.example"})
	if err != nil {
		t.Fatal(err)
	}
	foreignPEM, _, err := other.issueInternal(now, "gw-1", []string{"gw-1.internal"}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if b.FromOtherInternalCA(mustCerts(t, foreignPEM)[0]) {
		t.Error("another trust domain's internal certificate is taken for this one's")
	}
	// An expired file is not given a new life.
	if _, err := b.ReissueInternal(oldChain[0], key, oldChain[0].NotAfter.Add(time.Hour)); !errors.Is(err, ErrTTL) {
		t.Errorf("re-issue of an expired certificate: %v, want ErrTTL", err)
	}
	// A certificate with no internal SPIFFE ID is not re-issued.
	gwPEM, _, err := b.issueGateway(now, []string{"gw.example"}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ReissueInternal(mustCerts(t, gwPEM)[0], key, now); !errors.Is(err, ErrName) {
		t.Errorf("re-issue of a gateway certificate: %v", err)
	}
}

func TestInternalCARollback(t *testing.T) {
	t.Parallel()
	b, err := Init(InitOptions{TrustDomain: "compute.example"})
	if err != nil {
		t.Fatal(err)
	}
	old := b.InternalCA.Cert
	for _, activate := range []bool{false, true} {
		if err := b.PrepareInternalCA(time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
		if activate {
			if err := b.ActivateInternalCA(); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.RollbackInternalCA(); err != nil {
			t.Fatal(err)
		}
		if roots := b.InternalCARoots(); !b.InternalCA.Cert.Equal(old) || len(roots) != 1 {
			t.Fatalf("rollback (activated %v) did not restore the old CA alone: %d roots", activate, len(roots))
		}
	}
	if err := b.RollbackInternalCA(); !errors.Is(err, ErrRotation) {
		t.Fatalf("rollback with none open: %v", err)
	}
	if err := b.RetireInternalCA(); !errors.Is(err, ErrRotation) {
		t.Fatalf("retire with none open: %v", err)
	}
}
