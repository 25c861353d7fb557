package gateway

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TestGatewaySendsReleasePins: a session with the release.pins capability
// gets the accepted statements after Welcome and again when one is added;
// ReleasePinsHeld is recorded for the node, and a report out of bounds is
// not; a live node without the capability counts as not holding the pin.
func TestGatewaySendsReleasePins(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	e := newEnv(t, st)
	first, err := st.ReleasePinStatementAdd(ctx, &store.ReleasePinStatement{Action: "add", Pin: "sha256/a",
		Statement: []byte("stmt-1"), Signature: []byte("sig-1"), SignedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	g := e.start(func(c *Config) { c.BundleReload = 50 * time.Millisecond })
	with, without := e.join(g, "gpu-pins", "m-pins"), e.join(g, "gpu-old", "m-old")
	hello := func(caps ...string) *sessionv1.Hello {
		return &sessionv1.Hello{BcdVersion: "0.1.1", Os: "linux", Arch: "amd64", Capabilities: caps}
	}
	// The first read of the statements may follow the Welcome: the loop
	// then sends them to the open sessions.
	s, err := e.connectWith(e.dial(g, &with.cert), hello(sessionv1.CapabilityExec, sessionv1.CapabilityReleasePins))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(s.welcome.GetCapabilities(), sessionv1.CapabilityReleasePins) {
		t.Fatalf("welcome capabilities %v lack release.pins", s.welcome.GetCapabilities())
	}
	_, err = e.connectWith(e.dial(g, &without.cert), hello(sessionv1.CapabilityExec))
	if err != nil {
		t.Fatal(err)
	}
	recvPins := func(s *clientSession) *sessionv1.ReleasePins {
		t.Helper()
		for {
			m, err := s.stream.Recv()
			if err != nil {
				t.Fatalf("session ended before ReleasePins: %v", err)
			}
			if p := m.GetReleasePins(); p != nil {
				return p
			}
		}
	}
	p := recvPins(s)
	if len(p.GetStatements()) != 1 || string(p.GetStatements()[0].GetStatement()) != "stmt-1" || string(p.GetStatements()[0].GetSignature()) != "sig-1" {
		t.Fatalf("first ReleasePins = %v", p)
	}
	if _, err := st.ReleasePinStatementAdd(ctx, &store.ReleasePinStatement{Action: "remove", Pin: "sha256/b",
		Statement: []byte("stmt-2"), Signature: []byte("sig-2"), SignedAt: time.Now(), AddedAt: first.AddedAt.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	p = recvPins(s)
	if len(p.GetStatements()) != 2 || string(p.GetStatements()[1].GetStatement()) != "stmt-2" {
		t.Fatalf("ReleasePins after an add = %v, want both, oldest first", p)
	}

	// Reports: one out of bounds is dropped; a good one is recorded.
	send := func(seq uint64, pins ...string) {
		t.Helper()
		if err := s.stream.Send(&sessionv1.NodeMessage{Seq: seq, Body: &sessionv1.NodeMessage_ReleasePinsHeld{
			ReleasePinsHeld: &sessionv1.ReleasePinsHeld{Pins: pins}}}); err != nil {
			t.Fatal(err)
		}
	}
	send(2, "not-a-pin")
	send(3, "sha256/a")
	e.eventually(t, 30*time.Second, "the report is recorded", func() bool {
		c, err := st.ReleasePinCounts(ctx, []string{"sha256/a"}, 10)
		return err == nil && c.Holding == 1
	})
	c, err := st.ReleasePinCounts(ctx, []string{"sha256/a"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if c.Live != 2 || len(c.Missing) != 1 || c.Missing[0] != without.id {
		t.Fatalf("counts = %+v, want 2 live, %s missing", c, without.id)
	}
	if c, _ := st.ReleasePinCounts(ctx, []string{"not-a-pin"}, 0); c == nil || c.Holding != 0 {
		t.Fatalf("a report out of bounds was recorded: %+v", c)
	}
}
