package tests

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// hostileNode is a node's session held by hand: the test decides when, and
// with which tunnel id, it opens a Tunnel stream.
type hostileNode struct {
	id    string
	cc    *grpc.ClientConn
	msgs  chan *sessionv1.GatewayMessage
	ended chan error // the session stream's end
}

// holdSession joins a node with token and opens its session offering the
// tunnel capability.
func holdSession(t *testing.T, d *deployment, name, token string) *hostileNode {
	t.Helper()
	ctx := context.Background()
	fd, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: name, Session: session.Config{StartJitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fd.Join(ctx, d.gatewayURL, token); err != nil {
		t.Fatal(err)
	}
	id := fd.Identity()
	cert := tls.Certificate{PrivateKey: fd.Key()}
	for _, c := range id.Chain {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13} //nolint:gosec // the gateway's certificate is not what is tested
	cc, err := grpc.NewClient(d.gwAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	sctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	stream, err := sessionv1.NewSessionServiceClient(cc).Connect(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Hello{Hello: &sessionv1.Hello{
		BcdVersion: "0.0.0-e2e", Os: runtime.GOOS, Arch: runtime.GOARCH, BootId: "boot-" + name,
		Capabilities: []string{sessionv1.CapabilityTunnel}}}}); err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetWelcome() == nil {
		t.Fatalf("%s: first answer %v, %v; want Welcome", name, first, err)
	}
	n := &hostileNode{id: id.NodeID, cc: cc, msgs: make(chan *sessionv1.GatewayMessage, 64), ended: make(chan error, 1)}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				n.ended <- err
				return
			}
			select {
			case n.msgs <- m:
			default:
			}
		}
	}()
	return n
}

// tunnelOpen waits for the gateway's TunnelOpen on n's session.
func (n *hostileNode) tunnelOpen(t *testing.T) string {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case m := <-n.msgs:
			if o := m.GetTunnelOpen(); o != nil {
				return o.GetTunnelId()
			}
		case err := <-n.ended:
			t.Fatalf("node %s's session ended waiting for TunnelOpen: %v", n.id, err)
		case <-deadline:
			t.Fatalf("node %s got no TunnelOpen", n.id)
		}
	}
}

// presentTunnel opens a Tunnel stream on n's connection naming id, and
// returns the stream and the gateway's refusal, if it refuses within 5 s.
func (n *hostileNode) presentTunnel(t *testing.T, id string) (sessionv1.SessionService_TunnelClient, error) {
	t.Helper()
	st, err := sessionv1.NewSessionServiceClient(n.cc).Tunnel(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&sessionv1.TunnelFrame{TunnelId: id}); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := st.Recv()
		got <- err
	}()
	select {
	case err := <-got:
		return st, err
	case <-time.After(5 * time.Second):
		return st, nil
	}
}

// TestTunnelIDCollision (issue 28): node B names the id of a tunnel that
// waits for node A. The gateway refuses B's stream (PermissionDenied) and
// the tunnel keeps waiting for A, which then opens it; a second tunnel of
// A, named by B and never opened by A, times out for its opener. The
// process keeps running and both sessions stay up. (Before, B's stream
// ended A's tunnel, and the opener's timeout closed a closed channel: the
// process panicked and every session dropped.)
func TestTunnelIDCollision(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, backendSQLite)
	file, _ := d.joinToken(2, time.Hour)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(b))
	a := holdSession(t, d, "collide-a", token)
	bn := holdSession(t, d, "collide-b", token)
	admin := &client.Client{BaseURL: d.api + "/api", Token: d.adminToken}

	open := func() chan error {
		done := make(chan error, 1)
		go func() {
			tun, err := admin.OpenTunnel(context.Background(), &apiv1.CreateTunnelRequest{Node: a.id, Kind: tunnel.KindPort, Port: 22}, nil)
			if err == nil {
				tun.Close()
			}
			done <- err
		}()
		return done
	}

	// 1. B names A's waiting tunnel: refused; A opens it after all.
	first := open()
	id := a.tunnelOpen(t)
	if _, err := bn.presentTunnel(t, id); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("node B naming node A's tunnel %s: %v, want PermissionDenied", id, err)
	}
	// The opener closes the tunnel once it is open: the stream ends (EOF).
	stA, err := a.presentTunnel(t, id)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("node A opening its own tunnel %s after B named it: %v", id, err)
	}
	select {
	case err := <-first:
		if err != nil {
			t.Fatalf("the opener of tunnel %s: %v", id, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the opener of A's tunnel never returned")
	}
	_ = stA.CloseSend()

	// 2. B names A's second tunnel, which A never opens: the opener
	// times out (tunnel.OpenTimeout), and nothing else happens.
	second := open()
	id2 := a.tunnelOpen(t)
	if _, err := bn.presentTunnel(t, id2); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("node B naming node A's tunnel %s: %v, want PermissionDenied", id2, err)
	}
	select {
	case err := <-second:
		if err == nil {
			t.Fatal("the opener of a tunnel A never opened succeeded")
		}
		t.Logf("the opener of tunnel %s: %v", id2, err)
	case <-time.After(tunnel.OpenTimeout + 30*time.Second):
		t.Fatal("the opener of A's second tunnel never returned")
	}

	// The process runs, and both sessions are up: the API lists both
	// nodes on a gateway, their streams have not ended, serve has not
	// exited.
	nodes := d.nodes()
	for _, n := range []*hostileNode{a, bn} {
		if nodes[n.id].GatewayID == "" {
			t.Fatalf("node %s holds no session: %+v", n.id, nodes[n.id])
		}
		select {
		case err := <-n.ended:
			t.Fatalf("node %s's session ended: %v", n.id, err)
		default:
		}
	}
	select {
	case <-d.serve.Done():
		t.Fatalf("serve exited:\n%s", d.serve.Output())
	default:
	}
}
