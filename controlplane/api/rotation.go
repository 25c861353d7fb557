package api

import (
	"context"
	"errors"
	"math"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rotation"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// MaxRotationReason bounds a rotation request's reason, in characters.
const MaxRotationReason = 200

// rotator returns the Rotator of CA ca ("node", "gateway" or "internal", checked by
// rotationCA) over this process's store. The node CA's validity setting
// (pki.nodeCAValidity) is the node CA's only.
func (s *Server) rotator(ca string) (*rotation.Rotator, error) {
	cfg := rotation.Config{Secret: s.cfg.Secret, CA: ca, Threshold: s.cfg.RotationThreshold,
		RetireGrace: s.cfg.RotationRetireGrace, Now: s.cfg.Now}
	if ca == "" || ca == store.RotationCANode {
		cfg.CAValidity = s.cfg.RotationCAValidity
	}
	return rotation.New(cfg, s.store)
}

// rotationCA checks a request's ca: "node", "gateway", "internal" or empty
// (node).
func rotationCA(ca string) error {
	if ca != "" && ca != store.RotationCANode && ca != store.RotationCAGateway && ca != store.RotationCAInternal {
		return invalid("ca", "%q cannot be rotated here: the node CA (\"node\"), the gateway serving CA (\"gateway\") and the internal CA (\"internal\") rotate in phases", ca)
	}
	return nil
}

func rotationReason(reason string) error {
	if len([]rune(reason)) > MaxRotationReason {
		return invalid("reason", "at most %d characters", MaxRotationReason)
	}
	return nil
}

// rotationError maps the Rotator's refusals to API errors.
func rotationError(err error) error {
	var nr *rotation.NotReadyError
	switch {
	case errors.As(err, &nr):
		return &Error{Code: apiv1.CodeConflict, Message: nr.Error()}
	case errors.Is(err, rotation.ErrChanged):
		return &Error{Code: apiv1.CodeConflict, Message: err.Error() + ": see pki rotate node-ca status"}
	case errors.Is(err, rotation.ErrInProgress):
		return &Error{Code: apiv1.CodeConflict, Message: "a rotation of this CA is in progress: see pki rotate node-ca|gateway-ca|internal-ca status; advance it or roll it back first"}
	case errors.Is(err, rotation.ErrNoRotation):
		return notFound("%v", err)
	case errors.Is(err, rotation.ErrThreshold):
		return invalid("threshold", "%v", err)
	}
	return err
}

func (s *Server) pkiRotationStart(ctx context.Context, p *iam.Principal, r *apiv1.RotationStartRequest) (*apiv1.RotationResponse, error) {
	if err := rotationCA(r.GetCa()); err != nil {
		return nil, err
	}
	if t := r.GetThreshold(); t < 0 || t > 1 || math.IsNaN(t) {
		return nil, invalid("threshold", "want a share above 0 and at most 1, such as 0.99 (0: the default)")
	}
	if err := rotationReason(r.GetReason()); err != nil {
		return nil, err
	}
	rot, err := s.rotator(r.GetCa())
	if err != nil {
		return nil, err
	}
	if _, err := rot.Start(ctx, rotation.StartParams{Actor: "token:" + p.TokenID, Threshold: r.GetThreshold(), Reason: r.GetReason()}); err != nil {
		return nil, rotationError(err)
	}
	return s.rotationStatus(ctx, rot)
}

func (s *Server) pkiRotationStatus(ctx context.Context, _ *iam.Principal, r *apiv1.RotationStatusRequest) (*apiv1.RotationResponse, error) {
	if err := rotationCA(r.GetCa()); err != nil {
		return nil, err
	}
	rot, err := s.rotator(r.GetCa())
	if err != nil {
		return nil, err
	}
	return s.rotationStatus(ctx, rot)
}

func (s *Server) pkiRotationAdvance(ctx context.Context, p *iam.Principal, r *apiv1.RotationAdvanceRequest) (*apiv1.RotationResponse, error) {
	if err := rotationCA(r.GetCa()); err != nil {
		return nil, err
	}
	if err := rotationReason(r.GetReason()); err != nil {
		return nil, err
	}
	rot, err := s.rotator(r.GetCa())
	if err != nil {
		return nil, err
	}
	if _, err := rot.Advance(ctx, rotation.AdvanceParams{Actor: "token:" + p.TokenID, Force: r.GetForce(), Reason: r.GetReason()}); err != nil {
		return nil, rotationError(err)
	}
	return s.rotationStatus(ctx, rot)
}

func (s *Server) pkiRotationRollback(ctx context.Context, p *iam.Principal, r *apiv1.RotationRollbackRequest) (*apiv1.RotationResponse, error) {
	if err := rotationCA(r.GetCa()); err != nil {
		return nil, err
	}
	if err := rotationReason(r.GetReason()); err != nil {
		return nil, err
	}
	rot, err := s.rotator(r.GetCa())
	if err != nil {
		return nil, err
	}
	if _, err := rot.Rollback(ctx, "token:"+p.TokenID, r.GetReason()); err != nil {
		return nil, rotationError(err)
	}
	return s.rotationStatus(ctx, rot)
}

// rotationStatus answers with the latest rotation and its counts.
func (s *Server) rotationStatus(ctx context.Context, rot *rotation.Rotator) (*apiv1.RotationResponse, error) {
	st, err := rot.Status(ctx)
	if err != nil {
		return nil, rotationError(err)
	}
	ro := st.Rotation
	return &apiv1.RotationResponse{Rotation: &apiv1.CARotation{
		Id: ro.ID, Ca: ro.CA, Phase: ro.Phase, OldCaId: ro.OldCAID, NewCaId: ro.NewCAID, Threshold: ro.Threshold,
		StartedBy: ro.StartedBy, StartedAt: ts(ro.StartedAt), ActivatedAt: tsp(ro.ActivatedAt), RetiredAt: tsp(ro.RetiredAt),
		RolledBackAt: tsp(ro.RolledBackAt), LiveNodes: int32(st.Live), AckedNodes: int32(st.Acked), MissingNodeIds: st.Missing,
		NodesOffNewCa: int32(st.OffNewCA), OffNewCaNodeIds: st.OffNewCAIDs, Ready: st.Ready, Waiting: st.Waiting,
		RetireAt: tsp(st.RetireAt), OldPinTokens: int32(st.OldPinTokens), OldPinTokenIds: st.OldPinTokenIDs,
	}}, nil
}
