package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// RenewRequest is a node asking for a new certificate. The caller has
// authenticated the node (mutual TLS with its current, unrevoked
// certificate); NodeID comes from that certificate, never from the request.
type RenewRequest struct {
	NodeID string
	// CSR is the DER PKCS #10 request; the node may keep or rotate its key.
	CSR []byte
	// Serial is the serial of the certificate the node authenticated with,
	// for the audit log.
	Serial string
	Source string
	Via    string
}

// Renew issues a new certificate for an authenticated node and records it on
// the node, with an audit row, in one transaction. The previous certificate
// is not revoked: the session it authenticated stays up, and it expires on
// its own (the node renews two thirds into its life). A malformed CSR is a
// refusal wrapping ErrRefused and ErrInvalidRequest; an unknown node wraps
// store.ErrNotFound.
func (a *Admitter) Renew(ctx context.Context, req *RenewRequest) (*pki.Issued, error) {
	details := auditDetails{Via: req.Via, PreviousSerial: req.Serial}
	entry := &store.AuditEntry{Actor: "node:" + req.NodeID, Action: ActionRenew, Resource: "node/" + req.NodeID, SourceIP: req.Source}
	if len(req.CSR) > MaxCSRSize {
		err := fmt.Errorf("%w: %w: CSR is %d bytes, at most %d", ErrRefused, ErrInvalidRequest, len(req.CSR), MaxCSRSize)
		a.audit(ctx, entry, &details, OutcomeRefused, err)
		return nil, err
	}
	cert, err := a.issue(ctx, req.CSR, req.NodeID, pki.IssueOptions{Now: a.cfg.Now(), TTL: a.cfg.NodeCertTTL})
	switch {
	case errors.Is(err, pki.ErrCSRInvalid) || errors.Is(err, pki.ErrKeyType):
		err = fmt.Errorf("%w: %w: %w", ErrRefused, ErrInvalidRequest, err)
		a.audit(ctx, entry, &details, OutcomeRefused, err)
		return nil, err
	case err != nil:
		err = fmt.Errorf("renew: %w", err)
		a.audit(ctx, entry, &details, OutcomeError, err)
		return nil, err
	}
	details.Serial = cert.Serial
	err = store.InTx(ctx, a.store, func(tx renewTx) error {
		err := tx.NodeSetCertificate(ctx, &store.NodeSetCertificateParams{
			ID: req.NodeID, Serial: cert.Serial, NotAfter: cert.NotAfter, KeySHA256: cert.KeySHA256, CAID: cert.CAID,
		})
		if err != nil {
			return err
		}
		ok := *entry
		ok.Outcome, ok.Details = OutcomeSuccess, mustJSON(details)
		_, err = tx.AuditInsert(ctx, &ok)
		return err
	})
	if err != nil {
		err = fmt.Errorf("renew certificate of node %s: %w", req.NodeID, err)
		a.audit(ctx, entry, &details, OutcomeError, err)
		return nil, err
	}
	a.log.InfoContext(ctx, "Node certificate renewed", logkey.NodeID, req.NodeID, "serial", cert.Serial, "previous_serial", req.Serial)
	return cert, nil
}

// ReattestRequest is a node whose certificate expired asking for a new one.
// The caller checked the node's KeyProof (Proven); nothing else in the
// request is trusted.
type ReattestRequest struct {
	Proven ProvenKey
	// CSR is the DER PKCS #10 request for the new certificate's key.
	CSR    []byte
	Source string
	Via    string
}

// Reattest issues a new certificate to a node that proved the key of its
// latest certificate, when that certificate expired less than
// Config.ReattestGrace ago (DESIGN.md, "Re-attestation after an outage"),
// and records it with a node.reattested audit row, in one transaction.
// Refusals wrap ErrRefused with ErrGracePassed, ErrUnknownNode,
// ErrNotLatestKey, ErrNodeRevoked or ErrInvalidRequest; each leaves a
// refused audit row.
func (a *Admitter) Reattest(ctx context.Context, req *ReattestRequest) (*pki.Issued, error) {
	p := req.Proven
	details := auditDetails{Via: req.Via, PreviousSerial: p.Serial, NotAfter: p.NotAfter.UTC().Format(time.RFC3339)}
	entry := &store.AuditEntry{Actor: "node:" + p.NodeID, Action: ActionReattest, Resource: "node/" + p.NodeID, SourceIP: req.Source}
	refuse := func(err error) (*pki.Issued, error) {
		a.audit(ctx, entry, &details, OutcomeRefused, err)
		a.log.InfoContext(ctx, "Re-attestation refused", logkey.NodeID, p.NodeID, "source", req.Source, logkey.Err, err)
		return nil, err
	}
	now := a.cfg.Now()
	switch {
	case a.cfg.ReattestGrace == 0:
		return refuse(fmt.Errorf("%w: %w: re-attestation is off on this deployment (pki.reattestGrace 0)", ErrRefused, ErrGracePassed))
	case now.Sub(p.NotAfter) > a.cfg.ReattestGrace:
		return refuse(fmt.Errorf("%w: %w: certificate expired at %s, more than %s ago", ErrRefused, ErrGracePassed,
			p.NotAfter.UTC().Format(time.RFC3339), a.cfg.ReattestGrace))
	case len(req.CSR) > MaxCSRSize:
		return refuse(fmt.Errorf("%w: %w: CSR is %d bytes, at most %d", ErrRefused, ErrInvalidRequest, len(req.CSR), MaxCSRSize))
	}
	cert, err := a.issue(ctx, req.CSR, p.NodeID, pki.IssueOptions{Now: now, TTL: a.cfg.NodeCertTTL})
	switch {
	case errors.Is(err, pki.ErrCSRInvalid) || errors.Is(err, pki.ErrKeyType):
		return refuse(fmt.Errorf("%w: %w: %w", ErrRefused, ErrInvalidRequest, err))
	case err != nil:
		err = fmt.Errorf("reattest: %w", err)
		a.audit(ctx, entry, &details, OutcomeError, err)
		return nil, err
	}
	details.Serial = cert.Serial
	err = store.InTx(ctx, a.store, func(tx reattestTx) error {
		if _, err := a.provenNode(ctx, tx, &p); err != nil {
			return err
		}
		err := tx.NodeSetCertificate(ctx, &store.NodeSetCertificateParams{
			ID: p.NodeID, Serial: cert.Serial, NotAfter: cert.NotAfter, KeySHA256: cert.KeySHA256, CAID: cert.CAID, Reattested: true,
		})
		if err != nil {
			return err
		}
		ok := *entry
		ok.Outcome, ok.Details = OutcomeSuccess, mustJSON(details)
		_, err = tx.AuditInsert(ctx, &ok)
		return err
	})
	switch {
	case errors.Is(err, ErrRefused):
		return refuse(err)
	case err != nil:
		err = fmt.Errorf("reattest node %s: %w", p.NodeID, err)
		a.audit(ctx, entry, &details, OutcomeError, err)
		return nil, err
	}
	a.log.InfoContext(ctx, "Node re-attested", logkey.NodeID, p.NodeID, "serial", cert.Serial, "previous_serial", p.Serial,
		"expired_for", now.Sub(p.NotAfter).Round(time.Second), "source", req.Source)
	return cert, nil
}

// ReattestGrace is the configured re-attestation grace (zero: off).
func (a *Admitter) ReattestGrace() time.Duration { return a.cfg.ReattestGrace }

// issue issues a node certificate from the node CA in force, and warns when
// it had to be cut short to the CA's end (pki.Issued.CutShort): the node
// then renews sooner, and the rotation reconciler (pki.autoRotate) did not
// activate the next CA in time.
func (a *Admitter) issue(ctx context.Context, csr []byte, nodeID string, opts pki.IssueOptions) (*pki.Issued, error) {
	cert, err := a.bundle.Load().IssueNode(csr, nodeID, opts)
	if err == nil && cert.CutShort {
		a.log.WarnContext(ctx, "Node certificate cut short to the node CA's end: rotate the node CA (better-compute pki rotate node-ca start)",
			logkey.NodeID, nodeID, "not_after", cert.NotAfter, "issuer", cert.CAID)
	}
	return cert, err
}
