package sessionv1

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
)

// Command kinds: the values of Command.kind, as session.proto lists them.
// These constants are the one definition of the wire names; the API, the
// gateway, the simulator and bcd all refer to them.
const (
	// KindExec runs a program (ExecSpec).
	KindExec = "exec"
	// KindInventoryRefresh makes the node collect and send its inventory
	// now; it takes no spec.
	KindInventoryRefresh = "inventory.refresh"
	// KindPowerStatus asks a BMC for the power state (PowerSpec).
	KindPowerStatus = "power.status"
	// KindPowerOn powers a machine on (PowerSpec).
	KindPowerOn = "power.on"
	// KindPowerOff powers a machine off at once, a hard off (PowerSpec).
	KindPowerOff = "power.off"
	// KindPowerSoftOff asks the operating system to shut down (PowerSpec).
	KindPowerSoftOff = "power.soft-off"
	// KindPowerCycle powers a machine off and on again (PowerSpec).
	KindPowerCycle = "power.cycle"
	// KindPowerReset resets a machine (PowerSpec).
	KindPowerReset = "power.reset"
	// KindBootSet sets the next boot device (BootSpec).
	KindBootSet = "boot.set"
	// KindUpgrade moves bcd to a release (UpgradeSpec).
	KindUpgrade = "upgrade"
	// KindReboot reboots the machine; it takes no spec.
	KindReboot = "reboot"
	// KindDrain makes the node wait for its running commands to end while
	// it refuses new exec, upgrade and rollback commands, and succeed once
	// none is left (EXPIRED at its deadline); it takes no spec. Leaving a
	// gateway is the gateway's Drain message, not this kind
	// (docs/bcd.md, "Node kinds").
	KindDrain = "drain"
	// KindGPUReset resets one GPU through the root helper (GPUResetSpec).
	KindGPUReset = "gpu.reset"
	// KindGPUDiag checks the node's GPUs before they return to service:
	// DCGM's diagnostic through the root helper, or the built-in NVML
	// check (GPUDiagSpec).
	KindGPUDiag = "gpu.diag"
	// KindRollback restores the bcd release kept beside the current one;
	// it takes no spec.
	KindRollback = "rollback"
)

// kinds is every kind in the order session.proto lists them.
var kinds = []string{KindExec, KindInventoryRefresh, KindPowerStatus, KindPowerOn, KindPowerOff, KindPowerSoftOff,
	KindPowerCycle, KindPowerReset, KindBootSet, KindUpgrade, KindReboot, KindDrain,
	KindGPUReset, KindGPUDiag, KindRollback}

// Kinds returns every command kind of the protocol, in session.proto's
// order (a new slice each call).
func Kinds() []string { return append([]string(nil), kinds...) }

// KnownKind reports whether kind is one of Kinds.
func KnownKind(kind string) bool {
	for _, k := range kinds {
		if k == kind {
			return true
		}
	}
	return false
}

// PowerAction returns the PowerSpec.action of a power.* kind (its suffix:
// "cycle" for "power.cycle") and true; "" and false for any other kind,
// unknown power.* kinds included.
func PowerAction(kind string) (string, bool) {
	switch kind {
	case KindPowerStatus, KindPowerOn, KindPowerOff, KindPowerSoftOff, KindPowerCycle, KindPowerReset:
		return strings.TrimPrefix(kind, "power."), true
	}
	return "", false
}

// ErrUnknownKind is returned (wrapped) by CheckSpec for a kind not in Kinds.
var ErrUnknownKind = errors.New("unknown command kind")

// ErrSpecMismatch is returned (wrapped) by CheckSpec when a command's spec
// does not fit its kind.
var ErrSpecMismatch = errors.New("command spec does not fit its kind")

// CheckSpec checks that kind is a protocol kind and that c's spec is the
// one it takes: an ExecSpec with a non-empty argv[0] for "exec", a
// PowerSpec whose action is empty or the kind's suffix for "power.*", a
// BootSpec with a device for "boot.set", an UpgradeSpec with a version for
// "upgrade", a GPUResetSpec with a GPU UUID for "gpu.reset", a GPUDiagSpec with a level of
// at most 3 for "gpu.diag", and none for the other kinds. c.Kind is not read (the caller
// passes the kind it means). Errors wrap ErrUnknownKind or ErrSpecMismatch
// and name the field ("exec.argv").
func CheckSpec(kind string, c *Command) error {
	if !KnownKind(kind) {
		return fmt.Errorf("%w %q: want one of %s", ErrUnknownKind, kind, strings.Join(kinds, ", "))
	}
	want := "no spec"
	ok := false
	switch kind {
	case KindExec:
		want = "exec"
		if e := c.GetExec(); e != nil {
			if len(e.GetArgv()) == 0 || e.GetArgv()[0] == "" {
				return fmt.Errorf("%w: exec.argv is required for kind %s", ErrSpecMismatch, kind)
			}
			ok = true
		}
	case KindBootSet:
		want = "boot"
		if b := c.GetBoot(); b != nil {
			if b.GetDevice() == "" {
				return fmt.Errorf("%w: boot.device is required for kind %s", ErrSpecMismatch, kind)
			}
			ok = true
		}
	case KindUpgrade:
		want = "upgrade"
		if u := c.GetUpgrade(); u != nil {
			if u.GetVersion() == "" {
				return fmt.Errorf("%w: upgrade.version is required for kind %s", ErrSpecMismatch, kind)
			}
			ok = true
		}
	case KindGPUReset:
		want = "gpuReset"
		if g := c.GetGpuReset(); g != nil {
			if g.GetGpuUuid() == "" {
				return fmt.Errorf("%w: gpuReset.gpuUuid is required for kind %s", ErrSpecMismatch, kind)
			}
			ok = true
		}
	case KindGPUDiag:
		want = "gpuDiag"
		if g := c.GetGpuDiag(); g != nil {
			if g.GetLevel() > 3 {
				return fmt.Errorf("%w: gpuDiag.level %d is not a DCGM run level: want 0 to 3", ErrSpecMismatch, g.GetLevel())
			}
			ok = true
		}
	default:
		if action, power := PowerAction(kind); power {
			want = "power"
			if p := c.GetPower(); p != nil {
				if a := p.GetAction(); a != "" && a != action {
					return fmt.Errorf("%w: power.action %q disagrees with kind %s", ErrSpecMismatch, a, kind)
				}
				ok = true
			}
		} else {
			ok = c.GetSpec() == nil
		}
	}
	if !ok {
		return fmt.Errorf("%w: kind %s takes %s", ErrSpecMismatch, kind, want)
	}
	return nil
}

// DefaultOutputLimitBytes is the output a command keeps when its spec names
// no limit (an exec without outputLimitBytes, and every other kind): bcd
// stops capturing past it, the API fills it into exec specs at enqueue, and
// the gateway keeps no more of a node's output (issue 28).
const DefaultOutputLimitBytes = 1 << 20

// MarshalSpec returns the protojson form of c's spec alone: c with every
// field but the spec oneof cleared ({"exec":{"argv":["nvidia-smi"]}}, {}
// for a command without a spec). It is the form the control plane stores a
// command's spec in until dispatch; UnmarshalSpec reads it back.
func MarshalSpec(c *Command) ([]byte, error) {
	b, err := protojson.Marshal(&Command{Spec: c.GetSpec()})
	if err != nil {
		return nil, fmt.Errorf("marshal command spec: %w", err)
	}
	return b, nil
}

// UnmarshalSpec sets c's spec from MarshalSpec's form, leaving its other
// fields alone. Fields this build does not know are dropped; a field other
// than the spec, or JSON that is not a Command, is an error.
func UnmarshalSpec(b []byte, c *Command) error {
	spec := &Command{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, spec); err != nil {
		return fmt.Errorf("unmarshal command spec: %w", err)
	}
	if spec.GetId() != "" || spec.GetKind() != "" || spec.GetDeadline() != nil || spec.GetAttempt() != 0 {
		return errors.New("unmarshal command spec: holds fields other than the spec")
	}
	c.Spec = spec.Spec
	return nil
}
