package tests

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestWebSocketFallbackBehindTerminatingProxy: a site whose proxy
// terminates TLS and passes no client certificate. A real bcd joins
// through the gateway's WebSocket fallback behind such a proxy (a Go
// reverse proxy with its own certificate, trusted by the machine through
// SSL_CERT_FILE), holds its session there, runs a command, and keeps to
// the fallback: its identity lists the wss URL only, though Welcome lists
// the gateway's direct URL, which this machine could reach.
func TestWebSocketFallbackBehindTerminatingProxy(t *testing.T) {
	t.Parallel()
	wsPort := freePort(t)
	proxyLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var upgrades, withCerts atomic.Int32
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", wsPort)})
	proxy := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			withCerts.Add(1)
		}
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			upgrades.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	proxy.Listener = proxyLn
	proxy.StartTLS()
	t.Cleanup(proxy.Close)
	caFile := filepath.Join(t.TempDir(), "proxy-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: proxy.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	wsURL := "wss://" + proxyLn.Addr().String() + "/v1/session"

	d := newDeploymentWith(t, backendSQLite, deploymentConfig{gateway: fmt.Sprintf(
		"    ws:\n      publicURL: %s\n      listen: 127.0.0.1:%d\n      tls: \"off\"\n", wsURL, wsPort)})
	tokenFile, _ := d.joinToken(1, time.Hour)
	m := newMachine(t, "behind-proxy")
	env := []string{"SSL_CERT_FILE=" + caFile}
	bin, args := m.argv("join", "--gateway", wsURL, "--token-file", tokenFile, "--data-dir", m.dataDir)
	code, stdout, stderr := testenv.Run(t, env, "", bin, args...)
	if code != 0 {
		t.Fatalf("bcd join through the WebSocket fallback: exit %d\n%s%s", code, stdout, stderr)
	}
	match := regexp.MustCompile(`Joined as node (\S+) `).FindStringSubmatch(stdout)
	if match == nil {
		t.Fatalf("bcd join printed no node id: %q", stdout)
	}
	nodeID := match[1]
	bin, args = m.argv("node", "--data-dir", m.dataDir)
	node := testenv.Start(t, env, bin, args...)
	node.WaitLine(sessionEstablished.String(), 60*time.Second)
	eventually(t, 30*time.Second, func() bool { return d.nodes()[nodeID].State == "ready" },
		func() string { return fmt.Sprintf("node %s is %+v", nodeID, d.nodes()[nodeID]) })

	code, stdout, stderr = testenv.Run(t, d.env, "", d.bc, d.viaAPI("--config", d.cfgFile, "commands", "run", "--node", nodeID, "--", "echo", "through the proxy")...)
	if code != 0 || !strings.Contains(stdout, nodeID+": through the proxy") {
		t.Fatalf("commands run through the fallback: exit %d\n%s%s", code, stdout, stderr)
	}
	if upgrades.Load() < 2 || withCerts.Load() != 0 {
		t.Fatalf("the proxy relayed %d WebSocket upgrades (join, session), %d requests with a client certificate: want 2 or more, none",
			upgrades.Load(), withCerts.Load())
	}

	b, err := os.ReadFile(filepath.Join(m.dataDir, "identity.json"))
	if err != nil {
		t.Fatal(err)
	}
	var id struct {
		Gateways      []string `json:"gateways"`
		KnownGateways []struct {
			URL string `json:"url"`
		} `json:"known_gateways"`
	}
	if err := json.Unmarshal(b, &id); err != nil {
		t.Fatal(err)
	}
	if len(id.Gateways) != 1 || id.Gateways[0] != wsURL {
		t.Fatalf("identity gateways = %v, want only %s", id.Gateways, wsURL)
	}
	for _, k := range id.KnownGateways {
		if !strings.HasPrefix(k.URL, "wss://") {
			t.Fatalf("identity keeps a direct gateway %s: the fallback must never be left by bcd's own choice", k.URL)
		}
	}

	// The node's certificate chain with a key that is not its own, through
	// the same proxy: the in-band handshake refuses it.
	chain := readChain(t, filepath.Join(m.dataDir, "node.crt"))
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		c, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: proxy.Client()})
		if err != nil {
			return nil, err
		}
		return websocket.NetConn(context.Background(), c, websocket.MessageBinary), nil
	}
	// The gateway's certificate is not what is tested here: the
	// gateway's refusal of the forged client is.
	inner := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13, //nolint:gosec // see above
		Certificates: []tls.Certificate{{Certificate: chain, PrivateKey: other}}}
	cc, err := grpc.NewClient("passthrough:///gateway", grpc.WithContextDialer(dialer), grpc.WithTransportCredentials(credentials.NewTLS(inner)))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	before := upgrades.Load()
	stream, err := sessionv1.NewSessionServiceClient(cc).Connect(ctx)
	if err == nil {
		_ = stream.Send(&sessionv1.NodeMessage{Body: &sessionv1.NodeMessage_Hello{Hello: &sessionv1.Hello{BcdVersion: "0.0.0-e2e"}}})
		_, err = stream.Recv()
	}
	if err == nil {
		t.Fatal("the node's certificate with another key opened a session through the fallback")
	}
	if upgrades.Load() == before {
		t.Fatalf("the forged attempt never reached the proxy: %v", err)
	}
	d.serve.WaitLine(`invalid signature by the client certificate`, 15*time.Second)
}

// readChain reads the PEM certificates of path, leaf first, as DER.
func readChain(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var chain [][]byte
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			break
		}
		chain = append(chain, blk.Bytes)
	}
	if len(chain) == 0 {
		t.Fatalf("%s holds no certificate", path)
	}
	return chain
}
