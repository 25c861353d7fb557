package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// writeKeyPair writes a self-signed certificate and its key as PEM files.
func writeKeyPair(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "api.test"},
		DNSNames: []string{"api.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "api.crt"), filepath.Join(dir, "api.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// host.tls files that do not load, and a gateway public URL that is not an
// origin, are configuration errors before anything starts.
func TestRefusedAtLoad(t *testing.T) {
	cert, key := writeKeyPair(t)
	_, otherKey := writeKeyPair(t)
	for _, tc := range []struct {
		name  string
		flags Flags
		key   string
	}{
		{"missing cert file", Flags{APITLSCert: "/nonexistent/api.crt", APITLSKey: key}, "host.tls"},
		{"key of another cert", Flags{APITLSCert: cert, APITLSKey: otherKey}, "host.tls"},
		{"cert as key", Flags{APITLSCert: cert, APITLSKey: cert}, "host.tls"},
		{"path", Flags{PublicURL: "https://h.example:8443/path"}, "host.gateway.publicURL"},
		{"credentials", Flags{PublicURL: "https://user:pw@h.example:8443"}, "host.gateway.publicURL"},
		{"query", Flags{PublicURL: "https://h.example:8443?x=1"}, "host.gateway.publicURL"},
		{"fragment", Flags{PublicURL: "https://h.example:8443#f"}, "host.gateway.publicURL"},
		{"no host", Flags{PublicURL: "https://:8443"}, "host.gateway.publicURL"},
		{"port out of range", Flags{PublicURL: "https://h.example:99999"}, "host.gateway.publicURL"},
		{"empty port", Flags{PublicURL: "https://h.example:"}, "host.gateway.publicURL"},
		{"not https", Flags{PublicURL: "ftp://h.example"}, "host.gateway.publicURL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load("", env(map[string]string{"HOME": t.TempDir()}), tc.flags)
			var ce *Error
			if !errors.As(err, &ce) || ce.Key != tc.key {
				t.Fatalf("err = %v, want a config error naming %s", err, tc.key)
			}
		})
	}
	if c, err := Load("", env(map[string]string{"HOME": t.TempDir()}), Flags{PublicURL: "https://[fd99::1]:8443/"}); err != nil ||
		c.Host.Gateway.PublicURL != "https://[fd99::1]:8443" {
		t.Fatalf("an IPv6 origin with a trailing slash: %v %+v", err, c)
	}
}

func TestPublicURLDefaults(t *testing.T) {
	c, err := Load("", env(map[string]string{"HOME": "/home/x"}), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Host.TLS.Mode != TLSModeOff || c.Host.PublicURL != "http://localhost:3000" || c.APIScheme() != "http" {
		t.Fatalf("no public URL: tls %q, API public URL %q; want off and http://localhost:3000 (dev and the tests stay on plain HTTP)", c.Host.TLS.Mode, c.Host.PublicURL)
	}

	// A public URL off loopback turns HTTPS on, and the API's public URL
	// is the same host on host.listen's port.
	c, err = Load("", env(map[string]string{"HOME": "/home/x"}), Flags{PublicURL: "https://compute.example.com:8443"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Host.Gateway.PublicURL != "https://compute.example.com:8443" || c.Host.TLS.Mode != TLSModeAuto ||
		c.Host.PublicURL != "https://compute.example.com:3000" {
		t.Fatalf("public URL: gateway %q, tls %q, API %q", c.Host.Gateway.PublicURL, c.Host.TLS.Mode, c.Host.PublicURL)
	}
	if got := c.PublicHosts(); !slices.Equal(got, []string{"compute.example.com"}) {
		t.Fatalf("public hosts %v", got)
	}

	// Loopback names keep plain HTTP unless asked.
	for _, u := range []string{"https://localhost:8443", "https://127.0.0.2:8443", "https://[::1]:8443", "https://a.localhost:8443"} {
		c, err := Load("", env(nil), Flags{PublicURL: u})
		if err != nil || c.Host.TLS.Mode != TLSModeOff {
			t.Errorf("%s: tls %q, %v; want off", u, c.Host.TLS.Mode, err)
		}
	}
	c, err = Load("", env(nil), Flags{PublicURL: "https://127.0.0.2:8443", APITLS: "auto", Listen: "127.0.0.2:0"})
	if err != nil || c.Host.TLS.Mode != TLSModeAuto || c.Host.PublicURL != "" || c.APIPublicHost() != "127.0.0.2" {
		t.Fatalf("explicit auto on port 0: %+v %v; want auto, the public URL left to the bound port", c.Host, err)
	}

	// host.publicURL says otherwise: a proxy in front.
	path := writeFile(t, "host:\n  publicURL: https://api.example.com/\n  tls:\n    mode: off\n")
	c, err = Load(path, env(nil), Flags{PublicURL: "https://gw.example.com:443"})
	if err != nil || c.Host.PublicURL != "https://api.example.com" || c.Host.TLS.Mode != TLSModeOff {
		t.Fatalf("host.publicURL: %+v %v", c.Host, err)
	}
	if got := c.PublicHosts(); !slices.Equal(got, []string{"api.example.com", "gw.example.com"}) {
		t.Fatalf("public hosts %v", got)
	}

	// Cert and key alone mean mode files.
	cert, key := writeKeyPair(t)
	c, err = Load("", env(nil), Flags{APITLSCert: cert, APITLSKey: key})
	if err != nil || c.Host.TLS.Mode != TLSModeFiles || c.Host.PublicURL != "https://localhost:3000" {
		t.Fatalf("files: %+v %v", c.Host, err)
	}
}

func TestPublicURLEnvAndFlags(t *testing.T) {
	path := writeFile(t, `
host:
  gateway:
    listen: 10.0.0.1:8443
    publicURL: https://file.example.com:8443
  tls:
    mode: off
downloads:
  releasePins: [sha256/aGVsbG8gd29ybGQgaGVsbG8gd29ybGQ]
`)
	c, err := Load(path, env(nil), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Host.Gateway.Listen != "10.0.0.1:8443" || c.Host.Gateway.PublicURL != "https://file.example.com:8443" ||
		c.Host.TLS.Mode != TLSModeOff || len(c.Downloads.ReleasePins) != 1 || c.Host.PublicURL != "http://file.example.com:3000" {
		t.Fatalf("file: %+v %+v", c.Host, c.Downloads)
	}
	envCert, envKey := writeKeyPair(t)
	e := env(map[string]string{EnvPublicURL: "https://env.example.com:9443", EnvGatewayListen: "10.0.0.2:9443",
		EnvAPITLS: "files", EnvAPITLSCert: envCert, EnvAPITLSKey: envKey})
	c, err = Load(path, e, Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Host.Gateway.Listen != "10.0.0.2:9443" || c.Host.Gateway.PublicURL != "https://env.example.com:9443" ||
		c.Host.TLS != (APITLS{Mode: TLSModeFiles, Cert: envCert, Key: envKey}) {
		t.Fatalf("env: %+v", c.Host)
	}
	c, err = Load(path, e, Flags{PublicURL: "https://flag.example.com:7443", GatewayListen: "10.0.0.3:7443", APITLS: "auto"})
	if err == nil {
		t.Fatalf("auto with the env's cert and key loaded: %+v", c.Host)
	}
	c, err = Load(path, env(map[string]string{EnvPublicURL: "https://env.example.com:9443"}),
		Flags{PublicURL: "https://flag.example.com:7443", GatewayListen: "10.0.0.3:7443", APITLS: "auto"})
	if err != nil || c.Host.Gateway.Listen != "10.0.0.3:7443" || c.Host.Gateway.PublicURL != "https://flag.example.com:7443" ||
		c.Host.TLS.Mode != TLSModeAuto || c.Host.PublicURL != "https://flag.example.com:3000" {
		t.Fatalf("flags: %+v %v", c.Host, err)
	}
}

func TestPublicURLRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    Flags
		file string
		key  string
	}{
		{"http gateway URL", Flags{PublicURL: "http://gw.example.com:8443"}, "", "host.gateway.publicURL"},
		{"no host", Flags{PublicURL: "https://"}, "", "host.gateway.publicURL"},
		{"bad gateway listen", Flags{GatewayListen: "gw.example.com"}, "", "host.gateway.listen"},
		{"unknown tls mode", Flags{APITLS: "on"}, "", "host.tls.mode"},
		{"files without key", Flags{APITLS: "files", APITLSCert: "/a.crt"}, "", "host.tls"},
		{"cert with off", Flags{APITLS: "off", APITLSCert: "/a.crt", APITLSKey: "/a.key"}, "", "host.tls"},
		{"API public URL with a path", Flags{}, "host:\n  publicURL: https://api.example.com/api\n", "host.publicURL"},
		{"API public URL not http", Flags{}, "host:\n  publicURL: ftp://api.example.com\n", "host.publicURL"},
		{"bad release pin", Flags{}, "downloads:\n  releasePins: [abc]\n", "downloads.releasePins[0]"},
		{"unknown tls key", Flags{}, "host:\n  tls:\n    mod: auto\n", "host.tls.mod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			if tc.file != "" {
				path = writeFile(t, tc.file)
			}
			_, err := Load(path, env(nil), tc.f)
			var ce *Error
			if !errors.As(err, &ce) || ce.Key != tc.key {
				t.Fatalf("err = %v, want a config error for %s", err, tc.key)
			}
			if tc.key == "file" && !strings.Contains(err.Error(), "mod") {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

func TestIsLoopbackHost(t *testing.T) {
	for h, want := range map[string]bool{"localhost": true, "LOCALHOST.": true, "x.localhost": true, "127.0.0.1": true,
		"127.1.2.3": true, "::1": true, "0.0.0.0": false, "192.0.2.1": false, "compute.example.com": false, "localhost.example.com": false, "": false} {
		if got := IsLoopbackHost(h); got != want {
			t.Errorf("IsLoopbackHost(%q) = %v, want %v", h, got, want)
		}
	}
}
