package gateway

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

func TestCommandMessageBMC(t *testing.T) {
	for _, tc := range []struct {
		kind, spec string
		want       *sessionv1.Command
	}{
		{"power.status", `{}`, &sessionv1.Command{Spec: &sessionv1.Command_Power{Power: &sessionv1.PowerSpec{Action: "status"}}}},
		{"power.soft-off", `{"bmc":"rack1-u07"}`, &sessionv1.Command{Spec: &sessionv1.Command_Power{Power: &sessionv1.PowerSpec{Bmc: "rack1-u07", Action: "soft-off"}}}},
		{"boot.set", `{"bmc":"r2","device":"pxe","persistent":true}`, &sessionv1.Command{Spec: &sessionv1.Command_Boot{Boot: &sessionv1.BootSpec{Bmc: "r2", Device: "pxe", Persistent: true}}}},
	} {
		msg, err := commandMessage(&store.Command{ID: "cmd_1", Kind: tc.kind, Spec: []byte(tc.spec), DeadlineAt: time.Now(), Attempt: 1})
		if err != nil {
			t.Fatalf("%s: %v", tc.kind, err)
		}
		got := msg.GetCommand()
		if got.GetKind() != tc.kind || !proto.Equal(&sessionv1.Command{Spec: got.Spec}, tc.want) {
			t.Errorf("%s: %v, want spec %v", tc.kind, got, tc.want)
		}
	}
	if _, err := commandMessage(&store.Command{ID: "cmd_2", Kind: "boot.set", Spec: []byte(`{"device":`)}); err == nil {
		t.Error("a malformed boot spec was sent")
	}
}
