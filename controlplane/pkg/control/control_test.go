package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// recorder is the gateway side: it records the wake-ups and revocation
// reads asked of it, and holds sessions of the nodes in held.
type recorder struct {
	held    map[string]bool
	mu      sync.Mutex
	woken   [][]string
	revokes []string
	got     chan struct{}
}

func newRecorder(held ...string) *recorder {
	r := &recorder{held: map[string]bool{}, got: make(chan struct{}, 16)}
	for _, n := range held {
		r.held[n] = true
	}
	return r
}

func (r *recorder) WakeNodes(ids []string) int {
	r.mu.Lock()
	r.woken = append(r.woken, slices.Clone(ids))
	r.mu.Unlock()
	r.got <- struct{}{}
	n := 0
	for _, id := range ids {
		if r.held[id] {
			n++
		}
	}
	return n
}

func (r *recorder) RevokeNow(nodeID string) bool {
	r.mu.Lock()
	r.revokes = append(r.revokes, nodeID)
	r.mu.Unlock()
	r.got <- struct{}{}
	return r.held[nodeID]
}

func (r *recorder) OpenTunnel(context.Context, string, *sessionv1.TunnelOpen) (tunnel.Conn, string, error) {
	return nil, "", tunnel.ErrNoSession
}

func (r *recorder) wakes() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.woken)
}

// fallback records the nodes the client handed to the bus.
type fallback struct {
	mu    sync.Mutex
	nodes []string
}

func (f *fallback) Wake(_ context.Context, ids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes = append(f.nodes, ids...)
}

func (f *fallback) got() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.nodes)
}

type fixture struct {
	st     store.Store
	bundle *pki.Bundle
	dir    string
	log    *slog.Logger
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := pki.Init(pki.InitOptions{TrustDomain: "control.test"})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{st: st, bundle: b, dir: dir, log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
}

// identity issues an internal certificate for name into its own directory.
func (f *fixture) identity(t *testing.T, name string) *Identity {
	t.Helper()
	cert, key, err := bootstrap.WriteInternalCert(f.bundle, filepath.Join(f.dir, name), name, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id, err := NewIdentity(f.bundle, cert, key, f.log)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// gateway starts a control server for rec and registers gateway gwID with
// its address.
func (f *fixture) gateway(t *testing.T, gwID string, rec Gateway) *Server {
	t.Helper()
	srv, err := Listen(ServerConfig{Listen: "127.0.0.1:0"}, f.identity(t, gwID), f.log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Run(ctx, rec); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if _, err := f.st.GatewayUpsert(context.Background(), &store.GatewayUpsertParams{ID: gwID, Region: "default", InternalAddress: srv.Address()}); err != nil {
		t.Fatal(err)
	}
	return srv
}

// node makes node id with a session on gwID ("" for none).
func (f *fixture) node(t *testing.T, pool *store.Pool, id, gwID string) {
	t.Helper()
	ctx := context.Background()
	if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: id, MachineID: "m-" + id}); err != nil {
		t.Fatal(err)
	}
	if gwID == "" {
		return
	}
	if _, _, err := f.st.SessionOpen(ctx, &store.SessionOpenParams{NodeID: id, SessionID: "sess-" + id, GatewayID: gwID, RemoteAddr: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) pool(t *testing.T) *store.Pool {
	t.Helper()
	ctx := context.Background()
	site, err := f.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "default"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := f.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestWakeReachesOnlyTheOwningGateway: a Wake of a node with a session on
// gateway A calls A alone; a node without a session and one on a gateway
// without an internal address go to the fallback bus.
func TestWakeReachesOnlyTheOwningGateway(t *testing.T) {
	f := newFixture(t)
	pool := f.pool(t)
	a, b := newRecorder("node-a"), newRecorder("node-b")
	f.gateway(t, "gw-a", a)
	f.gateway(t, "gw-b", b)
	if _, err := f.st.GatewayUpsert(context.Background(), &store.GatewayUpsertParams{ID: "gw-old", Region: "default"}); err != nil {
		t.Fatal(err)
	}
	f.node(t, pool, "node-a", "gw-a")
	f.node(t, pool, "node-b", "gw-b")
	f.node(t, pool, "node-idle", "")
	f.node(t, pool, "node-old", "gw-old")

	fb := &fallback{}
	c, err := NewClient(ClientConfig{Fallback: fb}, f.identity(t, "api-1"), f.st, f.log)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	c.Wake(context.Background(), []string{"node-a"})
	if got := a.wakes(); len(got) != 1 || !slices.Equal(got[0], []string{"node-a"}) {
		t.Fatalf("gateway A woken with %v, want once with [node-a]", got)
	}
	if got := b.wakes(); len(got) != 0 {
		t.Fatalf("gateway B woken with %v, want never", got)
	}
	if got := fb.got(); len(got) != 0 {
		t.Fatalf("fallback woken for %v, want none", got)
	}

	c.Wake(context.Background(), []string{"node-b", "node-idle", "node-old"})
	if got := b.wakes(); len(got) != 1 || !slices.Equal(got[0], []string{"node-b"}) {
		t.Fatalf("gateway B woken with %v, want once with [node-b]", got)
	}
	if got := a.wakes(); len(got) != 1 {
		t.Fatalf("gateway A woken %d times, want still once", len(got))
	}
	got := fb.got()
	slices.Sort(got)
	if !slices.Equal(got, []string{"node-idle", "node-old"}) {
		t.Fatalf("fallback woken for %v, want [node-idle node-old]", got)
	}

	c.Revoked(context.Background(), "node-a", "0a")
	a.mu.Lock()
	revokes := slices.Clone(a.revokes)
	a.mu.Unlock()
	if !slices.Equal(revokes, []string{"node-a"}) {
		t.Fatalf("gateway A revocation reads %v, want [node-a]", revokes)
	}
}

// TestWakeFallsBackWhenTheGatewayIsGone: a gateway row whose internal
// address answers nothing: the client gives up within its timeout and
// wakes the fallback.
func TestWakeFallsBackWhenTheGatewayIsGone(t *testing.T) {
	f := newFixture(t)
	pool := f.pool(t)
	srv, err := Listen(ServerConfig{Listen: "127.0.0.1:0"}, f.identity(t, "gw-gone"), f.log)
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Address()
	srv.Close()
	if _, err := f.st.GatewayUpsert(context.Background(), &store.GatewayUpsertParams{ID: "gw-gone", InternalAddress: addr}); err != nil {
		t.Fatal(err)
	}
	f.node(t, pool, "node-x", "gw-gone")
	fb := &fallback{}
	c, err := NewClient(ClientConfig{Fallback: fb, Timeout: 300 * time.Millisecond}, f.identity(t, "api-1"), f.st, f.log)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Wake(context.Background(), []string{"node-x"})
	if got := fb.got(); !slices.Equal(got, []string{"node-x"}) {
		t.Fatalf("fallback woken for %v, want [node-x]", got)
	}
}

// TestServerRefusesOtherCertificates: a client presenting the gateway's
// serving certificate (gateway serving CA, not the internal CA) and one
// from another deployment's internal CA are refused; neither reaches the
// gateway.
func TestServerRefusesOtherCertificates(t *testing.T) {
	f := newFixture(t)
	pool := f.pool(t)
	rec := newRecorder("node-a")
	f.gateway(t, "gw-a", rec)
	f.node(t, pool, "node-a", "gw-a")

	gwCert, gwKey, err := bootstrap.WriteGatewayCert(f.bundle, filepath.Join(f.dir, "serving"), []string{"localhost"}, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.Init(pki.InitOptions{TrustDomain: "control.test"})
	if err != nil {
		t.Fatal(err)
	}
	otherCert, otherKey, err := bootstrap.WriteInternalCert(other, filepath.Join(f.dir, "other"), "api-1", nil, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// The other deployment's process holds its own bundle: it presents its
	// files as they are (a process of this deployment would re-issue a
	// same-named CA's certificate from its own, as after a rotation).
	for name, c := range map[string]struct {
		b     *pki.Bundle
		files [2]string
	}{"gateway serving certificate": {f.bundle, [2]string{gwCert, gwKey}}, "another deployment's internal CA": {other, [2]string{otherCert, otherKey}}} {
		files := c.files
		id, err := NewIdentity(c.b, files[0], files[1], f.log)
		if err != nil {
			t.Fatal(err)
		}
		fb := &fallback{}
		c, err := NewClient(ClientConfig{Fallback: fb, Timeout: 2 * time.Second}, id, f.st, f.log)
		if err != nil {
			t.Fatal(err)
		}
		c.Wake(context.Background(), []string{"node-a"})
		c.Close()
		if got := rec.wakes(); len(got) != 0 {
			t.Fatalf("%s: gateway woken with %v, want refused", name, got)
		}
		if got := fb.got(); !slices.Equal(got, []string{"node-a"}) {
			t.Fatalf("%s: fallback woken for %v, want [node-a] after the refusal", name, got)
		}
	}
}

// TestIdentityFollowsAnInternalCARotation: server and client identities
// follow the bundle through an internal-CA rotation without new files.
// Each step opens a new connection (a new handshake): while one side
// trusts both CAs every call goes through; a client that never learnt the
// new CA cannot reach a server that presents it (what the rotation's proof
// prevents); after retirement an identity made from the old files
// re-issues its certificate from the new CA and is accepted.
func TestIdentityFollowsAnInternalCARotation(t *testing.T) {
	f := newFixture(t)
	pool := f.pool(t)
	rec := newRecorder("node-a")
	srv := f.gateway(t, "gw-a", rec)
	f.node(t, pool, "node-a", "gw-a")
	clientID := f.identity(t, "api-1")
	oldID := pki.NodeCAID(f.bundle.InternalCA.Cert)

	clone := func(b *pki.Bundle) *pki.Bundle {
		t.Helper()
		raw, err := b.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		out, err := pki.UnmarshalBundle(raw)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	prepared := clone(f.bundle)
	if err := prepared.PrepareInternalCA(time.Time{}, 0); err != nil {
		t.Fatal(err)
	}
	newID := pki.NodeCAID(prepared.NextInternalCA.Cert)
	activated := clone(prepared)
	if err := activated.ActivateInternalCA(); err != nil {
		t.Fatal(err)
	}
	retired := clone(activated)
	if err := retired.RetireInternalCA(); err != nil {
		t.Fatal(err)
	}
	wake := func(what string, id *Identity, want bool) {
		t.Helper()
		fb := &fallback{}
		c, err := NewClient(ClientConfig{Fallback: fb, Timeout: 2 * time.Second}, id, f.st, f.log)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		before := len(rec.wakes())
		c.Wake(context.Background(), []string{"node-a"})
		if got := len(rec.wakes()) > before; got != want {
			t.Fatalf("%s: gateway reached %v, want %v (fallback got %v)", what, got, want, fb.got())
		}
	}
	set := func(id *Identity, b *pki.Bundle) {
		t.Helper()
		if err := id.SetBundle(b); err != nil {
			t.Fatal(err)
		}
	}

	set(srv.Identity(), prepared)
	wake("propagating, the server trusting both", clientID, true)
	set(clientID, prepared)
	if got := clientID.Trusts(); !slices.Equal(got, []string{oldID, newID}) || clientID.Presents() != oldID {
		t.Fatalf("propagating: trusts %v, presents %s", got, clientID.Presents())
	}
	set(srv.Identity(), activated)
	if srv.Identity().Presents() != newID {
		t.Fatalf("activated: the server presents %s, want the new CA %s", srv.Identity().Presents(), newID)
	}
	wake("activated, the client still trusting both and presenting the old CA's", clientID, true)
	stale := f.identity(t, "api-2") // never learnt the new CA
	wake("activated, a client that never trusted the new CA", stale, false)
	set(clientID, activated)
	wake("activated on both sides", clientID, true)
	set(srv.Identity(), retired)
	set(clientID, retired)
	if got := clientID.Trusts(); !slices.Equal(got, []string{newID}) || clientID.Presents() != newID {
		t.Fatalf("retired: trusts %v, presents %s", got, clientID.Presents())
	}
	wake("retired on both sides", clientID, true)
	restarted := f.identity(t, "api-3") // files from the old CA, as after a restart
	set(restarted, retired)
	if restarted.Presents() != newID {
		t.Fatalf("a restarted process presents %s, want its certificate re-issued from %s", restarted.Presents(), newID)
	}
	wake("retired, a process started with the old CA's files", restarted, true)
}

// TestWakeRefusesAnAddressWithoutHost: an internal address with no host
// (":port") gives the client no name to verify the server's certificate
// for; the call is refused, not made unverified, and falls back.
func TestWakeRefusesAnAddressWithoutHost(t *testing.T) {
	f := newFixture(t)
	pool := f.pool(t)
	rec := newRecorder("node-a")
	srv := f.gateway(t, "gw-a", rec)
	_, port, err := net.SplitHostPort(srv.Address())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.GatewayUpsert(context.Background(), &store.GatewayUpsertParams{ID: "gw-a", Region: "default", InternalAddress: ":" + port}); err != nil {
		t.Fatal(err)
	}
	f.node(t, pool, "node-a", "gw-a")
	fb := &fallback{}
	c, err := NewClient(ClientConfig{Fallback: fb, Timeout: 2 * time.Second}, f.identity(t, "api-1"), f.st, f.log)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Wake(context.Background(), []string{"node-a"})
	if got := rec.wakes(); len(got) != 0 {
		t.Fatalf("gateway woken with %v through an address without a host, want refused", got)
	}
	if got := fb.got(); !slices.Equal(got, []string{"node-a"}) {
		t.Fatalf("fallback woken for %v, want [node-a]", got)
	}
}

// bundleSource serves a sealed bundle to Identity.Run, or an error, and
// counts the reads.
type bundleSource struct {
	mu     sync.Mutex
	sealed []byte
	err    error
	reads  int
}

func (s *bundleSource) PKIBundleGet(context.Context) (*store.PKIBundle, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	if s.err != nil {
		return nil, s.err
	}
	return &store.PKIBundle{Sealed: s.sealed}, nil
}

func (s *bundleSource) set(sealed []byte, err error) (reads int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sealed, s.err = sealed, err
	return s.reads
}

func (s *bundleSource) readsNow() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

// TestIdentityRunFollowsTheStoredBundle: Run reads the sealed bundle on
// its interval and trusts a changed one's internal CAs; a read that fails
// (the database away) keeps the bundle in force, and a later change is
// still taken: the loop never ends on an error. Two rotations in a row.
func TestIdentityRunFollowsTheStoredBundle(t *testing.T) {
	f := newFixture(t)
	const secret = "control-test-secret-0123456789abcdef"
	id := f.identity(t, "api-1")
	src := &bundleSource{}
	seal := func(b *pki.Bundle) []byte {
		t.Helper()
		s, err := b.SealBundle(secret)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	src.set(seal(f.bundle), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- id.Run(ctx, src, secret, 5*time.Millisecond, time.Hour) }()
	defer func() { cancel(); <-done }()
	waitTrusts := func(what string, want []string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !slices.Equal(id.Trusts(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: trusts %v, want %v", what, id.Trusts(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	b := f.bundle
	ids := []string{pki.NodeCAID(b.InternalCA.Cert)}
	for round := range 2 {
		if err := b.PrepareInternalCA(time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
		next := pki.NodeCAID(b.NextInternalCA.Cert)
		// The database is away first: the bundle in force stays.
		before := src.set(nil, errors.New("database unavailable"))
		for src.readsNow() < before+3 {
			time.Sleep(5 * time.Millisecond)
		}
		waitTrusts(fmt.Sprintf("round %d, reads failing", round), []string{ids[len(ids)-1]})
		src.set(seal(b), nil)
		waitTrusts(fmt.Sprintf("round %d, propagating", round), []string{ids[len(ids)-1], next})
		for _, step := range []func() error{b.ActivateInternalCA, b.RetireInternalCA} {
			if err := step(); err != nil {
				t.Fatal(err)
			}
		}
		src.set(seal(b), nil)
		waitTrusts(fmt.Sprintf("round %d, retired", round), []string{next})
		if id.Presents() != next {
			t.Fatalf("round %d: presents %s, want its files' certificate re-issued from %s", round, id.Presents(), next)
		}
		ids = append(ids, next)
	}
}
