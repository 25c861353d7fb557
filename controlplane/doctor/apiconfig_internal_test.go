package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
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

// dev listens on 127.0.0.1 whatever host.listen's default says: doctor
// judges plain HTTP by the address the running API recorded (issue 41),
// and warns when that one is every address although the file says
// loopback.
func TestAPIConfigListensWhereTheServeRecorded(t *testing.T) {
	dir := t.TempDir()
	c := &config.Config{DataDir: dir, RolesList: []string{"all"}}
	c.Host.Listen = "0.0.0.0:3000"
	c.Host.TLS.Mode = config.TLSModeOff
	if r := APITLS(apiConfig(c), time.Now()); r.Status != Warn {
		t.Fatalf("nothing recorded, host.listen 0.0.0.0: %+v, want warn", r)
	}
	record := func(addr string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, bootstrap.APIListenFile), []byte(addr+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	record("127.0.0.1:3000")
	if r := APITLS(apiConfig(c), time.Now()); r.Status != OK || !strings.Contains(r.Detail, bootstrap.APIListenFile) {
		t.Fatalf("dev recorded 127.0.0.1:3000: %+v, want ok naming the record", r)
	}
	c.Host.Listen = "127.0.0.1:3000"
	record("[::]:3000")
	if r := APITLS(apiConfig(c), time.Now()); r.Status != Warn || !strings.Contains(r.Hint, "[::]:3000") {
		t.Fatalf("host.listen 127.0.0.1 but the API recorded [::]:3000: %+v, want warn naming it", r)
	}
}
