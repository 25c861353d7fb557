package sim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const wait = 20 * time.Second

func fastSession() session.Config {
	return session.Config{BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, StartJitter: 50 * time.Millisecond}
}

func TestFleetJoinsRunsAndReconnects(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{HeartbeatInterval: 50 * time.Millisecond})
	tok := p.NewToken(t)
	g.AddToken(tok)
	const n = 20
	f, err := sim.NewFleet(sim.FleetConfig{GatewayURL: g.URL, Token: tok, N: n, JoinConcurrency: 4, Session: fastSession()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	if err := f.Join(ctx); err != nil {
		t.Fatal(err)
	}
	if st := f.Stats(); st.Joined != n || g.Joins() != n {
		t.Fatalf("joined %d (gateway saw %d), want %d", st.Joined, g.Joins(), n)
	}
	ids := map[string]bool{}
	for _, d := range f.Daemons() {
		ids[d.NodeID()] = true
	}
	if len(ids) != n {
		t.Errorf("%d distinct node ids, want %d", len(ids), n)
	}

	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()
	if err := f.WaitFor(ctx, func(s sim.FleetStats) bool { return s.Connected == n }); err != nil {
		t.Fatal(err)
	}

	// Every session says who it is and sends its inventory.
	s := g.NextSession(t, wait)
	if s.Hello.GetBcdVersion() != sim.Version || len(s.Hello.GetInventoryDigest()) != 64 {
		t.Errorf("hello = %v", s.Hello)
	}
	select {
	case m := <-s.Messages():
		inv := m.GetInventory()
		if inv == nil || len(inv.GetGpus()) != 8 || inv.GetDigest() != s.Hello.GetInventoryDigest() {
			t.Errorf("first message after Welcome = %v, want the 8-GPU inventory", m)
		}
	case <-time.After(wait):
		t.Fatal("no inventory")
	}

	// A dropped session comes back.
	s.End(status.New(codes.Unavailable, "bye"))
	if err := f.WaitFor(ctx, func(s sim.FleetStats) bool { return s.Reconnects >= 1 && s.Connected == n }); err != nil {
		t.Fatal(err)
	}
	if st := f.Stats(); st.Disconnects < 1 || st.Connects < n+1 || st.Stopped != 0 {
		t.Errorf("stats = %+v", st)
	}
}

func TestFleetCountsRevokedDaemons(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	tok := p.NewToken(t)
	g.AddToken(tok)
	f, err := sim.NewFleet(sim.FleetConfig{GatewayURL: g.URL, Token: tok, N: 3, Session: fastSession(), NoInventory: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	if err := f.Join(ctx); err != nil {
		t.Fatal(err)
	}
	g.Revoke(f.Daemons()[0].NodeID(), "test")
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()
	if err := f.WaitFor(ctx, func(s sim.FleetStats) bool { return s.Stopped == 1 && s.Connected == 2 && s.Running == 2 }); err != nil {
		t.Error(err)
	}
	stop()
	<-done
}

func TestFleetJoinFailure(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	tok := p.NewToken(t) // not accepted by the gateway
	f, err := sim.NewFleet(sim.FleetConfig{GatewayURL: g.URL, Token: tok, N: 5})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Join(t.Context()); !errors.Is(err, session.ErrJoinRefused) {
		t.Errorf("Join = %v, want ErrJoinRefused", err)
	}
	if _, err := sim.NewFleet(sim.FleetConfig{GatewayURL: g.URL, Token: tok}); err == nil {
		t.Error("NewFleet with N = 0 succeeded")
	}
}

func TestFakeDaemonRunBeforeJoin(t *testing.T) {
	t.Parallel()
	d, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Run(t.Context()); !errors.Is(err, sim.ErrNotJoined) {
		t.Errorf("Run = %v, want ErrNotJoined", err)
	}
	d2, _ := sim.NewFakeDaemon(sim.DaemonConfig{Name: "x"})
	if d.Inventory().GetDigest() != d2.Inventory().GetDigest() || d.Facts().GetMachineId() != d2.Facts().GetMachineId() {
		t.Error("the simulated host is not a function of its name")
	}
}

// StopDaemon ends one daemon's session (the last running), then the one
// before it; the others stay connected, and with none left it returns nil.
func TestFleetStopDaemon(t *testing.T) {
	t.Parallel()
	p := sessiontest.NewPKI(t)
	g := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{})
	tok := p.NewToken(t)
	g.AddToken(tok)
	f, err := sim.NewFleet(sim.FleetConfig{GatewayURL: g.URL, Token: tok, N: 2, Session: fastSession(), NoInventory: true})
	if err != nil {
		t.Fatal(err)
	}
	if f.StopDaemon() != nil {
		t.Fatal("StopDaemon before Run stopped a daemon")
	}
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	if err := f.Join(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()
	if err := f.WaitFor(ctx, func(s sim.FleetStats) bool { return s.Connected == 2 }); err != nil {
		t.Fatal(err)
	}
	if d := f.StopDaemon(); d != f.Daemons()[1] {
		t.Fatalf("StopDaemon stopped %v, want the last daemon", d)
	}
	if err := f.WaitFor(ctx, func(s sim.FleetStats) bool { return s.Connected == 1 && s.Running == 1 && s.Stopped == 0 }); err != nil {
		t.Fatal(err)
	}
	if d := f.StopDaemon(); d != f.Daemons()[0] {
		t.Fatalf("second StopDaemon stopped %v, want the first daemon", d)
	}
	if err := f.WaitFor(ctx, func(s sim.FleetStats) bool { return s.Running == 0 }); err != nil {
		t.Fatal(err)
	}
	if d := f.StopDaemon(); d != nil {
		t.Fatalf("StopDaemon with none running stopped %v", d.Name())
	}
	stop()
	<-done
}
