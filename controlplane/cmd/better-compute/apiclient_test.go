package main

import (
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/serve"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// deploymentDir makes a data directory that looks deployed (a state.db)
// holding the admin token token ("" for none).
func deploymentDir(t *testing.T, token string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, backend.EmbeddedFile), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if token != "" {
		if err := os.WriteFile(filepath.Join(dir, serve.AdminTokenFile), []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestAPIDiscovery checks the order the CLI finds its server and token in:
// flags, then environment, then the configuration file's own host.listen
// (host.publicURL when its port is 0) and data directory.
func TestAPIDiscovery(t *testing.T) {
	t.Parallel()
	envDir := deploymentDir(t, "bcat_env_dir")
	cfgDir := deploymentDir(t, "bcat_config_dir")
	cfgFile := filepath.Join(t.TempDir(), "serve.yaml")
	if err := os.WriteFile(cfgFile, []byte("dataDir: "+cfgDir+"\nhost:\n  listen: 0.0.0.0:4567\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	publicFile := filepath.Join(t.TempDir(), "public.yaml")
	if err := os.WriteFile(publicFile, []byte("dataDir: "+cfgDir+"\nhost:\n  listen: 127.0.0.1:0\n  publicURL: http://cp.example.com:3000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name               string
		flags              apiFlags
		env                map[string]string
		config, dataDir    string
		server, serverFrom string
		token, tokenFrom   string
	}{
		{name: "flags over everything", flags: apiFlags{server: "http://flag:1", token: "bcat_flag"},
			env:    map[string]string{envURL: "http://env:2", envToken: "bcat_env", config.EnvDataDir: envDir},
			config: cfgFile, server: "http://flag:1/api", serverFrom: "--server", token: "bcat_flag", tokenFrom: "--token"},
		{name: "environment over the configuration",
			env:    map[string]string{envURL: "http://env:2/base", envToken: "bcat_env"},
			config: cfgFile, server: "http://env:2/base", serverFrom: envURL, token: "bcat_env", tokenFrom: envToken},
		{name: "the configuration's listen and data directory", config: cfgFile,
			server: "http://127.0.0.1:4567/api", serverFrom: "host.listen of " + cfgFile,
			token: "bcat_config_dir", tokenFrom: filepath.Join(cfgDir, serve.AdminTokenFile)},
		{name: "the configuration's public URL when it listens on port 0", config: publicFile,
			server: "http://cp.example.com:3000/api", serverFrom: "host.publicURL of " + publicFile,
			token: "bcat_config_dir", tokenFrom: filepath.Join(cfgDir, serve.AdminTokenFile)},
		{name: "the environment's data directory over the configuration's", config: cfgFile,
			env:    map[string]string{config.EnvDataDir: envDir},
			server: "http://127.0.0.1:4567/api", serverFrom: "host.listen of " + cfgFile,
			token: "bcat_env_dir", tokenFrom: filepath.Join(envDir, serve.AdminTokenFile)},
		{name: "--data-dir over both", config: cfgFile, dataDir: envDir,
			env:    map[string]string{config.EnvDataDir: cfgDir},
			server: "http://127.0.0.1:4567/api", serverFrom: "host.listen of " + cfgFile,
			token: "bcat_env_dir", tokenFrom: filepath.Join(envDir, serve.AdminTokenFile)},
		{name: "no configuration file: the defaults and the environment's data directory",
			env:    map[string]string{config.EnvDataDir: envDir, envToken: ""},
			server: "http://127.0.0.1:3000/api", serverFrom: "host.listen of the default configuration",
			token: "bcat_env_dir", tokenFrom: filepath.Join(envDir, serve.AdminTokenFile)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			vars := map[string]string{"HOME": t.TempDir()}
			for k, v := range tc.env {
				vars[k] = v
			}
			e := &env{getenv: func(k string) string { return vars[k] }, configPath: tc.config, dataDir: tc.dataDir}
			c, err := e.client(&tc.flags)
			if err != nil {
				t.Fatal(err)
			}
			if c.BaseURL != tc.server || e.api.serverFrom != tc.serverFrom {
				t.Errorf("server %s from %s, want %s from %s", c.BaseURL, e.api.serverFrom, tc.server, tc.serverFrom)
			}
			if c.Token != tc.token || e.api.tokenFrom != tc.tokenFrom {
				t.Errorf("token %s from %s, want %s from %s", c.Token, e.api.tokenFrom, tc.token, tc.tokenFrom)
			}
		})
	}
}

// TestNoDeploymentNoFiles: an API command pointed at a data directory
// without a deployment fails (exit 1) with a hint and leaves nothing
// behind; a deployment without an admin token asks for one.
func TestNoDeploymentNoFiles(t *testing.T) {
	t.Parallel()
	parent := t.TempDir()
	typo := filepath.Join(parent, "dtaa")
	c := cli{t: t, env: map[string]string{"HOME": t.TempDir()}}
	for _, args := range [][]string{
		{"sites", "list", "--data-dir", typo},
		{"join-tokens", "create", "--pool", "default", "--data-dir", typo},
		{"nodes", "list", "--data-dir", typo},
		{"audit", "list", "--data-dir", typo},
		{"pki", "issue-gateway", "--dns", "gw.example.com", "--out-dir", t.TempDir(), "--data-dir", typo},
		{"doctor", "--data-dir", typo},
	} {
		c.fails(1, "no deployment in "+typo+" (no state.db): start one with `better-compute serve`", args...)
	}
	if entries, err := os.ReadDir(parent); err != nil || len(entries) != 0 {
		t.Fatalf("a mistyped --data-dir left %v behind (%v)", entries, err)
	}
	c.fails(exitUsage, "no API token: give --token", "sites", "list", "--data-dir", deploymentDir(t, ""))
}

// TestUnauthenticatedNamesServerAndToken: an UNAUTHENTICATED answer names
// the server and where the token came from.
func TestUnauthenticatedNamesServerAndToken(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(api.New(api.Config{Secret: strings.Repeat("s", 32)}, sqlitetest.Open(t), nil).Handler())
	t.Cleanup(srv.Close)
	dir := deploymentDir(t, "bcat_stale")
	c := cli{t: t, env: map[string]string{"HOME": t.TempDir(), config.EnvDataDir: dir}}
	c.fails(1, "UNAUTHENTICATED: unknown token (server "+srv.URL+"/api from --server; token from --token)",
		"sites", "list", "--server", srv.URL, "--token", "bcat_wrong")
	c.with(envURL, srv.URL, envToken, "bcat_wrong").fails(1, "(server "+srv.URL+"/api from "+envURL+"; token from "+envToken+")",
		"nodes", "list")
	c.fails(1, "token from "+filepath.Join(dir, serve.AdminTokenFile)+")", "audit", "list", "--server", srv.URL)
	// Other errors are left as they are.
	if _, _, errOut := c.run("sites", "list", "--server", srv.URL, "--token", "bcat_wrong", "-o", "yaml"); strings.Contains(errOut, "token from") {
		t.Fatalf("a usage error names the token's source: %s", errOut)
	}
	if err := (&env{api: &apiTarget{}}).explain(errors.New("x")); err.Error() != "x" {
		t.Fatalf("explain changed a plain error: %v", err)
	}
}
