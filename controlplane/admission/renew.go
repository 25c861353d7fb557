package admission

import (
	"context"
	"errors"
	"fmt"

	"github.com/better-compute/better-compute/controlplane/pki"
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
	cert, err := a.bundle.IssueNode(req.CSR, req.NodeID, pki.IssueOptions{Now: a.cfg.Now(), TTL: a.cfg.NodeCertTTL})
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
	err = a.store.Tx(ctx, func(tx store.Store) error {
		n, err := tx.NodeGet(ctx, req.NodeID)
		if err != nil {
			return err
		}
		notAfter := cert.NotAfter
		_, err = tx.NodeUpsert(ctx, &store.NodeUpsertParams{
			ID: n.ID, PoolID: n.PoolID, Hostname: n.Hostname, MachineID: n.MachineID, Labels: n.Labels,
			BCDVersion: n.BCDVersion, OS: n.OS, Arch: n.Arch, CertSerial: cert.Serial, CertNotAfter: &notAfter,
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
	a.log.InfoContext(ctx, "Node certificate renewed", "node_id", req.NodeID, "serial", cert.Serial, "previous_serial", req.Serial)
	return cert, nil
}
