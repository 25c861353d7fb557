package doctor

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/better-compute/better-compute/controlplane/bootstrap"
	"github.com/better-compute/better-compute/controlplane/config"
)

// A serve started with --public-url serves HTTPS although no file says so:
// doctor judges the API by the URL that serve recorded, not by the file.
func TestAPIConfigFollowsTheRunningServe(t *testing.T) {
	dir := t.TempDir()
	c := &config.Config{DataDir: dir, RolesList: []string{"all"}}
	c.Host.Listen = "0.0.0.0:3000"
	c.Host.TLS.Mode = config.TLSModeOff
	if a := apiConfig(c); a.TLSMode != config.TLSModeOff {
		t.Fatalf("nothing recorded: mode %s", a.TLSMode)
	}
	if err := os.WriteFile(filepath.Join(dir, bootstrap.APIURLFile), []byte("https://127.0.0.1:3000/api\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := apiConfig(c)
	if a.TLSMode != config.TLSModeAuto || a.CertFile != filepath.Join(dir, bootstrap.PKIDir, bootstrap.APICertFile) {
		t.Fatalf("a serve recorded https: %+v", a)
	}
}
