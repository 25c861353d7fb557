package api

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/installer/manifest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// Bounds of the release pin methods.
const (
	// MaxPinSignatureBytes bounds a pin statement's signature.
	MaxPinSignatureBytes = 2 << 10
	// MaxPinStatements is how many statements the deployment accepts in
	// all (gateways send them all to every node).
	MaxPinStatements = 64
	// maxPinMissing bounds ReleasePinResponse.missing_node_ids.
	maxPinMissing = 100
)

// pinsInForce are downloads.releasePins with the accepted statements
// applied in order, and the statements.
func (s *Server) pinsInForce(ctx context.Context) ([]string, []*store.ReleasePinStatement, error) {
	sts, err := s.store.ReleasePinStatements(ctx)
	if err != nil {
		return nil, nil, err
	}
	pins := slices.Clone(s.cfg.ReleasePins)
	for _, st := range sts {
		switch {
		case st.Action == manifest.PinAdd && !slices.Contains(pins, st.Pin):
			pins = append(pins, st.Pin)
		case st.Action == manifest.PinRemove:
			if i := slices.Index(pins, st.Pin); i >= 0 && len(pins) > 1 {
				pins = slices.Delete(pins, i, i+1)
			}
		}
	}
	return pins, sts, nil
}

// acceptPinStatement checks a request's bounds and verifies its statement
// against the pins in force; the statement must be of action.
func (s *Server) acceptPinStatement(ctx context.Context, r *apiv1.ReleasePinStatementRequest, action string) (*manifest.PinStatement, []string, error) {
	switch {
	case len(r.GetStatement()) == 0 || len(r.GetStatement()) > manifest.MaxPinStatementSize:
		return nil, nil, invalid("statement", "want the pin statement release pins sign wrote, 1 to %d bytes", manifest.MaxPinStatementSize)
	case len(r.GetSignature()) == 0 || len(r.GetSignature()) > MaxPinSignatureBytes:
		return nil, nil, invalid("signature", "want the statement's .minisig, 1 to %d bytes", MaxPinSignatureBytes)
	}
	pins, sts, err := s.pinsInForce(ctx)
	if err != nil {
		return nil, nil, err
	}
	if len(pins) == 0 {
		return nil, nil, invalid("statement", "no release keys are pinned (downloads.releasePins): a statement must be signed by a pinned key")
	}
	if len(sts) >= MaxPinStatements {
		return nil, nil, &Error{Code: apiv1.CodeConflict, Message: "the deployment holds the most pin statements it sends to nodes (64)"}
	}
	st, err := manifest.VerifyPinStatement(r.GetStatement(), r.GetSignature(), pins)
	switch {
	case errors.Is(err, manifest.ErrUnpinnedKey):
		return nil, nil, invalid("statement", "signed by a key the deployment does not pin: a statement must be signed by a key nodes already pin (%v)", err)
	case errors.Is(err, manifest.ErrBadSignature):
		return nil, nil, invalid("signature", "does not verify the statement: %v", err)
	case err != nil:
		return nil, nil, invalid("statement", "%v", err)
	}
	if st.Action != action {
		return nil, nil, invalid("statement", "a statement to %s %s: use release.pins%s", st.Action, st.Pin, titled(st.Action))
	}
	return st, pins, nil
}

func titled(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func (s *Server) releasePinsAdd(ctx context.Context, p *iam.Principal, r *apiv1.ReleasePinStatementRequest) (*apiv1.ReleasePinResponse, error) {
	st, _, err := s.acceptPinStatement(ctx, r, manifest.PinAdd)
	if err != nil {
		return nil, err
	}
	if _, err := s.store.ReleasePinStatementAdd(ctx, &store.ReleasePinStatement{Action: st.Action, Pin: st.Pin,
		Statement: r.GetStatement(), Signature: r.GetSignature(), SignedAt: st.CreatedAt, AddedBy: "token:" + p.TokenID}); err != nil {
		return nil, err
	}
	return s.pinStatus(ctx, st.Pin)
}

func (s *Server) releasePinsStatus(ctx context.Context, _ *iam.Principal, r *apiv1.ReleasePinStatusRequest) (*apiv1.ReleasePinResponse, error) {
	if _, err := manifest.ParsePin(r.GetPin()); err != nil || len(r.GetPin()) > 64 {
		return nil, invalid("pin", "want a release key pin sha256/... as release keygen prints it")
	}
	return s.pinStatus(ctx, r.GetPin())
}

func (s *Server) releasePinsRemove(ctx context.Context, p *iam.Principal, r *apiv1.ReleasePinStatementRequest) (*apiv1.ReleasePinResponse, error) {
	st, pins, err := s.acceptPinStatement(ctx, r, manifest.PinRemove)
	if err != nil {
		return nil, err
	}
	after := slices.DeleteFunc(slices.Clone(pins), func(x string) bool { return x == st.Pin })
	if len(after) == 0 {
		return nil, &Error{Code: apiv1.CodeConflict, Message: "it is the deployment's last release pin: add the next key's pin first (release pins add)"}
	}
	// The pins that verify the current release: its signer's, else every
	// pin left.
	need, version := after, ""
	if s.cfg.Releases != nil {
		if vs := s.cfg.Releases.Versions("bcd"); len(vs) > 0 {
			version = vs[0]
			if mf, sig, err := s.cfg.Releases.Manifest(version); err == nil {
				for _, k := range pins {
					if _, err := manifest.Verify(mf, sig, []string{k}, s.now()); err == nil {
						need = []string{k}
						break
					}
				}
			}
		}
	}
	if slices.Contains(need, st.Pin) {
		return nil, &Error{Code: apiv1.CodeConflict, Message: "the current release " + version + " is signed by the key of " + st.Pin +
			": no node could verify it without this pin; sign releases with the next key first"}
	}
	c, err := s.store.ReleasePinCounts(ctx, need, maxPinMissing)
	if err != nil {
		return nil, err
	}
	if c.Holding < c.Live {
		what := "the current release " + version
		if version == "" {
			what = "a release"
		}
		return nil, &Error{Code: apiv1.CodeConflict, Message: fmt.Sprintf(
			"%d of %d live nodes would be left with no pin that verifies %s: %s (release pins status %s lists who holds it)",
			c.Live-c.Holding, c.Live, what, strings.Join(c.Missing, ", "), need[0])}
	}
	if _, err := s.store.ReleasePinStatementAdd(ctx, &store.ReleasePinStatement{Action: st.Action, Pin: st.Pin,
		Statement: r.GetStatement(), Signature: r.GetSignature(), SignedAt: st.CreatedAt, AddedBy: "token:" + p.TokenID}); err != nil {
		return nil, err
	}
	return s.pinStatus(ctx, st.Pin)
}

// pinStatus answers with pin's reach across the live nodes.
func (s *Server) pinStatus(ctx context.Context, pin string) (*apiv1.ReleasePinResponse, error) {
	pins, sts, err := s.pinsInForce(ctx)
	if err != nil {
		return nil, err
	}
	c, err := s.store.ReleasePinCounts(ctx, []string{pin}, maxPinMissing)
	if err != nil {
		return nil, err
	}
	return &apiv1.ReleasePinResponse{Pin: pin, LiveNodes: int32(c.Live), HoldingNodes: int32(c.Holding), MissingNodeIds: c.Missing,
		Pins: pins, Statements: int32(len(sts))}, nil
}
