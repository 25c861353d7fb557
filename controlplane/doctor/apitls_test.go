package doctor_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/doctor"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
)

func TestAPITLS(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b, err := pki.Init(pki.InitOptions{TrustDomain: "example.com"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert, key, _, err := bootstrap.EnsureServingCert(b, dir, bootstrap.APICertFile, bootstrap.APIKeyFile,
		bootstrap.Names{DNS: []string{"compute.example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	plain := doctor.APIConfig{Enabled: true, TLSMode: config.TLSModeOff}
	files := doctor.APIConfig{Enabled: true, TLSMode: config.TLSModeFiles, CertFile: cert, KeyFile: key, PublicURL: "https://compute.example.com:3000"}
	missing := files
	missing.CertFile = filepath.Join(dir, "nope.crt")
	unreadable := filepath.Join(dir, "garbage.crt")
	if err := os.WriteFile(unreadable, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	garbage := files
	garbage.CertFile = unreadable
	auto := doctor.APIConfig{Enabled: true, TLSMode: config.TLSModeAuto, CertFile: missing.CertFile, KeyFile: key}
	otherName := files
	otherName.PublicURL = "https://other.example.com:3000"

	for _, tc := range []struct {
		name string
		cfg  doctor.APIConfig
		at   time.Time
		st   doctor.Status
		hint string
	}{
		{"plain on loopback", with(plain, "127.0.0.1:3000"), now, doctor.OK, "loopback only"},
		{"plain on every address", with(plain, "0.0.0.0:3000"), now, doctor.Warn, "clear text"},
		{"plain on a LAN address", with(plain, "192.0.2.1:3000"), now, doctor.Warn, "--api-tls auto"},
		{"plain behind a TLS proxy", func() doctor.APIConfig {
			c := with(plain, "0.0.0.0:3000")
			c.PublicURL = "https://api.example.com"
			return c
		}(), now, doctor.OK, "terminate TLS"},
		{"files", files, now, doctor.OK, "serves HTTPS"},
		{"files missing", missing, now, doctor.Fail, "cannot load"},
		{"files unreadable", garbage, now, doctor.Fail, "cannot load"},
		{"auto before the first start", auto, now, doctor.OK, "first start"},
		{"expired", files, now.Add(400 * 24 * time.Hour), doctor.Fail, "expired"},
		{"ending soon", files, now.Add(350 * 24 * time.Hour), doctor.Warn, "ends in"},
		{"not yet valid", files, now.Add(-2 * time.Hour), doctor.Fail, "not valid yet"},
		{"names another host", otherName, now, doctor.Warn, "does not name other.example.com"},
		{"no api role", doctor.APIConfig{}, now, doctor.OK, "no api role"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want(t, doctor.APITLS(tc.cfg, tc.at), doctor.IDAPITLS, tc.st, tc.hint)
		})
	}
}

func with(c doctor.APIConfig, listen string) doctor.APIConfig {
	c.Listen = listen
	return c
}
