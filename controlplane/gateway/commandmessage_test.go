package gateway

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TestCommandMessage: the stored session-protocol spec is sent as it is,
// whatever the kind; one that does not decode is not sent.
func TestCommandMessage(t *testing.T) {
	t.Parallel()
	deadline := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		kind, spec string
		want       *sessionv1.Command
	}{
		{"exec", `{"exec":{"argv":["uname","-a"],"asRoot":true,"outputLimitBytes":"1048576"}}`,
			&sessionv1.Command{Spec: &sessionv1.Command_Exec{Exec: &sessionv1.ExecSpec{Argv: []string{"uname", "-a"}, AsRoot: true, OutputLimitBytes: 1 << 20}}}},
		{"power.status", `{"power":{"action":"status"}}`, &sessionv1.Command{Spec: &sessionv1.Command_Power{Power: &sessionv1.PowerSpec{Action: "status"}}}},
		{"power.soft-off", `{"power":{"bmc":"rack1-u07","action":"soft-off"}}`, &sessionv1.Command{Spec: &sessionv1.Command_Power{Power: &sessionv1.PowerSpec{Bmc: "rack1-u07", Action: "soft-off"}}}},
		{"boot.set", `{"boot":{"bmc":"r2","device":"pxe","persistent":true}}`, &sessionv1.Command{Spec: &sessionv1.Command_Boot{Boot: &sessionv1.BootSpec{Bmc: "r2", Device: "pxe", Persistent: true}}}},
		{"upgrade", `{"upgrade":{"version":"0.2.0","baseUrl":"https://compute.example.com/api/downloads"}}`,
			&sessionv1.Command{Spec: &sessionv1.Command_Upgrade{Upgrade: &sessionv1.UpgradeSpec{Version: "0.2.0", BaseUrl: "https://compute.example.com/api/downloads"}}}},
		{"inventory.refresh", `{}`, &sessionv1.Command{}},
	} {
		msg, err := commandMessage(&store.Command{ID: "cmd_1", Kind: tc.kind, SessionSpec: []byte(tc.spec), DeadlineAt: deadline, Attempt: 2})
		if err != nil {
			t.Fatalf("%s: %v", tc.kind, err)
		}
		got := msg.GetCommand()
		if got.GetId() != "cmd_1" || got.GetKind() != tc.kind || got.GetAttempt() != 2 || !got.GetDeadline().AsTime().Equal(deadline) ||
			!proto.Equal(&sessionv1.Command{Spec: got.Spec}, tc.want) {
			t.Errorf("%s: %v, want spec %v", tc.kind, got, tc.want)
		}
	}
	for _, spec := range []string{`{"boot":{"device":`, `{"id":"cmd_other"}`, ``} {
		if _, err := commandMessage(&store.Command{ID: "cmd_2", Kind: "boot.set", SessionSpec: []byte(spec)}); err == nil {
			t.Errorf("spec %q was sent", spec)
		}
	}
}
