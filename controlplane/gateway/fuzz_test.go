package gateway

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/jointoken"
	"github.com/better-compute/better-compute/proto/keyproof"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// fuzzGateway is a gateway that is built but not run, on SQLite.
func fuzzGateway(f *testing.F) (*env, *Gateway) {
	e := newEnv(f, backends[0].open(f))
	g, err := New(Config{
		Region:   "eu-1",
		CertFile: filepath.Join(e.dir, bootstrap.GatewayCertFile),
		KeyFile:  filepath.Join(e.dir, bootstrap.GatewayKeyFile),
	}, e.st, e.bundle, slog.New(slog.DiscardHandler))
	if err != nil {
		f.Fatal(err)
	}
	g.publicURL = "https://localhost:8443"
	return e, g
}

func mustMarshal(f *testing.F, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// FuzzJoinRequest feeds arbitrary JoinRequest bytes to Join: it never
// panics and never admits (the fuzzer cannot know a token's secret).
func FuzzJoinRequest(f *testing.F) {
	e, g := fuzzGateway(f)
	real := e.token(1000000, time.Hour)
	wrong, err := jointoken.New(e.bundle.GatewayPin(), nil)
	if err != nil {
		f.Fatal(err)
	}
	forged := strings.Replace(wrong.String(), wrong.ID(), real.ID(), 1)
	_, csr := newKey(f)
	facts := &sessionv1.NodeFacts{Hostname: "gpu-01", MachineId: "0123", Os: "linux", Arch: "amd64", Labels: map[string]string{"a": "b"}}
	f.Add(mustMarshal(f, &sessionv1.JoinRequest{Token: forged, Csr: csr, Facts: facts}))
	f.Add(mustMarshal(f, &sessionv1.JoinRequest{Token: wrong.String(), Csr: csr, Facts: facts}))
	f.Add(mustMarshal(f, &sessionv1.JoinRequest{Token: "bct1.garbage", Csr: []byte{0x30, 0x82}, Facts: &sessionv1.NodeFacts{}}))
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0x0f})
	js := &joinService{g: g}
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}})
	f.Fuzz(func(t *testing.T, data []byte) {
		var req sessionv1.JoinRequest
		if err := proto.Unmarshal(data, &req); err != nil {
			return
		}
		resp, err := js.Join(ctx, &req)
		if err == nil || resp != nil {
			t.Fatalf("fuzzed request admitted: %v", resp)
		}
	})
}

// fuzzMessages feeds arbitrary NodeMessage bytes to an open session's
// message handler (and Hello to the negotiation): nothing panics, and only
// capabilities the gateway supports are ever accepted.
func fuzzMessages(f *testing.F, seeds ...*sessionv1.NodeMessage) {
	e, g := fuzzGateway(f)
	ctx := context.Background()
	if _, err := e.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node-fuzz", PoolID: e.pool.ID, Hostname: "fuzz"}); err != nil {
		f.Fatal(err)
	}
	for _, m := range seeds {
		f.Add(mustMarshal(f, m))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var m sessionv1.NodeMessage
		if err := proto.Unmarshal(data, &m); err != nil {
			return
		}
		if h := m.GetHello(); h != nil {
			for _, c := range g.negotiate(h).capabilities {
				if !g.caps[c] {
					t.Fatalf("capability %q accepted", c)
				}
			}
		}
		// A fresh session each time, so every message reaches the store.
		s := &session{nodeID: "node-fuzz", id: "sess_fuzz"}
		g.handle(ctx, s, &m)
	})
}

func FuzzConnectHello(f *testing.F) {
	fuzzMessages(f,
		&sessionv1.NodeMessage{Seq: 1, Body: &sessionv1.NodeMessage_Hello{Hello: &sessionv1.Hello{
			BcdVersion: "0.1.0", Os: "linux", Arch: "amd64", BootId: "b", Capabilities: []string{"exec", "x.y", "exec"},
			Resume: &sessionv1.ResumeCursor{SessionId: "sess_1", LastGatewaySeq: 7}, InventoryDigest: "d",
			PendingResults: []*sessionv1.CommandResult{{CommandId: "cmd_1", State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED}},
		}}},
		&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Hello{Hello: &sessionv1.Hello{BcdVersion: "\x00\x7f", Capabilities: []string{""}}}},
	)
}

func FuzzConnectHeartbeat(f *testing.F) {
	fuzzMessages(f, &sessionv1.NodeMessage{Seq: 2, Body: &sessionv1.NodeMessage_Heartbeat{Heartbeat: &sessionv1.Heartbeat{
		SentAt: timestamppb.Now(), InventoryDigest: "d", RunningCommandIds: []string{"cmd_1"}, Load1: 0.5, UptimeSeconds: 10,
	}}})
}

func FuzzConnectInventory(f *testing.F) {
	fuzzMessages(f, &sessionv1.NodeMessage{Seq: 3, Body: &sessionv1.NodeMessage_Inventory{Inventory: &sessionv1.Inventory{
		Digest: "abc", Host: &sessionv1.HostInfo{Hostname: "gpu-01", Cpu: &sessionv1.CPU{Model: "EPYC", Cores: 64}},
		Gpus:        []*sessionv1.GPU{{Index: 0, Name: "NVIDIA A100-SXM4-40GB", Uuid: "GPU-1", MigMode: sessionv1.MIGMode_MIG_MODE_DISABLED}},
		CollectedAt: &timestamppb.Timestamp{Seconds: -1 << 40},
	}}})
}

func FuzzConnectCommandUpdate(f *testing.F) {
	fuzzMessages(f, &sessionv1.NodeMessage{Seq: 4, Body: &sessionv1.NodeMessage_CommandUpdate{CommandUpdate: &sessionv1.CommandUpdate{
		CommandId: "cmd_1", UpdateSeq: 1, Update: &sessionv1.CommandUpdate_Output{Output: &sessionv1.OutputChunk{
			Stream: sessionv1.OutputStream_OUTPUT_STREAM_STDOUT, Data: []byte("hello\n"),
		}},
	}}})
}

func FuzzConnectReleasePinsHeld(f *testing.F) {
	fuzzMessages(f, &sessionv1.NodeMessage{Seq: 6, Body: &sessionv1.NodeMessage_ReleasePinsHeld{ReleasePinsHeld: &sessionv1.ReleasePinsHeld{
		Pins: []string{"sha256/" + strings.Repeat("A", 43) + "=", "", "sha256/\x00"}}}})
}

func FuzzConnectEvent(f *testing.F) {
	fuzzMessages(f, &sessionv1.NodeMessage{Seq: 5, Body: &sessionv1.NodeMessage_Event{Event: &sessionv1.Event{
		Kind: "gpu.xid", Time: timestamppb.Now(), Severity: sessionv1.Severity_SEVERITY_CRITICAL, GpuUuid: "GPU-1", Xid: 79,
		Message: "fallen off the bus\n", Attributes: map[string]string{"pid": "1234"},
	}}})
}

// FuzzReattestRequest feeds arbitrary ReattestRequest bytes, as they would
// arrive on a connection whose exporter is fixed, to the key-proof check
// and re-attestation: it never panics, and nothing but the one valid proof
// of the seeds (a nonce minted for that exporter, signed by the node's
// key) is accepted.
func FuzzReattestRequest(f *testing.F) {
	e, g := fuzzGateway(f)
	ctx := context.Background()
	ekm := []byte(strings.Repeat("e", keyproof.ExporterLen))
	// A node of the deployment, as Join made it.
	key, csr := newKey(f)
	tok := e.token(1, time.Hour)
	adm, err := g.admit.Join(ctx, &admission.Request{Token: tok.String(), CSR: csr, Facts: admission.Facts{Hostname: "gpu-01"}})
	if err != nil {
		f.Fatal(err)
	}
	nonce := g.nonces.mint(g.cfg.Clock.Now(), ekm)
	sig, err := keyproof.Sign(key, keyproof.PurposeReattest, nonce, ekm)
	if err != nil {
		f.Fatal(err)
	}
	valid := &sessionv1.KeyProof{CertificateChain: [][]byte{adm.Cert.CertDER}, Nonce: nonce, Signature: sig}
	f.Add(mustMarshal(f, &sessionv1.ReattestRequest{Proof: valid, Csr: csr}))
	f.Add(mustMarshal(f, &sessionv1.ReattestRequest{Proof: &sessionv1.KeyProof{CertificateChain: valid.CertificateChain, Nonce: nonce, Signature: sig[:8]}, Csr: csr}))
	f.Add(mustMarshal(f, &sessionv1.ReattestRequest{Proof: &sessionv1.KeyProof{Nonce: []byte("x")}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &sessionv1.ReattestRequest{}
		if proto.Unmarshal(b, req) != nil {
			return
		}
		proven, err := g.verifyProof(req.GetProof(), keyproof.PurposeReattest, ekm)
		if err != nil {
			return
		}
		if string(req.GetProof().GetNonce()) != string(nonce) || proven.NodeID != adm.Node.ID {
			t.Fatalf("accepted a proof with nonce %x for node %s", req.GetProof().GetNonce(), proven.NodeID)
		}
		// The grace is off on this gateway: admitted proofs are refused
		// there, cleanly.
		if _, err := g.admit.Reattest(ctx, &admission.ReattestRequest{Proven: *proven, CSR: req.GetCsr()}); err == nil {
			t.Fatal("re-attested with re-attestation off")
		}
	})
}
