package gateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// terminatingProxy is a TLS-terminating reverse proxy in front of the
// gateway's plain WebSocket listener, as a site's TLS-inspecting proxy is:
// it has its own certificate, asks for no client certificate (so it can
// pass none on), and counts the upgrades it relayed.
type terminatingProxy struct {
	*httptest.Server
	upgrades  atomic.Int32
	withCerts atomic.Int32 // requests that arrived with a client certificate
}

func startTerminatingProxy(t *testing.T, backend net.Addr) *terminatingProxy {
	t.Helper()
	target := &url.URL{Scheme: "http", Host: backend.String()}
	p := &terminatingProxy{}
	rp := httputil.NewSingleHostReverseProxy(target)
	p.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			p.withCerts.Add(1)
		}
		if r.Header.Get("Upgrade") != "" {
			p.upgrades.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

// wsDial returns a gRPC connection to the gateway through the proxy's
// WebSocket, with the node's TLS (clientTLS, cert when given) inside it.
func (e *env) wsDial(p *terminatingProxy, cert *tls.Certificate) *grpc.ClientConn {
	e.t.Helper()
	wsURL := "wss://" + p.Listener.Addr().String() + WebSocketPath
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		c, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: p.Client()})
		if err != nil {
			return nil, err
		}
		return websocket.NetConn(context.Background(), c, websocket.MessageBinary), nil
	}
	cc, err := grpc.NewClient("passthrough:///gateway", grpc.WithContextDialer(dialer),
		grpc.WithTransportCredentials(credentials.NewTLS(e.clientTLS(cert))))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { cc.Close() })
	return cc
}

// TestWebSocketFallback: behind a proxy that terminates TLS and passes no
// client certificate, a machine joins and holds a session through the
// WebSocket fallback, its identity proved in-band (the TLS inside the
// WebSocket); a certificate presented with a key that is not its own is
// refused, and opens no session.
func TestWebSocketFallback(t *testing.T) {
	e := newEnv(t, sqlitetest.Open(t))
	g := e.start(func(c *Config) { c.WebSocketListen = "127.0.0.1:0" })
	if g.WebSocketAddr() == nil {
		t.Fatal("no WebSocket address with WebSocketListen set")
	}
	proxy := startTerminatingProxy(t, g.WebSocketAddr())

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	key, csr := newKey(t)
	resp, err := sessionv1.NewJoinServiceClient(e.wsDial(proxy, nil)).Join(ctx, &sessionv1.JoinRequest{
		Token: e.token(1, time.Hour).String(), Csr: csr,
		Facts: &sessionv1.NodeFacts{Hostname: "behind-proxy", MachineId: "m-ws", Os: "linux", Arch: "amd64", BcdVersion: "0.1.0"},
	})
	if err != nil {
		t.Fatalf("join through the WebSocket fallback: %v", err)
	}
	cert := tls.Certificate{Certificate: resp.CertificateChain, PrivateKey: key}
	s, err := e.connectOn(e.wsDial(proxy, &cert))
	if err != nil {
		t.Fatalf("session through the WebSocket fallback: %v", err)
	}
	if g.Sessions() != 1 {
		t.Fatalf("gateway holds %d sessions, want 1", g.Sessions())
	}
	if proxy.upgrades.Load() < 2 || proxy.withCerts.Load() != 0 {
		t.Fatalf("the proxy relayed %d upgrades, %d with a client certificate: want 2 or more, none", proxy.upgrades.Load(), proxy.withCerts.Load())
	}
	if sess, err := e.st.SessionGet(ctx, resp.NodeId); err != nil || sess.GatewayID != g.ID() {
		t.Fatalf("session row of %s: %+v %v", resp.NodeId, sess, err)
	}

	// The node's chain with another key: the gateway's TLS checks the
	// signature made with the key against the certificate's.
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	forged := tls.Certificate{Certificate: resp.CertificateChain, PrivateKey: other}
	if _, err := e.connectOn(e.wsDial(proxy, &forged)); err == nil {
		t.Fatal("a session with the node's certificate and another key was opened")
	}
	if g.Sessions() != 1 {
		t.Fatalf("gateway holds %d sessions after the forged attempt, want 1", g.Sessions())
	}
	s.cancel()
}

// FuzzWebSocketHandshake sends arbitrary bytes inside the fallback's
// WebSocket, where the in-band TLS handshake reads them: the gateway must
// neither panic nor open a session, and must still serve a real handshake
// afterwards.
func FuzzWebSocketHandshake(f *testing.F) {
	e := newEnv(f, sqlitetest.Open(f))
	g := e.start(func(c *Config) { c.WebSocketListen = "127.0.0.1:0"; c.HelloTimeout = time.Second })
	wsURL := "ws://" + g.WebSocketAddr().String() + WebSocketPath
	// Seeds: a TLS ClientHello's record header, a truncated record, HTTP
	// instead of TLS, nothing.
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0xc8, 0x01, 0x00, 0x00, 0xc4, 0x03, 0x03})
	f.Add([]byte{0x16, 0x03, 0x03, 0xff, 0xff})
	f.Add([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(ctx, wsURL, nil)
		if err != nil {
			t.Fatalf("WebSocket upgrade: %v", err)
		}
		defer c.CloseNow()
		nc := websocket.NetConn(ctx, c, websocket.MessageBinary)
		_, _ = nc.Write(data)
		// The gateway's TLS answers a ClientHello (or an alert) at once;
		// reading what comes in a moment makes it process the input
		// before the connection closes.
		_ = nc.SetReadDeadline(time.Now().Add(5 * time.Millisecond))
		_, _ = io.Copy(io.Discard, nc)
		if n := g.Sessions(); n != 0 {
			t.Fatalf("%d sessions after %x", n, data)
		}
	})
}
