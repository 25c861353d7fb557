package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"time"
)

// ErrRotation reports a node-CA rotation step that does not fit the
// bundle's state: preparing while a rotation is in progress, activating
// without a prepared CA, retiring without an activated one, rolling back
// with nothing to roll back.
var ErrRotation = errors.New("node CA rotation step does not apply")

// PrepareNodeCA makes the next node CA at now (zero: time.Now()), valid for
// validity (zero: DefaultCAValidity), and keeps it in NextNodeCA: trusted
// (NodeCARoots lists it) but not issuing. It fails with ErrRotation while a
// rotation is in progress (NextNodeCA or PreviousNodeCA set), and with
// ErrBundleInvalid for an invalid bundle. DESIGN.md, "CA rotation": the
// prepare phase.
func (b *Bundle) PrepareNodeCA(now time.Time, validity time.Duration) error {
	return b.prepareNext(kindNode, "node", &b.NextNodeCA, b.PreviousNodeCA, now, validity)
}

// prepareNext makes the next CA of kind (named what in errors) into *next,
// unless a rotation of that CA is open (*next or previous set): the
// prepare phase every CA's rotation shares.
func (b *Bundle) prepareNext(kind caKind, what string, next **CA, previous *CA, now time.Time, validity time.Duration) error {
	if err := b.Validate(); err != nil {
		return fmt.Errorf("prepare %s CA: %w", what, err)
	}
	if *next != nil || previous != nil {
		return fmt.Errorf("prepare %s CA: %w: a %s CA rotation is in progress", what, ErrRotation, what)
	}
	now, validity, err := caTimes(now, validity)
	if err != nil {
		return fmt.Errorf("prepare %s CA: %w", what, err)
	}
	ca, err := newCA(kind, b.TrustDomain, now, validity)
	if err != nil {
		return fmt.Errorf("prepare %s CA: %w", what, err)
	}
	*next = ca
	return nil
}

// ActivateNodeCA makes NextNodeCA the issuer and keeps the old node CA,
// key included, in PreviousNodeCA: still trusted, and the issuer again if
// the rotation is rolled back. It fails with ErrRotation without a
// prepared CA.
func (b *Bundle) ActivateNodeCA() error {
	if b.NextNodeCA == nil {
		return fmt.Errorf("activate node CA: %w: no prepared node CA", ErrRotation)
	}
	b.PreviousNodeCA, b.NodeCA, b.NextNodeCA = b.NodeCA, b.NextNodeCA, nil
	return nil
}

// RetireNodeCA drops PreviousNodeCA from the trusted roots and its key, and
// keeps its certificate in RetiredNodeRoots, which verify re-attestation
// only (ReattestRoots) until PruneRetiredNodeRoots drops them. It fails
// with ErrRotation without an activated rotation.
func (b *Bundle) RetireNodeCA() error {
	if b.PreviousNodeCA == nil {
		return fmt.Errorf("retire node CA: %w: no activated rotation", ErrRotation)
	}
	b.RetiredNodeRoots = append(b.RetiredNodeRoots, b.PreviousNodeCA.Cert)
	b.PreviousNodeCA = nil
	return nil
}

// RollbackNodeCA undoes a rotation that is not retired. Prepared only, it
// drops NextNodeCA (it issued nothing). Activated, it makes PreviousNodeCA
// the issuer again and keeps the rolled-back CA's certificate in
// PreviousNodeRoots, so that certificates it issued keep verifying until
// their nodes renew from the old CA; its key is dropped. It fails with
// ErrRotation when no rotation is in progress.
func (b *Bundle) RollbackNodeCA() error {
	switch {
	case b.NextNodeCA != nil:
		b.NextNodeCA = nil
	case b.PreviousNodeCA != nil:
		b.PreviousNodeRoots = append(b.PreviousNodeRoots, b.NodeCA.Cert)
		b.NodeCA, b.PreviousNodeCA = b.PreviousNodeCA, nil
	default:
		return fmt.Errorf("roll back node CA: %w: no rotation in progress", ErrRotation)
	}
	return nil
}

// ReattestRoots returns the roots a re-attestation proof's chain may chain
// to: NodeCARoots, then RetiredNodeRoots. A node that slept through a
// rotation proves its old certificate against these.
func (b *Bundle) ReattestRoots() []*x509.Certificate {
	return append(b.NodeCARoots(), b.RetiredNodeRoots...)
}

// ReattestVerifier returns a NodeVerifier over ReattestRoots.
func (b *Bundle) ReattestVerifier() *NodeVerifier {
	return &NodeVerifier{Roots: certPool(b.ReattestRoots()), TrustDomain: b.TrustDomain}
}

// PruneRetiredNodeRoots drops the retired roots for which keep reports
// false and returns how many it dropped.
func (b *Bundle) PruneRetiredNodeRoots(keep func(*x509.Certificate) bool) int {
	before := len(b.RetiredNodeRoots)
	out := b.RetiredNodeRoots[:0]
	for _, c := range b.RetiredNodeRoots {
		if keep(c) {
			out = append(out, c)
		}
	}
	b.RetiredNodeRoots = out
	return before - len(out)
}

// NodeCAID names a node CA certificate in rotation records and status: the
// serial of its certificate, as FormatSerial spells it.
func NodeCAID(c *x509.Certificate) string {
	return FormatSerial(c.SerialNumber)
}

// CAMadeAt is when a CA certificate this package made was made: its
// NotBefore, which is backdated, plus the backdate. A CA's life runs from
// CAMadeAt to its NotAfter; the rotation reconciler times a node-CA
// rotation by it (docs/pki.md, "Rotating the node CA").
func CAMadeAt(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(caBackdate)
}
