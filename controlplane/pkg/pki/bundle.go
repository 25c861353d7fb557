package pki

import (
	"cmp"
	"crypto/x509"
	"fmt"
	"slices"
	"time"

	"github.com/better-compute/better-compute/proto/jointoken"
)

// Bundle holds the CAs of one deployment: everything `better-compute pki
// init` writes, sealed under the deployment secret. It is plain data with
// no lock; share it read-only, and serialise RotateNodeCA and
// PruneNodeRoots with other use. Methods other than Validate expect a
// valid bundle, as Init and UnmarshalBundle return.
type Bundle struct {
	// TrustDomain is the SPIFFE trust domain of every identity the bundle
	// issues, such as "compute.example.com".
	TrustDomain string
	// NodeCA signs node certificates.
	NodeCA *CA
	// GatewayCA signs the gateways' TLS serving certificates.
	GatewayCA *CA
	// InternalCA signs the internal control API's certificates.
	InternalCA *CA
	// PreviousNodeRoots are node CA certificates replaced by RotateNodeCA,
	// still trusted so that the certificates they issued keep verifying
	// until they expire. Oldest first; their keys are not kept.
	PreviousNodeRoots []*x509.Certificate
	// NextNodeCA is the node CA a rotation prepared (PrepareNodeCA):
	// trusted, not yet issuing. Nil outside the propagating phase.
	NextNodeCA *CA
	// PreviousNodeCA is the node CA an activated rotation replaced
	// (ActivateNodeCA): trusted, and kept with its key so that a rollback
	// can make it the issuer again. Nil outside the activated phase.
	PreviousNodeCA *CA
	// RetiredNodeRoots are node CA certificates a rotation retired
	// (RetireNodeCA): no longer trusted for sessions, still trusted to
	// verify a re-attestation proof (ReattestRoots). Oldest first.
	RetiredNodeRoots []*x509.Certificate
	// NextGatewayCA is the gateway serving CA a gateway-CA rotation
	// prepared (PrepareGatewayCA): sent to nodes and pinned by new join
	// tokens, not yet served. Nil outside the propagating phase.
	NextGatewayCA *CA
	// PreviousGatewayCA is the gateway serving CA an activated gateway-CA
	// rotation replaced (ActivateGatewayCA), kept with its key: gateways
	// serve a chain that still verifies against its pin
	// (GatewayServingChain), and a rollback makes it the CA in force
	// again. Nil outside the activated phase.
	PreviousGatewayCA *CA
	// NextInternalCA is the internal CA an internal-CA rotation prepared
	// (PrepareInternalCA): trusted by every control-plane process beside
	// the one in force, not issuing yet. Nil outside the propagating
	// phase.
	NextInternalCA *CA
	// PreviousInternalCA is the internal CA an activated internal-CA
	// rotation replaced (ActivateInternalCA), kept with its key: still
	// trusted until the rotation retires, and the CA in force again on a
	// rollback. Nil outside the activated phase.
	PreviousInternalCA *CA
}

// InitOptions configures Init.
type InitOptions struct {
	// TrustDomain is the SPIFFE trust domain; required, checked by
	// ValidateTrustDomain.
	TrustDomain string
	// Now is the time the CAs are made at. Defaults to time.Now().
	Now time.Time
	// Validity is how long each CA certificate is valid. Defaults to
	// DefaultCAValidity (ten years).
	Validity time.Duration
	// NodeValidity is how long the node CA's certificate is valid, when
	// not zero; the node CA rotates (PrepareNodeCA), the others do not.
	// Defaults to Validity.
	NodeValidity time.Duration
}

// Init makes a bundle with a fresh node CA, gateway serving CA and internal
// CA for opts.TrustDomain. It fails with ErrTrustDomain for an invalid
// trust domain and ErrTTL for a negative validity.
func Init(opts InitOptions) (*Bundle, error) {
	if err := ValidateTrustDomain(opts.TrustDomain); err != nil {
		return nil, fmt.Errorf("init pki bundle: %w", err)
	}
	now, validity, err := caTimes(opts.Now, opts.Validity)
	if err != nil {
		return nil, fmt.Errorf("init pki bundle: %w", err)
	}
	if opts.NodeValidity < 0 {
		return nil, fmt.Errorf("init pki bundle: %w: node CA validity %s is negative", ErrTTL, opts.NodeValidity)
	}
	b := &Bundle{TrustDomain: opts.TrustDomain}
	for _, ca := range []struct {
		kind     caKind
		dst      **CA
		validity time.Duration
	}{
		{kindNode, &b.NodeCA, cmp.Or(opts.NodeValidity, validity)},
		{kindGateway, &b.GatewayCA, validity},
		{kindInternal, &b.InternalCA, validity},
	} {
		if *ca.dst, err = newCA(ca.kind, b.TrustDomain, now, ca.validity); err != nil {
			return nil, fmt.Errorf("init pki bundle: %w", err)
		}
	}
	return b, nil
}

// caTimes fills in the defaults for a CA's creation time and validity.
func caTimes(now time.Time, validity time.Duration) (time.Time, time.Duration, error) {
	if validity < 0 {
		return time.Time{}, 0, fmt.Errorf("%w: CA validity %s is negative", ErrTTL, validity)
	}
	if validity == 0 {
		validity = DefaultCAValidity
	}
	if now.IsZero() {
		now = time.Now()
	}
	return now, validity, nil
}

// Validate checks that b is complete and consistent: a valid trust domain,
// all three CAs present, each a CA certificate with a matching P-256 key,
// and every previous root a CA certificate. Errors wrap ErrBundleInvalid.
func (b *Bundle) Validate() error {
	if b == nil {
		return fmt.Errorf("%w: nil bundle", ErrBundleInvalid)
	}
	if err := ValidateTrustDomain(b.TrustDomain); err != nil {
		return fmt.Errorf("%w: %w", ErrBundleInvalid, err)
	}
	if err := b.NodeCA.validate(kindNode); err != nil {
		return err
	}
	if err := b.GatewayCA.validate(kindGateway); err != nil {
		return err
	}
	if err := b.InternalCA.validate(kindInternal); err != nil {
		return err
	}
	for i, root := range b.PreviousNodeRoots {
		if root == nil || !root.IsCA {
			return fmt.Errorf("%w: previous node root %d is not a CA certificate", ErrBundleInvalid, i)
		}
	}
	for i, root := range b.RetiredNodeRoots {
		if root == nil || !root.IsCA {
			return fmt.Errorf("%w: retired node root %d is not a CA certificate", ErrBundleInvalid, i)
		}
	}
	if b.NextNodeCA != nil && b.PreviousNodeCA != nil {
		return fmt.Errorf("%w: both a next and a previous node CA", ErrBundleInvalid)
	}
	if b.NextNodeCA != nil {
		if err := b.NextNodeCA.validate(kindNode); err != nil {
			return fmt.Errorf("next: %w", err)
		}
	}
	if b.PreviousNodeCA != nil {
		if err := b.PreviousNodeCA.validate(kindNode); err != nil {
			return fmt.Errorf("previous: %w", err)
		}
	}
	if b.NextGatewayCA != nil && b.PreviousGatewayCA != nil {
		return fmt.Errorf("%w: both a next and a previous gateway CA", ErrBundleInvalid)
	}
	for name, ca := range map[string]*CA{"next": b.NextGatewayCA, "previous": b.PreviousGatewayCA} {
		if ca == nil {
			continue
		}
		if err := ca.validate(kindGateway); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	if b.NextInternalCA != nil && b.PreviousInternalCA != nil {
		return fmt.Errorf("%w: both a next and a previous internal CA", ErrBundleInvalid)
	}
	for name, ca := range map[string]*CA{"next": b.NextInternalCA, "previous": b.PreviousInternalCA} {
		if ca == nil {
			continue
		}
		if err := ca.validate(kindInternal); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// NodeCARoots returns the certificates that node certificates may chain
// to: the current node CA first, then a rotation's next or previous node CA
// (NextNodeCA, PreviousNodeCA), then the retained previous roots. This is
// the list a JoinResponse and a session's bundle carry and a NodeVerifier
// trusts. The slice is new; the certificates are shared.
func (b *Bundle) NodeCARoots() []*x509.Certificate {
	roots := make([]*x509.Certificate, 0, 2+len(b.PreviousNodeRoots))
	roots = append(roots, b.NodeCA.Cert)
	for _, ca := range []*CA{b.NextNodeCA, b.PreviousNodeCA} {
		if ca != nil {
			roots = append(roots, ca.Cert)
		}
	}
	return append(roots, b.PreviousNodeRoots...)
}

// GatewayPin returns the pin of the gateway serving CA's key, the
// "sha256/<base64>" form of jointoken.Pin that join tokens carry.
func (b *Bundle) GatewayPin() string {
	return jointoken.Pin(b.GatewayCA.Cert)
}

// RotateNodeCA replaces the node CA with a fresh one made at now (zero:
// time.Now()) valid for validity (zero: DefaultCAValidity), and appends the
// old certificate to PreviousNodeRoots so that certificates it issued keep
// verifying. The old key is dropped. New node certificates come from the
// new CA at once; nodes pick up the new root with their next renewal.
func (b *Bundle) RotateNodeCA(now time.Time, validity time.Duration) error {
	if err := b.Validate(); err != nil {
		return fmt.Errorf("rotate node CA: %w", err)
	}
	now, validity, err := caTimes(now, validity)
	if err != nil {
		return fmt.Errorf("rotate node CA: %w", err)
	}
	ca, err := newCA(kindNode, b.TrustDomain, now, validity)
	if err != nil {
		return fmt.Errorf("rotate node CA: %w", err)
	}
	b.PreviousNodeRoots = append(b.PreviousNodeRoots, b.NodeCA.Cert)
	b.NodeCA = ca
	return nil
}

// PruneNodeRoots drops the previous node roots that have expired at now
// (now after their NotAfter), after which no certificate they issued can verify, and returns how many
// it dropped.
func (b *Bundle) PruneNodeRoots(now time.Time) int {
	before := len(b.PreviousNodeRoots)
	b.PreviousNodeRoots = slices.DeleteFunc(b.PreviousNodeRoots, func(c *x509.Certificate) bool {
		return now.After(c.NotAfter) // the test crypto/x509 applies

	})
	return before - len(b.PreviousNodeRoots)
}
