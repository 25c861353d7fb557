package rotation

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// AuditTokenRevoked is the audit action of a join token that a forced
// retirement of a gateway-CA rotation revoked because it pinned only the
// old gateway CA.
const AuditTokenRevoked = "pki.rotation.token-revoked"

// what names the Rotator's CA in messages.
func (r *Rotator) what() string {
	if r.cfg.CA == store.RotationCAGateway {
		return "gateway CA"
	}
	return "node CA"
}

// inForce is the id of the CA of r's kind in force in b.
func (r *Rotator) inForce(b *pki.Bundle) string {
	if r.cfg.CA == store.RotationCAGateway {
		return pki.NodeCAID(b.GatewayCA.Cert)
	}
	return pki.NodeCAID(b.NodeCA.Cert)
}

// next is the id of the CA of r's kind a rotation prepared in b.
func (r *Rotator) next(b *pki.Bundle) string {
	if r.cfg.CA == store.RotationCAGateway {
		return pki.NodeCAID(b.NextGatewayCA.Cert)
	}
	return pki.NodeCAID(b.NextNodeCA.Cert)
}

// prepare makes the next CA of r's kind in b.
func (r *Rotator) prepare(b *pki.Bundle, now time.Time) error {
	if r.cfg.CA == store.RotationCAGateway {
		return b.PrepareGatewayCA(now, r.cfg.CAValidity)
	}
	return b.PrepareNodeCA(now, r.cfg.CAValidity)
}

// apply changes b for a move to phase to.
func (r *Rotator) apply(b *pki.Bundle, to string) error {
	gw := r.cfg.CA == store.RotationCAGateway
	switch {
	case to == store.RotationActivated && gw:
		return b.ActivateGatewayCA()
	case to == store.RotationActivated:
		return b.ActivateNodeCA()
	case to == store.RotationRetired && gw:
		return b.RetireGatewayCA()
	case to == store.RotationRetired:
		return b.RetireNodeCA()
	case to == store.RotationRolledBack && gw:
		return b.RollbackGatewayCA()
	case to == store.RotationRolledBack:
		return b.RollbackNodeCA()
	}
	return nil
}

// gatewayRetireReady judges an activated gateway-CA rotation: it retires
// (and gateways stop serving the chain the old pin verifies) once every
// live node acknowledged the new roots and no join token pins only the old
// CA.
func (r *Rotator) gatewayRetireReady(out *Status) {
	var missing []string
	if out.Acked < out.Live {
		missing = append(missing, fmt.Sprintf("%d of %d live nodes acknowledged the new gateway CA", out.Acked, out.Live))
	}
	if out.OldPinTokens > 0 {
		missing = append(missing, fmt.Sprintf("%d join tokens made before the rotation pin only the old gateway CA and can still be used: %s (advance --force revokes them)",
			out.OldPinTokens, strings.Join(out.OldPinTokenIDs, ", ")))
	}
	out.Ready = len(missing) == 0
	out.Waiting = strings.Join(missing, "; ")
}

// tokenLister is what OldPinTokens reads.
type tokenLister interface {
	JoinTokenList(ctx context.Context, p *store.ListParams) ([]*store.JoinToken, error)
}

// OldPinTokens returns the ids of the join tokens made before a gateway-CA
// rotation started at startedAt, which pin only the old gateway CA, that
// can still be used at now: not revoked, not expired, uses left. Tokens
// made since pin both CAs (pki.Bundle.GatewayPins).
func OldPinTokens(ctx context.Context, st tokenLister, startedAt, now time.Time) ([]string, error) {
	var ids []string
	p := store.ListParams{Limit: store.MaxListLimit}
	for {
		toks, err := st.JoinTokenList(ctx, &p)
		if err != nil {
			return nil, fmt.Errorf("list join tokens: %w", err)
		}
		for _, t := range toks {
			if t.CreatedAt.Before(startedAt) && t.RevokedAt == nil && now.Before(t.ExpiresAt) && t.Uses < t.MaxUses {
				ids = append(ids, t.ID)
			}
		}
		if len(toks) < p.Limit {
			return ids, nil
		}
		p.Cursor = toks[len(toks)-1].ID
	}
}

// revokeOldPinTokens revokes, in tx, every join token that pins only the
// old gateway CA of ro, with an audit row each: a forced retirement.
func (r *Rotator) revokeOldPinTokens(ctx context.Context, tx rotationTx, ro *store.PKIRotation, actor string) error {
	ids, err := OldPinTokens(ctx, tx, ro.StartedAt, r.cfg.Now())
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := tx.JoinTokenRevoke(ctx, id); err != nil {
			return fmt.Errorf("revoke join token %s: %w", id, err)
		}
		details, err := json.Marshal(map[string]string{"rotation": ro.ID, "oldCaId": ro.OldCAID,
			"reason": "pins only the gateway CA that advance --force retired"})
		if err != nil {
			return err
		}
		if _, err := tx.AuditInsert(ctx, &store.AuditEntry{Actor: actorOr(actor), Action: AuditTokenRevoked,
			Resource: "join-token/" + id, Outcome: "success", Details: details}); err != nil {
			return err
		}
	}
	return nil
}

func actorOr(actor string) string {
	if actor == "" {
		return ActorReconciler
	}
	return actor
}
