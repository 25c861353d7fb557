package doctor

import (
	"context"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Check ids of the lifetimes (docs/doctor.md, "Lifetimes").
const (
	IDNodeCA      = "pki.node-ca"
	IDGatewayCA   = "pki.gateway-ca"
	IDInternalCA  = "pki.internal-ca"
	IDTokenExpiry = "iam.token-expiry"
)

// Lifetime windows. A CA warns CAWarnWithin before its end (a rotation
// takes time: prepare, propagate to every node, activate, retire) and fails
// CAFailWithin before it; a serving or internal certificate warns
// GatewayCertWarnWithin before its end and fails ServingCertFailWithin
// before it; an API token warns iam.TokenExpiryWarning before its end and
// fails TokenFailWithin before it when it was made to live longer than
// iam.TokenExpiryWarning (a token made short on purpose only warns).
const (
	CAFailWithin          = 30 * 24 * time.Hour
	ServingCertFailWithin = 7 * 24 * time.Hour
	TokenFailWithin       = 24 * time.Hour
)

// dateOnly is how the checks spell an end date.
const dateOnly = "2006-01-02"

// CAs checks each CA of the bundle (the node CA, the gateway CA, the
// internal CA), one result each, whose hint names the CA and its end date:
// fail once expired or within CAFailWithin, warn within CAWarnWithin. With
// no bundle each reports the pki check's status, pointing at it.
func CAs(b *pki.Bundle, pkiRes Result, now time.Time) []Result {
	cas := []struct {
		id, name string
		ca       func(*pki.Bundle) *pki.CA
	}{
		{IDNodeCA, "node CA", func(b *pki.Bundle) *pki.CA { return b.NodeCA }},
		{IDGatewayCA, "gateway CA", func(b *pki.Bundle) *pki.CA { return b.GatewayCA }},
		{IDInternalCA, "internal CA", func(b *pki.Bundle) *pki.CA { return b.InternalCA }},
	}
	out := make([]Result, 0, len(cas))
	for _, c := range cas {
		if b == nil {
			out = append(out, result(c.id, pkiRes.Status, "no PKI bundle to read the "+c.name+" from (see the pki check)"))
			continue
		}
		end := c.ca(b).Cert.NotAfter
		date := end.UTC().Format(dateOnly)
		detail := fmt.Sprintf("%s of %s valid until %s", c.name, b.TrustDomain, end.UTC().Format(time.RFC3339))
		switch left := end.Sub(now); {
		case left <= 0:
			out = append(out, result(c.id, Fail, fmt.Sprintf("the %s ended on %s: nothing it signed verifies; rotate it", c.name, date), detail))
		case left < CAFailWithin:
			out = append(out, result(c.id, Fail, fmt.Sprintf("the %s ends on %s, in %s: rotate it now", c.name, date, days(left)), detail))
		case left < CAWarnWithin:
			out = append(out, result(c.id, Warn, fmt.Sprintf("the %s ends on %s, in %s: plan its rotation", c.name, date, days(left)), detail))
		default:
			out = append(out, result(c.id, OK, fmt.Sprintf("the %s ends on %s", c.name, date), detail))
		}
	}
	return out
}

// TokenExpiry checks the live API tokens (neither revoked nor expired) that
// expire: one within iam.TokenExpiryWarning warns (the iam role has written
// token.expiring for it), one within TokenFailWithin fails when it was made
// to live longer than iam.TokenExpiryWarning (a token someone relies on is
// about to stop working). Tokens without an expiry are not judged.
func TokenExpiry(ctx context.Context, st interface {
	APITokenList(context.Context, *store.ListParams) ([]*store.APIToken, error)
}, now time.Time) Result {
	var soon, failing []string
	var earliest *store.APIToken
	live := 0
	p := &store.ListParams{Limit: store.MaxListLimit}
	for {
		page, err := st.APITokenList(ctx, p)
		if err != nil {
			return result(IDTokenExpiry, Fail, "cannot list API tokens: "+err.Error())
		}
		for _, t := range page {
			if t.RevokedAt != nil || t.ExpiresAt == nil || !t.ExpiresAt.After(now) {
				continue
			}
			live++
			if earliest == nil || t.ExpiresAt.Before(*earliest.ExpiresAt) {
				earliest = t
			}
			left := t.ExpiresAt.Sub(now)
			if left > iam.TokenExpiryWarning {
				continue
			}
			name := fmt.Sprintf("%s (%s, ends %s)", t.ID, t.Role, t.ExpiresAt.UTC().Format(time.RFC3339))
			soon = append(soon, name)
			if left <= TokenFailWithin && t.ExpiresAt.Sub(t.CreatedAt) > iam.TokenExpiryWarning {
				failing = append(failing, name)
			}
		}
		if len(page) < store.MaxListLimit {
			break
		}
		p.Cursor = page[len(page)-1].ID
	}
	switch {
	case len(failing) > 0:
		return result(IDTokenExpiry, Fail, fmt.Sprintf("%d long-lived API token(s) end within %s: make their successors (better-compute tokens create) and hand them out now", len(failing), short(TokenFailWithin)),
			"ending: "+some(failing))
	case len(soon) > 0:
		return result(IDTokenExpiry, Warn, fmt.Sprintf("%d API token(s) end within %s: make their successors (better-compute tokens create), then revoke them", len(soon), days(iam.TokenExpiryWarning)),
			"ending: "+some(soon))
	case earliest != nil:
		return result(IDTokenExpiry, OK, fmt.Sprintf("no API token ends within %s", days(iam.TokenExpiryWarning)),
			fmt.Sprintf("%d live token(s) with an expiry; the first, %s, ends %s", live, earliest.ID, earliest.ExpiresAt.UTC().Format(dateOnly)))
	}
	return result(IDTokenExpiry, OK, "no live API token has an expiry")
}
