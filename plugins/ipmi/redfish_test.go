package ipmi_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/bcd/plugin"
	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// redfishBMC is just enough of a Redfish service for bmclib's gofish
// provider: the service root, sessions, one ComputerSystem with its Reset
// action and Boot override, and one Manager.
type redfishBMC struct {
	user, password string

	mu      sync.Mutex
	power   string // "On" or "Off"
	boot    map[string]any
	resets  []string
	logins  int
	logouts int
}

const redfishToken = "token-1"

func newRedfishBMC(user, password string) *redfishBMC {
	return &redfishBMC{user: user, password: password, power: "On",
		boot: map[string]any{"BootSourceOverrideEnabled": "Disabled", "BootSourceOverrideTarget": "None", "BootSourceOverrideMode": "UEFI"}}
}

func (b *redfishBMC) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	reply := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		if v != nil {
			_ = json.NewEncoder(w).Encode(v)
		}
	}
	ref := func(path string) map[string]string { return map[string]string{"@odata.id": path} }
	collection := func(members ...string) map[string]any {
		refs := make([]map[string]string, len(members))
		for i, m := range members {
			refs[i] = ref(m)
		}
		return map[string]any{"Members": refs, "Members@odata.count": len(refs)}
	}
	path := strings.TrimSuffix(r.URL.Path, "/")

	switch {
	case path == "/redfish/v1" && r.Method == http.MethodGet:
		reply(200, map[string]any{
			"@odata.id": "/redfish/v1/", "Id": "RootService", "RedfishVersion": "1.11.0",
			"Systems": ref("/redfish/v1/Systems"), "Managers": ref("/redfish/v1/Managers"),
			"SessionService": ref("/redfish/v1/SessionService"),
			"Links":          map[string]any{"Sessions": ref("/redfish/v1/SessionService/Sessions")},
		})
		return
	case path == "/redfish/v1/SessionService/Sessions" && r.Method == http.MethodPost:
		var body struct{ UserName, Password string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		if body.UserName != b.user || body.Password != b.password {
			reply(401, map[string]any{"error": map[string]any{"code": "Base.1.8.NoValidSession", "message": "invalid credentials"}})
			return
		}
		b.logins++
		w.Header().Set("X-Auth-Token", redfishToken)
		w.Header().Set("Location", "/redfish/v1/SessionService/Sessions/1")
		reply(201, map[string]any{"@odata.id": "/redfish/v1/SessionService/Sessions/1", "Id": "1", "UserName": b.user})
		return
	}
	if r.Header.Get("X-Auth-Token") != redfishToken {
		reply(401, map[string]any{"error": map[string]any{"code": "Base.1.8.NoValidSession", "message": "no session"}})
		return
	}
	switch {
	case path == "/redfish/v1/SessionService/Sessions/1" && r.Method == http.MethodDelete:
		b.logouts++
		reply(204, nil)
	case path == "/redfish/v1/Systems" && r.Method == http.MethodGet:
		reply(200, collection("/redfish/v1/Systems/1"))
	case path == "/redfish/v1/Systems/1" && r.Method == http.MethodGet:
		reply(200, map[string]any{
			"@odata.id": "/redfish/v1/Systems/1", "Id": "1", "Name": "System",
			"Manufacturer": "Acme", "Model": "X100", "SerialNumber": "SN-42",
			"PowerState": b.power, "Boot": b.boot,
			"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{
				"target":                            "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
				"ResetType@Redfish.AllowableValues": []string{"On", "ForceOff", "GracefulShutdown", "ForceRestart", "PowerCycle"},
			}},
		})
	case path == "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset" && r.Method == http.MethodPost:
		var body struct{ ResetType string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		b.resets = append(b.resets, body.ResetType)
		switch body.ResetType {
		case "On", "ForceRestart", "PowerCycle":
			b.power = "On"
		case "ForceOff", "GracefulShutdown":
			b.power = "Off"
		default:
			reply(400, map[string]any{"error": map[string]any{"message": "bad ResetType"}})
			return
		}
		reply(204, nil)
	case path == "/redfish/v1/Systems/1" && r.Method == http.MethodPatch:
		var body struct{ Boot map[string]any }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Boot == nil {
			reply(400, map[string]any{"error": map[string]any{"message": "bad body"}})
			return
		}
		for k, v := range body.Boot {
			b.boot[k] = v
		}
		reply(204, nil)
	case path == "/redfish/v1/Managers" && r.Method == http.MethodGet:
		reply(200, collection("/redfish/v1/Managers/1"))
	case path == "/redfish/v1/Managers/1" && r.Method == http.MethodGet:
		reply(200, map[string]any{"@odata.id": "/redfish/v1/Managers/1", "Id": "1", "ManagerType": "BMC",
			"Model": "AcmeBMC", "FirmwareVersion": "2.71.0"})
	default:
		reply(404, map[string]any{"error": map[string]any{"message": "not found: " + r.Method + " " + path}})
	}
}

// TestRedfishFallback drives the same commands through the real bcx-ipmi
// against a Redfish service, with ipmitool first in the provider order and
// pointed at a closed port: every call falls back to Redfish.
func TestRedfishFallback(t *testing.T) {
	requireTools(t, "ipmitool") // the first provider must get as far as not answering
	const user, password = "root", "rf-Secret-7734"
	bmc := newRedfishBMC(user, password)
	srv := httptest.NewTLSServer(bmc)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	rfPort, _ := strconv.Atoi(u.Port())
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})

	logs := newCapture()
	h := newHost(t, pluginDir(t), logs.logger())
	ctx := context.Background()
	tgt := &pluginv1.BMCTarget{
		Address:      "127.0.0.1",
		Username:     user,
		Password:     password,
		Providers:    []pluginv1.Provider{pluginv1.Provider_PROVIDER_IPMITOOL, pluginv1.Provider_PROVIDER_REDFISH},
		Timeout:      durationpb.New(2 * time.Second), // 1 s for the silent ipmitool, the rest for Redfish
		IpmiPort:     uint32(freeUDPPort(t)),
		RedfishPort:  uint32(rfPort),
		RedfishCaPem: caPEM,
	}
	do := func(action pluginv1.PowerAction) *pluginv1.PowerResponse {
		t.Helper()
		start := time.Now()
		resp, err := h.Power(ctx, "ipmi", &pluginv1.PowerRequest{Target: tgt, Action: action})
		if err != nil {
			t.Fatalf("%v: %v", action, err)
		}
		t.Logf("%v: %v %q via %v in %s", action, resp.GetState(), resp.GetRawState(), resp.GetProvider(), time.Since(start).Round(time.Millisecond))
		if resp.GetProvider() != pluginv1.Provider_PROVIDER_REDFISH {
			t.Errorf("%v answered by %v, want the Redfish fallback", action, resp.GetProvider())
		}
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
	do(pluginv1.PowerAction_POWER_ACTION_ON)
	status(pluginv1.PowerState_POWER_STATE_ON)
	do(pluginv1.PowerAction_POWER_ACTION_CYCLE)
	do(pluginv1.PowerAction_POWER_ACTION_SOFT_OFF)
	status(pluginv1.PowerState_POWER_STATE_OFF)

	resp, err := h.BootDevice(ctx, "ipmi", &pluginv1.BootDeviceRequest{Target: tgt, Device: pluginv1.BootDevice_BOOT_DEVICE_PXE})
	if err != nil || resp.GetProvider() != pluginv1.Provider_PROVIDER_REDFISH {
		t.Fatalf("boot pxe once: %v, %v; want it done by Redfish", resp, err)
	}
	info, err := h.BMCInfo(ctx, "ipmi", &pluginv1.BMCInfoRequest{Target: tgt})
	if err != nil {
		t.Fatalf("bmc info: %v", err)
	}
	if info.GetVendor() != "Acme" || info.GetModel() != "X100" || info.GetSerial() != "SN-42" ||
		info.GetFirmwareVersion() != "2.71.0" || info.GetProvider() != pluginv1.Provider_PROVIDER_REDFISH {
		t.Errorf("bmc info = %+v, want Acme X100 SN-42, firmware 2.71.0, via Redfish", info)
	}

	bmc.mu.Lock()
	wantResets := []string{"ForceOff", "On", "ForceRestart", "GracefulShutdown"}
	if strings.Join(bmc.resets, ",") != strings.Join(wantResets, ",") {
		t.Errorf("Redfish resets = %v, want %v", bmc.resets, wantResets)
	}
	if bmc.boot["BootSourceOverrideTarget"] != "Pxe" || bmc.boot["BootSourceOverrideEnabled"] != "Once" {
		t.Errorf("Redfish boot override = %v, want Pxe, Once", bmc.boot)
	}
	if bmc.logins == 0 || bmc.logins != bmc.logouts {
		t.Errorf("%d Redfish logins, %d logouts; want every session closed", bmc.logins, bmc.logouts)
	}
	bmc.mu.Unlock()

	// Redfish alone, with a wrong password: a clear error naming the BMC.
	const wrong = "rf-Wrong-1209"
	bad := &pluginv1.BMCTarget{Address: "127.0.0.1", Username: user, Password: wrong,
		Providers: []pluginv1.Provider{pluginv1.Provider_PROVIDER_REDFISH}, RedfishPort: uint32(rfPort), RedfishCaPem: caPEM,
		Timeout: durationpb.New(5 * time.Second)}
	_, err = h.Power(ctx, "ipmi", &pluginv1.PowerRequest{Target: bad, Action: pluginv1.PowerAction_POWER_ACTION_STATUS})
	t.Logf("wrong Redfish password: %v", err)
	var pe *plugin.Error
	if !errors.As(err, &pe) || pe.Reason != plugin.ReasonAuthFailed || !strings.Contains(err.Error(), "bmc 127.0.0.1") {
		t.Errorf("wrong Redfish password: %v, want AUTH_FAILED naming bmc 127.0.0.1", err)
	}

	// A certificate that does not chain to redfish_ca_pem is refused.
	other := httptest.NewUnstartedServer(bmc)
	other.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	other.StartTLS()
	t.Cleanup(other.Close)
	ou, _ := url.Parse(other.URL)
	otherPort, _ := strconv.Atoi(ou.Port())
	untrusted := &pluginv1.BMCTarget{Address: "127.0.0.1", Username: user, Password: password,
		Providers: []pluginv1.Provider{pluginv1.Provider_PROVIDER_REDFISH}, RedfishPort: uint32(otherPort),
		RedfishCaPem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: selfSigned(t)}),
		Timeout:      durationpb.New(5 * time.Second)}
	_, err = h.Power(ctx, "ipmi", &pluginv1.PowerRequest{Target: untrusted, Action: pluginv1.PowerAction_POWER_ACTION_STATUS})
	t.Logf("untrusted Redfish certificate: %v", err)
	if err == nil || !strings.Contains(err.Error(), "does not verify against redfish_ca_pem") {
		t.Errorf("untrusted certificate: %v, want a certificate error", err)
	}

	for _, secret := range []string{password, wrong} {
		if log := logs.String(); strings.Contains(log, secret) {
			t.Errorf("the log holds password %q:\n%s", secret, log)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("an error holds password %q", secret)
		}
	}
}
