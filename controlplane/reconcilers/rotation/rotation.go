package rotation

import (
	"cmp"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Defaults of Config.
const (
	// DefaultThreshold is the share of live nodes whose acknowledgement
	// activates a rotation.
	DefaultThreshold = 0.99
	// DefaultRetireGrace is Config.RetireGrace's default and its least
	// value: the re-attestation grace's default (7 days).
	DefaultRetireGrace = 7 * 24 * time.Hour
	// MissingListed is how many unacknowledged nodes, or nodes still on
	// another CA, a Status lists.
	MissingListed = 20
)

// Actors of phase changes the Rotator makes on its own.
const (
	// ActorReconciler is the actor of a phase change the reconciler made.
	ActorReconciler = "reconciler"
)

// Audit actions of the phase changes, one per phase.
const (
	AuditStarted    = "pki.rotation.started"
	AuditActivated  = "pki.rotation.activated"
	AuditRetired    = "pki.rotation.retired"
	AuditRolledBack = "pki.rotation.rolled-back"
)

var phaseAudit = map[string]string{
	store.RotationPropagating: AuditStarted,
	store.RotationActivated:   AuditActivated,
	store.RotationRetired:     AuditRetired,
	store.RotationRolledBack:  AuditRolledBack,
}

// Errors of the Rotator; match them with errors.Is.
var (
	// ErrNoRotation reports a CA that has no rotation, or none open
	// when one must be.
	ErrNoRotation = errors.New("no CA rotation in progress")
	// ErrInProgress reports a start while a rotation is open.
	ErrInProgress = errors.New("a CA rotation is in progress")
	// ErrCA reports a Config.CA that does not rotate in phases.
	ErrCA = errors.New("only the node CA (\"node\"), the gateway serving CA (\"gateway\") and the internal CA (\"internal\") rotate in phases")
	// ErrThreshold reports a threshold outside (0, 1].
	ErrThreshold = errors.New("threshold must be above 0 and at most 1")
	// ErrChanged reports an Advance whose expected rotation or phase
	// (AdvanceParams.ID, From) is no longer the open one's: another
	// advance, a rollback or a new rotation came first. Nothing moved.
	ErrChanged = errors.New("the CA rotation changed meanwhile")
	// ErrNotFenced reports a fenced write (StartParams.Fence,
	// AdvanceParams.Fence) over a store that cannot fence.
	ErrNotFenced = errors.New("rotation: the store cannot fence writes by a lease")
)

// NotReadyError is Advance's refusal when the phase's condition does not
// hold; Missing says what is missing, for an operator.
type NotReadyError struct {
	Phase   string
	Missing string
}

func (e *NotReadyError) Error() string {
	return fmt.Sprintf("rotation is %s and cannot advance yet: %s (advance --force moves on anyway)", e.Phase, e.Missing)
}

// Store is what the Rotator reads and writes; Tx's callback gets the whole
// store of the transaction.
type Store interface {
	store.Transactor
	PKIBundleGet(ctx context.Context) (*store.PKIBundle, error)
	PKIRotationLatest(ctx context.Context, ca string) (*store.PKIRotation, error)
	PKIRotationAckCounts(ctx context.Context, rotationID string, missingLimit int) (*store.PKIRotationAckCounts, error)
	NodeCertsOffCA(ctx context.Context, caID string, now *time.Time, limit int) (int, []string, error)
	JoinTokenList(ctx context.Context, p *store.ListParams) ([]*store.JoinToken, error)
	ProcessList(ctx context.Context) ([]*store.Process, error)
}

// rotationTx is what a phase change reads and writes in its transaction:
// the bundle, the rotation's row, the counts behind its condition, and the
// audit row.
type rotationTx interface {
	counter
	PKIBundleGet(ctx context.Context) (*store.PKIBundle, error)
	PKIBundleUpdate(ctx context.Context, b *store.PKIBundle) error
	PKIRotationCreate(ctx context.Context, p *store.PKIRotationCreateParams) (*store.PKIRotation, error)
	PKIRotationLatest(ctx context.Context, ca string) (*store.PKIRotation, error)
	PKIRotationSetPhase(ctx context.Context, p *store.PKIRotationSetPhaseParams) (*store.PKIRotation, error)
	AuditInsert(ctx context.Context, e *store.AuditEntry) (int64, error)
	JoinTokenRevoke(ctx context.Context, id string) error
}

// Config configures a Rotator.
type Config struct {
	// CA is the CA the Rotator rotates: store.RotationCANode (the
	// default) or store.RotationCAGateway.
	CA string
	// Secret is the deployment secret the bundle is sealed under;
	// required.
	Secret string
	// Threshold is the share of live nodes, above 0 and at most 1, whose
	// acknowledgement activates a rotation started without one. Defaults
	// to DefaultThreshold.
	Threshold float64
	// CAValidity is the new CA's life. Defaults to
	// pki.DefaultCAValidity (ten years).
	CAValidity time.Duration
	// RetireGrace is how long after activation a rotation retires even
	// while nodes are still on the old CA; at least the re-attestation
	// grace (pki.reattestGrace), so a node that slept through can come
	// back. Defaults to DefaultRetireGrace.
	RetireGrace time.Duration
	// AutoRotate lets Reconcile start a rotation when the node CA in force
	// is due (Due), and activate one, forced, once the old CA reaches its
	// activation deadline (ActivateBy). Defaults to false here; the
	// configuration's pki.autoRotate defaults to true.
	AutoRotate bool
	// NodeCertTTL is the life of the node certificates the gateways issue
	// (host.gateway.nodeCertTTL), which ActivateBy leaves on the old CA.
	// Defaults to pki.DefaultNodeTTL.
	NodeCertTTL time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Rotator drives the rotations of one CA (Config.CA). It is safe for
// concurrent use.
type Rotator struct {
	cfg   Config
	store Store
	// fenced is store when it fences writes by a lease (every backend
	// does), nil otherwise.
	fenced store.FencedTransactor
}

// New returns a Rotator over st. It fails for a missing secret, a
// threshold outside (0, 1] or a negative validity or grace.
func New(cfg Config, st Store) (*Rotator, error) {
	cfg.Threshold = cmp.Or(cfg.Threshold, DefaultThreshold)
	cfg.CAValidity = cmp.Or(cfg.CAValidity, pki.DefaultCAValidity)
	cfg.RetireGrace = cmp.Or(cfg.RetireGrace, DefaultRetireGrace)
	cfg.NodeCertTTL = cmp.Or(cfg.NodeCertTTL, pki.DefaultNodeTTL)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.CA = cmp.Or(cfg.CA, store.RotationCANode)
	switch {
	case caKinds[cfg.CA].what == "":
		return nil, fmt.Errorf("rotation: %w: %q", ErrCA, cfg.CA)
	case st == nil:
		return nil, errors.New("rotation: store is required")
	case cfg.Secret == "":
		return nil, errors.New("rotation: the deployment secret is required")
	case !validThreshold(cfg.Threshold):
		return nil, fmt.Errorf("rotation: %w: %v", ErrThreshold, cfg.Threshold)
	case cfg.CAValidity < 0 || cfg.RetireGrace < 0 || cfg.NodeCertTTL < 0:
		return nil, errors.New("rotation: CA validity, retire grace and node certificate TTL must not be negative")
	}
	fenced, _ := st.(store.FencedTransactor)
	return &Rotator{cfg: cfg, store: st, fenced: fenced}, nil
}

// inTx runs fn in one transaction, fenced by fence's lease when fence is
// not nil (store.InFencedTx: store.ErrFenced, and nothing written, once
// the lease is lost).
func (r *Rotator) inTx(ctx context.Context, fence *store.Fence, fn func(tx rotationTx) error) error {
	if fence == nil {
		return store.InTx(ctx, r.store, fn)
	}
	if r.fenced == nil {
		return ErrNotFenced
	}
	return store.InFencedTx(ctx, r.fenced, *fence, fn)
}

func validThreshold(t float64) bool { return t > 0 && t <= 1 && !math.IsNaN(t) }

// StartParams are Start's inputs.
type StartParams struct {
	// Actor is "token:<id>" or ActorReconciler.
	Actor string
	// Threshold overrides Config.Threshold when not zero; above 0 and at
	// most 1.
	Threshold float64
	// Reason goes into the event and audit row.
	Reason string
	// Fence, when not nil, fences the write by the lease the caller holds
	// (the reconciler's LeaseName): store.ErrFenced, and nothing written,
	// once it is lost. An operator's call leaves it nil.
	Fence *store.Fence
}

// Start makes the next CA and starts a rotation, propagating. It
// fails with ErrInProgress while a rotation is open and ErrThreshold for a
// threshold outside (0, 1].
func (r *Rotator) Start(ctx context.Context, p StartParams) (*store.PKIRotation, error) {
	threshold := cmp.Or(p.Threshold, r.cfg.Threshold)
	if !validThreshold(threshold) {
		return nil, fmt.Errorf("start %s rotation: %w: %v", r.what(), ErrThreshold, threshold)
	}
	now := r.cfg.Now()
	var out *store.PKIRotation
	err := r.inTx(ctx, p.Fence, func(tx rotationTx) error {
		b, prev, err := r.loadBundle(ctx, tx)
		if err != nil {
			return err
		}
		oldID := r.inForce(b)
		if err := r.prepare(b, now); err != nil {
			if errors.Is(err, pki.ErrRotation) {
				return ErrInProgress
			}
			return err
		}
		if err := r.saveBundle(ctx, tx, b, prev); err != nil {
			return err
		}
		ro, err := tx.PKIRotationCreate(ctx, &store.PKIRotationCreateParams{CA: r.cfg.CA, OldCAID: oldID,
			NewCAID: r.next(b), Threshold: threshold, StartedBy: cmp.Or(p.Actor, ActorReconciler), Now: &now})
		if errors.Is(err, store.ErrConflict) {
			return ErrInProgress
		}
		if err != nil {
			return err
		}
		out = ro
		return audit(ctx, tx, ro, p.Actor, p.Reason, false)
	})
	if err != nil {
		return nil, fmt.Errorf("start %s rotation: %w", r.what(), err)
	}
	return out, nil
}

// Status is a rotation and the counts behind its phase.
type Status struct {
	Rotation *store.PKIRotation
	// Live is how many nodes have a session; Acked how many of them
	// acknowledged the rotation's bundle; Missing lists up to
	// MissingListed of those that did not, by id. For the internal CA they
	// count processes with the internal control API and those that trust
	// the new CA.
	Live, Acked int
	Missing     []string
	// OffNewCA is how many nodes hold a valid certificate from another CA
	// than the new one; OffNewCAIDs lists up to MissingListed of them. For
	// the internal CA: processes presenting one.
	OffNewCA    int
	OffNewCAIDs []string
	// OldPinTokens is how many join tokens made before a gateway-CA
	// rotation started, and so pinning only the old gateway CA, can still
	// be used (unexpired, not revoked, uses left); OldPinTokenIDs lists up
	// to MissingListed of them. Gateway-CA rotations only.
	OldPinTokens   int
	OldPinTokenIDs []string
	// Ready reports whether the phase's condition holds (propagating:
	// enough acks; activated: no node off the new CA, or the retire grace
	// passed); Waiting says what is missing when it does not.
	Ready   bool
	Waiting string
	// RetireAt is when an activated rotation retires even with nodes off
	// the new CA.
	RetireAt *time.Time
}

// Status returns the latest rotation of the CA with its counts;
// ErrNoRotation when the CA was never rotated.
func (r *Rotator) Status(ctx context.Context) (*Status, error) {
	ro, err := r.store.PKIRotationLatest(ctx, r.cfg.CA)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: the %s was never rotated", ErrNoRotation, r.what())
	}
	if err != nil {
		return nil, fmt.Errorf("%s rotation status: %w", r.what(), err)
	}
	st, err := r.status(ctx, r.store, ro)
	if err != nil {
		return nil, fmt.Errorf("%s rotation status: %w", r.what(), err)
	}
	return st, nil
}

// counter is what status reads.
type counter interface {
	PKIRotationAckCounts(ctx context.Context, rotationID string, missingLimit int) (*store.PKIRotationAckCounts, error)
	NodeCertsOffCA(ctx context.Context, caID string, now *time.Time, limit int) (int, []string, error)
	JoinTokenList(ctx context.Context, p *store.ListParams) ([]*store.JoinToken, error)
	ProcessList(ctx context.Context) ([]*store.Process, error)
}

func (r *Rotator) status(ctx context.Context, st counter, ro *store.PKIRotation) (*Status, error) {
	out := &Status{Rotation: ro}
	if r.cfg.CA == store.RotationCAInternal {
		if err := internalStatus(ctx, st, ro, out); err != nil {
			return nil, err
		}
		internalReady(ro, out)
		return out, nil
	}
	counts, err := st.PKIRotationAckCounts(ctx, ro.ID, MissingListed)
	if err != nil {
		return nil, err
	}
	out.Live, out.Acked, out.Missing = counts.Live, counts.Acked, counts.Missing
	now := r.cfg.Now()
	if r.cfg.CA == store.RotationCAGateway {
		if ro.Phase == store.RotationPropagating || ro.Phase == store.RotationActivated {
			ids, err := OldPinTokens(ctx, st, ro.StartedAt, now)
			if err != nil {
				return nil, err
			}
			out.OldPinTokens, out.OldPinTokenIDs = len(ids), ids[:min(len(ids), MissingListed)]
		}
	} else if ro.Phase == store.RotationActivated || ro.Phase == store.RotationRetired {
		if out.OffNewCA, out.OffNewCAIDs, err = st.NodeCertsOffCA(ctx, ro.NewCAID, &now, MissingListed); err != nil {
			return nil, err
		}
	}
	switch ro.Phase {
	case store.RotationPropagating:
		need := Needed(out.Live, ro.Threshold)
		// No live node is no proof: a fleet whose gateways are all down
		// acknowledges nothing (advance --force moves on anyway).
		out.Ready = out.Live > 0 && out.Acked >= need
		if !out.Ready {
			out.Waiting = fmt.Sprintf("%d of %d live nodes acknowledged the new bundle, %d needed (threshold %s)",
				out.Acked, out.Live, need, formatShare(ro.Threshold))
		}
	case store.RotationActivated:
		if r.cfg.CA == store.RotationCAGateway {
			r.gatewayRetireReady(out)
			break
		}
		at := ro.ActivatedAt.Add(r.cfg.RetireGrace)
		out.RetireAt = &at
		out.Ready = out.OffNewCA == 0 || !now.Before(at)
		if !out.Ready {
			out.Waiting = fmt.Sprintf("%d nodes hold a valid certificate from another CA than the new one (they move at their next renewal); the old CA retires anyway at %s",
				out.OffNewCA, at.UTC().Format(time.RFC3339))
		}
	}
	return out, nil
}

// Needed is how many of live nodes must acknowledge for a threshold: the
// ceiling of live × threshold (0 with no live node).
func Needed(live int, threshold float64) int {
	return int(math.Ceil(float64(live)*threshold - 1e-9))
}

func formatShare(t float64) string {
	return fmt.Sprintf("%g %%", math.Round(t*10000)/100)
}

// AdvanceParams are Advance's inputs.
type AdvanceParams struct {
	Actor string
	// Force moves on although the phase's condition does not hold.
	Force  bool
	Reason string
	// ID and From, when set, are the rotation and the phase the caller
	// judged: Advance moves nothing, and fails with ErrChanged, when the
	// latest rotation is another one or in another phase by the time its
	// transaction reads it. The reconciler sets both, so that a forced
	// activation it decided on never moves a rotation that was activated
	// meanwhile on to retired; an operator's call may leave them empty
	// (advance moves whatever is open).
	ID, From string
	// Fence, when not nil, fences the write by the lease the caller holds
	// (store.ErrFenced, nothing written, once it is lost).
	Fence *store.Fence
}

// Advance moves the open rotation on: propagating to activated, activated
// to retired. It fails with ErrNoRotation when none is open, with
// ErrChanged when p.ID or p.From no longer match it, and with a
// *NotReadyError when the phase's condition does not hold and p.Force is
// not set.
func (r *Rotator) Advance(ctx context.Context, p AdvanceParams) (*Status, error) {
	var out *Status
	err := r.inTx(ctx, p.Fence, func(tx rotationTx) error {
		ro, err := r.latestRotation(ctx, tx)
		if err != nil {
			return err
		}
		if (p.ID != "" && ro.ID != p.ID) || (p.From != "" && ro.Phase != p.From) {
			want := cmp.Or(p.ID, "the open rotation")
			if p.From != "" {
				want += " " + p.From
			}
			return fmt.Errorf("%w: expected %s, the latest (%s) is %s: nothing moved", ErrChanged, want, ro.ID, ro.Phase)
		}
		if err := isOpen(ro); err != nil {
			return err
		}
		st, err := r.status(ctx, tx, ro)
		if err != nil {
			return err
		}
		forced := false
		if !st.Ready {
			if !p.Force {
				return &NotReadyError{Phase: ro.Phase, Missing: st.Waiting}
			}
			forced = true
		}
		to := store.RotationActivated
		if ro.Phase == store.RotationActivated {
			to = store.RotationRetired
		}
		if forced && to == store.RotationRetired && st.OldPinTokens > 0 {
			if err := r.revokeOldPinTokens(ctx, tx, ro, p.Actor); err != nil {
				return err
			}
		}
		moved, err := r.move(ctx, tx, ro, to, p.Actor, cmp.Or(p.Reason, st.reason(to)), forced)
		if err != nil {
			return err
		}
		st.Rotation = moved
		out = st
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("advance %s rotation: %w", r.what(), err)
	}
	return out, nil
}

// reason is why a phase change whose condition holds happens.
func (s *Status) reason(to string) string {
	internal := s.Rotation != nil && s.Rotation.CA == store.RotationCAInternal
	switch {
	case internal && to == store.RotationActivated:
		return fmt.Sprintf("every process with the internal control API (%d) trusts the new internal CA", s.Live)
	case internal:
		return fmt.Sprintf("every process with the internal control API (%d) presents a certificate from the new internal CA", s.Live)
	case to == store.RotationActivated:
		return fmt.Sprintf("%d of %d live nodes acknowledged the new bundle", s.Acked, s.Live)
	case s.Rotation != nil && s.Rotation.CA == store.RotationCAGateway:
		return fmt.Sprintf("every live node (%d) trusts the new gateway CA and no join token pins only the old one", s.Live)
	case s.OffNewCA == 0:
		return "no valid node certificate from another CA than the new one"
	default:
		return "the retire grace passed"
	}
}

// Rollback returns the open rotation to the old CA as the issuer. It fails
// with ErrNoRotation when none is open (after retired, going back is a new
// rotation).
func (r *Rotator) Rollback(ctx context.Context, actor, reason string) (*store.PKIRotation, error) {
	var out *store.PKIRotation
	err := store.InTx(ctx, r.store, func(tx rotationTx) error {
		ro, err := r.openRotation(ctx, tx)
		if err != nil {
			return err
		}
		out, err = r.move(ctx, tx, ro, store.RotationRolledBack, actor, reason, false)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("roll back %s rotation: %w", r.what(), err)
	}
	return out, nil
}

// move changes ro's phase, then the bundle, then writes the audit row, in
// tx: the row's conditional update serialises concurrent moves.
func (r *Rotator) move(ctx context.Context, tx rotationTx, ro *store.PKIRotation, to, actor, reason string, forced bool) (*store.PKIRotation, error) {
	now := r.cfg.Now()
	actor = cmp.Or(actor, ActorReconciler)
	moved, err := tx.PKIRotationSetPhase(ctx, &store.PKIRotationSetPhaseParams{ID: ro.ID, From: ro.Phase, To: to, Actor: actor,
		Forced: forced, Reason: reason, Now: &now})
	if err != nil {
		return nil, err
	}
	b, prev, err := r.loadBundle(ctx, tx)
	if err != nil {
		return nil, err
	}
	err = r.apply(b, to)
	if err != nil {
		return nil, fmt.Errorf("bundle does not match rotation %s (%s): %w", ro.ID, ro.Phase, err)
	}
	if err := r.saveBundle(ctx, tx, b, prev); err != nil {
		return nil, err
	}
	return moved, audit(ctx, tx, moved, actor, reason, forced)
}

// openRotation returns the CA's open rotation, or ErrNoRotation.
func (r *Rotator) openRotation(ctx context.Context, tx rotationTx) (*store.PKIRotation, error) {
	ro, err := r.latestRotation(ctx, tx)
	if err != nil {
		return nil, err
	}
	if err := isOpen(ro); err != nil {
		return nil, err
	}
	return ro, nil
}

// latestRotation returns the CA's latest rotation, open or not, or
// ErrNoRotation when there is none.
func (r *Rotator) latestRotation(ctx context.Context, tx rotationTx) (*store.PKIRotation, error) {
	ro, err := tx.PKIRotationLatest(ctx, r.cfg.CA)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrNoRotation
	}
	return ro, err
}

// isOpen is nil for a rotation still open (propagating or activated),
// ErrNoRotation otherwise.
func isOpen(ro *store.PKIRotation) error {
	if ro.Phase != store.RotationPropagating && ro.Phase != store.RotationActivated {
		return fmt.Errorf("%w: the latest (%s) is %s", ErrNoRotation, ro.ID, ro.Phase)
	}
	return nil
}

// loadBundle opens the bundle in tx, and returns its sealed form for
// saveBundle.
func (r *Rotator) loadBundle(ctx context.Context, tx rotationTx) (*pki.Bundle, []byte, error) {
	sealed, err := tx.PKIBundleGet(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("load pki bundle: %w", err)
	}
	b, err := pki.OpenBundle(r.cfg.Secret, sealed.Sealed)
	if err != nil {
		return nil, nil, err
	}
	return b, sealed.Sealed, nil
}

// saveBundle writes b over prev, the sealed bundle it was loaded as: a
// rotation of the other CA that changed the bundle meanwhile makes it
// store.ErrConflict (PKIBundle.Prev), so neither change is lost.
func (r *Rotator) saveBundle(ctx context.Context, tx rotationTx, b *pki.Bundle, prev []byte) error {
	sealed, err := b.SealBundle(r.cfg.Secret)
	if err != nil {
		return err
	}
	return tx.PKIBundleUpdate(ctx, &store.PKIBundle{TrustDomain: b.TrustDomain, Sealed: sealed, Prev: prev})
}

// auditDetails are a phase change's audit details.
type auditDetails struct {
	Phase   string `json:"phase"`
	OldCAID string `json:"oldCaId"`
	NewCAID string `json:"newCaId"`
	Forced  bool   `json:"forced,omitempty"`
	Reason  string `json:"reason,omitempty"`
}

func audit(ctx context.Context, tx rotationTx, ro *store.PKIRotation, actor, reason string, forced bool) error {
	details, err := json.Marshal(auditDetails{Phase: ro.Phase, OldCAID: ro.OldCAID, NewCAID: ro.NewCAID, Forced: forced, Reason: reason})
	if err != nil {
		return err
	}
	_, err = tx.AuditInsert(ctx, &store.AuditEntry{Actor: cmp.Or(actor, ActorReconciler), Action: phaseAudit[ro.Phase],
		Resource: "rotation/" + ro.ID, Outcome: "success", Details: details})
	return err
}

// LeaseName is the rotation reconciler's singleton lease.
const LeaseName = "singleton:pki-rotation"

// DefaultInterval is how often the reconciler looks at the open rotation.
const DefaultInterval = 5 * time.Second

// ActivateMargin is how much more than a node certificate's life the old
// CA has left at its activation deadline (ActivateBy): two passes of the
// reconciler.
const ActivateMargin = 2 * DefaultInterval

// MaxRollbackHold is the most the least wait after a rollback
// (RollbackHold) can be: ten minutes.
const MaxRollbackHold = 10 * time.Minute

// RollbackHold is the least time the reconciler waits after an operator
// rolled back a rotation from the node CA ca before it starts another:
// MaxRollbackHold, or a twelfth of ca's life where that is shorter (a CA
// of compressed life, in tests). It applies also to a rollback at or past
// ca's activation deadline, where half the time left to the deadline is
// nothing.
func RollbackHold(ca *x509.Certificate) time.Duration {
	made := pki.CAMadeAt(ca)
	return min(MaxRollbackHold, ca.NotAfter.Sub(made)/12)
}

// Due is when the rotation reconciler starts rotating the node CA ca (with
// AutoRotate): half-way through its life, from pki.CAMadeAt to NotAfter,
// as SPIRE prepares its next CA. After an operator rolled back a rotation
// from ca at rolledBackAt (nil: none), no sooner than half-way from then to
// ca's activation deadline, and no sooner than RollbackHold after it
// (which a rollback past the deadline would otherwise not get), which
// gives the operator time to look; pki.autoRotate false keeps the old CA
// for as long as the operator wants.
func Due(ca *x509.Certificate, nodeCertTTL time.Duration, rolledBackAt *time.Time) time.Time {
	made := pki.CAMadeAt(ca)
	at := made.Add(ca.NotAfter.Sub(made) / 2)
	if rolledBackAt != nil {
		if wait := rolledBackAt.Add(max(ActivateBy(ca, nodeCertTTL).Sub(*rolledBackAt)/2, RollbackHold(ca))); wait.After(at) {
			at = wait
		}
	}
	return at
}

// ActivateBy is the activation deadline of a rotation away from the node
// CA ca: five sixths of its life (SPIRE's anchor), or sooner where the CA
// would then have less than nodeCertTTL plus ActivateMargin left. Until
// then ca still signs full node certificates; from then on the reconciler
// activates the rotation (with AutoRotate) whatever the acknowledgements,
// so that no node certificate is cut short to ca's end.
func ActivateBy(ca *x509.Certificate, nodeCertTTL time.Duration) time.Time {
	made := pki.CAMadeAt(ca)
	at := made.Add(ca.NotAfter.Sub(made) / 6 * 5)
	if last := ca.NotAfter.Add(-nodeCertTTL - ActivateMargin); last.Before(at) {
		at = last
	}
	return at
}

// Reconcile is one pass of the rotation reconciler (run under LeaseName):
// it advances the open rotation when its phase's condition holds, activated
// at the threshold of acks and retired once no node is off the new CA or
// the retire grace passed, as ActorReconciler. With AutoRotate it also
// starts a rotation when the node CA in force is Due and none is open, and
// activates a propagating one, forced, from the old CA's ActivateBy. It
// reports the phase moved to, "" when nothing moved; no open rotation is
// not an error.
//
// Every phase change names the rotation and the phase it judged
// (AdvanceParams.ID, From): when another advance, a rollback or a start
// came first, nothing moves and the next pass looks again. In particular
// the one forced change the reconciler makes is propagating to activated:
// it never forces a rotation on to retired.
//
// fence, when not nil, is the reconciler's lease (LeaseName): its writes
// are fenced by it (store.InFencedTx), and fail with store.ErrFenced,
// writing nothing, once another worker holds it.
func (r *Rotator) Reconcile(ctx context.Context, fence *store.Fence) (string, error) {
	ro, err := r.store.PKIRotationLatest(ctx, r.cfg.CA)
	if errors.Is(err, store.ErrNotFound) {
		ro, err = nil, nil
	}
	if err != nil {
		return "", fmt.Errorf("reconcile %s rotation: %w", r.what(), err)
	}
	if ro == nil || (ro.Phase != store.RotationPropagating && ro.Phase != store.RotationActivated) {
		if !r.cfg.AutoRotate || r.cfg.CA != store.RotationCANode {
			return "", nil
		}
		return r.autoStart(ctx, ro, fence)
	}
	st, err := r.status(ctx, r.store, ro)
	if err != nil {
		return "", fmt.Errorf("reconcile %s rotation: %w", r.what(), err)
	}
	p := AdvanceParams{Actor: ActorReconciler, ID: ro.ID, From: ro.Phase, Fence: fence}
	if !st.Ready {
		if !r.cfg.AutoRotate || ro.Phase != store.RotationPropagating || r.cfg.CA != store.RotationCANode {
			return "", nil
		}
		old, err := r.nodeCA(ctx)
		if err != nil {
			return "", fmt.Errorf("reconcile node CA rotation: %w", err)
		}
		by := ActivateBy(old, r.cfg.NodeCertTTL)
		if r.cfg.Now().Before(by) {
			return "", nil
		}
		p.Force = true
		p.Reason = fmt.Sprintf("the old node CA ends at %s: activated at its deadline %s, while it can still sign a full node certificate (%s)",
			old.NotAfter.UTC().Format(time.RFC3339), by.UTC().Format(time.RFC3339), st.Waiting)
	}
	moved, err := r.Advance(ctx, p)
	var nr *NotReadyError
	if errors.As(err, &nr) || errors.Is(err, ErrChanged) || errors.Is(err, ErrNoRotation) || errors.Is(err, store.ErrConflict) {
		return "", nil // changed meanwhile: the next pass looks again
	}
	if err != nil {
		return "", err
	}
	return moved.Rotation.Phase, nil
}

// autoStart starts a rotation as ActorReconciler when the node CA in force
// is Due; latest is the latest rotation, closed, or nil.
func (r *Rotator) autoStart(ctx context.Context, latest *store.PKIRotation, fence *store.Fence) (string, error) {
	ca, err := r.nodeCA(ctx)
	if err != nil {
		return "", fmt.Errorf("reconcile node CA rotation: %w", err)
	}
	var rolledBackAt *time.Time
	if latest != nil && latest.Phase == store.RotationRolledBack && latest.OldCAID == pki.NodeCAID(ca) {
		rolledBackAt = latest.RolledBackAt
	}
	due := Due(ca, r.cfg.NodeCertTTL, rolledBackAt)
	if r.cfg.Now().Before(due) {
		return "", nil
	}
	reason := dueReason(ca, r.cfg.NodeCertTTL, rolledBackAt, due)
	ro, err := r.Start(ctx, StartParams{Actor: ActorReconciler, Reason: reason, Fence: fence})
	if errors.Is(err, ErrInProgress) {
		return "", nil // started meanwhile: the next pass looks again
	}
	if err != nil {
		return "", err
	}
	return ro.Phase, nil
}

// dueReason is the audit reason of a rotation the reconciler starts at due
// (Due): the node CA in force passed half its life, or, after an
// operator's rollback at rolledBackAt, the wait after it passed.
func dueReason(ca *x509.Certificate, nodeCertTTL time.Duration, rolledBackAt *time.Time, due time.Time) string {
	const layout = time.RFC3339
	made := pki.CAMadeAt(ca)
	half := made.Add(ca.NotAfter.Sub(made) / 2)
	what := fmt.Sprintf("the node CA in force (made %s, ends %s)", made.UTC().Format(layout), ca.NotAfter.UTC().Format(layout))
	if rolledBackAt == nil || !due.After(half) {
		return fmt.Sprintf("%s passed half its life at %s", what, half.UTC().Format(layout))
	}
	return fmt.Sprintf("%s passed half its life at %s; an operator rolled back the rotation from it at %s, and the reconciler waited until %s "+
		"(half the time from the rollback to the activation deadline %s, at least %s)", what, half.UTC().Format(layout),
		rolledBackAt.UTC().Format(layout), due.UTC().Format(layout), ActivateBy(ca, nodeCertTTL).UTC().Format(layout), RollbackHold(ca))
}

// nodeCA is the certificate of the node CA in force.
func (r *Rotator) nodeCA(ctx context.Context) (*x509.Certificate, error) {
	sealed, err := r.store.PKIBundleGet(ctx)
	if err != nil {
		return nil, fmt.Errorf("load pki bundle: %w", err)
	}
	b, err := pki.OpenBundle(r.cfg.Secret, sealed.Sealed)
	if err != nil {
		return nil, err
	}
	return b.NodeCA.Cert, nil
}
