package pki

import (
	"crypto/x509"
	"errors"
	"testing"
	"time"
)

// roundTrip marshals and unmarshals b, failing the test on an error.
func roundTrip(t *testing.T, b *Bundle) *Bundle {
	t.Helper()
	data, err := b.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	out, err := UnmarshalBundle(data)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestNodeCARotationPhases walks a bundle through prepare, activate and
// retire, checking at each phase which CA issues, which roots verify a
// session and which verify re-attestation, through a marshal round trip.
func TestNodeCARotationPhases(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "td")
	oldCA := b.NodeCA
	_, onOld := issueNode(t, b, "node-old", IssueOptions{})

	if err := b.ActivateNodeCA(); !errors.Is(err, ErrRotation) {
		t.Fatalf("ActivateNodeCA before prepare: error = %v, want ErrRotation", err)
	}
	if err := b.PrepareNodeCA(testNow, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.PrepareNodeCA(testNow, 0); !errors.Is(err, ErrRotation) {
		t.Fatalf("PrepareNodeCA twice: error = %v, want ErrRotation", err)
	}
	b = roundTrip(t, b)
	if !b.NodeCA.Cert.Equal(oldCA.Cert) || b.NextNodeCA == nil {
		t.Fatal("propagating: the old CA must still issue, with the next one kept")
	}
	if len(b.NodeCARoots()) != 2 {
		t.Fatalf("propagating: %d roots, want old + new", len(b.NodeCARoots()))
	}
	newCert := b.NextNodeCA.Cert
	_, stillOld := issueNode(t, b, "node-2", IssueOptions{})
	if err := stillOld.CheckSignatureFrom(oldCA.Cert); err != nil {
		t.Fatalf("propagating: issued by another CA than the old one: %v", err)
	}

	if err := b.ActivateNodeCA(); err != nil {
		t.Fatal(err)
	}
	b = roundTrip(t, b)
	_, onNew := issueNode(t, b, "node-new", IssueOptions{})
	if err := onNew.CheckSignatureFrom(newCert); err != nil {
		t.Fatalf("activated: not issued by the new CA: %v", err)
	}
	for name, c := range map[string]*x509.Certificate{"old": onOld, "new": onNew} {
		if _, _, err := b.VerifyNode([]*x509.Certificate{c}, testNow); err != nil {
			t.Fatalf("activated: certificate on the %s CA does not verify: %v", name, err)
		}
	}

	if err := b.RetireNodeCA(); err != nil {
		t.Fatal(err)
	}
	b = roundTrip(t, b)
	if _, _, err := b.VerifyNode([]*x509.Certificate{onOld}, testNow); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("retired: certificate on the old CA: error = %v, want ErrUntrusted", err)
	}
	if _, _, err := b.ReattestVerifier().Verify([]*x509.Certificate{onOld}, testNow); err != nil {
		t.Fatalf("retired: the old certificate must still verify re-attestation: %v", err)
	}
	if n := b.PruneRetiredNodeRoots(func(*x509.Certificate) bool { return false }); n != 1 {
		t.Fatalf("PruneRetiredNodeRoots dropped %d, want 1", n)
	}
	if _, _, err := b.ReattestVerifier().Verify([]*x509.Certificate{onOld}, testNow); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("pruned: error = %v, want ErrUntrusted", err)
	}
	if err := b.RetireNodeCA(); !errors.Is(err, ErrRotation) {
		t.Fatalf("RetireNodeCA twice: error = %v, want ErrRotation", err)
	}
}

// TestNodeCARollback rolls back from propagating (the next CA is dropped)
// and from activated (the old CA issues again; the new one's certificates
// keep verifying).
func TestNodeCARollback(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "td")
	oldCA := b.NodeCA
	if err := b.RollbackNodeCA(); !errors.Is(err, ErrRotation) {
		t.Fatalf("RollbackNodeCA with no rotation: error = %v, want ErrRotation", err)
	}
	if err := b.PrepareNodeCA(testNow, time.Hour*24*365); err != nil {
		t.Fatal(err)
	}
	if err := b.RollbackNodeCA(); err != nil {
		t.Fatal(err)
	}
	if b.NextNodeCA != nil || len(b.NodeCARoots()) != 1 || !b.NodeCA.Cert.Equal(oldCA.Cert) {
		t.Fatal("rollback from propagating left the next CA")
	}

	if err := b.PrepareNodeCA(testNow, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.ActivateNodeCA(); err != nil {
		t.Fatal(err)
	}
	_, onNew := issueNode(t, b, "node-new", IssueOptions{})
	if err := b.RollbackNodeCA(); err != nil {
		t.Fatal(err)
	}
	b = roundTrip(t, b)
	if !b.NodeCA.Cert.Equal(oldCA.Cert) || b.PreviousNodeCA != nil {
		t.Fatal("rollback from activated: the old CA is not the issuer")
	}
	_, back := issueNode(t, b, "node-back", IssueOptions{})
	if err := back.CheckSignatureFrom(oldCA.Cert); err != nil {
		t.Fatalf("after rollback: not issued by the old CA: %v", err)
	}
	if _, _, err := b.VerifyNode([]*x509.Certificate{onNew}, testNow); err != nil {
		t.Fatalf("after rollback: a certificate of the rolled-back CA must still verify: %v", err)
	}
}
