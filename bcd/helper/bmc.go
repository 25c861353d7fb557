package helper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/better-compute/better-compute/bcd/bmc"
)

// BMCRunner carries out BMC calls in the helper; *bmc.Controller
// implements it.
type BMCRunner interface {
	Do(ctx context.Context, req *bmc.Request) (*bmc.Result, error)
}

// errNoBMC answers OpBMC on a helper started without a BMC controller.
var errNoBMC = errors.New("this root helper does not run BMC calls")

// bmc runs OpBMC: one call through the helper's controller, answered with
// one Frame carrying the Result (and the error, which names the BMC and
// holds no password).
func (s *Server) bmc(ctx context.Context, enc *json.Encoder, req *bmc.Request) {
	f := Frame{Done: true}
	switch {
	case req == nil:
		f.ExitCode, f.Error = -1, "bmc needs a request"
	case s.cfg.BMC == nil:
		f.ExitCode, f.Error = -1, errNoBMC.Error()
	default:
		// The controller logs the call (never its credentials).
		res, err := s.cfg.BMC.Do(ctx, req)
		if res != nil {
			f.Result, _ = json.Marshal(res)
		}
		if err != nil {
			f.ExitCode, f.Error = -1, err.Error()
			f.Cancelled = ctx.Err() != nil
		}
	}
	_ = enc.Encode(f)
}

// BMC asks the helper to carry out req (as root, through the plugin host it
// runs). It returns the helper's Result, filled as far as the call went,
// and an error naming the BMC when the call failed; ErrUnavailable when no
// helper listens. Ending ctx closes the connection, which cancels the call.
func (c *Client) BMC(ctx context.Context, req *bmc.Request) (*bmc.Result, error) {
	f, err := c.do(ctx, Request{Op: OpBMC, BMC: req}, nil)
	if err != nil {
		return nil, err
	}
	var res *bmc.Result
	if len(f.Result) > 0 {
		res = &bmc.Result{}
		if err := json.Unmarshal(f.Result, res); err != nil {
			return nil, fmt.Errorf("root helper: malformed BMC result: %w", err)
		}
	}
	switch {
	case f.Cancelled && ctx.Err() != nil:
		return res, ctx.Err()
	case f.Error != "":
		return res, errors.New(f.Error)
	case res == nil:
		return nil, errors.New("root helper: no BMC result")
	}
	return res, nil
}
