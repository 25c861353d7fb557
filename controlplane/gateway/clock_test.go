package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	nodesession "github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TestMeasureSkew checks the write rule with an injected clock: the skew
// (the node's clock minus the gateway's) is queued on a session's first
// heartbeat, then only when it moved by more than a second; heartbeats
// without a time are ignored.
func TestMeasureSkew(t *testing.T) {
	t.Parallel()
	g := &Gateway{}
	s := &session{nodeID: "node_a"}
	now := time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)
	beat := func(nodeTime time.Time) {
		g.measureSkew(s, &sessionv1.Heartbeat{SentAt: timestamppb.New(nodeTime)}, now)
	}
	want := func(what string, skew time.Duration, queued bool) {
		t.Helper()
		m := g.skews.take()
		w, ok := m["node_a"]
		switch {
		case ok != queued:
			t.Errorf("%s: queued = %v, want %v", what, ok, queued)
		case ok && (w.skew != skew || !w.at.Equal(now)):
			t.Errorf("%s: queued %s at %s, want %s at %s", what, w.skew, w.at, skew, now)
		}
	}

	g.measureSkew(s, &sessionv1.Heartbeat{}, now)
	want("no sent_at", 0, false)
	beat(now.Add(-90 * time.Minute))
	want("first heartbeat", -90*time.Minute, true)
	now = now.Add(10 * time.Second)
	beat(now.Add(-90*time.Minute + 800*time.Millisecond))
	want("moved 0.8 s", 0, false)
	beat(now.Add(-90*time.Minute - 1500*time.Millisecond))
	want("moved 1.5 s", -90*time.Minute-1500*time.Millisecond, true)
	// A new session measures again at its first heartbeat.
	s = &session{nodeID: "node_a"}
	beat(now.Add(-90*time.Minute - 1500*time.Millisecond))
	want("first heartbeat of a new session", -90*time.Minute-1500*time.Millisecond, true)
}

// TestStoreSkews checks that pending skews reach the store, that a node
// deleted meanwhile holds up no other, and that a failed batch stays
// pending.
func TestStoreSkews(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, sqlitetest.Open(t))
	g := e.start(nil)
	n := e.join(g, "gpu-skew", "")
	at := time.Now().UTC().Truncate(time.Millisecond)
	g.skews.put(n.id, skewWrite{skew: -5400 * time.Second, at: at})
	g.skews.put("node_gone", skewWrite{skew: time.Second, at: at})
	if err := g.storeSkews(ctx); err != nil {
		t.Fatal(err)
	}
	nd, err := e.st.NodeGet(ctx, n.id)
	if err != nil || nd.ClockSkew == nil || *nd.ClockSkew != -5400*time.Second || nd.ClockSkewAt == nil || !nd.ClockSkewAt.Equal(at) {
		t.Fatalf("node clock skew = %v at %v (%v)", nd.ClockSkew, nd.ClockSkewAt, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	g.skews.put(n.id, skewWrite{skew: time.Minute, at: at})
	if err := g.storeSkews(cctx); err == nil {
		t.Fatal("store with a cancelled context succeeded")
	}
	if m := g.skews.take(); m[n.id].skew != time.Minute {
		t.Errorf("failed write not kept pending: %v", m)
	}
}

// shiftedClock is the system clock moved by d: a simulated machine whose
// clock is wrong (the real clock is never changed).
type shiftedClock struct{ d time.Duration }

func (c shiftedClock) Now() time.Time { return time.Now().Add(c.d) }

func (shiftedClock) AfterFunc(d time.Duration, f func()) nodesession.Timer {
	return time.AfterFunc(d, f)
}

// skewSignal is a store that reports each clock skew written in a
// transaction once that transaction has committed.
type skewSignal struct {
	store.Store
	wrote chan time.Duration
}

func (s *skewSignal) Tx(ctx context.Context, fn func(store.Store) error) error {
	tx := &skewSignalTx{}
	err := s.Store.Tx(ctx, func(inner store.Store) error {
		tx.Store, tx.skews = inner, nil
		return fn(tx)
	})
	if err == nil {
		for _, skew := range tx.skews {
			select {
			case s.wrote <- skew:
			default:
			}
		}
	}
	return err
}

type skewSignalTx struct {
	store.Store
	skews []time.Duration
}

func (t *skewSignalTx) NodeSetClockSkew(ctx context.Context, id string, skew time.Duration, now *time.Time) error {
	err := t.Store.NodeSetClockSkew(ctx, id, skew, now)
	if err == nil {
		t.skews = append(t.skews, skew)
	}
	return err
}

// lockedBuffer collects log output written from many goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// writeOldGatewayCert writes into dir a serving certificate for localhost
// and 127.0.0.1 issued from b's gateway CA at issued (backdated an hour,
// as pki issues them), as a gateway that has served for a while has.
func writeOldGatewayCert(t *testing.T, b *pki.Bundle, dir string, issued time.Time) {
	t.Helper()
	key, _ := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: issued.Add(-time.Hour), NotAfter: issued.Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, b.GatewayCA.Cert, &key.PublicKey, b.GatewayCA.Key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, bootstrap.GatewayCertFile), pki.EncodeCertificatesPEM(leaf, b.GatewayCA.Cert), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, bootstrap.GatewayKeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestNodeClockBehind is the clock rule end to end (issue 14, "Clocks"): a
// simulated node (FakeDaemon, bcd/session) whose clock is 90 minutes behind
// joins a real gateway; its certificate is not yet valid by its own clock
// but valid by the gateway's, and it keeps it, connects, logs the skew in
// seconds and its direction, and the gateway records the skew from its
// heartbeats.
func TestNodeClockBehind(t *testing.T) {
	t.Parallel()
	forBackends(t, func(t *testing.T, b backend) {
		ctx := context.Background()
		st := &skewSignal{Store: b.open(t), wrote: make(chan time.Duration, 16)}
		e := newEnv(t, st)
		// A deployment made two days ago, with a gateway certificate issued
		// yesterday: what a node 90 minutes behind can verify. (A fresh one
		// is backdated an hour, not 90 minutes.)
		var err error
		e.bundle, err = pki.Init(pki.InitOptions{TrustDomain: testTrustDomain, Now: time.Now().Add(-48 * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		writeOldGatewayCert(t, e.bundle, e.dir, time.Now().Add(-24*time.Hour))
		g := e.start(func(c *Config) { c.HeartbeatInterval = 50 * time.Millisecond; c.FlushInterval = 50 * time.Millisecond })

		clk := shiftedClock{-90 * time.Minute}
		var logs lockedBuffer
		connected := make(chan struct{}, 1)
		d, err := sim.NewFakeDaemon(sim.DaemonConfig{
			Name:        "gpu-behind",
			NoInventory: true,
			Logger:      slog.New(slog.NewTextHandler(&logs, nil)),
			Session: nodesession.Config{
				Clock: clk, StartJitter: -1, BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
				OnEvent: func(ev nodesession.Event) {
					if ev.Kind == nodesession.EventConnected {
						select {
						case connected <- struct{}{}:
						default:
						}
					}
				},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		jctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := d.Join(jctx, g.PublicURL(), e.token(1, time.Hour).String()); err != nil {
			t.Fatalf("join with the clock 90 min behind: %v", err)
		}
		leaf := d.Identity().Chain[0]
		if !clk.Now().Before(leaf.NotBefore) || !time.Now().After(leaf.NotBefore) {
			t.Fatalf("certificate valid from %s: want not yet valid by the node's clock %s, valid by the gateway's", leaf.NotBefore, clk.Now())
		}
		if s := d.Identity().ClockSkew.Round(time.Minute); s != -90*time.Minute {
			t.Errorf("join measured a skew of %s, want -90m", d.Identity().ClockSkew)
		}

		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- d.Run(rctx) }()
		defer func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("Run = %v", err)
			}
		}()
		select {
		case <-connected:
		case <-deadline(t, 20*time.Second):
			t.Fatalf("not connected; log:\n%s", logs.String())
		}
		select {
		case skew := <-st.wrote:
			if skew.Round(time.Minute) != -90*time.Minute {
				t.Errorf("gateway wrote a skew of %s, want about -90m", skew)
			}
		case <-deadline(t, 20*time.Second):
			t.Fatal("gateway wrote no clock skew")
		}
		nd, err := e.st.NodeGet(ctx, d.NodeID())
		if err != nil || nd.ClockSkew == nil || nd.ClockSkew.Round(time.Minute) != -90*time.Minute || nd.ClockSkewAt == nil {
			t.Fatalf("node clock skew = %v at %v (%v)", nd.ClockSkew, nd.ClockSkewAt, err)
		}
		if out := logs.String(); !strings.Contains(out, "this machine's clock is 5400 s behind the gateway's") {
			t.Errorf("node log does not give the skew:\n%s", out)
		}
	})
}
