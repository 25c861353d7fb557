package gateway

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/controlplane/internal/clocktest"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	"github.com/better-compute/better-compute/proto/jointoken"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

const testTrustDomain = "test.better-compute.local"

// testSecret is a deployment secret for the tests.
const testSecret = "gateway-test-secret-gateway-test-secret"

// backend opens a fresh, migrated store of one kind for a test.
type backend struct {
	name string
	open func(t testing.TB) store.Store
}

var backends = []backend{
	{"sqlite", sqlitetest.Open},
	{"postgres", func(t testing.TB) store.Store {
		ctx := context.Background()
		s, err := postgres.Open(ctx, pgtest.URL(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if _, err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		return s
	}},
}

// forBackends runs fn against each backend, in parallel.
func forBackends(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			fn(t, b)
		})
	}
}

// testLog routes logs through t.
func testLog(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// env is a deployment for one test: a store, a bundle, a site and a pool.
type env struct {
	t      testing.TB
	st     store.Store
	bundle *pki.Bundle
	site   *store.Site
	pool   *store.Pool
	dir    string
	// clock is the gateways' clock: the system clock, watched, so that
	// eventually wakes each time one of their loops finished a pass.
	clock *clocktest.Real
}

func newEnv(t testing.TB, st store.Store) *env {
	t.Helper()
	ctx := context.Background()
	b, err := pki.Init(pki.InitOptions{TrustDomain: testTrustDomain})
	if err != nil {
		t.Fatal(err)
	}
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "ams-1", Region: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "gpu", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, _, err := bootstrap.WriteGatewayCert(b, dir, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, 0); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, st: st, bundle: b, site: site, pool: pool, dir: dir, clock: clocktest.NewReal()}
}

// running is a gateway running in the test.
type running struct {
	*Gateway
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // Run's error, once done
}

// stop cancels the gateway and waits for Run to return.
func (r *running) stop(t testing.TB) {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
		if r.err != nil {
			t.Errorf("gateway Run: %v", r.err)
		}
	case <-deadline(t, 20*time.Second):
		t.Fatal("gateway did not stop")
	}
}

// testFlushInterval is the tests' gateways' FlushInterval (the default
// is 1 s).
const testFlushInterval = 200 * time.Millisecond

// start runs a gateway on 127.0.0.1:0 in region eu-1 with test-friendly
// timings; mod adjusts the configuration.
func (e *env) start(mod func(*Config)) *running {
	e.t.Helper()
	cfg := Config{
		Listen:        "127.0.0.1:0",
		Region:        "eu-1",
		CertFile:      filepath.Join(e.dir, bootstrap.GatewayCertFile),
		KeyFile:       filepath.Join(e.dir, bootstrap.GatewayKeyFile),
		ShutdownGrace: 300 * time.Millisecond,
		DrainDelay:    time.Second,
		Secret:        testSecret,
		Clock:         e.clock,
		// Compressed loops: what a test waits for (a flush, a read-back
		// of superseded sessions, a revocation) comes in a fifth of the
		// defaults' time. A test of a loop's own pace sets its interval.
		FlushInterval:          testFlushInterval,
		RevocationPollInterval: 200 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	g, err := New(cfg, e.st, e.bundle, testLog(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{Gateway: g, cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = g.Run(ctx)
		close(r.done)
	}()
	select {
	case <-g.Ready():
	case <-r.done:
		e.t.Fatalf("gateway did not start: %v", r.err)
	case <-deadline(e.t, 20*time.Second):
		e.t.Fatal("gateway not ready")
	}
	e.t.Cleanup(func() { r.stop(e.t) })
	return r
}

// token makes a join token for the env's pool.
func (e *env) token(maxUses int, ttl time.Duration) jointoken.Token {
	e.t.Helper()
	tok, err := jointoken.New(e.bundle.GatewayPin(), nil)
	if err != nil {
		e.t.Fatal(err)
	}
	_, err = e.st.JoinTokenCreate(context.Background(), &store.JoinTokenCreateParams{
		ID: tok.ID(), SecretHash: tok.SecretHash(), PoolID: e.pool.ID, MaxUses: maxUses, ExpiresAt: time.Now().Add(ttl),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

// clientTLS trusts the env's gateway CA and presents cert when given.
func (e *env) clientTLS(cert *tls.Certificate) *tls.Config {
	roots := x509.NewCertPool()
	roots.AddCert(e.bundle.GatewayCA.Cert)
	c := &tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS13}
	if cert != nil {
		c.Certificates = []tls.Certificate{*cert}
	}
	return c
}

// dial opens a client connection to g, with cert as client certificate
// when given.
func (e *env) dial(g *running, cert *tls.Certificate) *grpc.ClientConn {
	e.t.Helper()
	cc, err := grpc.NewClient(g.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(e.clientTLS(cert))))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { cc.Close() })
	return cc
}

// newKey makes a P-256 key and a CSR for it.
func newKey(t testing.TB) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "ignored"}, DNSNames: []string{"ignored.example"},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return key, csr
}

// node is a joined machine.
type node struct {
	id   string
	key  *ecdsa.PrivateKey
	resp *sessionv1.JoinResponse
	cert tls.Certificate
}

// join joins a machine through g with a fresh key and a one-use token.
func (e *env) join(g *running, hostname, machineID string) *node {
	e.t.Helper()
	return e.joinWith(g, e.token(1, time.Hour), hostname, machineID)
}

func (e *env) joinWith(g *running, tok jointoken.Token, hostname, machineID string) *node {
	e.t.Helper()
	key, csr := newKey(e.t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := sessionv1.NewJoinServiceClient(e.dial(g, nil)).Join(ctx, &sessionv1.JoinRequest{
		Token: tok.String(), Csr: csr,
		Facts: &sessionv1.NodeFacts{Hostname: hostname, MachineId: machineID, Os: "linux", Arch: "amd64", BcdVersion: "0.1.0",
			Labels: map[string]string{"rack": "r1"}},
	})
	if err != nil {
		e.t.Fatalf("join %s: %v", hostname, err)
	}
	return &node{id: resp.NodeId, key: key, resp: resp, cert: tls.Certificate{Certificate: resp.CertificateChain, PrivateKey: key}}
}

// clientSession is a client side of Connect.
type clientSession struct {
	stream  sessionv1.SessionService_ConnectClient
	welcome *sessionv1.Welcome
	cancel  context.CancelFunc
}

// connect opens a session for n on a new connection and reads Welcome.
func (e *env) connect(g *running, n *node) *clientSession {
	e.t.Helper()
	s, err := e.tryConnect(g, &n.cert)
	if err != nil {
		e.t.Fatalf("connect %s: %v", n.id, err)
	}
	return s
}

// tryConnect opens a session with cert on a new connection.
func (e *env) tryConnect(g *running, cert *tls.Certificate) (*clientSession, error) {
	e.t.Helper()
	return e.connectOn(e.dial(g, cert))
}

func (e *env) connectOn(cc *grpc.ClientConn) (*clientSession, error) {
	return e.connectWith(cc, &sessionv1.Hello{
		BcdVersion: "0.1.1", Os: "linux", Arch: "amd64", Capabilities: []string{"exec", "future.thing", "inventory.v1", "exec"},
	})
}

// connectWith opens a session on cc with hello as its first message.
func (e *env) connectWith(cc *grpc.ClientConn, hello *sessionv1.Hello) (*clientSession, error) {
	ctx, cancel := context.WithCancel(context.Background())
	e.t.Cleanup(cancel)
	stream, err := sessionv1.NewSessionServiceClient(cc).Connect(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	err = stream.Send(&sessionv1.NodeMessage{Seq: 1, Body: &sessionv1.NodeMessage_Hello{Hello: hello}})
	if errors.Is(err, io.EOF) {
		// The server ended the stream already; Recv says why.
		_, err = stream.Recv()
	}
	if err != nil {
		cancel()
		return nil, err
	}
	m, err := stream.Recv()
	if err != nil {
		cancel()
		return nil, err
	}
	if m.GetWelcome() == nil {
		cancel()
		return nil, errors.New("first message is not Welcome")
	}
	return &clientSession{stream: stream, welcome: m.GetWelcome(), cancel: cancel}, nil
}

// awaitEnd reads until the stream ends and returns the messages read and
// the final error; it fails the test after within.
func awaitEnd(t *testing.T, s *clientSession, within time.Duration) ([]*sessionv1.GatewayMessage, error) {
	t.Helper()
	type result struct {
		msgs []*sessionv1.GatewayMessage
		err  error
	}
	done := make(chan result, 1)
	go func() {
		var msgs []*sessionv1.GatewayMessage
		for {
			m, err := s.stream.Recv()
			if err != nil {
				done <- result{msgs, err}
				return
			}
			msgs = append(msgs, m)
		}
	}()
	select {
	case r := <-done:
		return r.msgs, r.err
	case <-deadline(t, within):
		s.cancel()
		t.Fatalf("session still open after %s", within)
		return nil, nil
	}
}

// wantCode fails unless err is a status with code c.
func wantCode(t *testing.T, err error, c codes.Code) *status.Status {
	t.Helper()
	st, _ := status.FromError(err)
	if err == nil || st.Code() != c {
		t.Fatalf("error = %v, want code %s", err, c)
	}
	return st
}

// eventually waits until cond holds, checking it each time one of the
// env's gateways finished a pass of a loop (its flush, dispatch, lease or
// revocation loop begins its next wait), and fails the test once within
// has passed.
func (e *env) eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := e.clock.Until(ctx, cond); err != nil {
		t.Fatalf("%s: not within %s", what, within)
	}
}

// countingStore counts the gateway's heartbeat writes, including those made
// inside its transactions, and the session closes and inventory writes of
// its committed transactions: tests wait on those instead of sleeping.
type countingStore struct {
	store.Store
	heartbeatWrites atomic.Int64
	heartbeatIDs    atomic.Int64
	sessionCloses   atomic.Int64 // committed
	inventoryWrites atomic.Int64 // committed
}

func (c *countingStore) Tx(ctx context.Context, fn func(store.Store) error) error {
	tx := &countingTx{c: c}
	err := c.Store.Tx(ctx, func(s store.Store) error { tx.Store = s; return fn(tx) })
	c.committed(tx, err)
	return err
}

func (c *countingStore) FencedTx(ctx context.Context, f store.Fence, fn func(store.Store) error) error {
	tx := &countingTx{c: c}
	err := c.Store.FencedTx(ctx, f, func(s store.Store) error { tx.Store = s; return fn(tx) })
	c.committed(tx, err)
	return err
}

// committed adds what tx did when it committed (err is nil).
func (c *countingStore) committed(tx *countingTx, err error) {
	if err == nil {
		c.sessionCloses.Add(tx.closes)
		c.inventoryWrites.Add(tx.inventories)
	}
}

// countingTx is one transaction of a countingStore; a transaction runs on
// one goroutine, so its own counts need no lock.
type countingTx struct {
	store.Store
	c           *countingStore
	closes      int64
	inventories int64
}

func (t *countingTx) SessionClose(ctx context.Context, nodeID, sessionID string) error {
	t.closes++
	return t.Store.SessionClose(ctx, nodeID, sessionID)
}

func (t *countingTx) NodeSetInventory(ctx context.Context, id string, inventory []byte, digest string) error {
	t.inventories++
	return t.Store.NodeSetInventory(ctx, id, inventory, digest)
}

func (t *countingTx) SessionHeartbeatBatch(ctx context.Context, gatewayID string, ids []string, now *time.Time) (int, error) {
	t.c.heartbeatWrites.Add(1)
	t.c.heartbeatIDs.Add(int64(len(ids)))
	return t.Store.SessionHeartbeatBatch(ctx, gatewayID, ids, now)
}

// deadline returns a channel closed once d has passed: the guard of a
// wait, as a context deadline rather than a timer. It does not end with
// t.Context(), so cleanups (which run after it ends) can use it too.
func deadline(t testing.TB, d time.Duration) <-chan struct{} {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx.Done()
}
