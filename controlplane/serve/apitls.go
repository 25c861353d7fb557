package serve

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// apiCertFiles are the API's certificate files for host.tls: none for mode
// off, the configured files for mode files, and for mode auto a
// certificate from the gateway serving CA in DataDir/pki (api.crt,
// api.key) for bootstrap.LocalNames of the public hosts, issued when
// missing or when those names changed, keeping its key so that the pin
// nodes add prints survives.
func apiCertFiles(ctx context.Context, cfg *config.Config, st store.Store, opts Options) (certFile, keyFile string, err error) {
	switch cfg.Host.TLS.Mode {
	case config.TLSModeOff:
		return "", "", nil
	case config.TLSModeFiles:
		return cfg.Host.TLS.Cert, cfg.Host.TLS.Key, nil
	}
	load := func() (*pki.Bundle, error) { return bootstrap.LoadBundle(ctx, st, cfg.Secret) }
	if cfg.Embedded {
		// The gateway role made it already; EnsureBundle is for order's sake.
		load = func() (*pki.Bundle, error) {
			b, _, err := bootstrap.EnsureBundle(ctx, st, cfg.Secret,
				pki.InitOptions{TrustDomain: bootstrap.DefaultTrustDomain, NodeValidity: cfg.PKI.NodeCAValidity.Duration})
			return b, err
		}
	}
	b, err := load()
	if err != nil {
		return "", "", fmt.Errorf("host.tls mode auto issues the API certificate from the gateway serving CA: %w", err)
	}
	names := bootstrap.LocalNames(cfg.PublicHosts())
	certFile, keyFile, issued, err := bootstrap.EnsureServingCert(b, filepath.Join(cfg.DataDir, bootstrap.PKIDir), bootstrap.APICertFile, bootstrap.APIKeyFile, names)
	if err != nil {
		return "", "", fmt.Errorf("issue the API certificate: %w", err)
	}
	if issued {
		opts.Log.InfoContext(ctx, "API certificate issued from the gateway serving CA", "cert", certFile, "names", names.String())
	}
	return certFile, keyFile, nil
}

// withInstall fills in c what the API needs to serve HTTPS, nodes.add and
// the install script: its certificate files, its public URL, the gateway's
// public URL, the downloads folder (dl, when it lists releases) and the
// release pins.
func withInstall(c api.Config, cfg *config.Config, dl http.Handler, certFile, keyFile string) api.Config {
	c.TLSCertFile, c.TLSKeyFile = certFile, keyFile
	c.PublicURL, c.PublicHost = cfg.Host.PublicURL, cfg.APIPublicHost()
	c.GatewayURL = cfg.Host.Gateway.PublicURL
	c.WebSocketURL = cfg.Host.Gateway.WS.PublicURL
	if rel, ok := dl.(api.Releases); ok {
		c.Releases = rel
	}
	c.ReleasePins = cfg.Downloads.ReleasePins
	return c
}

// servingRenewer keeps the serving certificates this process issues for
// itself (the embedded default's gateway certificate, when host.gateway
// .tlsFiles is not set; host.tls mode auto's API certificate) renewed while
// it runs (bootstrap.Renewer); nil when it issues none.
func servingRenewer(cfg *config.Config, st store.Store, gateway, api bool, log *slog.Logger) (*bootstrap.Renewer, error) {
	var certs []bootstrap.ServingCert
	gc := cfg.Host.Gateway.TLSFiles
	if gateway && cfg.Embedded && gc.Cert == "" && gc.Key == "" {
		certs = append(certs, bootstrap.ServingCert{Use: "gateway", CertName: bootstrap.GatewayCertFile, KeyName: bootstrap.GatewayKeyFile})
	}
	if api && cfg.Host.TLS.Mode == config.TLSModeAuto {
		certs = append(certs, bootstrap.ServingCert{Use: "api", CertName: bootstrap.APICertFile, KeyName: bootstrap.APIKeyFile})
	}
	if len(certs) == 0 {
		return nil, nil
	}
	return bootstrap.NewRenewer(bootstrap.RenewerConfig{Store: st, Secret: cfg.Secret, Dir: filepath.Join(cfg.DataDir, bootstrap.PKIDir),
		Certs: certs, Names: func() bootstrap.Names { return bootstrap.LocalNames(cfg.PublicHosts()) },
		Log: log})
}
