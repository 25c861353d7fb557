package gateway

import (
	"errors"
	"sync"
	"testing"
	"time"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// sentStream is a Connect stream that keeps what the gateway sends.
type sentStream struct {
	sessionv1.SessionService_ConnectServer
	mu   sync.Mutex
	sent []*sessionv1.GatewayMessage
}

func (f *sentStream) Send(m *sessionv1.GatewayMessage) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent = append(f.sent, m)
	return nil
}

// TestNothingBeforeWelcome: a session is registered (open) before accept
// sends its Welcome; a dispatch round that finds it meanwhile gets
// ErrNoSession, which puts its command back in the queue, so Welcome is
// the node's first message, numbered 1, and the command follows it. (A
// Command answering Hello ends the session on the node as a protocol
// violation: seen in TestRollingUpgradeUnderLoad under a stream of
// commands.)
func TestNothingBeforeWelcome(t *testing.T) {
	st := &sentStream{}
	s := &session{nodeID: "node_1", id: "sess_1", stream: st}
	cmd := &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Command{Command: &sessionv1.Command{Id: "cmd_1"}}}
	if err := s.send(cmd); !errors.Is(err, ErrNoSession) {
		t.Fatalf("send before Welcome = %v, want ErrNoSession", err)
	}
	if err := s.welcome(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Welcome{Welcome: &sessionv1.Welcome{SessionId: s.id}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.send(cmd); err != nil {
		t.Fatalf("send after Welcome: %v", err)
	}
	if len(st.sent) != 2 || st.sent[0].GetWelcome() == nil || st.sent[0].GetSeq() != 1 ||
		st.sent[1].GetCommand().GetId() != "cmd_1" || st.sent[1].GetSeq() != 2 {
		t.Fatalf("sent %v, want Welcome (seq 1) then the command (seq 2)", st.sent)
	}
}

// TestReconnectWindow: the Welcome's reconnect window is the time the
// gateway needs to admit every session it holds, whole seconds, at least
// one (issue 37).
func TestReconnectWindow(t *testing.T) {
	for _, tc := range []struct {
		sessions int
		rate     float64
		want     time.Duration
	}{
		{0, 500, time.Second},
		{1, 500, time.Second},
		{1000, 500, 2 * time.Second},
		{1001, 500, 3 * time.Second},
		{10000, 500, 20 * time.Second},
		{10, 0, time.Second},
	} {
		if got := ReconnectWindow(tc.sessions, tc.rate); got != tc.want {
			t.Errorf("ReconnectWindow(%d, %v) = %v, want %v", tc.sessions, tc.rate, got, tc.want)
		}
	}
}
