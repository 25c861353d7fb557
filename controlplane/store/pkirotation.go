package store

import (
	"context"
	"time"
)

// CAs a PKIRotation rotates.
const (
	// RotationCANode is the node CA.
	RotationCANode = "node"
	// RotationCAGateway is the gateway serving CA.
	RotationCAGateway = "gateway"
	// RotationCAInternal is the internal CA of the internal control API;
	// its proof is the processes' rows (Process.InternalCAs), not nodes'
	// acks.
	RotationCAInternal = "internal"
)

// Phases of a PKIRotation (DESIGN.md, "CA rotation"; docs/pki.md). A
// rotation starts propagating, moves to activated and then retired, or to
// rolled-back from either of the first two.
const (
	RotationPropagating = "propagating" // the new CA is trusted, not issuing; nodes ack its bundle
	RotationActivated   = "activated"   // the new CA issues at each node's next renewal; the old one is trusted
	RotationRetired     = "retired"     // the old CA is out of the serving bundle (re-attestation only)
	RotationRolledBack  = "rolled-back" // the old CA issues again; the new one's certificates verify until renewed
)

// PKIRotation is one rotation of a CA in phases.
type PKIRotation struct {
	ID string
	// CA is the CA rotated: RotationCANode, RotationCAGateway or
	// RotationCAInternal.
	CA string
	// Phase is one of the Rotation* phases.
	Phase string
	// OldCAID and NewCAID are the serials of the old and the new CA
	// certificate (pki.NodeCAID).
	OldCAID, NewCAID string
	// Threshold is the share of live nodes, above 0 and at most 1, whose
	// acknowledgement of the new bundle activates the rotation.
	Threshold float64
	// StartedBy is the actor that started it: "token:<id>" or
	// "reconciler".
	StartedBy    string
	StartedAt    time.Time
	ActivatedAt  *time.Time
	RetiredAt    *time.Time
	RolledBackAt *time.Time
	UpdatedAt    time.Time
}

// PKIRotationCreateParams starts a rotation in the propagating phase.
type PKIRotationCreateParams struct {
	// ID defaults to a new "rot_" id.
	ID               string
	CA               string
	OldCAID, NewCAID string
	Threshold        float64
	StartedBy        string
	Now              *time.Time
}

// PKIRotationSetPhaseParams moves a rotation from one phase to another.
type PKIRotationSetPhaseParams struct {
	ID string
	// From is the phase the rotation must be in; otherwise the move is
	// ErrConflict and nothing changes.
	From, To string
	// Actor and Forced go into the phase's event.
	Actor  string
	Forced bool
	Reason string
	Now    *time.Time
}

// PKIRotationAckCounts is how many live nodes (nodes with an open session)
// acknowledged a rotation's bundle.
type PKIRotationAckCounts struct {
	Live, Acked int
	// Missing lists live nodes that have not acked, by id, at most the
	// limit asked for.
	Missing []string
}

// PKIRotationStore keeps CA rotations and their acknowledgements.
type PKIRotationStore interface {
	// PKIRotationCreate starts a rotation, propagating, and writes its
	// event; ErrConflict while another rotation of the CA is open.
	PKIRotationCreate(ctx context.Context, p *PKIRotationCreateParams) (*PKIRotation, error)
	// PKIRotationLatest returns the CA's latest rotation; ErrNotFound when
	// it was never rotated.
	PKIRotationLatest(ctx context.Context, ca string) (*PKIRotation, error)
	// PKIRotationSetPhase moves a rotation from p.From to p.To, stamps the
	// phase's time and writes its event; ErrConflict when it is not in
	// p.From, ErrNotFound when it does not exist.
	PKIRotationSetPhase(ctx context.Context, p *PKIRotationSetPhaseParams) (*PKIRotation, error)
	// PKIRotationAck records that nodes acknowledged the rotation's bundle;
	// acking twice, or for a node deleted since, is not an error.
	PKIRotationAck(ctx context.Context, rotationID string, nodeIDs []string, now *time.Time) error
	// PKIRotationAckCounts counts the live nodes and those of them that
	// acked, listing at most missingLimit that did not.
	PKIRotationAckCounts(ctx context.Context, rotationID string, missingLimit int) (*PKIRotationAckCounts, error)
	// NodeCertsOffCA counts the nodes whose certificate is valid at now
	// (zero: the database's clock) and was not issued by the node CA caID
	// (NodeUpsertParams.CertCAID, NodeSetCertificateParams.CAID), listing
	// at most limit of them by id.
	NodeCertsOffCA(ctx context.Context, caID string, now *time.Time, limit int) (int, []string, error)
}
