package sessionv1_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

var (
	testTime    = timestamppb.New(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))
	testGPUUUID = "GPU-5c1f4b7e-8a4e-4b7d-9c1e-2f6a1b3c4d5e"
)

func testInventory() *sessionv1.Inventory {
	return &sessionv1.Inventory{
		Digest: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		Host: &sessionv1.HostInfo{
			Hostname:      "gpu-07",
			MachineId:     "4c4c4544003710378058b4c04f4e4d32",
			BootId:        "b0a6c6b2-6d1c-4c8e-9a53-0f4f2f8f5c11",
			UptimeSeconds: 86400,
			Os:            &sessionv1.OS{Name: "debian", Version: "12", Kernel: "6.1.0-18-amd64"},
			Cpu: &sessionv1.CPU{
				Model: "AMD EPYC 9654 96-Core Processor", Sockets: 2, Cores: 192, Threads: 384,
				Flags: []string{"avx2", "avx512f"},
			},
			Memory: &sessionv1.Memory{TotalBytes: 1 << 40, AvailableBytes: 1 << 39},
			Disks: []*sessionv1.Disk{
				{Name: "nvme0n1", SizeBytes: 3840755982336, Model: "SAMSUNG MZQL23T8HCLS", Serial: "S64HNE0T", Rotational: false},
			},
			Nics: []*sessionv1.NIC{
				{Name: "enp65s0f0", Mac: "aa:bb:cc:dd:ee:ff", SpeedMbps: 100000, Addresses: []string{"10.0.0.5/24"}, Driver: "mlx5_core"},
			},
			Dmi: &sessionv1.DMI{SystemVendor: "Supermicro", ProductName: "SYS-821GE-TNHR", ProductSerial: "S123", BiosVersion: "2.1"},
		},
		Gpus: []*sessionv1.GPU{{
			Index: 0, Name: "NVIDIA H100 80GB HBM3", Uuid: testGPUUUID, Serial: "1654922001234",
			PciBusId: "00000000:18:00.0", MemoryTotalBytes: 85520809984, MemoryUsedBytes: 1 << 20,
			DriverVersion: "550.54.15", CudaDriverVersion: "12.4", TemperatureC: 41,
			PowerDrawMw: 71000, PowerLimitMw: 700000, EccVolatileCorrected: 1, EccAggregateCorrected: 3,
			RemappedRowsCorrectable: 2, RemappedRowsPending: true,
			MigMode: sessionv1.MIGMode_MIG_MODE_ENABLED, MigModePending: sessionv1.MIGMode_MIG_MODE_ENABLED,
			MigDevices: []*sessionv1.MIGDevice{
				{Index: 0, Uuid: "MIG-1d2c", Profile: "1g.10gb", GpuInstanceId: 9, ComputeInstanceId: 0, MemoryTotalBytes: 10 << 30},
			},
			Clocks: &sessionv1.Clocks{SmMhz: 1980, MemoryMhz: 2619, SmMaxMhz: 1980, MemoryMaxMhz: 2619},
			Health: &sessionv1.GPUHealth{
				State:   sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED,
				Reasons: []string{"row remapping pending"},
			},
		}},
		Plugins:     []*sessionv1.PluginInfo{{Name: "ipmi", Version: "0.1.0", Healthy: true}},
		CollectedAt: testTime,
	}
}

func testResult() *sessionv1.CommandResult {
	return &sessionv1.CommandResult{
		CommandId:       "cmd-1",
		State:           sessionv1.CommandState_COMMAND_STATE_SUCCEEDED,
		ExitCode:        0,
		OutputTruncated: true,
		FinishedAt:      testTime,
		DetailJson:      []byte(`{"state":"on"}`),
	}
}

// nodeMessages holds one NodeMessage per body variant, and per CommandUpdate
// variant.
func nodeMessages() map[string]*sessionv1.NodeMessage {
	update := func(u *sessionv1.CommandUpdate) *sessionv1.NodeMessage {
		u.CommandId = "cmd-1"
		u.UpdateSeq = 3
		return &sessionv1.NodeMessage{Seq: 9, Body: &sessionv1.NodeMessage_CommandUpdate{CommandUpdate: u}}
	}
	return map[string]*sessionv1.NodeMessage{
		"hello": {Seq: 1, Body: &sessionv1.NodeMessage_Hello{Hello: &sessionv1.Hello{
			BcdVersion: "0.3.1", Os: "linux", Arch: "amd64", BootId: "b0a6c6b2-6d1c-4c8e-9a53-0f4f2f8f5c11",
			Capabilities:    []string{"exec", "cancel", "inventory.v1", "gpu.nvml", "resume"},
			Resume:          &sessionv1.ResumeCursor{SessionId: "sess-1", LastGatewaySeq: 41},
			PendingResults:  []*sessionv1.CommandResult{testResult()},
			InventoryDigest: "9f86d081",
		}}},
		"heartbeat": {Seq: 2, Body: &sessionv1.NodeMessage_Heartbeat{Heartbeat: &sessionv1.Heartbeat{
			SentAt: testTime, InventoryDigest: "9f86d081", RunningCommandIds: []string{"cmd-1", "cmd-2"},
			Load1: 0.5, Load5: 1.25, Load15: 2, UptimeSeconds: 86400, MemoryAvailableBytes: 1 << 30,
		}}},
		"inventory": {Seq: 3, Body: &sessionv1.NodeMessage_Inventory{Inventory: testInventory()}},
		"command_update.accepted": update(&sessionv1.CommandUpdate{
			Update: &sessionv1.CommandUpdate_Accepted{Accepted: &sessionv1.Accepted{AcceptedAt: testTime}},
		}),
		"command_update.running": update(&sessionv1.CommandUpdate{
			Update: &sessionv1.CommandUpdate_Running{Running: &sessionv1.Running{StartedAt: testTime, Pid: 4242}},
		}),
		"command_update.output": update(&sessionv1.CommandUpdate{
			Update: &sessionv1.CommandUpdate_Output{Output: &sessionv1.OutputChunk{
				Stream: sessionv1.OutputStream_OUTPUT_STREAM_STDERR, Data: []byte("oops\n\x00\xff"), Offset: 65536,
			}},
		}),
		"command_update.result": update(&sessionv1.CommandUpdate{
			Update: &sessionv1.CommandUpdate_Result{Result: testResult()},
		}),
		"bundle_ack": {Seq: 6, Body: &sessionv1.NodeMessage_BundleAck{BundleAck: &sessionv1.BundleAck{RotationId: "rot_1"}}},
		"release_pins_held": {Seq: 7, Body: &sessionv1.NodeMessage_ReleasePinsHeld{ReleasePinsHeld: &sessionv1.ReleasePinsHeld{
			Pins: []string{"sha256/" + strings.Repeat("A", 43) + "=", "sha256/" + strings.Repeat("B", 43) + "="}}}},
		"event": {Seq: 5, Body: &sessionv1.NodeMessage_Event{Event: &sessionv1.Event{
			Kind: "gpu.xid", Time: testTime, Severity: sessionv1.Severity_SEVERITY_CRITICAL,
			GpuUuid: testGPUUUID, Xid: 79, Message: "GPU has fallen off the bus",
			Attributes: map[string]string{"pid": "1234"},
		}}},
	}
}

// gatewayMessages holds one GatewayMessage per body variant, and per Command
// spec variant.
func gatewayMessages() map[string]*sessionv1.GatewayMessage {
	command := func(c *sessionv1.Command) *sessionv1.GatewayMessage {
		c.Id = "cmd-1"
		c.Deadline = testTime
		c.Attempt = 2
		return &sessionv1.GatewayMessage{Seq: 7, Body: &sessionv1.GatewayMessage_Command{Command: c}}
	}
	return map[string]*sessionv1.GatewayMessage{
		"welcome": {Seq: 1, Body: &sessionv1.GatewayMessage_Welcome{Welcome: &sessionv1.Welcome{
			SessionId: "sess-2", HeartbeatInterval: durationpb.New(15 * time.Second), ServerTime: testTime,
			Capabilities: []string{"exec", "cancel"}, NodeId: "node-1", GatewayId: "gw-a",
		}}},
		"command.none": command(&sessionv1.Command{Kind: "inventory.refresh"}),
		"command.exec": command(&sessionv1.Command{Kind: "exec", Spec: &sessionv1.Command_Exec{Exec: &sessionv1.ExecSpec{
			Argv: []string{"nvidia-smi", "-q"}, Env: map[string]string{"LANG": "C"}, Cwd: "/tmp",
			Timeout: durationpb.New(time.Minute), OutputLimitBytes: 1 << 20, AsRoot: true,
		}}}),
		"command.power": command(&sessionv1.Command{Kind: "power.cycle", Spec: &sessionv1.Command_Power{Power: &sessionv1.PowerSpec{
			Bmc: "10.0.9.7:623", Action: "cycle",
		}}}),
		"command.boot": command(&sessionv1.Command{Kind: "boot.pxe", Spec: &sessionv1.Command_Boot{Boot: &sessionv1.BootSpec{
			Device: "pxe", Persistent: true,
		}}}),
		"command.upgrade": command(&sessionv1.Command{Kind: "upgrade", Spec: &sessionv1.Command_Upgrade{Upgrade: &sessionv1.UpgradeSpec{
			Version: "0.4.0", BaseUrl: "https://compute.example.com/api/downloads",
		}}}),
		"command.gpu_reset": command(&sessionv1.Command{Kind: "gpu.reset", Spec: &sessionv1.Command_GpuReset{GpuReset: &sessionv1.GPUResetSpec{
			GpuUuid: "GPU-5c1f0000-0000-0000-0000-000000000000", Force: true,
		}}}),
		"command.gpu_diag": command(&sessionv1.Command{Kind: "gpu.diag", Spec: &sessionv1.Command_GpuDiag{GpuDiag: &sessionv1.GPUDiagSpec{
			Level: 2, GpuUuid: "GPU-5c1f0000-0000-0000-0000-000000000000",
		}}}),
		"cancel": {Seq: 3, Body: &sessionv1.GatewayMessage_Cancel{Cancel: &sessionv1.Cancel{CommandId: "cmd-1", Reason: "operator"}}},
		"release_pins": {Seq: 6, Body: &sessionv1.GatewayMessage_ReleasePins{ReleasePins: &sessionv1.ReleasePins{
			Statements: []*sessionv1.ReleasePinStatement{{Statement: []byte(`{"type":"better-compute.release-pin/v1"}`), Signature: []byte("untrusted comment: x\n\x00\xff")}},
		}}},
		"bundle": {Seq: 5, Body: &sessionv1.GatewayMessage_Bundle{Bundle: &sessionv1.Bundle{
			NodeCaRoots: [][]byte{{0x30, 0x82, 0x01, 0x0a}, {0x30, 0x82, 0x01, 0x0b}}, RotationId: "rot_1",
		}}},
		"drain": {Seq: 4, Body: &sessionv1.GatewayMessage_Drain{Drain: &sessionv1.Drain{
			Delay: durationpb.New(60 * time.Second), Reason: "gateway shutting down",
			PreferGateways: []string{"https://gw-b.example.com:8443"},
		}}},
		"revoked":    {Seq: 5, Body: &sessionv1.GatewayMessage_Revoked{Revoked: &sessionv1.Revoked{Reason: "node revoked"}}},
		"superseded": {Seq: 6, Body: &sessionv1.GatewayMessage_Superseded{Superseded: &sessionv1.Superseded{BySessionId: "sess_2"}}},
		"tunnel_open": {Seq: 7, Body: &sessionv1.GatewayMessage_TunnelOpen{TunnelOpen: &sessionv1.TunnelOpen{TunnelId: "tun_1", Kind: sessionv1.TunnelKindShell,
			AsRoot: true, Rows: 24, Cols: 80, Term: "xterm"}}},
	}
}

// joinMessages holds the JoinService requests and responses.
func joinMessages() map[string]proto.Message {
	return map[string]proto.Message{
		"join_request": &sessionv1.JoinRequest{Token: "secret", Csr: []byte{0x30, 0x82}, Facts: &sessionv1.NodeFacts{
			Hostname: "gpu-07", MachineId: "4c4c4544", Os: "linux", Arch: "arm64", BcdVersion: "0.3.1",
			BootId: "b0a6c6b2", Labels: map[string]string{"rack": "r12"},
		}},
		"join_response": &sessionv1.JoinResponse{
			NodeId: "node-1", CertificateChain: [][]byte{{1}, {2}}, NodeCaRoots: [][]byte{{3}},
			TrustDomain: "compute.example.com", SpiffeId: "spiffe://compute.example.com/node/node-1",
			Gateways: []string{"https://gw.example.com:8443"}, RenewAfter: testTime,
			PoolId: "pool-1", SiteId: "site-1", Region: "eu-1",
		},
		"renew_request":   &sessionv1.RenewRequest{Csr: []byte{0x30}},
		"renew_response":  &sessionv1.RenewResponse{CertificateChain: [][]byte{{1}}, NodeCaRoots: [][]byte{{3}}, RenewAfter: testTime},
		"secret_request":  &sessionv1.SecretRequest{Name: "bmc/ipmi"},
		"secret_response": &sessionv1.SecretResponse{Name: "bmc/ipmi", Value: []byte("pw"), ExpiresAt: testTime},
	}
}

func allMessages() map[string]proto.Message {
	all := joinMessages()
	for name, m := range nodeMessages() {
		all["node."+name] = m
	}
	for name, m := range gatewayMessages() {
		all["gateway."+name] = m
	}
	return all
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for name, want := range allMessages() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, err := proto.Marshal(want)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			got := want.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(b, got); err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !proto.Equal(got, want) {
				t.Errorf("round trip changed the message:\n got %v\nwant %v", got, want)
			}
		})
	}
}

// TestRoundTripCoversEveryVariant fails when a oneof gains a variant that
// TestRoundTrip does not exercise.
func TestRoundTripCoversEveryVariant(t *testing.T) {
	t.Parallel()
	type key struct {
		oneof   protoreflect.FullName
		variant protoreflect.Name
	}
	seen := map[key]bool{}
	var walk func(m protoreflect.Message)
	walk = func(m protoreflect.Message) {
		oneofs := m.Descriptor().Oneofs()
		for i := range oneofs.Len() {
			if fd := m.WhichOneof(oneofs.Get(i)); fd != nil {
				seen[key{oneofs.Get(i).FullName(), fd.Name()}] = true
			}
		}
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			if fd.Message() != nil && !fd.IsList() && !fd.IsMap() {
				walk(v.Message())
			}
			return true
		})
	}
	for _, m := range allMessages() {
		walk(m.ProtoReflect())
	}
	for _, m := range []proto.Message{
		&sessionv1.NodeMessage{}, &sessionv1.GatewayMessage{}, &sessionv1.Command{}, &sessionv1.CommandUpdate{},
	} {
		oneofs := m.ProtoReflect().Descriptor().Oneofs()
		for i := range oneofs.Len() {
			o := oneofs.Get(i)
			for j := range o.Fields().Len() {
				if k := (key{o.FullName(), o.Fields().Get(j).Name()}); !seen[k] {
					t.Errorf("no round-trip case sets %s to %s", k.oneof, k.variant)
				}
			}
		}
	}
}

// TestUnknownFields decodes messages as a newer peer would send them: with
// fields, oneof variants and enum values this version does not know. Decoding
// must succeed, keep what it knows, and carry the rest through a re-encode.
func TestUnknownFields(t *testing.T) {
	t.Parallel()

	t.Run("field", func(t *testing.T) {
		t.Parallel()
		for name, want := range allMessages() {
			b, err := proto.Marshal(want)
			if err != nil {
				t.Fatalf("%s: Marshal: %v", name, err)
			}
			var extra []byte
			extra = protowire.AppendTag(extra, 1000, protowire.VarintType)
			extra = protowire.AppendVarint(extra, 7)
			extra = protowire.AppendTag(extra, 1001, protowire.BytesType)
			extra = protowire.AppendString(extra, "from the future")
			newer := append(append([]byte(nil), extra...), b...) // unknown fields first: order must not matter

			got := want.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(newer, got); err != nil {
				t.Fatalf("%s: Unmarshal with unknown fields: %v", name, err)
			}
			if !bytes.Equal(got.ProtoReflect().GetUnknown(), extra) {
				t.Errorf("%s: unknown fields = %x, want %x", name, got.ProtoReflect().GetUnknown(), extra)
			}
			// Ignoring the unknown fields leaves exactly the known message.
			got.ProtoReflect().SetUnknown(nil)
			if !proto.Equal(got, want) {
				t.Errorf("%s: known fields changed:\n got %v\nwant %v", name, got, want)
			}

			// A relay that re-encodes the message keeps the unknown fields.
			got = want.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(newer, got); err != nil {
				t.Fatal(err)
			}
			relayed, err := proto.Marshal(got)
			if err != nil {
				t.Fatalf("%s: re-Marshal: %v", name, err)
			}
			if !bytes.Contains(relayed, extra) {
				t.Errorf("%s: re-encoded message lost its unknown fields", name)
			}

			// DiscardUnknown drops them without error.
			got = want.ProtoReflect().New().Interface()
			if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(newer, got); err != nil {
				t.Fatalf("%s: Unmarshal discarding unknown fields: %v", name, err)
			}
			if !proto.Equal(got, want) {
				t.Errorf("%s: DiscardUnknown: got %v, want %v", name, got, want)
			}
		}
	})

	t.Run("oneof variant", func(t *testing.T) {
		t.Parallel()
		// A NodeMessage whose body is a variant added later (field 63,
		// beyond every variant of today's oneof).
		var b []byte
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, 12)
		b = protowire.AppendTag(b, 63, protowire.BytesType)
		b = protowire.AppendBytes(b, protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 1))
		var got sessionv1.NodeMessage
		if err := proto.Unmarshal(b, &got); err != nil {
			t.Fatalf("Unmarshal: %v", err)
		}
		if got.GetSeq() != 12 || got.GetBody() != nil {
			t.Errorf("got seq %d body %v, want seq 12 and no body", got.GetSeq(), got.GetBody())
		}
	})

	t.Run("enum value", func(t *testing.T) {
		t.Parallel()
		// A CommandResult whose state is a value added later.
		var b []byte
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, "cmd-1")
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, 99)
		var got sessionv1.CommandResult
		if err := proto.Unmarshal(b, &got); err != nil {
			t.Fatalf("Unmarshal: %v", err)
		}
		if got.GetCommandId() != "cmd-1" || got.GetState() != sessionv1.CommandState(99) {
			t.Errorf("got %v, want command cmd-1 in state 99", &got)
		}
		if _, ok := sessionv1.CommandState_name[int32(got.GetState())]; ok {
			t.Errorf("state 99 has a name; pick a number this version does not define")
		}
	})
}

func FuzzNodeMessageUnmarshal(f *testing.F) {
	for _, m := range nodeMessages() {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	// seq 1 and an empty unknown field 1000.
	f.Add(protowire.AppendBytes(protowire.AppendTag([]byte{0x08, 0x01}, 1000, protowire.BytesType), nil))

	deterministic := proto.MarshalOptions{Deterministic: true}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m sessionv1.NodeMessage
		if err := proto.Unmarshal(b, &m); err != nil {
			return // rejecting garbage is fine; panicking is not
		}
		out, err := deterministic.Marshal(&m)
		if err != nil {
			t.Fatalf("Marshal after a successful Unmarshal: %v", err)
		}
		// What we encode, we decode, to the same encoding.
		var again sessionv1.NodeMessage
		if err := proto.Unmarshal(out, &again); err != nil {
			t.Fatalf("Unmarshal of our own encoding: %v", err)
		}
		out2, err := deterministic.Marshal(&again)
		if err != nil {
			t.Fatalf("second Marshal: %v", err)
		}
		if !bytes.Equal(out, out2) {
			t.Fatalf("encoding is not stable:\n first %x\nsecond %x", out, out2)
		}
	})
}
