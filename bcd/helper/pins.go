package helper

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/upgrade"
)

// OpPinsApply applies a release pin statement to root's pin file for an
// unprivileged node (upgrade.ApplyPinStatement).
const OpPinsApply = "pins.apply"

// PinsRequest is OpPinsApply's request: a pin statement and its minisign
// signature (installer/manifest, SignPinStatement).
//
// The helper trusts none of it: it verifies the statement against its own
// pins (Config.PinsFile), so a node can at worst ask it to apply a
// statement signed by a key the machine already pins.
type PinsRequest struct {
	Statement []byte `json:"statement"`
	Signature []byte `json:"signature"`
}

// pinsApply carries out OpPinsApply; the last frame's Result is the
// upgrade.PinChange.
func (s *Server) pinsApply(ctx context.Context, enc *json.Encoder, req *PinsRequest) {
	f := Frame{Done: true}
	c, err := upgrade.ApplyPinStatement(cmp.Or(s.cfg.PinsFile, upgrade.DefaultPinsFile), req.Statement, req.Signature)
	if err != nil {
		s.log.WarnContext(ctx, "Helper refused a release pin statement", logkey.Err, err)
		f.ExitCode, f.Error = -1, err.Error()
	} else {
		if c.Changed {
			s.log.InfoContext(ctx, "Applied a release pin statement at the node's request", "action", c.Statement.Action, "pin", c.Statement.Pin)
		}
		f.Result, _ = json.Marshal(c)
	}
	_ = enc.Encode(f)
}

// ApplyPinStatement asks the helper to verify a pin statement against root's
// pin file and apply it (upgrade.ApplyPinStatement). A refusal is an error
// naming the helper's reason.
func (c *Client) ApplyPinStatement(ctx context.Context, statement, sig []byte) (*upgrade.PinChange, error) {
	f, err := c.do(ctx, Request{Op: OpPinsApply, Pins: &PinsRequest{Statement: statement, Signature: sig}}, nil)
	if err != nil {
		return nil, err
	}
	if f.Error != "" {
		return nil, fmt.Errorf("root helper: %s", f.Error)
	}
	var pc upgrade.PinChange
	if err := json.Unmarshal(f.Result, &pc); err != nil || pc.Statement == nil {
		return nil, errors.New("root helper: no pin change in its answer")
	}
	return &pc, nil
}
