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

// caKind is what differs between the CAs that rotate in phases: its name
// in messages, where the bundle keeps it in force and prepared, and the
// bundle's change for each phase.
type caKind struct {
	what     string
	inForce  func(*pki.Bundle) *pki.CA
	next     func(*pki.Bundle) *pki.CA
	prepare  func(b *pki.Bundle, now time.Time, validity time.Duration) error
	activate func(*pki.Bundle) error
	retire   func(*pki.Bundle) error
	rollback func(*pki.Bundle) error
}

// caKinds are the CAs that rotate in phases, by store.RotationCA*.
var caKinds = map[string]caKind{
	store.RotationCANode: {"node CA", func(b *pki.Bundle) *pki.CA { return b.NodeCA }, func(b *pki.Bundle) *pki.CA { return b.NextNodeCA },
		(*pki.Bundle).PrepareNodeCA, (*pki.Bundle).ActivateNodeCA, (*pki.Bundle).RetireNodeCA, (*pki.Bundle).RollbackNodeCA},
	store.RotationCAGateway: {"gateway CA", func(b *pki.Bundle) *pki.CA { return b.GatewayCA }, func(b *pki.Bundle) *pki.CA { return b.NextGatewayCA },
		(*pki.Bundle).PrepareGatewayCA, (*pki.Bundle).ActivateGatewayCA, (*pki.Bundle).RetireGatewayCA, (*pki.Bundle).RollbackGatewayCA},
	store.RotationCAInternal: {"internal CA", func(b *pki.Bundle) *pki.CA { return b.InternalCA }, func(b *pki.Bundle) *pki.CA { return b.NextInternalCA },
		(*pki.Bundle).PrepareInternalCA, (*pki.Bundle).ActivateInternalCA, (*pki.Bundle).RetireInternalCA, (*pki.Bundle).RollbackInternalCA},
}

// kind is the Rotator's CA (New checked Config.CA).
func (r *Rotator) kind() caKind { return caKinds[r.cfg.CA] }

// what names the Rotator's CA in messages.
func (r *Rotator) what() string { return r.kind().what }

// inForce is the id of the CA of r's kind in force in b.
func (r *Rotator) inForce(b *pki.Bundle) string { return pki.NodeCAID(r.kind().inForce(b).Cert) }

// next is the id of the CA of r's kind a rotation prepared in b.
func (r *Rotator) next(b *pki.Bundle) string { return pki.NodeCAID(r.kind().next(b).Cert) }

// prepare makes the next CA of r's kind in b.
func (r *Rotator) prepare(b *pki.Bundle, now time.Time) error {
	return r.kind().prepare(b, now, r.cfg.CAValidity)
}

// apply changes b for a move to phase to.
func (r *Rotator) apply(b *pki.Bundle, to string) error {
	k := r.kind()
	switch to {
	case store.RotationActivated:
		return k.activate(b)
	case store.RotationRetired:
		return k.retire(b)
	case store.RotationRolledBack:
		return k.rollback(b)
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
