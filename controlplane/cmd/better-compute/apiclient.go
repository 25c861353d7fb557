package main

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/bootstrap"
	"github.com/better-compute/better-compute/controlplane/client"
	"github.com/better-compute/better-compute/controlplane/config"
	"github.com/better-compute/better-compute/controlplane/serve"
)

// Environment variables of API commands.
const (
	envURL    = "BETTER_COMPUTE_URL"
	envToken  = "BETTER_COMPUTE_TOKEN"
	envCAFile = "BETTER_COMPUTE_CA_FILE"
)

// apiFlags are the server and token flags of every API command.
type apiFlags struct {
	server, token, caFile string
}

func (f *apiFlags) add(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&f.server, "server", "", "API URL, such as http://127.0.0.1:3000 (env "+envURL+"; default the embedded default's)")
	cmd.PersistentFlags().StringVar(&f.token, "token", "", "API bearer token (env "+envToken+"; default the embedded default's admin token)")
	cmd.PersistentFlags().StringVar(&f.caFile, "ca-file", "", "PEM file of the CA (or certificate) an https API is trusted by, beside the system's (env "+envCAFile+"; default also the data directory's pki/api.crt)")
}

// client resolves the server and token: flags, then environment, then the
// embedded default's data directory.
func (e *env) client(f *apiFlags) (*client.Client, error) {
	server := cmp.Or(f.server, e.getenv(envURL), e.configuredAPI(), "http://127.0.0.1:3000")
	u, err := url.Parse(strings.TrimRight(server, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageError{fmt.Errorf("--server %q: want an http:// or https:// URL", server)}
	}
	if u.Path == "" {
		u.Path = "/api" // the default base path
	}
	server = u.String()
	token := cmp.Or(f.token, e.getenv(envToken))
	if token == "" {
		dir := cmp.Or(e.dataDir, e.getenv(config.EnvDataDir), config.DefaultDataDir(e.getenv))
		b, err := os.ReadFile(filepath.Join(dir, serve.AdminTokenFile))
		if err != nil {
			return nil, usageError{fmt.Errorf("no API token: give --token or %s (the embedded default keeps one in %s)", envToken, filepath.Join(dir, serve.AdminTokenFile))}
		}
		token = strings.TrimSpace(string(b))
	}
	hc, err := e.httpClient(f)
	if err != nil {
		return nil, err
	}
	return &client.Client{BaseURL: server, Token: token, HTTP: hc}, nil
}

// httpClient trusts the system's CAs and the certificates of --ca-file
// (or $BETTER_COMPUTE_CA_FILE), else those the deployment keeps: the data
// directory's pki/api.crt (host.tls mode auto: the API certificate and the
// gateway serving CA that issued it) and host.tls.cert (mode files).
func (e *env) httpClient(f *apiFlags) (*http.Client, error) {
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	if ca := cmp.Or(f.caFile, e.getenv(envCAFile)); ca != "" {
		b, err := os.ReadFile(ca)
		if err != nil {
			return nil, usageError{fmt.Errorf("--ca-file: %w", err)}
		}
		if !roots.AppendCertsFromPEM(b) {
			return nil, usageError{fmt.Errorf("--ca-file %s: no PEM certificate in it", ca)}
		}
	} else {
		dir := cmp.Or(e.dataDir, e.getenv(config.EnvDataDir), config.DefaultDataDir(e.getenv))
		files := []string{filepath.Join(dir, bootstrap.PKIDir, bootstrap.APICertFile)}
		if cfg, err := e.load(config.Flags{}); err == nil && cfg.Host.TLS.Mode == config.TLSModeFiles {
			files = append(files, cfg.Host.TLS.Cert)
		}
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				roots.AppendCertsFromPEM(b)
			}
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	return &http.Client{Timeout: 60 * time.Second, Transport: tr}, nil
}

// configuredAPI is the API URL the configuration's host.listen and basePath
// name (a wildcard host is dialled on loopback), or "" when the
// configuration does not load.
func (e *env) configuredAPI() string {
	cfg, err := e.load(config.Flags{})
	if err != nil {
		return ""
	}
	host, port, err := net.SplitHostPort(cfg.Host.Listen)
	if err != nil || port == "0" {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return cfg.APIScheme() + "://" + net.JoinHostPort(host, port) + cfg.BasePath
}
