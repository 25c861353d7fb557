package rotation

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
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
	switch r.cfg.CA {
	case store.RotationCAGateway:
		return "gateway CA"
	case store.RotationCAInternal:
		return "internal CA"
	}
	return "node CA"
}

// inForce is the id of the CA of r's kind in force in b.
func (r *Rotator) inForce(b *pki.Bundle) string {
	switch r.cfg.CA {
	case store.RotationCAGateway:
		return pki.NodeCAID(b.GatewayCA.Cert)
	case store.RotationCAInternal:
		return pki.NodeCAID(b.InternalCA.Cert)
	}
	return pki.NodeCAID(b.NodeCA.Cert)
}

// next is the id of the CA of r's kind a rotation prepared in b.
func (r *Rotator) next(b *pki.Bundle) string {
	switch r.cfg.CA {
	case store.RotationCAGateway:
		return pki.NodeCAID(b.NextGatewayCA.Cert)
	case store.RotationCAInternal:
		return pki.NodeCAID(b.NextInternalCA.Cert)
	}
	return pki.NodeCAID(b.NextNodeCA.Cert)
}

// prepare makes the next CA of r's kind in b.
func (r *Rotator) prepare(b *pki.Bundle, now time.Time) error {
	switch r.cfg.CA {
	case store.RotationCAGateway:
		return b.PrepareGatewayCA(now, r.cfg.CAValidity)
	case store.RotationCAInternal:
		return b.PrepareInternalCA(now, r.cfg.CAValidity)
	}
	return b.PrepareNodeCA(now, r.cfg.CAValidity)
}

// phaseSteps are the bundle's changes of one CA, by the phase moved to.
type phaseSteps map[string]func(*pki.Bundle) error

var steps = map[string]phaseSteps{
	store.RotationCANode: {store.RotationActivated: (*pki.Bundle).ActivateNodeCA,
		store.RotationRetired: (*pki.Bundle).RetireNodeCA, store.RotationRolledBack: (*pki.Bundle).RollbackNodeCA},
	store.RotationCAGateway: {store.RotationActivated: (*pki.Bundle).ActivateGatewayCA,
		store.RotationRetired: (*pki.Bundle).RetireGatewayCA, store.RotationRolledBack: (*pki.Bundle).RollbackGatewayCA},
	store.RotationCAInternal: {store.RotationActivated: (*pki.Bundle).ActivateInternalCA,
		store.RotationRetired: (*pki.Bundle).RetireInternalCA, store.RotationRolledBack: (*pki.Bundle).RollbackInternalCA},
}

// apply changes b for a move to phase to.
func (r *Rotator) apply(b *pki.Bundle, to string) error {
	if step := steps[r.cfg.CA][to]; step != nil {
		return step(b)
	}
	return nil
}

// processLister is what the internal CA's status reads.
type processLister interface {
	ProcessList(ctx context.Context) ([]*store.Process, error)
}

// internalStatus fills out's counts for an internal-CA rotation from the
// processes' rows: the live ones are the registered processes that have
// the internal control API (they report internal CAs), and api or gateway
// processes of a build too old to report (counted as neither trusting nor
// presenting the new CA: upgrade them, or advance --force); acked, those
// that trust the new CA; off the new CA, those that present a certificate
// from another one. Processes are few; the count is done here.
func internalStatus(ctx context.Context, st processLister, ro *store.PKIRotation, out *Status) error {
	procs, err := st.ProcessList(ctx)
	if err != nil {
		return fmt.Errorf("list processes: %w", err)
	}
	for _, p := range procs {
		switch {
		case slices.Equal(p.InternalCAs, []string{store.NoInternalAPI}):
			continue
		case len(p.InternalCAs) == 0 && !slices.Contains(p.Roles, "api") && !slices.Contains(p.Roles, "gateway"):
			continue // an older build's process that uses no internal control API
		}
		out.Live++
		if slices.Contains(p.InternalCAs, ro.NewCAID) {
			out.Acked++
		} else if len(out.Missing) < MissingListed {
			out.Missing = append(out.Missing, p.ID)
		}
		if p.InternalCertCA != ro.NewCAID {
			out.OffNewCA++
			if len(out.OffNewCAIDs) < MissingListed {
				out.OffNewCAIDs = append(out.OffNewCAIDs, p.ID)
			}
		}
	}
	return nil
}

// internalReady judges an internal-CA rotation: it activates once every
// process with the internal control API trusts the new CA (none at all is
// no obstacle: nothing uses the CA, and a process loads the bundle when it
// starts), and retires once each of them presents a certificate from it.
// The threshold does not apply: one process that cannot verify its peers
// fails every call to it.
func internalReady(ro *store.PKIRotation, out *Status) {
	switch ro.Phase {
	case store.RotationPropagating:
		out.Ready = out.Acked == out.Live
		if !out.Ready {
			out.Waiting = fmt.Sprintf("%d of %d processes with the internal control API trust the new internal CA; waiting for %s",
				out.Acked, out.Live, strings.Join(out.Missing, ", "))
		}
	case store.RotationActivated:
		out.Ready = out.OffNewCA == 0 && out.Acked == out.Live
		if !out.Ready {
			out.Waiting = fmt.Sprintf("%d of %d processes with the internal control API still present a certificate from another internal CA: %s",
				out.OffNewCA, out.Live, strings.Join(out.OffNewCAIDs, ", "))
		}
	}
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
