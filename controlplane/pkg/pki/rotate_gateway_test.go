package pki

import (
	"crypto/x509"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/better-compute/better-compute/proto/jointoken"
)

func TestGatewayCARotation(t *testing.T) {
	t.Parallel()
	b, err := Init(InitOptions{TrustDomain: "compute.example"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	oldPin := b.GatewayPin()
	certPEM, keyPEM, err := b.issueGateway(now, []string{"gw.example"}, []net.IP{net.IPv4(127, 0, 0, 1)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	oldLeaf := mustCerts(t, certPEM)[0]
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ActivateGatewayCA(); !errors.Is(err, ErrRotation) {
		t.Fatalf("activate without prepare: %v", err)
	}
	if err := b.PrepareGatewayCA(now, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.PrepareGatewayCA(now, 0); !errors.Is(err, ErrRotation) {
		t.Fatalf("second prepare: %v", err)
	}
	pins := b.GatewayPins()
	if len(pins) != 2 || pins[0] != oldPin {
		t.Fatalf("pins while propagating: %v", pins)
	}
	newPin := pins[1]
	b = roundTrip(t, b)
	if err := b.ActivateGatewayCA(); err != nil {
		t.Fatal(err)
	}
	b = roundTrip(t, b)
	if b.GatewayPin() != newPin {
		t.Fatal("activated bundle does not serve from the new CA")
	}
	leaf, err := b.ReissueGateway(oldLeaf, key, now)
	if err != nil {
		t.Fatal(err)
	}
	tail, err := b.GatewayServingChain()
	if err != nil {
		t.Fatal(err)
	}
	chain := append([]*x509.Certificate{leaf}, tail...)
	for _, pin := range []string{oldPin, newPin} {
		if err := jointoken.VerifyChain(pin, chain, "gw.example", now); err != nil {
			t.Errorf("activated chain, pin %s: %v", pin, err)
		}
	}
	if err := b.RetireGatewayCA(); err != nil {
		t.Fatal(err)
	}
	tail, err = b.GatewayServingChain()
	if err != nil {
		t.Fatal(err)
	}
	chain = append([]*x509.Certificate{leaf}, tail...)
	if err := jointoken.VerifyChain(newPin, chain, "gw.example", now); err != nil {
		t.Errorf("retired chain, new pin: %v", err)
	}
	if err := jointoken.VerifyChain(oldPin, chain, "gw.example", now); !errors.Is(err, jointoken.ErrPinMismatch) {
		t.Errorf("retired chain, old pin: %v", err)
	}
	if len(b.GatewayPins()) != 1 {
		t.Errorf("pins after retire: %v", b.GatewayPins())
	}
}

func TestGatewayCARollback(t *testing.T) {
	t.Parallel()
	b, err := Init(InitOptions{TrustDomain: "compute.example"})
	if err != nil {
		t.Fatal(err)
	}
	oldPin := b.GatewayPin()
	for _, activate := range []bool{false, true} {
		if err := b.PrepareGatewayCA(time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
		if activate {
			if err := b.ActivateGatewayCA(); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.RollbackGatewayCA(); err != nil {
			t.Fatal(err)
		}
		if b.GatewayPin() != oldPin || len(b.GatewayPins()) != 1 {
			t.Fatalf("rollback (activated %v) did not restore the old CA", activate)
		}
	}
	if err := b.RollbackGatewayCA(); !errors.Is(err, ErrRotation) {
		t.Fatalf("rollback with none open: %v", err)
	}
}

func mustCerts(t *testing.T, pemData []byte) []*x509.Certificate {
	t.Helper()
	certs, err := ParseCertificatesPEM(pemData)
	if err != nil {
		t.Fatal(err)
	}
	return certs
}
