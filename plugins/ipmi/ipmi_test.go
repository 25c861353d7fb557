package ipmi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stmcginnis/gofish/common"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/bcd/plugin"
	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

func TestParseTarget(t *testing.T) {
	t.Parallel()
	ok := func(mod func(*pluginv1.BMCTarget)) *pluginv1.BMCTarget {
		tg := &pluginv1.BMCTarget{Address: "10.0.0.5", Username: "admin", Password: "pw"}
		if mod != nil {
			mod(tg)
		}
		return tg
	}
	got, err := parseTarget(ok(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got.timeout != DefaultTimeout || got.ipmiPort != 623 || got.rfPort != 443 || got.cipher != "3" ||
		len(got.providers) != 2 || got.providers[0] != pluginv1.Provider_PROVIDER_IPMITOOL {
		t.Errorf("defaults: %+v", got)
	}
	got, err = parseTarget(ok(func(tg *pluginv1.BMCTarget) {
		tg.Address = "fd00::5"
		tg.Providers = []pluginv1.Provider{pluginv1.Provider_PROVIDER_REDFISH, pluginv1.Provider_PROVIDER_REDFISH}
		tg.Timeout = durationpb.New(3 * time.Second)
	}))
	if err != nil || got.host != "[fd00::5]" || len(got.providers) != 1 || got.timeout != 3*time.Second {
		t.Errorf("IPv6, one provider, 3 s: %+v, %v", got, err)
	}
	for name, mod := range map[string]func(*pluginv1.BMCTarget){
		"no address":       func(tg *pluginv1.BMCTarget) { tg.Address = "" },
		"address and port": func(tg *pluginv1.BMCTarget) { tg.Address = "bmc1:623" },
		"url":              func(tg *pluginv1.BMCTarget) { tg.Address = "https://bmc1" },
		"dash":             func(tg *pluginv1.BMCTarget) { tg.Address = "-oProxyCommand" },
		"no user":          func(tg *pluginv1.BMCTarget) { tg.Username = "" },
		"control in user":  func(tg *pluginv1.BMCTarget) { tg.Username = "ad\nmin" },
		"negative timeout": func(tg *pluginv1.BMCTarget) { tg.Timeout = durationpb.New(-time.Second) },
		"bad provider":     func(tg *pluginv1.BMCTarget) { tg.Providers = []pluginv1.Provider{9} },
		"bad port":         func(tg *pluginv1.BMCTarget) { tg.IpmiPort = 70000 },
		"bad cipher":       func(tg *pluginv1.BMCTarget) { tg.IpmiCipherSuite = "x" },
		"bad CA":           func(tg *pluginv1.BMCTarget) { tg.RedfishCaPem = []byte("nope") },
	} {
		tg := ok(mod)
		tg.Password = "s3cret-value"
		if _, err := parseTarget(tg); err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "s3cret-value") {
			t.Errorf("%s: error holds the password: %v", name, err)
		}
	}
}

func TestNormalisePowerState(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]pluginv1.PowerState{
		"Chassis Power is on\n": pluginv1.PowerState_POWER_STATE_ON,
		"Chassis Power is off":  pluginv1.PowerState_POWER_STATE_OFF,
		"On":                    pluginv1.PowerState_POWER_STATE_ON,
		"Off":                   pluginv1.PowerState_POWER_STATE_OFF,
		"PoweringOn":            pluginv1.PowerState_POWER_STATE_ON,
		"PoweringOff":           pluginv1.PowerState_POWER_STATE_OFF,
		"Paused":                pluginv1.PowerState_POWER_STATE_UNSPECIFIED,
		"":                      pluginv1.PowerState_POWER_STATE_UNSPECIFIED,
	} {
		if got := normalisePowerState(raw); got != want {
			t.Errorf("normalisePowerState(%q) = %v, want %v", raw, got, want)
		}
	}
}

func TestParseMCInfo(t *testing.T) {
	t.Parallel()
	out := `Device ID                 : 32
Firmware Revision         : 2.50
IPMI Version              : 2.0
Manufacturer ID           : 674
Manufacturer Name         : DELL Inc
Product ID                : 256 (0x0100)
Product Name              : Unknown (0x100)
Aux Firmware Rev Info     :
    0x00
`
	got := parseMCInfo(out)
	if got.GetVendor() != "DELL Inc" || got.GetModel() != "Unknown (0x100)" || got.GetFirmwareVersion() != "2.50" {
		t.Errorf("parseMCInfo = %+v", got)
	}
}

func TestClassifyAndCombine(t *testing.T) {
	t.Parallel()
	tg := &target{address: "10.0.0.5", password: "Pa55-leak", ipmiPort: 623, rfPort: 443}
	ipmi, rf := pluginv1.Provider_PROVIDER_IPMITOOL, pluginv1.Provider_PROVIDER_REDFISH
	cases := []struct {
		p    pluginv1.Provider
		err  error
		want plugin.Reason
	}{
		{ipmi, errors.New("Error: Unable to establish IPMI v2 / RMCP+ session: exit status 1"), plugin.ReasonAuthFailed},
		{ipmi, context.DeadlineExceeded, plugin.ReasonTimeout},
		{ipmi, fmt.Errorf("x: %w", errUnsupported), plugin.ReasonUnsupported},
		{rf, &common.Error{HTTPReturnedStatusCode: 401}, plugin.ReasonAuthFailed},
		{rf, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, plugin.ReasonUnreachable},
		{rf, &net.DNSError{Err: "no such host", Name: "bmc1"}, plugin.ReasonUnreachable},
		{rf, errors.New("500 internal error"), plugin.ReasonBMCError},
	}
	for _, c := range cases {
		if got := classify(c.p, c.err, time.Second); got.reason != c.want {
			t.Errorf("classify(%v, %v) = %v (%s), want %v", c.p, c.err, got.reason, got.detail, c.want)
		}
	}

	err := combine(tg, "power status", []failure{
		{provider: ipmi, reason: plugin.ReasonTimeout, detail: "no answer within 15s"},
		{provider: rf, reason: plugin.ReasonAuthFailed, detail: "refused Pa55-leak"},
	})
	st := status.Convert(err)
	if !strings.HasPrefix(st.Message(), "bmc 10.0.0.5: power status: ipmitool (port 623): no answer within 15s; redfish (port 443): ") {
		t.Errorf("combined message = %q", st.Message())
	}
	if strings.Contains(st.Message(), "Pa55-leak") {
		t.Errorf("combined message holds the password: %q", st.Message())
	}
	if len(st.Details()) != 1 || st.Code().String() != "Unauthenticated" {
		t.Errorf("combined status = %v %v, want Unauthenticated with an ErrorInfo", st.Code(), st.Details())
	}
}

// bmclib logs through logr; the call logger scrubs the call's password from
// whatever it logs.
func TestCallLoggerScrubs(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	s := New(Config{Logger: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug - 8}))})
	log := s.callLogger(&target{address: "10.0.0.5", password: "hunter2-Xy"}, "power status")
	logr.FromSlogHandler(log.Handler()).V(3).Info("ipmitool options", "opts", []string{"-P", "hunter2-Xy"}, "err", errors.New("pw hunter2-Xy"))
	log.Info("said hunter2-Xy")
	if strings.Contains(buf.String(), "hunter2-Xy") || !strings.Contains(buf.String(), plugin.Redacted) {
		t.Errorf("log holds the password, or nothing was redacted:\n%s", buf.String())
	}
}

// Neither bmclib nor the plugin's own ipmitool calls put the password in
// ipmitool's arguments: it goes in IPMITOOL_PASSWORD with -E.
func TestIpmitoolPasswordNotInArgv(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	record := filepath.Join(dir, "calls")
	fake := filepath.Join(dir, "ipmitool")
	script := `#!/bin/sh
{ printf 'argv:'; printf ' %s' "$@"; printf '\nenv: %s\n' "$IPMITOOL_PASSWORD"; } >>` + record + `
case "$*" in
*"mc info"*) printf 'Firmware Revision : 1.0\nManufacturer Name : Fake\n' ;;
*) echo "Chassis Power is on" ;;
esac
`
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	s := New(Config{IpmitoolPath: fake})
	const pw = "argv-Secret-55"
	tg := &pluginv1.BMCTarget{Address: "192.0.2.1", Username: "admin", Password: pw,
		Providers: []pluginv1.Provider{pluginv1.Provider_PROVIDER_IPMITOOL}}
	resp, err := s.Power(context.Background(), &pluginv1.PowerRequest{Target: tg, Action: pluginv1.PowerAction_POWER_ACTION_STATUS})
	if err != nil || resp.GetState() != pluginv1.PowerState_POWER_STATE_ON {
		t.Fatalf("status through the fake ipmitool: %v, %v", resp, err)
	}
	if _, err := s.BMCInfo(context.Background(), &pluginv1.BMCInfoRequest{Target: tg}); err != nil {
		t.Fatalf("bmc info through the fake ipmitool: %v", err)
	}
	b, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	calls := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(calls) != 4 {
		t.Fatalf("fake ipmitool calls:\n%s\nwant 2 (argv and env lines each)", b)
	}
	for i := 0; i < len(calls); i += 2 {
		argv, env := calls[i], calls[i+1]
		if strings.Contains(argv, pw) || !strings.Contains(argv, " -E ") || !strings.Contains(argv, " -C 3 ") {
			t.Errorf("ipmitool %s: holds the password, or lacks -E or -C 3", argv)
		}
		if env != "env: "+pw {
			t.Errorf("ipmitool got %q, want the password in IPMITOOL_PASSWORD", env)
		}
	}
}
