package bmc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/plugin"
	"github.com/better-compute/better-compute/proto/bmcsecret"
	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

const (
	ownPW   = "own-Pa55-q7"
	namedPW = "named-Pa55-z3"
	sealPW  = "sealed-Pa55-k1"
)

const goodFile = `
bmc:
  address: 10.0.0.1
  username: root
  password: ` + ownPW + `
  timeout: 5s
  ipmiPort: 6230
bmcs:
  - name: rack1-u07
    address: 10.1.7.7
    username: admin
    password: ` + namedPW + `
    providers: [redfish, ipmitool]
  - name: rack1-u08
    address: 10.1.7.8
    username: admin
    password: x
`

func writeFile(t *testing.T, body string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bmc.yaml")
	if err := os.WriteFile(p, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadFile(t *testing.T) {
	f, err := ReadFile(writeFile(t, goodFile, 0o600))
	if err != nil {
		t.Fatal(err)
	}
	if f.Plugin != DefaultPlugin || f.BMC.Timeout != 5*time.Second || f.BMC.IPMIPort != 6230 || len(f.BMCs) != 2 {
		t.Fatalf("parsed %+v", f)
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "none.yaml")); !errors.Is(err, ErrNoFile) {
		t.Errorf("missing file: %v", err)
	}
	if _, err := ReadFile(writeFile(t, goodFile, 0o640)); err == nil || !strings.Contains(err.Error(), "chmod 0600") {
		t.Errorf("group-readable file: %v", err)
	}
	for name, body := range map[string]string{
		"unknown key":     "bmc:\n  address: 10.0.0.1\n  username: u\n  password: p\n  pasword: x\n",
		"no address":      "bmc:\n  username: u\n  password: p\n",
		"duplicate name":  "bmcs:\n- {name: a, address: h, username: u, password: p}\n- {name: a, address: h, username: u, password: p}\n",
		"bad name":        "bmcs:\n- {name: 'a b', address: h, username: u, password: p}\n",
		"own with a name": "bmc: {name: a, address: h, username: u, password: p}\n",
		"port in address": "bmc: {address: 'h:623', username: u, password: p}\n",
		"bad provider":    "bmc: {address: h, username: u, password: p, providers: [snmp]}\n",
	} {
		if _, err := ParseFile("bmc.yaml", []byte(body)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// A password in the wrong place is not quoted back.
	_, err = ParseFile("bmc.yaml", []byte("bmc: {address: h, username: u, password: p, ipmiPort: "+ownPW+"}\n"))
	if err == nil || strings.Contains(err.Error(), ownPW) {
		t.Errorf("password in a number field: %v", err)
	}
}

// fakePlugins records calls and answers from a script.
type fakePlugins struct {
	mu    sync.Mutex
	calls []string
	state pluginv1.PowerState
	err   error
}

func (f *fakePlugins) Power(_ context.Context, name string, req *pluginv1.PowerRequest) (*pluginv1.PowerResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("%s power %v %s:%d %s/%s", name, req.GetAction(), req.GetTarget().GetAddress(),
		req.GetTarget().GetIpmiPort(), req.GetTarget().GetUsername(), req.GetTarget().GetPassword()))
	if f.err != nil {
		return nil, f.err
	}
	switch req.GetAction() {
	case pluginv1.PowerAction_POWER_ACTION_ON:
		f.state = pluginv1.PowerState_POWER_STATE_ON
	case pluginv1.PowerAction_POWER_ACTION_OFF:
		f.state = pluginv1.PowerState_POWER_STATE_OFF
	case pluginv1.PowerAction_POWER_ACTION_STATUS:
		return &pluginv1.PowerResponse{State: f.state, RawState: "Chassis Power is " + powerName(f.state), Provider: pluginv1.Provider_PROVIDER_IPMITOOL}, nil
	}
	return &pluginv1.PowerResponse{Provider: pluginv1.Provider_PROVIDER_IPMITOOL}, nil
}

func (f *fakePlugins) BootDevice(_ context.Context, name string, req *pluginv1.BootDeviceRequest) (*pluginv1.BootDeviceResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("%s boot %v persistent=%v %s", name, req.GetDevice(), req.GetPersistent(), req.GetTarget().GetAddress()))
	if f.err != nil {
		return nil, f.err
	}
	return &pluginv1.BootDeviceResponse{Provider: pluginv1.Provider_PROVIDER_REDFISH}, nil
}

func TestDo(t *testing.T) {
	var logs bytes.Buffer
	fp := &fakePlugins{state: pluginv1.PowerState_POWER_STATE_ON}
	file := writeFile(t, goodFile, 0o600)
	c := New(Config{File: file, Plugins: fp, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()

	res, err := c.Do(ctx, &Request{Action: ActionStatus})
	if err != nil || res.Power != PowerOn || res.BMC != "10.0.0.1" || res.Source != "file "+file || res.Provider != "ipmitool" {
		t.Fatalf("own status: %+v %v", res, err)
	}
	res, err = c.Do(ctx, &Request{Action: ActionOff, BMC: "rack1-u07"})
	if err != nil || res.Power != PowerOff || res.Name != "rack1-u07" || res.BMC != "10.1.7.7" {
		t.Fatalf("named off: %+v %v", res, err)
	}
	// Sealed credentials win over the file's own BMC.
	creds := &bmcsecret.Credentials{Address: "10.9.9.9", Username: "ops", Password: sealPW, IPMIPort: 7000}
	res, err = c.Do(ctx, &Request{Action: ActionOn, Credentials: creds})
	if err != nil || res.Power != PowerOn || res.BMC != "10.9.9.9" || res.Source != SourceSecret {
		t.Fatalf("sealed on: %+v %v", res, err)
	}
	res, err = c.Do(ctx, &Request{Action: ActionBoot, Device: DevicePXE, BMC: "rack1-u08"})
	if err != nil || res.Device != "pxe" || res.Persistent == nil || *res.Persistent || res.Provider != "redfish" {
		t.Fatalf("boot: %+v %v", res, err)
	}
	want := []string{
		"ipmi power POWER_ACTION_STATUS 10.0.0.1:6230 root/" + ownPW,
		"ipmi power POWER_ACTION_OFF 10.1.7.7:0 admin/" + namedPW,
		"ipmi power POWER_ACTION_STATUS 10.1.7.7:0 admin/" + namedPW,
		"ipmi power POWER_ACTION_ON 10.9.9.9:7000 ops/" + sealPW,
		"ipmi power POWER_ACTION_STATUS 10.9.9.9:7000 ops/" + sealPW,
		"ipmi boot BOOT_DEVICE_PXE persistent=false 10.1.7.8",
	}
	if strings.Join(fp.calls, "\n") != strings.Join(want, "\n") {
		t.Errorf("calls:\n%s\nwant:\n%s", strings.Join(fp.calls, "\n"), strings.Join(want, "\n"))
	}

	// Unknown names, bad requests, no file: NOT_CONFIGURED or
	// INVALID_REQUEST, naming the BMC.
	for _, tc := range []struct {
		req    Request
		reason string
		text   string
	}{
		{Request{Action: ActionStatus, BMC: "rack9"}, ReasonNotConfigured, `bmc rack9: no BMC named "rack9" in the BMC file (it lists rack1-u07, rack1-u08)`},
		{Request{Action: "explode"}, string(plugin.ReasonInvalidRequest), "unknown BMC action"},
		{Request{Action: ActionBoot, Device: "floppy"}, string(plugin.ReasonInvalidRequest), "unknown boot device"},
		{Request{Action: ActionOn, Device: "pxe"}, string(plugin.ReasonInvalidRequest), "only for the boot action"},
	} {
		res, err := c.Do(ctx, &tc.req)
		if err == nil || res.Reason != tc.reason || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%+v: %+v %v, want %s %q", tc.req, res, err, tc.reason, tc.text)
		}
	}
	none := New(Config{File: filepath.Join(t.TempDir(), "absent.yaml"), Plugins: fp})
	if res, err := none.Do(ctx, &Request{Action: ActionStatus}); err == nil || res.Reason != ReasonNotConfigured ||
		!strings.Contains(err.Error(), "bmc credentials set") {
		t.Errorf("no file, own BMC: %+v %v", res, err)
	}

	// A plugin error that quotes the password: scrubbed, reason kept, the
	// BMC named once.
	fp.err = &plugin.Error{Plugin: "ipmi", Op: "power", Reason: plugin.ReasonAuthFailed,
		Message: "bmc 10.1.7.7: power status: wrong password " + namedPW}
	res, err = c.Do(ctx, &Request{Action: ActionStatus, BMC: "rack1-u07"})
	if err == nil || res.Reason != "AUTH_FAILED" || strings.Contains(err.Error(), namedPW) ||
		!strings.HasPrefix(err.Error(), "bmc rack1-u07: ") || !errors.Is(err, fp.err) {
		t.Errorf("auth failure: %+v %v", res, err)
	}
	fp.err = fmt.Errorf("%w", plugin.ErrCrashed)
	res, err = c.Do(ctx, &Request{Action: ActionStatus})
	if err == nil || res.Reason != ReasonPluginCrashed || !strings.HasPrefix(err.Error(), "bmc 10.0.0.1: ") {
		t.Errorf("crash: %+v %v", res, err)
	}
	b, _ := json.Marshal(res)
	for _, secret := range []string{ownPW, namedPW, sealPW} {
		if strings.Contains(logs.String(), secret) || strings.Contains(string(b), secret) {
			t.Errorf("password %q in the logs or a result:\n%s\n%s", secret, logs.String(), b)
		}
	}
}

func TestRealHostWithoutPlugin(t *testing.T) {
	file := writeFile(t, goodFile, 0o600)
	dir := t.TempDir()
	c := New(Config{File: file, PluginDir: dir})
	defer c.Close()
	res, err := c.Do(context.Background(), &Request{Action: ActionStatus})
	if !errors.Is(err, plugin.ErrNotFound) || res.Reason != ReasonNoPlugin || !strings.Contains(err.Error(), "bmc 10.0.0.1") {
		t.Fatalf("no plugin: %+v %v", res, err)
	}
	c.Close()
	if _, err := c.Do(context.Background(), &Request{Action: ActionStatus}); !errors.Is(err, plugin.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}
