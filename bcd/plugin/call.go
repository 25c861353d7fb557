package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// deadlineSlack is how close to the call's deadline an error without the
// plugin's answer counts as the deadline passing: the plugin's gRPC server
// may cancel the stream on its copy of the deadline a moment before the
// host's own timer fires.
const deadlineSlack = 50 * time.Millisecond

// exitGrace is how long a call that failed without the plugin's answer
// waits for the plugin's exit to show, to tell a crash from a transport
// error.
const exitGrace = 2 * time.Second

// Power reads or changes a machine's power through the BMC plugin called
// name (for example "ipmi"). The call's deadline is the earliest of ctx's,
// the target's timeout (DefaultBMCTimeout when unset) plus CallGrace, and
// CallTimeout. Errors are *Error: ErrBMC with the plugin's Reason when the
// BMC failed, ErrCrashed, ErrTimeout, ErrUnavailable, ErrUnsupported,
// ErrInvalid, ErrNotFound, ErrClosed, or the context's error when ctx ended
// first.
func (h *Host) Power(ctx context.Context, name string, req *pluginv1.PowerRequest) (*pluginv1.PowerResponse, error) {
	var resp *pluginv1.PowerResponse
	err := h.call(ctx, name, CapabilityPower, CapabilityPower, req.GetTarget(), func(ctx context.Context, c pluginv1.PluginServiceClient) error {
		var err error
		resp, err = c.Power(ctx, req)
		return err
	})
	return resp, err
}

// BootDevice sets the next boot device (or the persistent one) through the
// BMC plugin called name. Deadline and errors as for Power.
func (h *Host) BootDevice(ctx context.Context, name string, req *pluginv1.BootDeviceRequest) (*pluginv1.BootDeviceResponse, error) {
	var resp *pluginv1.BootDeviceResponse
	err := h.call(ctx, name, CapabilityBoot, CapabilityBoot, req.GetTarget(), func(ctx context.Context, c pluginv1.PluginServiceClient) error {
		var err error
		resp, err = c.BootDevice(ctx, req)
		return err
	})
	return resp, err
}

// BMCInfo reads what a BMC says about itself through the plugin called name.
// Deadline and errors as for Power.
func (h *Host) BMCInfo(ctx context.Context, name string, req *pluginv1.BMCInfoRequest) (*pluginv1.BMCInfoResponse, error) {
	var resp *pluginv1.BMCInfoResponse
	err := h.call(ctx, name, CapabilityBMCInfo, CapabilityBMCInfo, req.GetTarget(), func(ctx context.Context, c pluginv1.PluginServiceClient) error {
		var err error
		resp, err = c.BMCInfo(ctx, req)
		return err
	})
	return resp, err
}

// call runs fn against the running plugin name under the BMC call deadline,
// holding target's password for scrubbing, and turns what went wrong into
// an *Error.
func (h *Host) call(ctx context.Context, name, op, capability string, target *pluginv1.BMCTarget,
	fn func(context.Context, pluginv1.PluginServiceClient) error) error {
	release := h.secrets.hold(target.GetPassword())
	defer release()
	fail := func(kind error, reason Reason, msg string) error {
		return &Error{Plugin: name, Op: op, Reason: reason, Message: h.secrets.scrub(msg), kind: kind}
	}

	m, err := h.plugin(name)
	if errors.Is(err, ErrNotFound) {
		// Installed since the last scan?
		if rerr := h.rescan(); rerr == nil {
			m, err = h.plugin(name)
		}
	}
	if err != nil {
		return fail(err, "", err.Error())
	}
	if target == nil {
		return fail(ErrInvalid, ReasonInvalidRequest, "the request names no BMC target")
	}

	timeout := cmp.Or(target.GetTimeout().AsDuration(), DefaultBMCTimeout)
	if timeout < 0 {
		return fail(ErrInvalid, ReasonInvalidRequest, "negative BMC timeout")
	}
	timeout = min(timeout+h.cfg.CallGrace, h.cfg.CallTimeout)
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	inst, err := m.get(cctx)
	if err != nil {
		if ctx.Err() != nil {
			return fail(ctx.Err(), "", "waiting for the plugin: "+ctx.Err().Error())
		}
		return fail(err, "", err.Error())
	}
	if !m.can(capability) {
		return fail(ErrUnsupported, "", fmt.Sprintf("the plugin does not announce capability %q", capability))
	}

	err = fn(cctx, inst.rpc)
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	if reason, ok := reportedReason(st); ok {
		kind := ErrBMC
		switch reason {
		case ReasonUnsupported:
			kind = ErrUnsupported
		case ReasonInvalidRequest:
			kind = ErrInvalid
		}
		return fail(kind, reason, st.Message())
	}

	// Not the plugin's answer: the plugin died, hung, or the caller gave up.
	select {
	case <-inst.exited:
		return fail(ErrCrashed, "", m.crashed(inst))
	default:
	}
	if ctx.Err() != nil {
		return fail(ctx.Err(), "", "cancelled by the caller: "+ctx.Err().Error())
	}
	if deadline, _ := cctx.Deadline(); cctx.Err() != nil || st.Code() == codes.DeadlineExceeded || time.Until(deadline) < deadlineSlack {
		h.spawn(func() { m.probe(inst) }) // bounded by HealthTimeout, cut short by Close
		return fail(ErrTimeout, "", fmt.Sprintf("no answer within %s", timeout))
	}
	if inst.killReason.Load() != nil || inst.stopping.Load() {
		// The host is killing this process: the exit is coming.
		select {
		case <-inst.exited:
		case <-h.clock.After(exitGrace):
		}
		if inst.stopping.Load() {
			return fail(ErrClosed, "", "the plugin was stopped during the call")
		}
		return fail(ErrCrashed, "", m.crashed(inst))
	}
	switch st.Code() {
	case codes.Unavailable, codes.Canceled:
		// What a dying plugin's connection gives: wait for the exit to show.
		select {
		case <-inst.exited:
			return fail(ErrCrashed, "", m.crashed(inst))
		case <-h.clock.After(exitGrace):
		case <-h.closing:
		}
		return fail(ErrUnavailable, "", st.Message())
	case codes.Unimplemented:
		return fail(ErrUnsupported, "", st.Message())
	default:
		return fail(ErrBMC, ReasonBMCError, st.Message())
	}
}

// crashed records that inst exited during a call and returns the message
// for the caller.
func (m *managed) crashed(inst *instance) string {
	m.mu.Lock()
	if m.inst == inst {
		m.exitedLocked(inst)
	}
	m.mu.Unlock()
	return "the plugin process exited during the call (it is restarted; whether the BMC acted is unknown)"
}

// probe checks a plugin that let a call run past its deadline: one that does
// not answer its health check either is recycled.
func (m *managed) probe(inst *instance) {
	ctx, cancel := context.WithTimeout(context.Background(), m.h.cfg.HealthTimeout)
	defer cancel()
	go func() {
		select {
		case <-m.h.closing:
			cancel()
		case <-ctx.Done():
		}
	}()
	_, err := inst.rpc.Health(ctx, &pluginv1.HealthRequest{})
	if err == nil {
		m.h.log.Debug("Plugin still answers its health check", keyPlugin, m.name, keyPID, inst.pid)
		return
	}
	if m.h.isClosed() {
		return
	}
	select {
	case <-inst.exited:
		return
	default:
	}
	m.recycle(inst, fmt.Sprintf("a call ran past its deadline and the health check got no answer within %s", m.h.cfg.HealthTimeout))
}

// isClosed reports whether Close has been called.
func (h *Host) isClosed() bool {
	select {
	case <-h.closing:
		return true
	default:
		return false
	}
}
