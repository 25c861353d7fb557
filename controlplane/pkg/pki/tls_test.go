package pki

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/better-compute/better-compute/proto/jointoken"
)

// TestMutualTLS runs the handshake a daemon and a gateway make: the daemon
// trusts the gateway only through the pin in its join token, the gateway
// authenticates the daemon with a NodeVerifier built from roots alone.
func TestMutualTLS(t *testing.T) {
	t.Parallel()
	b := newTestBundle(t, "compute.example.com")
	other := newTestBundle(t, "compute.example.com")

	gatewayPEM, gatewayKey, err := b.issueGateway(testNow, []string{"gw.example.com"}, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	serving, err := tls.X509KeyPair(gatewayPEM, gatewayKey)
	if err != nil {
		t.Fatal(err)
	}
	nodeCert := func(b *Bundle) tls.Certificate {
		key := newP256(t)
		issued, err := b.IssueNode(newCSR(t, key, nil), "node-1", IssueOptions{Now: testNow})
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{issued.CertDER}, PrivateKey: key}
	}
	tok, err := jointoken.New(b.GatewayPin(), nil)
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := NewNodeVerifier(b.NodeCARoots(), b.TrustDomain)
	if err != nil {
		t.Fatal(err)
	}

	clock := func() time.Time { return testNow }
	server := func(seen *string) *tls.Config {
		return &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Time:         clock,
			Certificates: []tls.Certificate{serving},
			ClientAuth:   tls.RequireAnyClientCert,
			VerifyConnection: func(cs tls.ConnectionState) error {
				nodeID, _, err := verifier.Verify(cs.PeerCertificates, testNow)
				*seen = nodeID
				return err
			},
		}
	}
	client := func(pin string, cert tls.Certificate) *tls.Config {
		return &tls.Config{
			MinVersion:         tls.VersionTLS13,
			Time:               clock,
			ServerName:         "gw.example.com",
			Certificates:       []tls.Certificate{cert},
			InsecureSkipVerify: true, // replaced by the pin check
			VerifyConnection: func(cs tls.ConnectionState) error {
				return jointoken.VerifyChain(pin, cs.PeerCertificates, cs.ServerName, testNow)
			},
		}
	}

	var seen string
	if cerr, serr := handshake(t, client(tok.Pin(), nodeCert(b)), server(&seen)); cerr != nil || serr != nil {
		t.Fatalf("handshake: client %v, server %v", cerr, serr)
	}
	if seen != "node-1" {
		t.Fatalf("gateway saw node %q, want node-1", seen)
	}

	// A node certificate from another deployment is refused by the gateway.
	if _, serr := handshake(t, client(tok.Pin(), nodeCert(other)), server(&seen)); !errors.Is(serr, ErrUntrusted) {
		t.Fatalf("foreign node certificate: server error = %v, want ErrUntrusted", serr)
	}
	// A token pinning another deployment's gateway CA refuses this gateway.
	if cerr, _ := handshake(t, client(other.GatewayPin(), nodeCert(b)), server(&seen)); !errors.Is(cerr, jointoken.ErrPinMismatch) {
		t.Fatalf("other pin: client error = %v, want ErrPinMismatch", cerr)
	}
}

// handshake runs a TLS handshake between the two configurations over an
// in-memory pipe. After it the server sends two bytes and the client reads
// them, so that an alert the server sends after the client's handshake
// finished (TLS 1.3 checks client certificates last) reaches the client.
func handshake(t *testing.T, clientCfg, serverCfg *tls.Config) (clientErr, serverErr error) {
	t.Helper()
	c, s := net.Pipe()
	deadline := time.Now().Add(10 * time.Second)
	if err := c.SetDeadline(deadline); err != nil {
		t.Fatal(err)
	}
	if err := s.SetDeadline(deadline); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		srv := tls.Server(s, serverCfg)
		err := srv.Handshake()
		if err == nil {
			_, err = srv.Write([]byte("ok"))
		}
		_ = s.Close()
		done <- err
	}()
	cli := tls.Client(c, clientCfg)
	clientErr = cli.Handshake()
	if clientErr == nil {
		_, clientErr = io.ReadFull(cli, make([]byte, 2))
	}
	_ = c.Close()
	return clientErr, <-done
}
