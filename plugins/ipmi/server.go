package ipmi

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"

	"github.com/better-compute/better-compute/bcd/plugin"
	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// Name is the plugin's name: its executable is bcx-ipmi.
const Name = "ipmi"

// Config configures a Server.
type Config struct {
	// Version is the version Info reports, semantic version without a
	// leading "v". Defaults to "0.0.0-dev".
	Version string
	// IpmitoolPath is the ipmitool executable. Defaults to "ipmitool"
	// looked up in PATH; when there is none, the ipmitool provider reports
	// UNSUPPORTED and the others still work.
	IpmitoolPath string
	// Logger receives the plugin's records, each call's password scrubbed.
	// Defaults to discarding them.
	Logger *slog.Logger
}

// Server is bcx-ipmi's implementation of the plugin protocol.
type Server struct {
	pluginv1.UnimplementedPluginServiceServer
	version  string
	ipmitool string // "" when not installed
	log      *slog.Logger
}

// New returns a Server for cfg.
func New(cfg Config) *Server {
	s := &Server{
		version: cmp.Or(cfg.Version, "0.0.0-dev"),
		log:     cfg.Logger,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if p, err := exec.LookPath(cmp.Or(cfg.IpmitoolPath, "ipmitool")); err == nil {
		s.ipmitool = p
	}
	return s
}

// callLogger is the logger of one call on t: t's password scrubbed from
// every record, bmclib's included.
func (s *Server) callLogger(t *target, op string) *slog.Logger {
	secret := []string{t.password}
	h := plugin.RedactHandler(s.log.Handler(), func() []string { return secret })
	return slog.New(h).With(keyBMC, t.address, keyOp, op)
}

// Info names the plugin and its capabilities.
func (s *Server) Info(context.Context, *pluginv1.InfoRequest) (*pluginv1.InfoResponse, error) {
	return &pluginv1.InfoResponse{
		Name:         Name,
		Version:      s.version,
		Capabilities: []string{plugin.CapabilityPower, plugin.CapabilityBoot, plugin.CapabilityBMCInfo},
	}, nil
}

// Health says which providers can run. The plugin is healthy whenever it
// answers: Redfish needs nothing on the machine.
func (s *Server) Health(context.Context, *pluginv1.HealthRequest) (*pluginv1.HealthResponse, error) {
	msg := "providers: ipmitool (" + s.ipmitool + "), redfish"
	if s.ipmitool == "" {
		msg = "providers: redfish; ipmitool is not installed, so IPMI is unavailable"
	}
	return &pluginv1.HealthResponse{Healthy: true, Message: msg}, nil
}

// powerStates maps actions other than STATUS to bmclib's PowerSet states.
var powerStates = map[pluginv1.PowerAction]string{
	pluginv1.PowerAction_POWER_ACTION_ON:       "on",
	pluginv1.PowerAction_POWER_ACTION_OFF:      "off",
	pluginv1.PowerAction_POWER_ACTION_SOFT_OFF: "soft",
	pluginv1.PowerAction_POWER_ACTION_CYCLE:    "cycle",
	pluginv1.PowerAction_POWER_ACTION_RESET:    "reset",
}

// Power reads or changes the power of the machine behind the BMC.
func (s *Server) Power(ctx context.Context, req *pluginv1.PowerRequest) (*pluginv1.PowerResponse, error) {
	t, err := parseTarget(req.GetTarget())
	if err != nil {
		return nil, invalid(err)
	}
	action := req.GetAction()
	op := "power " + strings.ToLower(strings.TrimPrefix(action.String(), "POWER_ACTION_"))
	resp := &pluginv1.PowerResponse{}
	var fn func(ctx context.Context, ss *session) error
	if action == pluginv1.PowerAction_POWER_ACTION_STATUS {
		fn = func(ctx context.Context, ss *session) error {
			c, err := ss.bmc(ctx)
			if err != nil {
				return err
			}
			raw, err := c.PowerStateGet(ctx)
			if err != nil {
				return err
			}
			raw = strings.TrimSpace(raw)
			state := normalisePowerState(raw)
			if state == pluginv1.PowerState_POWER_STATE_UNSPECIFIED {
				return fmt.Errorf("unrecognised power state %q", raw)
			}
			resp.State, resp.RawState = state, raw
			return nil
		}
	} else {
		state, ok := powerStates[action]
		if !ok {
			return nil, invalid(fmt.Errorf("bmc %s: unknown power action %v", t.address, action))
		}
		fn = func(ctx context.Context, ss *session) error {
			c, err := ss.bmc(ctx)
			if err != nil {
				return err
			}
			done, err := c.PowerSet(ctx, state)
			if err != nil {
				return err
			}
			// bmclib's Redfish soft-off reports false after a successful
			// GracefulShutdown request; everywhere else false is a failure.
			if !done && !(state == "soft" && ss.provider == pluginv1.Provider_PROVIDER_REDFISH) {
				return fmt.Errorf("the BMC did not confirm power %s", state)
			}
			return nil
		}
	}
	p, err := s.each(ctx, t, op, fn)
	if err != nil {
		return nil, err
	}
	resp.Provider = p
	return resp, nil
}

// normalisePowerState maps a provider's power state to on or off: ipmitool's
// "Chassis Power is on" and Redfish's On, Off, PoweringOn and PoweringOff.
func normalisePowerState(raw string) pluginv1.PowerState {
	s := strings.ToLower(strings.TrimSpace(raw))
	s = strings.TrimPrefix(s, "chassis power is ")
	switch s {
	case "on", "poweringon":
		return pluginv1.PowerState_POWER_STATE_ON
	case "off", "poweringoff":
		return pluginv1.PowerState_POWER_STATE_OFF
	}
	return pluginv1.PowerState_POWER_STATE_UNSPECIFIED
}

// bootDevices maps boot devices to bmclib's names.
var bootDevices = map[pluginv1.BootDevice]string{
	pluginv1.BootDevice_BOOT_DEVICE_PXE:   "pxe",
	pluginv1.BootDevice_BOOT_DEVICE_DISK:  "disk",
	pluginv1.BootDevice_BOOT_DEVICE_BIOS:  "bios",
	pluginv1.BootDevice_BOOT_DEVICE_CDROM: "cdrom",
}

// BootDevice sets the next boot device, or the persistent one.
func (s *Server) BootDevice(ctx context.Context, req *pluginv1.BootDeviceRequest) (*pluginv1.BootDeviceResponse, error) {
	t, err := parseTarget(req.GetTarget())
	if err != nil {
		return nil, invalid(err)
	}
	dev, ok := bootDevices[req.GetDevice()]
	if !ok {
		return nil, invalid(fmt.Errorf("bmc %s: unknown boot device %v", t.address, req.GetDevice()))
	}
	when := "once"
	if req.GetPersistent() {
		when = "persistent"
	}
	p, err := s.each(ctx, t, "boot "+dev+" "+when, func(ctx context.Context, ss *session) error {
		c, err := ss.bmc(ctx)
		if err != nil {
			return err
		}
		done, err := c.BootDeviceSet(ctx, dev, req.GetPersistent(), req.GetEfi())
		if err != nil {
			return err
		}
		if !done {
			return fmt.Errorf("the BMC did not confirm boot device %s", dev)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &pluginv1.BootDeviceResponse{Provider: p}, nil
}

// BMCInfo reads what the BMC says about itself.
func (s *Server) BMCInfo(ctx context.Context, req *pluginv1.BMCInfoRequest) (*pluginv1.BMCInfoResponse, error) {
	t, err := parseTarget(req.GetTarget())
	if err != nil {
		return nil, invalid(err)
	}
	var resp *pluginv1.BMCInfoResponse
	_, err = s.each(ctx, t, "bmc info", func(ctx context.Context, ss *session) error {
		var err error
		switch ss.provider {
		case pluginv1.Provider_PROVIDER_IPMITOOL:
			resp, err = s.ipmitoolInfo(ctx, t)
		case pluginv1.Provider_PROVIDER_REDFISH:
			resp, err = redfishInfo(ctx, t)
		default:
			err = errUnsupported
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}
