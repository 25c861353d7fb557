package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/serve"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
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

// apiTarget is the server and token an API command calls with, and where
// each came from, as an UNAUTHENTICATED answer names them.
type apiTarget struct {
	server, serverFrom string // serverFrom: "--server", envURL or "host.listen of F"
	token, tokenFrom   string // tokenFrom: "--token", envToken or the admin-token file
}

// client resolves the server and token (resolveAPI) and the TLS trust
// (httpClient), and records them in e.api for explain.
func (e *env) client(f *apiFlags) (*client.Client, error) {
	cfg, cfgErr := e.load(config.Flags{})
	t, err := e.resolveAPI(f, cfg, cfgErr)
	if err != nil {
		return nil, err
	}
	if t.server, err = apiURL(t.server, t.serverFrom); err != nil {
		return nil, err
	}
	hc, err := e.httpClient(f, cfg)
	if err != nil {
		return nil, err
	}
	e.api = t
	return &client.Client{BaseURL: t.server, Token: t.token, HTTP: hc}, nil
}

// apiURL is server (from from) as an API URL: an http(s) URL, with the
// default base path /api when it has none.
func apiURL(server, from string) (string, error) {
	u, err := url.Parse(strings.TrimRight(server, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", usageError{fmt.Errorf("--server %q (from %s): want an http:// or https:// URL", server, from)}
	}
	if u.Path == "" {
		u.Path = "/api" // the default base path
	}
	return u.String(), nil
}

// signedInToken is the token of the person's sign-in to server (refreshed
// when due), or "" when there is none or server is not a URL.
func (e *env) signedInToken(f *apiFlags, cfg *config.Config, server string) (string, error) {
	u, err := apiURL(server, "")
	if err != nil {
		return "", nil // the caller names the bad URL
	}
	hc, err := e.httpClient(f, cfg)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return e.signedIn(ctx, u, hc)
}

// resolveAPI finds the server and the token, each from the first of: its
// flag (--server, --token); its environment variable (BETTER_COMPUTE_URL,
// BETTER_COMPUTE_TOKEN); for the token, the person's sign-in to the server
// (better-compute login, refreshed when due); the configuration, cfg (--config F, with the
// environment and --data-dir over it): the API address of its host.listen
// (host.publicURL when host.listen's port is 0) and the admin-token file in
// its dataDir, which without --config is the default data directory. cfgErr
// is the error loading cfg: an error here only when the configuration is
// needed or was named by --config. A data directory without a deployment is
// an error (exit 1) saying so, never a new deployment.
func (e *env) resolveAPI(f *apiFlags, cfg *config.Config, cfgErr error) (*apiTarget, error) {
	t := &apiTarget{}
	switch {
	case f.server != "":
		t.server, t.serverFrom = f.server, "--server"
	case e.getenv(envURL) != "":
		t.server, t.serverFrom = e.getenv(envURL), envURL
	}
	switch {
	case f.token != "":
		t.token, t.tokenFrom = f.token, "--token"
	case e.getenv(envToken) != "":
		t.token, t.tokenFrom = e.getenv(envToken), envToken
	}
	if cfgErr != nil && (e.configPath != "" || t.server == "" || t.token == "") {
		return nil, cfgErr
	}
	if t.server == "" {
		of := "the default configuration"
		if e.configPath != "" {
			of = e.configPath
		}
		// A serve running on this data directory recorded where it
		// listens (its scheme follows flags such as --public-url, which no
		// configuration file shows); else the configuration's host.listen.
		if u, path := bootstrap.RecordedAPIURL(cfg.DataDir); u != "" {
			t.server, t.serverFrom = u, path
		} else {
			t.server, t.serverFrom = configuredAPI(cfg), "host.listen of "+of
		}
		if t.server == "" && cfg.Host.PublicURL != "" {
			t.server, t.serverFrom = strings.TrimRight(cfg.Host.PublicURL, "/")+cfg.BasePath, "host.publicURL of "+of
		}
		if t.server == "" {
			t.server, t.serverFrom = "http://127.0.0.1:3000", "the default"
		}
	}
	if t.token == "" {
		// A person's sign-in (better-compute login) to this server.
		tok, err := e.signedInToken(f, cfg, t.server)
		if err != nil {
			return nil, err
		}
		if tok != "" {
			t.token, t.tokenFrom = tok, "your sign-in (better-compute login; "+e.credentialsPath()+")"
		}
	}
	if t.token == "" {
		path := filepath.Join(cfg.DataDir, serve.AdminTokenFile)
		b, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			if err := checkDeployment(cfg); err != nil {
				return nil, fmt.Errorf("%w; or give an API token with --token or %s, or sign in with better-compute login", err, envToken)
			}
		}
		if err != nil || strings.TrimSpace(string(b)) == "" {
			return nil, usageError{fmt.Errorf("no API token: give --token or %s (the embedded default keeps one in %s, which does not hold one)", envToken, path)}
		}
		t.token, t.tokenFrom = strings.TrimSpace(string(b)), path
	}
	return t, nil
}

// explain adds to an UNAUTHENTICATED answer the server called and where
// the token came from, so a token of the wrong deployment is seen at once.
func (e *env) explain(err error) error {
	var ae *client.Error
	if e.api == nil || !errors.As(err, &ae) || ae.Code != apiv1.CodeUnauthenticated {
		return err
	}
	return fmt.Errorf("%w (server %s from %s; token from %s)", err, e.api.server, e.api.serverFrom, e.api.tokenFrom)
}

// httpClient trusts the system's CAs and the certificates of --ca-file
// (or $BETTER_COMPUTE_CA_FILE), else those the deployment keeps: the data
// directory's pki/api.crt (host.tls mode auto: the API certificate and the
// gateway serving CA that issued it) and host.tls.cert (mode files).
// cfg may be nil (the configuration did not load): then only the
// --data-dir, environment or default data directory is read.
func (e *env) httpClient(f *apiFlags, cfg *config.Config) (*http.Client, error) {
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
		if cfg != nil {
			dir = cfg.DataDir
		}
		files := []string{filepath.Join(dir, bootstrap.PKIDir, bootstrap.APICertFile)}
		if cfg != nil && cfg.Host.TLS.Mode == config.TLSModeFiles {
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

// configuredAPI is the API URL cfg's host.listen and basePath name (a
// wildcard host is dialled on loopback), or "" when its port is 0 (chosen
// at listen time).
func configuredAPI(cfg *config.Config) string {
	host, port, err := net.SplitHostPort(cfg.Host.Listen)
	if err != nil || port == "0" {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return cfg.APIScheme() + "://" + net.JoinHostPort(host, port) + cfg.BasePath
}
