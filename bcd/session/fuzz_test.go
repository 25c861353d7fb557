package session

import (
	"context"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// discardStream is a nodeStream that drops what is sent.
type discardStream struct{}

func (discardStream) Send(*sessionv1.NodeMessage) error { return nil }

// sendingHandler answers each command and cancel through the session.
type sendingHandler struct{}

func (sendingHandler) HandleCommand(_ context.Context, cmd *sessionv1.Command, send func(*sessionv1.CommandUpdate) error) {
	_ = send(&sessionv1.CommandUpdate{CommandId: cmd.GetId(), UpdateSeq: 1})
}

func (sendingHandler) HandleCancel(context.Context, *sessionv1.Cancel) {}

// refusingPins refuses every statement and holds one pin.
type refusingPins struct{}

func (refusingPins) ApplyPinStatement(context.Context, []byte, []byte) error {
	return errors.New("unpinned")
}
func (refusingPins) HeldPins(context.Context) ([]string, error) { return []string{"sha256/a"}, nil }

// FuzzGatewayMessage feeds arbitrary bytes, decoded as a GatewayMessage,
// to a session's message handling: nothing may panic, whatever a gateway
// (or anyone in its place) sends.
func FuzzGatewayMessage(f *testing.F) {
	seeds := []*sessionv1.GatewayMessage{
		{Seq: 1, Body: &sessionv1.GatewayMessage_Welcome{Welcome: &sessionv1.Welcome{SessionId: "s", HeartbeatInterval: durationpb.New(-time.Second)}}},
		{Seq: 2, Body: &sessionv1.GatewayMessage_Command{Command: &sessionv1.Command{Id: "c", Kind: "exec"}}},
		{Seq: 3, Body: &sessionv1.GatewayMessage_Cancel{Cancel: &sessionv1.Cancel{CommandId: "c"}}},
		{Seq: 4, Body: &sessionv1.GatewayMessage_Drain{Drain: &sessionv1.Drain{Delay: &durationpb.Duration{Seconds: 1 << 62}, PreferGateways: []string{"https://x:1", "::"}}}},
		{Seq: 5, Body: &sessionv1.GatewayMessage_Drain{Drain: &sessionv1.Drain{Delay: &durationpb.Duration{Seconds: -1, Nanos: 5}}}},
		{Seq: 6, Body: &sessionv1.GatewayMessage_Revoked{Revoked: &sessionv1.Revoked{Reason: "r"}}},
		{Seq: 7},
		{Seq: 8, Body: &sessionv1.GatewayMessage_ReleasePins{ReleasePins: &sessionv1.ReleasePins{Statements: []*sessionv1.ReleasePinStatement{
			{Statement: []byte(`{"type":"better-compute.release-pin/v1"}`), Signature: []byte("sig")}, {}}}}},
	}
	for _, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x5a, 0x00}) // an empty variant 11 (Command)

	p := sessiontest.NewPKI(f)
	key := sessiontest.NewKey(f)
	cert := p.NodeCertificate(f, key, "node-1", time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	c, err := New(Config{
		Gateways:    []string{"https://127.0.0.1:1"},
		Trust:       Trust{Pin: p.Pin()},
		Key:         key,
		Chain:       []*x509.Certificate{cert},
		Handler:     sendingHandler{},
		OnEvent:     func(Event) {},
		ReleasePins: refusingPins{},
	})
	if err != nil {
		f.Fatal(err)
	}
	gw := c.gws[0]

	f.Fuzz(func(t *testing.T, data []byte) {
		var msg sessionv1.GatewayMessage
		if err := proto.Unmarshal(data, &msg); err != nil {
			return
		}
		s := newSession(context.Background(), c, gw, nil)
		s.stream = discardStream{}
		defer s.close()
		c.resume = nil
		if w := msg.GetWelcome(); w != nil {
			s.welcome(msg.GetSeq(), w)
			if s.interval < MinHeartbeatInterval {
				t.Fatalf("heartbeat interval %v below the minimum", s.interval)
			}
			return
		}
		_ = s.handle(&msg)
	})
}
