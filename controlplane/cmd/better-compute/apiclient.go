package main

import (
	"cmp"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/client"
	"github.com/better-compute/better-compute/controlplane/config"
	"github.com/better-compute/better-compute/controlplane/serve"
)

// Environment variables of API commands.
const (
	envURL   = "BETTER_COMPUTE_URL"
	envToken = "BETTER_COMPUTE_TOKEN"
)

// apiFlags are the server and token flags of every API command.
type apiFlags struct {
	server, token string
}

func (f *apiFlags) add(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&f.server, "server", "", "API URL, such as http://127.0.0.1:3000 (env "+envURL+"; default the embedded default's)")
	cmd.PersistentFlags().StringVar(&f.token, "token", "", "API bearer token (env "+envToken+"; default the embedded default's admin token)")
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
	return &client.Client{BaseURL: server, Token: token}, nil
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
	return "http://" + net.JoinHostPort(host, port) + cfg.BasePath
}
