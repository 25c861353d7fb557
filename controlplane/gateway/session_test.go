package gateway

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

func TestConnect(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(nil)
		n := e.join(g, "gpu-10", "")
		s := e.connect(g, n)
		w := s.welcome
		if w.NodeId != n.id || w.GatewayId != g.ID() || w.SessionId == "" || w.HeartbeatInterval.AsDuration() != 10*time.Second ||
			time.Since(w.ServerTime.AsTime()).Abs() > time.Minute || strings.Join(w.Capabilities, ",") != "exec,inventory.v1" {
			t.Fatalf("welcome = %+v", w)
		}
		row, err := e.st.SessionGet(ctx, n.id)
		if err != nil || row.SessionID != w.SessionId || row.GatewayID != g.ID() || row.Epoch != 1 {
			t.Fatalf("session row = %+v, %v", row, err)
		}
		nd, _ := e.st.NodeGet(ctx, n.id)
		if nd.State != store.NodeReady || nd.BCDVersion != "0.1.1" {
			t.Fatalf("node after connect = %+v", nd)
		}
		gw, err := e.st.GatewayGet(ctx, g.ID())
		if err != nil || gw.Address != g.PublicURL() || gw.Region != "eu-1" || gw.MaxStreams != 5000 {
			t.Fatalf("gateway row = %+v, %v", gw, err)
		}
		if l, err := e.st.LeaseGet(ctx, LeaseName(g.ID())); err != nil || l.Holder != g.ID() || time.Until(l.ExpiresAt) <= 0 {
			t.Fatalf("lease = %+v, %v", l, err)
		}

		// Inventory and events are stored.
		send := func(m *sessionv1.NodeMessage) {
			if err := s.stream.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Inventory{Inventory: &sessionv1.Inventory{
			Digest: "d1", Gpus: []*sessionv1.GPU{{Name: "NVIDIA A100-SXM4-40GB"}},
		}}})
		send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Event{Event: &sessionv1.Event{
			Kind: "gpu.xid", Xid: 79, Severity: sessionv1.Severity_SEVERITY_CRITICAL, Message: "fallen off the bus",
		}}})
		e.eventually(t, 30*time.Second, "inventory and event stored", func() bool {
			nd, _ := e.st.NodeGet(ctx, n.id)
			evs, _ := e.st.EventList(ctx, &store.EventListParams{NodeID: n.id})
			return nd.InventoryDigest == "d1" && strings.Contains(string(nd.Inventory), "A100") &&
				len(evs) == 1 && evs[0].Severity == "critical" && evs[0].Kind == "gpu.xid"
		})

		// The Send seam numbers messages after Welcome.
		if err := g.Send(n.id, &sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_Drain{Drain: &sessionv1.Drain{Reason: "test"}}}); err != nil {
			t.Fatal(err)
		}
		m, err := s.stream.Recv()
		if err != nil || m.GetDrain().GetReason() != "test" || m.Seq != 2 {
			t.Fatalf("sent message = %v, %v", m, err)
		}
		if err := g.Send("node_unknown", &sessionv1.GatewayMessage{}); !errors.Is(err, ErrNoSession) {
			t.Fatalf("send to a node without a session: %v", err)
		}
	})
}

// TestBootIDRecorded: the boot id of Hello is the node's BootID from the
// session's open on: a reconnection of the same boot keeps it, one of a new
// boot replaces it, and a Hello without one (an older bcd) or with a
// malformed one leaves none.
func TestBootIDRecorded(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(nil)
		n := e.join(g, "gpu-11", "")
		for _, tc := range []struct{ sent, want string }{
			{"4f1c2f8e-1d7a-4c38-9b55-6c1f0d3a7e21", "4f1c2f8e-1d7a-4c38-9b55-6c1f0d3a7e21"},
			{"4f1c2f8e-1d7a-4c38-9b55-6c1f0d3a7e21", "4f1c2f8e-1d7a-4c38-9b55-6c1f0d3a7e21"},
			{"9a0b7c55-2e61-4f0e-8d3b-0c7e5a1b2f44", "9a0b7c55-2e61-4f0e-8d3b-0c7e5a1b2f44"},
			{"", ""},
			{"bad\nboot", ""},
		} {
			s, err := e.connectWith(e.dial(g, &n.cert), &sessionv1.Hello{BcdVersion: "0.1.1", Os: "linux", Arch: "amd64", BootId: tc.sent})
			if err != nil {
				t.Fatalf("connect with boot id %q: %v", tc.sent, err)
			}
			nd, err := e.st.NodeGet(ctx, n.id)
			if err != nil {
				t.Fatal(err)
			}
			if nd.BootID != tc.want {
				t.Fatalf("after a session with boot id %q: node boot id %q, want %q", tc.sent, nd.BootID, tc.want)
			}
			row, err := e.st.SessionGet(ctx, n.id)
			if err != nil || row.SessionID != s.welcome.SessionId {
				t.Fatalf("session row = %+v, %v", row, err)
			}
		}
	})
}

func TestConnectRefused(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(nil)
		n := e.join(g, "gpu-11", "")

		// No client certificate.
		_, err := e.tryConnect(g, nil)
		st := wantCode(t, err, codes.Unauthenticated)
		if !strings.Contains(st.Message(), "client certificate is required") {
			t.Fatalf("message %q", st.Message())
		}

		// A certificate from another deployment's node CA, for this node id:
		// the handshake itself fails.
		other, err := pki.Init(pki.InitOptions{TrustDomain: testTrustDomain})
		if err != nil {
			t.Fatal(err)
		}
		key, csr := newKey(t)
		foreign, err := other.IssueNode(csr, n.id, pki.IssueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The client sees the server's alert ("unknown certificate
		// authority") or, when its write comes first, a broken connection.
		_, err = e.tryConnect(g, &tls.Certificate{Certificate: [][]byte{foreign.CertDER}, PrivateKey: key})
		wantCode(t, err, codes.Unavailable)

		// A certificate of this CA whose SPIFFE ID names a node that is not
		// a node of this deployment.
		stray, err := e.bundle.IssueNode(csr, "node-that-never-joined", pki.IssueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.tryConnect(g, &tls.Certificate{Certificate: [][]byte{stray.CertDER}, PrivateKey: key})
		st = wantCode(t, err, codes.PermissionDenied)
		if !strings.Contains(st.Message(), "node-that-never-joined") {
			t.Fatalf("stray node: message %q", st.Message())
		}

		// A certificate naming another (real) node, with a revoked serial.
		victim := e.join(g, "gpu-12", "")
		forged, err := e.bundle.IssueNode(csr, victim.id, pki.IssueOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.st.RevocationInsert(ctx, &store.Revocation{Serial: forged.Serial, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
		_, err = e.tryConnect(g, &tls.Certificate{Certificate: [][]byte{forged.CertDER}, PrivateKey: key})
		st = wantCode(t, err, codes.PermissionDenied)
		if !strings.Contains(st.Message(), "revoked") {
			t.Fatalf("revoked: message %q", st.Message())
		}
		if rows, _ := e.st.SessionList(ctx, ""); len(rows) != 0 {
			t.Fatalf("refused connects left sessions: %+v", rows)
		}

		// The first message must be Hello.
		cc := e.dial(g, &n.cert)
		stream, err := sessionv1.NewSessionServiceClient(cc).Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Heartbeat{Heartbeat: &sessionv1.Heartbeat{}}})
		_, err = stream.Recv()
		wantCode(t, err, codes.InvalidArgument)
	})
}

func TestHelloTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backends[0].open(t))
	g := e.start(func(c *Config) { c.HelloTimeout = 300 * time.Millisecond })
	n := e.join(g, "gpu-13", "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := sessionv1.NewSessionServiceClient(e.dial(g, &n.cert)).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := stream.Recv(); err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("silent stream: %v after %s", err, time.Since(start))
	}
}

func TestRevokedSessionClosed(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(nil)
		n := e.join(g, "gpu-20", "")
		bystander := e.join(g, "gpu-21", "")
		s := e.connect(g, n)
		sb := e.connect(g, bystander)
		nd, _ := e.st.NodeGet(ctx, n.id)
		start := time.Now()
		if err := e.st.RevocationInsert(ctx, &store.Revocation{Serial: nd.CertSerial, NodeID: n.id, Reason: "stolen"}); err != nil {
			t.Fatal(err)
		}
		msgs, _ := awaitEnd(t, s, 5*time.Second)
		if len(msgs) != 1 || !strings.Contains(msgs[0].GetRevoked().GetReason(), "stolen") {
			t.Fatalf("messages before the end: %v, want Revoked", msgs)
		}
		t.Logf("revoked session closed after %s", time.Since(start))
		// It cannot come back; the bystander stays.
		_, err := e.tryConnect(g, &n.cert)
		wantCode(t, err, codes.PermissionDenied)
		if err := sb.stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Heartbeat{Heartbeat: &sessionv1.Heartbeat{}}}); err != nil {
			t.Fatal(err)
		}
		e.eventually(t, 30*time.Second, "revoked session row removed", func() bool {
			_, err := e.st.SessionGet(ctx, n.id)
			return errors.Is(err, store.ErrNotFound)
		})
		if g.Sessions() != 1 {
			t.Fatalf("sessions = %d, want the bystander's", g.Sessions())
		}
	})
}

func TestSupersede(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		cs := &countingStore{Store: b.open(t)}
		e := newEnv(t, cs)
		g := e.start(nil)
		n := e.join(g, "gpu-30", "")
		old := e.connect(g, n)
		start := time.Now()
		newer := e.connect(g, n)
		msgs, err := awaitEnd(t, old, 10*time.Second)
		if err == nil {
			t.Fatal("superseded stream ended without error")
		}
		if len(msgs) != 1 || msgs[0].GetSuperseded().GetBySessionId() != newer.welcome.SessionId {
			t.Fatalf("superseded stream got %v before it ended, want Superseded naming %s", msgs, newer.welcome.SessionId)
		}
		t.Logf("superseded session closed after %s", time.Since(start))
		row, err := e.st.SessionGet(ctx, n.id)
		if err != nil || row.SessionID != newer.welcome.SessionId || row.Epoch != 2 {
			t.Fatalf("session row = %+v, %v", row, err)
		}
		if err := newer.stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Heartbeat{Heartbeat: &sessionv1.Heartbeat{}}}); err != nil {
			t.Fatal(err)
		}
		// The old session's delayed row removal, once a flush has committed
		// it, leaves the newer row.
		e.eventually(t, 30*time.Second, "the old session's close flushed", func() bool { return cs.sessionCloses.Load() >= 1 })
		if row, err := e.st.SessionGet(ctx, n.id); err != nil || row.SessionID != newer.welcome.SessionId {
			t.Fatalf("after flush: session row = %+v, %v", row, err)
		}
		if g.Sessions() != 1 {
			t.Fatalf("sessions = %d", g.Sessions())
		}
	})
}

func TestSupersededOnAnotherGateway(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		e := newEnv(t, b.open(t))
		g1 := e.start(nil)
		g2 := e.start(nil)
		n := e.join(g1, "gpu-31", "")
		if got := n.resp.Gateways; len(got) != 2 || got[0] != g1.PublicURL() || got[1] != g2.PublicURL() {
			t.Fatalf("gateways = %v, want %s then %s", got, g1.PublicURL(), g2.PublicURL())
		}
		old := e.connect(g1, n)
		start := time.Now()
		e.connect(g2, n)
		msgs, err := awaitEnd(t, old, 15*time.Second)
		if err == nil {
			t.Fatal("stream ended without error")
		}
		if len(msgs) != 1 || msgs[0].GetSuperseded() == nil {
			t.Fatalf("superseded stream got %v before it ended, want Superseded", msgs)
		}
		t.Logf("session superseded on the other gateway closed after %s", time.Since(start))
		e.eventually(t, 30*time.Second, "sessions counted", func() bool { return g1.Sessions() == 0 && g2.Sessions() == 1 })
	})
}

func TestMaxStreams(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		e := newEnv(t, b.open(t))
		g := e.start(func(c *Config) { c.MaxStreams = 1; c.RetryAfter = 2 * time.Second })
		a := e.join(g, "gpu-40", "")
		bn := e.join(g, "gpu-41", "")
		e.connect(g, a)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stream, err := sessionv1.NewSessionServiceClient(e.dial(g, &bn.cert)).Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Hello{Hello: &sessionv1.Hello{}}})
		_, err = stream.Recv()
		st := wantCode(t, err, codes.ResourceExhausted)
		ms, perr := strconv.Atoi(firstValue(stream.Trailer(), TrailerRetryAfter))
		if perr != nil || ms < 2000 || ms > 4000 {
			t.Fatalf("retry-after-ms trailer = %v", stream.Trailer())
		}
		var hint *errdetails.RetryInfo
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				hint = ri
			}
		}
		if hint == nil || hint.RetryDelay.AsDuration().Milliseconds() != int64(ms) {
			t.Fatalf("status details = %v, want RetryInfo of %d ms", st.Details(), ms)
		}
	})
}

func firstValue(md metadata.MD, key string) string {
	if v := md.Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func TestHeartbeatsBatched(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		cs := &countingStore{Store: b.open(t)}
		e := newEnv(t, cs)
		g := e.start(nil)
		var sessions []*clientSession
		var nodes []*node
		for i := range 5 {
			n := e.join(g, "gpu-5"+strconv.Itoa(i), "")
			nodes = append(nodes, n)
			sessions = append(sessions, e.connect(g, n))
		}
		before, _ := e.st.SessionGet(ctx, nodes[0].id)
		writes0, ids0 := cs.heartbeatWrites.Load(), cs.heartbeatIDs.Load()
		start := time.Now()
		beats := 0
		for time.Since(start) < 6*testFlushInterval {
			for _, s := range sessions {
				if err := s.stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Heartbeat{Heartbeat: &sessionv1.Heartbeat{}}}); err != nil {
					t.Fatal(err)
				}
				beats++
			}
			// The senders' pace: a round each time one of the
			// gateway's loops finished a pass (several a second).
			if err := e.clock.Next(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		// One more round after the count is read: the flush that writes it
		// commits after the read, whenever the earlier ones did.
		sent := cs.heartbeatWrites.Load()
		for _, s := range sessions {
			if err := s.stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Heartbeat{Heartbeat: &sessionv1.Heartbeat{}}}); err != nil {
				t.Fatal(err)
			}
			beats++
		}
		e.eventually(t, 30*time.Second, "a flush after the last heartbeats", func() bool { return cs.heartbeatWrites.Load() > sent })
		elapsed := time.Since(start)
		writes, ids := cs.heartbeatWrites.Load()-writes0, cs.heartbeatIDs.Load()-ids0
		t.Logf("%d heartbeats in %s: %d writes carrying %d session ids", beats, elapsed, writes, ids)
		if max := int64(elapsed/testFlushInterval) + 1; writes > max || writes < 2 {
			t.Fatalf("%d heartbeat writes in %s, want 2 to %d (one per flush interval, %s)", writes, elapsed, max, testFlushInterval)
		}
		if ids > writes*5 {
			t.Fatalf("%d session ids in %d writes: more than one per session per write", ids, writes)
		}
		after, _ := e.st.SessionGet(ctx, nodes[0].id)
		if !after.LastHeartbeatAt.After(before.LastHeartbeatAt) {
			t.Fatalf("last heartbeat %v not after %v", after.LastHeartbeatAt, before.LastHeartbeatAt)
		}
		if nd, _ := e.st.NodeGet(ctx, nodes[0].id); nd.LastSeenAt == nil || nd.LastSeenAt.Before(after.LastHeartbeatAt) {
			t.Fatalf("node last seen %v", nd.LastSeenAt)
		}
	})
}

// TestWelcomeAndDrainListGateways: Welcome lists the region's live
// gateways, this one first, so a node learns gateways added after it
// joined; a shutting-down gateway's Drain names the others to prefer.
func TestWelcomeAndDrainListGateways(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		e := newEnv(t, b.open(t))
		a := e.start(func(c *Config) {
			c.ID = "gw-a"
			c.DrainDelay = 300 * time.Millisecond
			c.ShutdownGrace = 300 * time.Millisecond
		})
		n := e.join(a, "gpu-61", "")
		bgw := e.start(func(c *Config) { c.ID = "gw-b" })
		var s *clientSession
		deadline := time.Now().Add(20 * time.Second)
		for {
			s = e.connect(a, n)
			if slices.Equal(s.welcome.GetGateways(), []string{a.PublicURL(), bgw.PublicURL()}) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Welcome lists %v, want [%s %s]", s.welcome.GetGateways(), a.PublicURL(), bgw.PublicURL())
			}
			s.cancel()
		}
		go a.cancel()
		msgs, err := awaitEnd(t, s, 10*time.Second)
		if len(msgs) != 1 || !slices.Equal(msgs[0].GetDrain().GetPreferGateways(), []string{bgw.PublicURL()}) {
			t.Fatalf("before the end: %v (%v), want a Drain preferring %s", msgs, err, bgw.PublicURL())
		}
	})
}

func TestShutdownDrains(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(func(c *Config) { c.DrainDelay = 30 * time.Second; c.ShutdownGrace = time.Second })
		n := e.join(g, "gpu-60", "")
		s := e.connect(g, n)
		go g.cancel()
		msgs, err := awaitEnd(t, s, 10*time.Second)
		if len(msgs) != 1 || msgs[0].GetDrain() == nil || msgs[0].GetDrain().Delay.AsDuration() > 30*time.Second {
			t.Fatalf("messages before the end: %v (%v), want one Drain", msgs, err)
		}
		g.stop(t)
		if rows, _ := e.st.SessionList(ctx, ""); len(rows) != 0 {
			t.Fatalf("session rows left: %+v", rows)
		}
		if _, err := e.st.GatewayGet(ctx, g.ID()); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("gateway row after shutdown: %v", err)
		}
		if l, err := e.st.LeaseGet(ctx, LeaseName(g.ID())); err != nil || l.Holder != "" {
			t.Fatalf("lease after shutdown = %+v, %v; want released", l, err)
		}
	})
}

func TestTLS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backends[0].open(t))
	g := e.start(func(c *Config) {
		c.CertReloadInterval = 100 * time.Millisecond
		c.HandshakeRate = 10
		c.HandshakeBurst = 1
	})
	handshake := func(cfg *tls.Config) (*tls.ConnectionState, error) {
		cfg.NextProtos = []string{"h2"}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", g.Addr().String(), cfg)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		st := c.ConnectionState()
		return &st, nil
	}
	old := e.clientTLS(nil)
	old.MinVersion, old.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	if _, err := handshake(old); err == nil {
		t.Fatal("a TLS 1.2 handshake succeeded")
	}

	// Handshakes are admitted at the configured rate.
	start := time.Now()
	for range 6 {
		if _, err := handshake(e.clientTLS(nil)); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("6 handshakes at 10/s with burst 1 took %s", d)
	}

	// A new certificate in the files is served to new handshakes.
	first, err := handshake(e.clientTLS(nil))
	if err != nil {
		t.Fatal(err)
	}
	certPath := filepath.Join(e.dir, bootstrap.GatewayCertFile)
	if _, _, err := bootstrap.WriteGatewayCert(e.bundle, e.dir, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(certPath); err != nil {
		t.Fatal(err)
	}
	e.eventually(t, 30*time.Second, "new certificate served", func() bool {
		st, err := handshake(e.clientTLS(nil))
		return err == nil && st.PeerCertificates[0].SerialNumber.Cmp(first.PeerCertificates[0].SerialNumber) != 0
	})
}

func TestDrainingRefusesNewSessions(t *testing.T) {
	t.Parallel()
	e := newEnv(t, backends[0].open(t))
	g := e.start(nil)
	n := e.join(g, "gpu-70", "")
	g.draining.Store(true)
	_, err := e.tryConnect(g, &n.cert)
	wantCode(t, err, codes.Unavailable)
}

// TestInventoryStoredOnlyWhenChanged: a daemon sends its inventory on every
// connect; after a reconnect the same digest writes nothing, a new one is
// stored.
func TestInventoryStoredOnlyWhenChanged(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		cs := &countingStore{Store: b.open(t)}
		e := newEnv(t, cs)
		g := e.start(nil)
		n := e.join(g, "gpu-11", "")
		inventory := func(s *clientSession, digest, gpu string) {
			t.Helper()
			if err := s.stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Inventory{Inventory: &sessionv1.Inventory{
				Digest: digest, Gpus: []*sessionv1.GPU{{Name: gpu}},
			}}}); err != nil {
				t.Fatal(err)
			}
		}
		stored := func(digest, gpu string) bool {
			nd, _ := e.st.NodeGet(ctx, n.id)
			return nd.InventoryDigest == digest && strings.Contains(string(nd.Inventory), gpu)
		}
		inventory(e.connect(g, n), "d1", "A100")
		// Counted once its transaction has committed, just after it shows.
		writes := func(n int64) bool { return cs.inventoryWrites.Load() >= n }
		e.eventually(t, 30*time.Second, "the first inventory stored", func() bool { return stored("d1", "A100") && writes(1) })
		if w := cs.inventoryWrites.Load(); w != 1 {
			t.Fatalf("%d inventory writes for the first inventory, want 1", w)
		}

		// The same digest from a new session is not written again (the
		// document differs only to show it). An event sent after it on the
		// same stream, once stored, shows it was handled; another node's
		// inventory sent after that, once stored, shows the batch it would
		// have been in was written.
		s := e.connect(g, n)
		inventory(s, "d1", "H100")
		if err := s.stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Event{Event: &sessionv1.Event{
			Kind: "gpu.xid", Xid: 79, Severity: sessionv1.Severity_SEVERITY_CRITICAL, Message: "after the inventory",
		}}}); err != nil {
			t.Fatal(err)
		}
		e.eventually(t, 30*time.Second, "the event after the inventory stored", func() bool {
			evs, _ := e.st.EventList(ctx, &store.EventListParams{NodeID: n.id})
			return len(evs) == 1
		})
		other := e.join(g, "gpu-14", "")
		inventory(e.connect(g, other), "d9", "L40S")
		e.eventually(t, 30*time.Second, "the other node's inventory stored", func() bool {
			nd, _ := e.st.NodeGet(ctx, other.id)
			return nd.InventoryDigest == "d9" && writes(2)
		})
		if w := cs.inventoryWrites.Load(); w != 2 || !stored("d1", "A100") {
			t.Fatalf("%d inventory writes, want 2 (the first, the other node's): an inventory with the stored digest was written again", w)
		}
		inventory(s, "d2", "B200")
		e.eventually(t, 30*time.Second, "the changed inventory stored", func() bool { return stored("d2", "B200") && writes(3) })
		if w := cs.inventoryWrites.Load(); w != 3 {
			t.Fatalf("%d inventory writes, want 3", w)
		}
	})
}

// TestInventoryRefusedHoldsUpNoOther: an inventory the database refuses
// (PostgreSQL's jsonb takes no NUL character) does not keep another node's
// from being stored.
func TestInventoryRefusedHoldsUpNoOther(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(nil)
		bad, good := e.join(g, "gpu-12", ""), e.join(g, "gpu-13", "")
		sb, sg := e.connect(g, bad), e.connect(g, good)
		for _, m := range []struct {
			s   *clientSession
			gpu string
		}{{sb, "A100\x00"}, {sg, "H100"}} {
			if err := m.s.stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Inventory{Inventory: &sessionv1.Inventory{
				Digest: "d-" + m.gpu[:4], Gpus: []*sessionv1.GPU{{Name: m.gpu}},
			}}}); err != nil {
				t.Fatal(err)
			}
		}
		e.eventually(t, 30*time.Second, "the other node's inventory stored", func() bool {
			nd, _ := e.st.NodeGet(ctx, good.id)
			return nd.InventoryDigest == "d-H100" && strings.Contains(string(nd.Inventory), "H100")
		})
	})
}

// TestConnectingBounded: with MaxConnecting 1, a connection in setup holds
// back the next one until it is set up, closed, or HelloTimeout has passed;
// a session that has its Welcome, and a connection that brought no client
// certificate (a Join), hold nothing.
func TestConnectingBounded(t *testing.T) {
	t.Parallel()
	const helloTimeout = 3 * time.Second
	e := newEnv(t, backends[0].open(t))
	joiner := e.start(nil)
	a, b := e.join(joiner, "gpu-60", ""), e.join(joiner, "gpu-61", "")
	g := e.start(func(c *Config) { c.MaxConnecting = 1; c.HelloTimeout = helloTimeout })
	inSetup := func() int { return g.ln.stats().inSetup }

	// A session set up gives its slot back at Welcome.
	e.connect(g, a)
	e.eventually(t, 30*time.Second, "no connection in setup after Welcome", func() bool { return inSetup() == 0 })

	// A join's connection, still open, gives it back at its handshake.
	start := time.Now()
	c := e.join(g, "gpu-62", "")
	e.connect(g, c)
	if d := time.Since(start); d > helloTimeout/2 {
		t.Fatalf("join then connect on one slot took %s: the join's idle connection held the slot", d)
	}

	// A client that connects and says nothing holds the only slot until it
	// closes.
	stalled, err := net.Dial("tcp", g.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	e.eventually(t, 30*time.Second, "the stalled connection accepted", func() bool { return inSetup() == 1 })
	done := make(chan error, 1)
	go func() {
		_, err := e.tryConnect(g, &b.cert)
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("connected beside a connection in setup (err %v)", err)
	case <-deadline(t, 500*time.Millisecond):
	}
	closed := time.Now()
	stalled.Close()
	if err := <-done; err != nil {
		t.Fatalf("connect after the stalled connection closed: %v", err)
	}
	if d := time.Since(closed); d > helloTimeout/2 {
		t.Fatalf("connected %s after the stalled connection closed", d)
	}

	// One that stays silent holds it for HelloTimeout.
	silent, err := net.Dial("tcp", g.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	e.eventually(t, 30*time.Second, "the silent connection accepted", func() bool { return inSetup() == 1 })
	accepted := time.Now()
	d := e.join(joiner, "gpu-63", "")
	if _, err := e.tryConnect(g, &d.cert); err != nil {
		t.Fatalf("connect beside a silent connection: %v", err)
	}
	if took := time.Since(accepted); took < helloTimeout-time.Second || took > helloTimeout+2*time.Second {
		t.Fatalf("connected %s after a silent connection took the only slot; want about %s", took, helloTimeout)
	}
}

// TestLocalRollbackRecorded: a Hello carrying LocalRollback (bcd restored
// its previous release by itself after a crash loop; issue 30) writes one
// node.rolled-back-locally in the session's open; a malformed one writes
// none and still opens the session.
func TestLocalRollbackRecorded(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		e := newEnv(t, b.open(t))
		g := e.start(nil)
		n := e.join(g, "gpu-12", "")
		at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
		for _, r := range []*sessionv1.LocalRollback{
			{FromVersion: "0.2.0", ToVersion: "0.1.0", Reason: "3 starts of 0.2.0 ended in an exit\nwithin 10m0s", Starts: 1 << 30,
				RolledBackAt: timestamppb.New(at)},
			{FromVersion: "bad\x00version", Reason: "x"},
			{ToVersion: "0.1.0"},
		} {
			if _, err := e.connectWith(e.dial(g, &n.cert), &sessionv1.Hello{BcdVersion: "0.1.0", Os: "linux", Arch: "amd64", LocalRollback: r}); err != nil {
				t.Fatalf("connect with %v: %v", r, err)
			}
		}
		entries, err := e.st.OutboxQuery(ctx, &store.OutboxQueryParams{Key: n.id, TopicPrefix: events.NodeRolledBackLocally})
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 {
			t.Fatalf("%d node.rolled-back-locally events, want 1", len(entries))
		}
		env, err := events.Parse(entries[0].Payload)
		if err != nil {
			t.Fatal(err)
		}
		var d events.NodeRolledBackLocallyData
		if err := json.Unmarshal(env.Data, &d); err != nil {
			t.Fatal(err)
		}
		want := events.NodeRolledBackLocallyData{NodeID: n.id, PoolID: d.PoolID, Hostname: "gpu-12", FromVersion: "0.2.0", ToVersion: "0.1.0",
			Reason: "3 starts of 0.2.0 ended in an exit within 10m0s", Starts: maxRollbackStarts, RolledBackAt: at}
		if d != want || d.PoolID == "" {
			t.Fatalf("data %+v, want %+v", d, want)
		}
	})
}
