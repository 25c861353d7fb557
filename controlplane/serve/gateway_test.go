package serve_test

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/gateway"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/serve"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/proto/jointoken"
)

const secret = "serve-test-secret-serve-test-secret-serve"

// load builds a configuration whose listeners use free loopback ports.
func load(t *testing.T, env map[string]string) *config.Config {
	t.Helper()
	cfg, err := config.Load("", func(k string) string { return env[k] }, config.Flags{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host.Gateway.Listen = "127.0.0.1:0"
	cfg.Host.Gateway.PublicURL = "" // from the bound port
	return cfg
}

func open(t *testing.T, cfg *config.Config) store.Store {
	t.Helper()
	if err := cfg.EnsureEmbeddedSecret(); err != nil {
		t.Fatal(err)
	}
	st, err := backend.Open(context.Background(), cfg.Database.URL, cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestEmbeddedGateway checks that the embedded default serves a gateway with
// nothing typed: PKI, certificate, default site and pool made on first start.
func TestEmbeddedGateway(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	cfg := load(t, map[string]string{config.EnvDataDir: dataDir})
	st := open(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan *gateway.Gateway, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve.Run(ctx, cfg, st, serve.Options{Log: slog.New(slog.NewTextHandler(t.Output(), nil)),
			GatewayReady: func(g *gateway.Gateway) { ready <- g }})
	}()
	var gw *gateway.Gateway
	select {
	case gw = <-ready:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("gateway not ready")
	}
	b, err := bootstrap.LoadBundle(ctx, st, cfg.Secret)
	if err != nil || b.TrustDomain != bootstrap.DefaultTrustDomain {
		t.Fatalf("bundle = %v, %v", b, err)
	}
	if _, err := st.PoolGet(ctx, bootstrap.DefaultPool); err != nil {
		t.Fatalf("default pool: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dataDir, bootstrap.PKIDir, bootstrap.GatewayKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("gateway key: %v %v", fi, err)
	}
	// A daemon holding only a token's pin trusts the gateway.
	tok, err := jointoken.New(b.GatewayPin(), nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", gw.Addr().String(), &tls.Config{
		ServerName:         "localhost",
		InsecureSkipVerify: true, // replaced by the pin check
		VerifyConnection: func(cs tls.ConnectionState) error {
			return jointoken.VerifyChain(tok.Pin(), cs.PeerCertificates, cs.ServerName, time.Now())
		},
	})
	if err != nil {
		t.Fatalf("pinned handshake: %v", err)
	}
	conn.Close()
	if !strings.HasPrefix(gw.PublicURL(), "https://localhost:") {
		t.Fatalf("public URL %s", gw.PublicURL())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// TestPostgresGatewayNeedsPKIInit checks the clear refusal of a gateway
// without pki init on PostgreSQL.
func TestPostgresGatewayNeedsPKIInit(t *testing.T) {
	t.Parallel()
	cfg := load(t, map[string]string{config.EnvDatabaseURL: pgtest.URL(t), config.EnvSecret: secret, config.EnvDataDir: t.TempDir()})
	st := open(t, cfg)
	err := serve.Run(context.Background(), cfg, st, serve.Options{Log: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if !errors.Is(err, bootstrap.ErrNoBundle) || !strings.Contains(err.Error(), "pki init") {
		t.Fatalf("serve without pki init: %v, want a refusal telling to run pki init", err)
	}
	// With a bundle but no certificate files, the configuration is at fault.
	if _, err := bootstrap.InitBundle(context.Background(), st, secret, "compute.example.com"); err != nil {
		t.Fatal(err)
	}
	err = serve.Run(context.Background(), cfg, st, serve.Options{Log: slog.New(slog.NewTextHandler(t.Output(), nil))})
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Key != "host.gateway.tlsFiles" {
		t.Fatalf("serve without certificate files: %v", err)
	}
}
