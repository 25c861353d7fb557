// Package bootstrap prepares what a deployment needs before its first node
// joins: the PKI bundle, sealed in the store (pki init), a gateway serving
// certificate on disk (pki issue-gateway), and for the embedded default all
// of it made on first start together with a site and a pool named
// "default", so that a newcomer types nothing (docs/pki.md).
package bootstrap

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Defaults of the embedded deployment.
const (
	// DefaultTrustDomain is the trust domain the embedded default's PKI
	// is made for.
	DefaultTrustDomain = "better-compute.local"
	// DefaultSite and DefaultPool name the site and pool the embedded
	// default makes.
	DefaultSite = "default"
	DefaultPool = "default"
	// PKIDir is the folder of the data directory holding the embedded
	// gateway certificate.
	PKIDir = "pki"
	// GatewayCertFile and GatewayKeyFile are the file names pki
	// issue-gateway and the embedded default write.
	GatewayCertFile = "gateway.crt"
	GatewayKeyFile  = "gateway.key"
	// renewBefore is how long before its end the embedded default replaces
	// its gateway certificate, at start.
	renewBefore = 30 * 24 * time.Hour
)

// ErrNoBundle reports a database in which pki init has not been run.
var ErrNoBundle = errors.New("no PKI bundle in the database")

// Store is what bootstrap reads and writes.
type Store interface {
	PKIBundleGet(ctx context.Context) (*store.PKIBundle, error)
	PKIBundleCreate(ctx context.Context, b *store.PKIBundle) error
	SiteGet(ctx context.Context, idOrName string) (*store.Site, error)
	SiteCreate(ctx context.Context, p *store.SiteCreateParams) (*store.Site, error)
	PoolGet(ctx context.Context, idOrName string) (*store.Pool, error)
	PoolCreate(ctx context.Context, p *store.PoolCreateParams) (*store.Pool, error)
}

// LoadBundle opens the deployment's bundle with the deployment secret. It
// fails with ErrNoBundle before pki init, and with pki.ErrSealOpen for a
// wrong secret.
func LoadBundle(ctx context.Context, st Store, secret string) (*pki.Bundle, error) {
	sealed, err := st.PKIBundleGet(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrNoBundle
	}
	if err != nil {
		return nil, fmt.Errorf("load pki bundle: %w", err)
	}
	b, err := openBundle(secret, sealed)
	if errors.Is(err, pki.ErrSealOpen) {
		return nil, fmt.Errorf("%w: is the deployment secret the one pki init ran with?", err)
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}

func openBundle(secret string, sealed *store.PKIBundle) (*pki.Bundle, error) {
	b, err := pki.OpenBundle(secret, sealed.Sealed)
	if err != nil {
		return nil, err
	}
	if b.TrustDomain != sealed.TrustDomain {
		return nil, fmt.Errorf("%w: sealed for %s, stored as %s", pki.ErrBundleInvalid, b.TrustDomain, sealed.TrustDomain)
	}
	return b, nil
}

// InitBundle makes a bundle for trustDomain, seals it under secret and stores
// it. It fails wrapping store.ErrConflict when the database has one.
func InitBundle(ctx context.Context, st Store, secret, trustDomain string) (*pki.Bundle, error) {
	return InitBundleWith(ctx, st, secret, pki.InitOptions{TrustDomain: trustDomain})
}

// InitBundleWith is InitBundle with the bundle made by pki.Init(opts): a
// node CA of the configured life (pki.nodeCAValidity), for one.
func InitBundleWith(ctx context.Context, st Store, secret string, opts pki.InitOptions) (*pki.Bundle, error) {
	trustDomain := opts.TrustDomain
	b, err := pki.Init(opts)
	if err != nil {
		return nil, err
	}
	sealed, err := b.SealBundle(secret)
	if err != nil {
		return nil, err
	}
	if err := st.PKIBundleCreate(ctx, &store.PKIBundle{TrustDomain: trustDomain, Sealed: sealed}); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return nil, fmt.Errorf("the database already holds a PKI bundle: %w", err)
		}
		return nil, err
	}
	return b, nil
}

// EnsureBundle loads the deployment's bundle, or makes one with
// pki.Init(opts) when the database has none (the embedded default's first
// start). made reports that this call made it.
func EnsureBundle(ctx context.Context, st Store, secret string, opts pki.InitOptions) (b *pki.Bundle, made bool, err error) {
	b, err = LoadBundle(ctx, st, secret)
	if !errors.Is(err, ErrNoBundle) {
		return b, false, err
	}
	b, err = InitBundleWith(ctx, st, secret, opts)
	if errors.Is(err, store.ErrConflict) { // made meanwhile by another process
		b, err = LoadBundle(ctx, st, secret)
		return b, false, err
	}
	return b, err == nil, err
}

// WriteGatewayCert issues a gateway serving certificate for dns and ips,
// valid for ttl (zero: pki.DefaultServerTTL), and writes it to
// dir/gateway.crt (leaf, then the gateway serving CA) and its key to
// dir/gateway.key, both mode 0600, each replaced atomically.
func WriteGatewayCert(b *pki.Bundle, dir string, dns []string, ips []net.IP, ttl time.Duration) (certPath, keyPath string, err error) {
	certPEM, keyPEM, err := b.IssueGateway(dns, ips, ttl)
	if err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("create %s: %w", dir, err)
	}
	certPath, keyPath = filepath.Join(dir, GatewayCertFile), filepath.Join(dir, GatewayKeyFile)
	if err := writeFile(keyPath, keyPEM); err != nil {
		return "", "", err
	}
	if err := writeFile(certPath, certPEM); err != nil {
		return "", "", err
	}
	return certPath, keyPath, nil
}

// writeFile writes data to path, mode 0600, through a temporary file renamed
// over it.
func writeFile(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// EmbeddedSetup is what Embedded made or found.
type EmbeddedSetup struct {
	Bundle *pki.Bundle
	// CertFile and KeyFile are the gateway certificate's files.
	CertFile, KeyFile string
	// Initialised reports that this call made the bundle.
	Initialised bool
	// Names are the gateway certificate's names; CertIssued reports that
	// this call issued it.
	Names      Names
	CertIssued bool
}

// Embedded makes sure the embedded default has what it serves with: the
// bundle (made for DefaultTrustDomain on first start), a gateway certificate
// in dataDir/pki for LocalNames(publicHosts) (the public hosts, localhost,
// 127.0.0.1, ::1, the hostname and the interface addresses; issued when
// missing, issued by another bundle, for other names, or within 30 days of
// its end, keeping its key), and the site "default" in region and its pool
// "default". A bundle made here has a node CA valid for nodeCAValidity
// (zero: pki.DefaultCAValidity).
func Embedded(ctx context.Context, st Store, secret, dataDir, region string, publicHosts []string, nodeCAValidity time.Duration) (*EmbeddedSetup, error) {
	setup := &EmbeddedSetup{}
	b, made, err := EnsureBundle(ctx, st, secret, pki.InitOptions{TrustDomain: DefaultTrustDomain, NodeValidity: nodeCAValidity})
	if err != nil {
		return nil, err
	}
	setup.Bundle, setup.Initialised = b, made
	setup.Names = LocalNames(publicHosts)
	setup.CertFile, setup.KeyFile, setup.CertIssued, err = EnsureServingCert(b, filepath.Join(dataDir, PKIDir), GatewayCertFile, GatewayKeyFile, setup.Names)
	if err != nil {
		return nil, fmt.Errorf("write the embedded gateway certificate: %w", err)
	}
	if err := ensureDefaults(ctx, st, region); err != nil {
		return nil, err
	}
	return setup, nil
}

// ensureDefaults makes the site and pool "default" when missing, the site
// in region (store.DefaultRegion when empty: the gateway's own default).
func ensureDefaults(ctx context.Context, st Store, region string) error {
	site, err := st.SiteGet(ctx, DefaultSite)
	if errors.Is(err, store.ErrNotFound) {
		site, err = st.SiteCreate(ctx, &store.SiteCreateParams{Name: DefaultSite, Region: cmp.Or(region, store.DefaultRegion)})
		if errors.Is(err, store.ErrConflict) {
			site, err = st.SiteGet(ctx, DefaultSite)
		}
	}
	if err != nil {
		return fmt.Errorf("default site: %w", err)
	}
	_, err = st.PoolGet(ctx, DefaultPool)
	if errors.Is(err, store.ErrNotFound) {
		_, err = st.PoolCreate(ctx, &store.PoolCreateParams{Name: DefaultPool, SiteID: site.ID})
		if errors.Is(err, store.ErrConflict) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("default pool: %w", err)
	}
	return nil
}
