package bmc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/plugin"
	"github.com/better-compute/better-compute/proto/bmcsecret"
	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// Actions of a Request: the suffix of the command kind power.<action>, and
// ActionBoot for boot.set.
const (
	ActionStatus  = "status"
	ActionOn      = "on"
	ActionOff     = "off" // hard
	ActionSoftOff = "soft-off"
	ActionCycle   = "cycle"
	ActionReset   = "reset"
	ActionBoot    = "boot"
)

// Boot devices of a boot Request.
const (
	DevicePXE   = "pxe"
	DeviceDisk  = "disk"
	DeviceBIOS  = "bios"
	DeviceCDROM = "cdrom"
)

// Reasons a Result gives for a failure: the plugin's (plugin.Reason:
// AUTH_FAILED, UNREACHABLE, TIMEOUT, UNSUPPORTED, BMC_ERROR,
// INVALID_REQUEST) and these.
const (
	// ReasonNotConfigured: no such BMC, no credentials for it, or a BMC
	// file that cannot be used.
	ReasonNotConfigured = "NOT_CONFIGURED"
	// ReasonNoPlugin: the plugin directory holds no such plugin.
	ReasonNoPlugin = "NO_PLUGIN"
	// ReasonPluginCrashed: the plugin exited during the call; whether the
	// BMC acted is unknown.
	ReasonPluginCrashed = "PLUGIN_CRASHED"
	// ReasonPluginTimeout: the plugin did not answer in time.
	ReasonPluginTimeout = "PLUGIN_TIMEOUT"
	// ReasonPluginUnavailable: the plugin could not be started.
	ReasonPluginUnavailable = "PLUGIN_UNAVAILABLE"
	// ReasonCancelled: the command was cancelled or its deadline passed.
	ReasonCancelled = "CANCELLED"
)

// SourceSecret is Result.Source for credentials the control plane sealed
// for the node; credentials from the BMC file give "file <path>".
const SourceSecret = "secret"

// Power states of Result.Power.
const (
	PowerOn  = "on"
	PowerOff = "off"
)

// Request is one BMC call. It travels from bcd to the root helper as JSON,
// credentials included (over the helper's socket, which only bcd's user may
// use).
type Request struct {
	// Action is one of the Action constants.
	Action string `json:"action"`
	// BMC names an entry of the BMC file's bmcs list; empty means the
	// node's own BMC.
	BMC string `json:"bmc,omitempty"`
	// Device is the boot device of ActionBoot: DevicePXE, DeviceDisk,
	// DeviceBIOS or DeviceCDROM.
	Device string `json:"device,omitempty"`
	// Persistent keeps the boot device for every later boot (ActionBoot).
	Persistent bool `json:"persistent,omitempty"`
	// Credentials are the node's own BMC credentials the control plane
	// sealed for it (secret bmc/<node id>); nil when it has none. Only used
	// when BMC is empty.
	Credentials *bmcsecret.Credentials `json:"credentials,omitempty"`
	// NodeID names another node whose BMC this node drives as its site's
	// BMC agent (PowerSpec.node_id): its credentials are the secret
	// bmc/<NodeID>, granted for the one command. Empty: this node's own.
	NodeID string `json:"nodeId,omitempty"`
}

// Result is what a call did: the command's detail_json. It never holds a
// credential.
type Result struct {
	// BMC is the BMC's address.
	BMC string `json:"bmc,omitempty"`
	// Name is the BMC's name in the BMC file; empty for the node's own.
	Name string `json:"name,omitempty"`
	// Action is the Request's.
	Action string `json:"action"`
	// NodeID is the Request's: the other node whose BMC answered.
	NodeID string `json:"nodeId,omitempty"`
	// Power is the machine's power, PowerOn or PowerOff, read right after
	// the action (for ActionStatus, the answer itself); empty when it
	// could not be read.
	Power string `json:"power,omitempty"`
	// Answer is the BMC's own words for the power state, for example
	// "Chassis Power is on".
	Answer string `json:"answer,omitempty"`
	// Provider is the provider that answered: "ipmitool" or "redfish".
	Provider string `json:"provider,omitempty"`
	// Device and Persistent echo a boot request.
	Device     string `json:"device,omitempty"`
	Persistent *bool  `json:"persistent,omitempty"`
	// Source says where the credentials came from: SourceSecret (sealed by
	// the control plane) or "file <path>".
	Source string `json:"source,omitempty"`
	// Reason says why the call failed (the Reason constants); empty on
	// success.
	Reason string `json:"reason,omitempty"`
	// TookMS is how long the call took, in milliseconds.
	TookMS int64 `json:"took_ms"`
}

// Error is a failed call. Its text names the BMC and never holds a
// password; Unwrap gives the plugin host's error (match with errors.Is
// against plugin.ErrCrashed, plugin.ErrBMC, ...).
type Error struct {
	msg string
	err error
}

func (e *Error) Error() string { return e.msg }

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.err }

// Plugins is what a Controller needs of the plugin host; *plugin.Host
// implements it.
type Plugins interface {
	Power(ctx context.Context, name string, req *pluginv1.PowerRequest) (*pluginv1.PowerResponse, error)
	BootDevice(ctx context.Context, name string, req *pluginv1.BootDeviceRequest) (*pluginv1.BootDeviceResponse, error)
}

// Config configures a Controller.
type Config struct {
	// File is the BMC file. Defaults to DefaultFile (/etc/bcd/bmc.yaml).
	File string
	// PluginDir is the plugin directory. Defaults to plugin.DefaultDir
	// (/usr/lib/bcd/plugins).
	PluginDir string
	// Plugins carries the calls. Defaults to a plugin.Host on PluginDir,
	// made at the first call (and again after a failure to make one), and
	// closed by Close.
	Plugins Plugins
	// Logger receives one line per call (never a password) and the plugin
	// host's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// Controller carries out BMC calls. Its methods are safe for concurrent use.
type Controller struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	host   *plugin.Host // made by Controller, closed by Close
	closed bool
}

// New returns a Controller for cfg. It touches neither the BMC file nor the
// plugin directory: calls do.
func New(cfg Config) *Controller {
	cfg.File = cmp.Or(cfg.File, DefaultFile)
	cfg.PluginDir = cmp.Or(cfg.PluginDir, plugin.DefaultDir)
	return &Controller{cfg: cfg, log: cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler))}
}

// Close stops the plugins the Controller started. Later calls fail.
func (c *Controller) Close() {
	c.mu.Lock()
	h := c.host
	c.host, c.closed = nil, true
	c.mu.Unlock()
	if h != nil {
		h.Close()
	}
}

// plugins returns what carries the calls.
func (c *Controller) plugins() (Plugins, error) {
	if c.cfg.Plugins != nil {
		return c.cfg.Plugins, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, plugin.ErrClosed
	}
	if c.host == nil {
		h, err := plugin.New(plugin.Config{Dir: c.cfg.PluginDir, Logger: c.log})
		if err != nil {
			return nil, err
		}
		c.host = h
	}
	return c.host, nil
}

// Do carries out req. It always returns a Result, filled as far as the call
// went (the BMC, the reason of a failure); the error, an *Error or ctx's
// error, names the BMC and says what went wrong.
func (c *Controller) Do(ctx context.Context, req *Request) (*Result, error) {
	start := time.Now()
	res := &Result{Action: req.Action, BMC: "", Name: req.BMC}
	fail := func(reason string, err error) (*Result, error) {
		res.Reason = reason
		res.TookMS = time.Since(start).Milliseconds()
		c.log.WarnContext(ctx, "BMC call failed", "action", req.Action, "bmc", res.BMC, "name", res.Name,
			"source", res.Source, "reason", reason, logkey.Err, err)
		return res, err
	}
	if err := checkRequest(req); err != nil {
		return fail(string(plugin.ReasonInvalidRequest), &Error{msg: err.Error(), err: err})
	}
	t, name, source, err := c.resolve(req)
	if err != nil {
		label := "the node's own BMC"
		if req.BMC != "" {
			label = "bmc " + req.BMC
		}
		return fail(ReasonNotConfigured, &Error{msg: label + ": " + err.Error(), err: err})
	}
	res.BMC, res.Name, res.Source = t.Address, t.Name, source
	target, err := t.pluginTarget()
	if err != nil {
		return fail(ReasonNotConfigured, c.wrap(t, err))
	}
	p, err := c.plugins()
	if err != nil {
		return fail(ReasonPluginUnavailable, c.wrap(t, fmt.Errorf("plugin host: %w", err)))
	}
	if req.Action == ActionBoot {
		persistent := req.Persistent
		res.Device, res.Persistent = req.Device, &persistent
		resp, err := p.BootDevice(ctx, name, &pluginv1.BootDeviceRequest{Target: target, Device: bootDevices[req.Device], Persistent: persistent})
		if err != nil {
			return fail(reasonOf(err), c.wrap(t, err))
		}
		res.Provider = providerName(resp.GetProvider())
	} else {
		resp, err := p.Power(ctx, name, &pluginv1.PowerRequest{Target: target, Action: powerActions[req.Action]})
		if err != nil {
			return fail(reasonOf(err), c.wrap(t, err))
		}
		res.Provider = providerName(resp.GetProvider())
		if req.Action != ActionStatus {
			// Report the state the action left, read at once; a failed
			// read does not undo a successful action.
			resp, err = p.Power(ctx, name, &pluginv1.PowerRequest{Target: target, Action: pluginv1.PowerAction_POWER_ACTION_STATUS})
			if err != nil {
				c.log.InfoContext(ctx, "Power state not read after the action", "bmc", t.Address, logkey.Err, c.wrap(t, err))
				resp = nil
			}
		}
		res.Power, res.Answer = powerName(resp.GetState()), resp.GetRawState()
	}
	res.TookMS = time.Since(start).Milliseconds()
	c.log.InfoContext(ctx, "BMC call", "action", req.Action, "bmc", res.BMC, "name", res.Name, "source", source,
		"power", res.Power, "provider", res.Provider, "took_ms", res.TookMS)
	return res, nil
}

// resolve finds the BMC req means, its credentials, and the plugin to call.
func (c *Controller) resolve(req *Request) (t *Target, pluginName, source string, err error) {
	if req.BMC == "" && req.Credentials != nil {
		t, err := fromCredentials(req.Credentials)
		if err != nil {
			return nil, "", "", fmt.Errorf("the credentials sealed by the control plane are unusable: %w", err)
		}
		pluginName := DefaultPlugin
		if f, ferr := ReadFile(c.cfg.File); ferr == nil {
			pluginName = f.Plugin
		}
		return t, pluginName, SourceSecret, nil
	}
	f, err := ReadFile(c.cfg.File)
	switch {
	case errors.Is(err, ErrNoFile) && req.BMC == "":
		return nil, "", "", fmt.Errorf("no credentials: set them with better-compute bmc credentials set, or in %s (bmc)", c.cfg.File)
	case errors.Is(err, ErrNoFile):
		return nil, "", "", fmt.Errorf("no BMC named %q: %s does not exist", req.BMC, c.cfg.File)
	case err != nil:
		return nil, "", "", err
	}
	source = "file " + c.cfg.File
	if req.BMC == "" {
		if f.BMC == nil {
			return nil, "", "", fmt.Errorf("no credentials: set them with better-compute bmc credentials set, or in %s (bmc)", c.cfg.File)
		}
		return f.BMC, f.Plugin, source, nil
	}
	t, err = f.lookup(req.BMC)
	if err != nil {
		return nil, "", "", fmt.Errorf("%w (%s)", err, c.cfg.File)
	}
	return t, f.Plugin, source, nil
}

// wrap makes err an *Error that names t and holds no password.
func (c *Controller) wrap(t *Target, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		var pe *plugin.Error
		if !errors.As(err, &pe) {
			return err
		}
	}
	msg := err.Error()
	switch {
	case !strings.Contains(msg, "bmc "+t.Address):
		msg = t.String() + ": " + msg
	case t.Name != "":
		msg = "bmc " + t.Name + ": " + msg
	}
	return &Error{msg: plugin.Scrub(msg, t.Password), err: err}
}

// reasonOf says why a call failed.
func reasonOf(err error) string {
	var pe *plugin.Error
	if errors.As(err, &pe) && pe.Reason != "" {
		return string(pe.Reason)
	}
	switch {
	case errors.Is(err, plugin.ErrCrashed):
		return ReasonPluginCrashed
	case errors.Is(err, plugin.ErrTimeout):
		return ReasonPluginTimeout
	case errors.Is(err, plugin.ErrNotFound):
		return ReasonNoPlugin
	case errors.Is(err, plugin.ErrUnsupported):
		return string(plugin.ReasonUnsupported)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ReasonCancelled
	}
	return ReasonPluginUnavailable
}

// pluginTarget is t as the plugin protocol's BMCTarget.
func (t *Target) pluginTarget() (*pluginv1.BMCTarget, error) {
	out := &pluginv1.BMCTarget{Address: t.Address, Username: t.Username, Password: t.Password,
		IpmiPort: t.IPMIPort, IpmiCipherSuite: t.IPMICipherSuite, RedfishPort: t.RedfishPort}
	for _, p := range t.Providers {
		switch p {
		case bmcsecret.ProviderIPMITool:
			out.Providers = append(out.Providers, pluginv1.Provider_PROVIDER_IPMITOOL)
		case bmcsecret.ProviderRedfish:
			out.Providers = append(out.Providers, pluginv1.Provider_PROVIDER_REDFISH)
		}
	}
	if t.Timeout > 0 {
		out.Timeout = durationpb.New(t.Timeout)
	}
	if t.RedfishCAFile != "" {
		b, err := os.ReadFile(t.RedfishCAFile)
		if err != nil {
			return nil, fmt.Errorf("redfishCAFile: %w", err)
		}
		out.RedfishCaPem = b
	}
	return out, nil
}

var powerActions = map[string]pluginv1.PowerAction{
	ActionStatus:  pluginv1.PowerAction_POWER_ACTION_STATUS,
	ActionOn:      pluginv1.PowerAction_POWER_ACTION_ON,
	ActionOff:     pluginv1.PowerAction_POWER_ACTION_OFF,
	ActionSoftOff: pluginv1.PowerAction_POWER_ACTION_SOFT_OFF,
	ActionCycle:   pluginv1.PowerAction_POWER_ACTION_CYCLE,
	ActionReset:   pluginv1.PowerAction_POWER_ACTION_RESET,
}

var bootDevices = map[string]pluginv1.BootDevice{
	DevicePXE:   pluginv1.BootDevice_BOOT_DEVICE_PXE,
	DeviceDisk:  pluginv1.BootDevice_BOOT_DEVICE_DISK,
	DeviceBIOS:  pluginv1.BootDevice_BOOT_DEVICE_BIOS,
	DeviceCDROM: pluginv1.BootDevice_BOOT_DEVICE_CDROM,
}

// CheckAction reports whether action is one of the Action constants.
func CheckAction(action string) error {
	if _, ok := powerActions[action]; ok || action == ActionBoot {
		return nil
	}
	return fmt.Errorf("unknown BMC action %q: want status, on, off, soft-off, cycle, reset or boot", action)
}

// CheckDevice reports whether device is a boot device this package knows.
func CheckDevice(device string) error {
	if _, ok := bootDevices[device]; ok {
		return nil
	}
	return fmt.Errorf("unknown boot device %q: want pxe, disk, bios or cdrom", device)
}

func checkRequest(req *Request) error {
	if err := CheckAction(req.Action); err != nil {
		return err
	}
	if req.BMC != "" && !validName(req.BMC) {
		return fmt.Errorf("BMC name %q: want 1 to 63 of A-Z, a-z, 0-9, '.', '-', '_'", req.BMC)
	}
	if req.Action == ActionBoot {
		return CheckDevice(req.Device)
	}
	if req.Device != "" || req.Persistent {
		return fmt.Errorf("a device is only for the boot action, not %s", req.Action)
	}
	return nil
}

func providerName(p pluginv1.Provider) string {
	switch p {
	case pluginv1.Provider_PROVIDER_IPMITOOL:
		return bmcsecret.ProviderIPMITool
	case pluginv1.Provider_PROVIDER_REDFISH:
		return bmcsecret.ProviderRedfish
	}
	return ""
}

func powerName(s pluginv1.PowerState) string {
	switch s {
	case pluginv1.PowerState_POWER_STATE_ON:
		return PowerOn
	case pluginv1.PowerState_POWER_STATE_OFF:
		return PowerOff
	}
	return ""
}
