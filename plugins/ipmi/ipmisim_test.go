package ipmi_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/bcd/plugin"
	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// TestIPMISim drives ipmi_sim through the real bcx-ipmi, started and called
// by bcd's plugin host: power status, off, on, cycle, PXE once and BMC info;
// a wrong password; an unreachable BMC; and a plugin killed mid-call.
func TestIPMISim(t *testing.T) {
	s := startSim(t)
	logs := newCapture()
	h := newHost(t, pluginDir(t), logs.logger())
	ctx := context.Background()
	var errs []string // every error text, checked for secrets at the end

	tgt := func(password string, port int, timeout time.Duration) *pluginv1.BMCTarget {
		return &pluginv1.BMCTarget{
			Address:   "127.0.0.1",
			Username:  simUser,
			Password:  password,
			Providers: []pluginv1.Provider{pluginv1.Provider_PROVIDER_IPMITOOL},
			IpmiPort:  uint32(port),
			Timeout:   durationpb.New(timeout),
		}
	}
	good := tgt(simPassword, s.port, 10*time.Second)
	do := func(action pluginv1.PowerAction) *pluginv1.PowerResponse {
		t.Helper()
		start := time.Now()
		resp, err := h.Power(ctx, "ipmi", &pluginv1.PowerRequest{Target: good, Action: action})
		if err != nil {
			t.Fatalf("%v: %v", action, err)
		}
		t.Logf("%v: %v %q via %v in %s", action, resp.GetState(), resp.GetRawState(), resp.GetProvider(), time.Since(start).Round(time.Millisecond))
		return resp
	}
	status := func(want pluginv1.PowerState) {
		t.Helper()
		if got := do(pluginv1.PowerAction_POWER_ACTION_STATUS); got.GetState() != want {
			t.Fatalf("status = %v (%q), want %v", got.GetState(), got.GetRawState(), want)
		}
	}

	status(pluginv1.PowerState_POWER_STATE_ON)
	do(pluginv1.PowerAction_POWER_ACTION_OFF)
	status(pluginv1.PowerState_POWER_STATE_OFF)
	if got := s.read(t, "power"); got != "0" {
		t.Errorf("simulated chassis power = %q after off, want 0", got)
	}
	do(pluginv1.PowerAction_POWER_ACTION_ON)
	status(pluginv1.PowerState_POWER_STATE_ON)
	do(pluginv1.PowerAction_POWER_ACTION_CYCLE)
	do(pluginv1.PowerAction_POWER_ACTION_RESET)

	if _, err := h.BootDevice(ctx, "ipmi", &pluginv1.BootDeviceRequest{Target: good, Device: pluginv1.BootDevice_BOOT_DEVICE_PXE}); err != nil {
		t.Fatalf("boot pxe once: %v", err)
	}
	if got := s.read(t, "boot"); got != "pxe" {
		t.Errorf("simulated boot device = %q after PXE once, want pxe", got)
	}

	info, err := h.BMCInfo(ctx, "ipmi", &pluginv1.BMCInfoRequest{Target: good})
	if err != nil {
		t.Fatalf("bmc info: %v", err)
	}
	t.Logf("bmc info: vendor %q, model %q, firmware %q", info.GetVendor(), info.GetModel(), info.GetFirmwareVersion())
	if info.GetFirmwareVersion() != "9.08" || info.GetVendor() == "" {
		t.Errorf("bmc info = %+v, want firmware 9.08 (sim.emu) and a vendor", info)
	}

	// A wrong password: a clear error naming the BMC, and the password
	// nowhere.
	const wrong = "Wr0ng-Pa55-9x7q"
	start := time.Now()
	_, err = h.Power(ctx, "ipmi", &pluginv1.PowerRequest{Target: tgt(wrong, s.port, 10*time.Second), Action: pluginv1.PowerAction_POWER_ACTION_STATUS})
	t.Logf("wrong password, after %s: %v", time.Since(start).Round(time.Millisecond), err)
	var pe *plugin.Error
	if !errors.Is(err, plugin.ErrBMC) || !errors.As(err, &pe) || pe.Reason != plugin.ReasonAuthFailed {
		t.Fatalf("wrong password: %v, want ErrBMC with reason AUTH_FAILED", err)
	}
	if !strings.Contains(err.Error(), "bmc 127.0.0.1") || !strings.Contains(err.Error(), "password") {
		t.Errorf("wrong password error %q does not name the BMC and the likely cause", err)
	}
	errs = append(errs, err.Error())

	// An unreachable BMC (a closed local port) fails within its timeout.
	closed := freeUDPPort(t)
	start = time.Now()
	_, err = h.Power(ctx, "ipmi", &pluginv1.PowerRequest{Target: tgt(simPassword, closed, 3*time.Second), Action: pluginv1.PowerAction_POWER_ACTION_STATUS})
	took := time.Since(start)
	t.Logf("unreachable BMC (timeout 3s) failed after %s: %v", took.Round(time.Millisecond), err)
	if !errors.Is(err, plugin.ErrBMC) || !errors.As(err, &pe) || pe.Reason != plugin.ReasonTimeout {
		t.Errorf("unreachable BMC: %v, want ErrBMC with reason TIMEOUT", err)
	}
	if took > 6*time.Second {
		t.Errorf("unreachable BMC took %s, want about its 3 s timeout", took)
	}
	errs = append(errs, err.Error())

	// The plugin killed mid-call: that call fails at once, the next one
	// runs on a restarted plugin, and the ipmitool it was waiting for does
	// not outlive it.
	pid := h.List()[0].PID
	errc := make(chan error, 1)
	go func() {
		_, err := h.Power(ctx, "ipmi", &pluginv1.PowerRequest{Target: tgt(simPassword, closed, 30*time.Second), Action: pluginv1.PowerAction_POWER_ACTION_STATUS})
		errc <- err
	}()
	var ipmitool int
	for deadline := time.Now().Add(10 * time.Second); ipmitool == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the plugin started no ipmitool within 10 s")
		}
		ipmitool = childNamed(pid, "ipmitool")
	}
	start = time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-errc:
	case <-time.After(10 * time.Second):
		t.Fatal("the call on a killed plugin did not return within 10 s")
	}
	t.Logf("call on the plugin killed mid-call failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
	if !errors.Is(err, plugin.ErrCrashed) {
		t.Fatalf("call on a killed plugin: %v, want ErrCrashed", err)
	}
	errs = append(errs, err.Error())
	status(pluginv1.PowerState_POWER_STATE_ON)
	st := h.List()[0]
	if st.Starts != 2 || st.PID == pid || !st.Healthy || st.Version != "0.0.0-test" {
		t.Errorf("after the kill: %+v, want a second start under a new pid, healthy, version 0.0.0-test", st)
	}
	for deadline := time.Now().Add(5 * time.Second); alive(ipmitool); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("ipmitool %d outlived the killed plugin", ipmitool)
			break
		}
	}

	log := logs.String()
	for _, secret := range []string{simPassword, wrong} {
		if strings.Contains(log, secret) {
			t.Errorf("the log holds password %q:\n%s", secret, log)
		}
		for _, e := range errs {
			if strings.Contains(e, secret) {
				t.Errorf("error %q holds password %q", e, secret)
			}
		}
	}
}
