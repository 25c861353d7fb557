package bootstrap_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	"github.com/better-compute/better-compute/proto/jointoken"
)

const secret = "bootstrap-test-secret-bootstrap-test-secret"

func TestInitAndLoad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	if _, err := bootstrap.LoadBundle(ctx, st, secret); !errors.Is(err, bootstrap.ErrNoBundle) {
		t.Fatalf("load before init: %v, want ErrNoBundle", err)
	}
	b, err := bootstrap.InitBundle(ctx, st, secret, "compute.example.com")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bootstrap.InitBundle(ctx, st, secret, "compute.example.com"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second init: %v, want ErrConflict", err)
	}
	got, err := bootstrap.LoadBundle(ctx, st, secret)
	if err != nil || got.GatewayPin() != b.GatewayPin() || got.TrustDomain != "compute.example.com" {
		t.Fatalf("loaded %v, %v", got, err)
	}
	if _, err := bootstrap.LoadBundle(ctx, st, "another-secret-another-secret-another"); !errors.Is(err, pki.ErrSealOpen) {
		t.Fatalf("load with another secret: %v, want ErrSealOpen", err)
	}
}

func TestEmbedded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	dir := t.TempDir()
	first, err := bootstrap.Embedded(ctx, st, secret, dir, "eu-1", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !first.Initialised || first.Bundle.TrustDomain != bootstrap.DefaultTrustDomain {
		t.Fatalf("setup = %+v", first)
	}
	for _, f := range []string{first.CertFile, first.KeyFile} {
		fi, err := os.Stat(f)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v, want mode 0600", f, fi, err)
		}
	}
	pair, err := tls.LoadX509KeyPair(first.CertFile, first.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	var chain []*x509.Certificate
	for _, der := range pair.Certificate {
		c, _ := x509.ParseCertificate(der)
		chain = append(chain, c)
	}
	for _, name := range []string{"localhost", "127.0.0.1", "::1"} {
		if err := jointoken.VerifyChain(first.Bundle.GatewayPin(), chain, name, pair.Leaf.NotBefore.Add(1)); err != nil {
			t.Fatalf("the embedded gateway certificate does not serve %s: %v", name, err)
		}
	}
	site, err := st.SiteGet(ctx, bootstrap.DefaultSite)
	if err != nil || site.Region != "eu-1" {
		t.Fatalf("default site = %+v, %v", site, err)
	}
	if pool, err := st.PoolGet(ctx, bootstrap.DefaultPool); err != nil || pool.SiteID != site.ID {
		t.Fatalf("default pool = %+v, %v", pool, err)
	}

	// A second start keeps everything.
	second, err := bootstrap.Embedded(ctx, st, secret, dir, "eu-1", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := tls.LoadX509KeyPair(second.CertFile, second.KeyFile)
	if second.Initialised || !again.Leaf.Equal(pair.Leaf) {
		t.Fatal("a second start re-made the PKI or the gateway certificate")
	}

	// A certificate from another bundle (the database was replaced) is
	// issued again.
	other := sqlitetest.Open(t)
	third, err := bootstrap.Embedded(ctx, other, secret, dir, "eu-1", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	reissued, _ := tls.LoadX509KeyPair(third.CertFile, third.KeyFile)
	if reissued.Leaf.Equal(pair.Leaf) {
		t.Fatal("a certificate of another PKI was kept")
	}
}
