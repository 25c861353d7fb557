package sessionv1_test

import (
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TestKindsMatchProto keeps the constants and session.proto's list of kinds
// (the comment on Command.kind) the same.
func TestKindsMatchProto(t *testing.T) {
	src, err := os.ReadFile("session.proto")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)// What to do: (.*?)\. A node answers`).FindSubmatch(src)
	if m == nil {
		t.Fatal("session.proto: the comment on Command.kind that lists the kinds is gone")
	}
	var inProto []string
	for _, q := range regexp.MustCompile(`"([^"]+)"`).FindAllStringSubmatch(string(m[1]), -1) {
		inProto = append(inProto, q[1])
	}
	if got := sessionv1.Kinds(); !slices.Equal(got, inProto) {
		t.Errorf("Kinds() = %q, session.proto lists %q", got, inProto)
	}
	for _, k := range inProto {
		if !sessionv1.KnownKind(k) {
			t.Errorf("KnownKind(%q) = false", k)
		}
	}
	if sessionv1.KnownKind("power.bogus") || sessionv1.KnownKind("") {
		t.Error("KnownKind accepts a kind the protocol does not have")
	}
}

func TestPowerAction(t *testing.T) {
	for kind, want := range map[string]string{"power.status": "status", "power.soft-off": "soft-off", "power.cycle": "cycle"} {
		if got, ok := sessionv1.PowerAction(kind); !ok || got != want {
			t.Errorf("PowerAction(%q) = %q, %v; want %q, true", kind, got, ok, want)
		}
	}
	for _, kind := range []string{"power.bogus", "boot.set", "exec", "power."} {
		if got, ok := sessionv1.PowerAction(kind); ok {
			t.Errorf("PowerAction(%q) = %q, true; want false", kind, got)
		}
	}
}

func TestCheckSpec(t *testing.T) {
	exec := &sessionv1.Command{Spec: &sessionv1.Command_Exec{Exec: &sessionv1.ExecSpec{Argv: []string{"true"}}}}
	power := func(action string) *sessionv1.Command {
		return &sessionv1.Command{Spec: &sessionv1.Command_Power{Power: &sessionv1.PowerSpec{Action: action}}}
	}
	boot := &sessionv1.Command{Spec: &sessionv1.Command_Boot{Boot: &sessionv1.BootSpec{Device: "pxe"}}}
	upgrade := &sessionv1.Command{Spec: &sessionv1.Command_Upgrade{Upgrade: &sessionv1.UpgradeSpec{Version: "0.2.0"}}}
	none := &sessionv1.Command{}
	for _, tc := range []struct {
		kind string
		c    *sessionv1.Command
		want error // nil, ErrUnknownKind or ErrSpecMismatch
		says string
	}{
		{"exec", exec, nil, ""},
		{"exec", none, sessionv1.ErrSpecMismatch, "takes exec"},
		{"exec", &sessionv1.Command{Spec: &sessionv1.Command_Exec{Exec: &sessionv1.ExecSpec{Argv: []string{""}}}}, sessionv1.ErrSpecMismatch, "exec.argv"},
		{"exec", boot, sessionv1.ErrSpecMismatch, "takes exec"},
		{"inventory.refresh", none, nil, ""},
		{"inventory.refresh", exec, sessionv1.ErrSpecMismatch, "takes no spec"},
		{"reboot", none, nil, ""},
		{"power.cycle", power(""), nil, ""},
		{"power.cycle", power("cycle"), nil, ""},
		{"power.cycle", power("on"), sessionv1.ErrSpecMismatch, `power.action "on"`},
		{"power.on", none, sessionv1.ErrSpecMismatch, "takes power"},
		{"boot.set", boot, nil, ""},
		{"boot.set", &sessionv1.Command{Spec: &sessionv1.Command_Boot{Boot: &sessionv1.BootSpec{}}}, sessionv1.ErrSpecMismatch, "boot.device"},
		{"upgrade", upgrade, nil, ""},
		{"upgrade", &sessionv1.Command{Spec: &sessionv1.Command_Upgrade{Upgrade: &sessionv1.UpgradeSpec{}}}, sessionv1.ErrSpecMismatch, "upgrade.version"},
		{"gpu.diag", &sessionv1.Command{Spec: &sessionv1.Command_GpuDiag{GpuDiag: &sessionv1.GPUDiagSpec{Level: 3}}}, nil, ""},
		{"gpu.diag", &sessionv1.Command{Spec: &sessionv1.Command_GpuDiag{GpuDiag: &sessionv1.GPUDiagSpec{Level: 4}}}, sessionv1.ErrSpecMismatch, "gpuDiag.level 4"},
		{"gpu.diag", none, sessionv1.ErrSpecMismatch, "takes gpuDiag"},
		{"power.bogus", power(""), sessionv1.ErrUnknownKind, "power.bogus"},
		{"", none, sessionv1.ErrUnknownKind, "want one of exec, inventory.refresh"},
	} {
		err := sessionv1.CheckSpec(tc.kind, tc.c)
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("CheckSpec(%q, %v) = %v, want nil", tc.kind, tc.c, err)
		case tc.want != nil && (!errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says)):
			t.Errorf("CheckSpec(%q, %v) = %v, want %v saying %q", tc.kind, tc.c, err, tc.want, tc.says)
		}
	}
}

func TestSpecRoundTrip(t *testing.T) {
	for _, c := range []*sessionv1.Command{
		{Spec: &sessionv1.Command_Exec{Exec: &sessionv1.ExecSpec{Argv: []string{"nvidia-smi", "-L"}, Env: map[string]string{"A": "b"},
			OutputLimitBytes: 1 << 20, AsRoot: true}}},
		{Spec: &sessionv1.Command_Power{Power: &sessionv1.PowerSpec{Bmc: "rack1", Action: "cycle"}}},
		{Spec: &sessionv1.Command_Boot{Boot: &sessionv1.BootSpec{Device: "pxe", Persistent: true}}},
		{Spec: &sessionv1.Command_Upgrade{Upgrade: &sessionv1.UpgradeSpec{Version: "0.2.0", BaseUrl: "https://x/api/downloads"}}},
		{},
	} {
		// Fields other than the spec are not stored.
		withID := proto.Clone(c).(*sessionv1.Command)
		withID.Id, withID.Kind, withID.Attempt = "cmd_1", "exec", 3
		b, err := sessionv1.MarshalSpec(withID)
		if err != nil {
			t.Fatal(err)
		}
		got := &sessionv1.Command{Id: "cmd_2", Attempt: 7}
		if err := sessionv1.UnmarshalSpec(b, got); err != nil {
			t.Fatalf("UnmarshalSpec(%s): %v", b, err)
		}
		want := proto.Clone(c).(*sessionv1.Command)
		want.Id, want.Attempt = "cmd_2", 7
		if !proto.Equal(got, want) {
			t.Errorf("round trip of %s: got %v, want %v", b, got, want)
		}
	}
	if err := sessionv1.UnmarshalSpec([]byte(`{"id":"cmd_1"}`), &sessionv1.Command{}); err == nil {
		t.Error("UnmarshalSpec took a stored spec holding an id")
	}
	if err := sessionv1.UnmarshalSpec([]byte(`[]`), &sessionv1.Command{}); err == nil {
		t.Error("UnmarshalSpec took JSON that is not a Command")
	}
	// A field a later build adds is dropped, not refused.
	c := &sessionv1.Command{}
	if err := sessionv1.UnmarshalSpec([]byte(`{"exec":{"argv":["x"],"laterField":1}}`), c); err != nil || c.GetExec().GetArgv()[0] != "x" {
		t.Errorf("UnmarshalSpec with an unknown field: %v, %v", c, err)
	}
}
