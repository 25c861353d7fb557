package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "better-compute.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaults(t *testing.T) {
	c, err := Load("", env(map[string]string{"HOME": "/home/x", "XDG_DATA_HOME": ""}), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Embedded || !c.AllRoles() || c.BasePath != "/api" || c.Host.Listen != "0.0.0.0:3000" {
		t.Fatalf("defaults = %+v", c)
	}
	g := c.Host.Gateway
	if g.Listen != "0.0.0.0:8443" || g.PublicURL != "https://localhost:8443" {
		t.Fatalf("gateway defaults = %+v", g)
	}
	// The keys the gateway owns pass only what was set: the gateway fills
	// its own defaults (gateway.Config), so that they live in one place.
	if g.Region != "" || g.MaxStreams != 0 || g.HeartbeatInterval.Duration != 0 || g.MissedHeartbeats != 0 ||
		g.DrainDelay.Duration != 0 || g.NodeCertTTL.Duration != 0 || g.NodeLogInterval.Duration != 0 ||
		g.ClockSkewLimit.Duration != 0 || g.Limits != (GatewayLimits{}) {
		t.Fatalf("gateway keys not set = %+v, want them left unset for the gateway's defaults", g)
	}
	// The API's per-caller bounds (issue 28) pass unset: the API owns
	// their defaults (api.DefaultEventStreamsPerToken, …).
	if l := c.Host.Limits; l != (APILimits{}) {
		t.Fatalf("host.limits = %+v, want it unset", l)
	}
	if c.DataDir != DefaultDataDir(env(map[string]string{"HOME": "/home/x"})) {
		t.Fatalf("data dir = %s", c.DataDir)
	}
	// The waves' health gate and the rollouts' interval pass unset: the
	// health gate (healthgate.Params, 0 means its default) and the rollouts
	// reconciler own their defaults.
	if r := c.Rollouts; r.HealthGate != (HealthGate{}) || r.Interval.Duration != 0 {
		t.Fatalf("rollouts = %+v, want it unset", r)
	}
	if c.PKI.ReattestGrace == nil || c.PKI.ReattestGrace.Duration != 7*24*time.Hour {
		t.Fatalf("pki.reattestGrace default = %v, want 168h", c.PKI.ReattestGrace)
	}
	if !c.PKI.AutoRotates() || c.PKI.NodeCAValidity.Duration != 87600*time.Hour {
		t.Fatalf("pki.autoRotate, nodeCAValidity defaults = %v, %v, want true, 87600h", c.PKI.AutoRotates(), c.PKI.NodeCAValidity)
	}
	// "0s" is kept: it turns re-attestation off.
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("pki:\n  reattestGrace: 0s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = Load(path, env(map[string]string{"HOME": "/home/x"}), Flags{})
	if err != nil || c.PKI.ReattestGrace == nil || c.PKI.ReattestGrace.Duration != 0 {
		t.Fatalf("pki.reattestGrace: 0s = %v (%v), want 0", c.PKI.ReattestGrace, err)
	}
	// A node CA of two and a half minutes for one-minute certificates, and
	// no automatic rotation.
	if err := os.WriteFile(path, []byte("host:\n  gateway:\n    nodeCertTTL: 60s\npki:\n  autoRotate: false\n  nodeCAValidity: 150s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err = Load(path, env(map[string]string{"HOME": "/home/x"}), Flags{})
	if err != nil || c.PKI.AutoRotates() || c.PKI.NodeCAValidity.Duration != 150*time.Second {
		t.Fatalf("pki.autoRotate: false, nodeCAValidity: 150s = %+v (%v)", c.PKI, err)
	}
}

func TestPrecedenceFileEnvFlags(t *testing.T) {
	path := writeFile(t, `
database:
  url: postgres://file@127.0.0.1:5432/db
secret: file-secret-file-secret-file-secret-00
roles: [api]
dataDir: /from/file
host:
  listen: 127.0.0.1:3001
  gateway:
    heartbeatInterval: 5s
trustedProxies: ["10.0.0.0/8", "::ffff:192.0.2.1", "fd00::/8"]
`)
	c, err := Load(path, env(map[string]string{
		EnvDatabaseURL: "postgres://env@127.0.0.1:5432/db",
		EnvRoles:       "api, gateway",
	}), Flags{DataDir: "/from/flag"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Database.URL != "postgres://env@127.0.0.1:5432/db" || c.DataDir != "/from/flag" ||
		!c.Runs("gateway") || c.Runs("controllers") || c.Host.Gateway.HeartbeatInterval.Duration != 5*time.Second {
		t.Fatalf("config = %+v", c)
	}
	if len(c.ParsedProxies) != 3 || c.ParsedProxies[1].String() != "192.0.2.1/32" {
		t.Fatalf("proxies = %v", c.ParsedProxies)
	}
}

func TestInvalid(t *testing.T) {
	pg := map[string]string{EnvDatabaseURL: "postgres://u@127.0.0.1/db", EnvSecret: strings.Repeat("s", 32)}
	for _, tc := range []struct {
		name, file string
		env        map[string]string
		flags      Flags
		key        string
	}{
		{"unknown key", "databse:\n  url: x\n", nil, Flags{}, "databse"},
		{"unknown nested key", "host:\n  gateway:\n    listn: 1\n", nil, Flags{}, "host.gateway.listn"},
		{"unknown key in a list item", "sinks:\n  files:\n  - {name: a, pth: /x}\n", nil, Flags{}, "sinks.files[0].pth"},
		{"wrong type", "host:\n  gateway:\n    maxStreams: many\n", nil, Flags{}, "host.gateway.maxStreams"},
		{"unset variable", "secret: ${BC_TEST_UNSET}\n", nil, Flags{}, "secret"},
		{"not a variable name", "host:\n  metrics:\n    bearerToken: ${a random string}\n", nil, Flags{}, "host.metrics.bearerToken"},
		{"malformed YAML", "host: [\n", nil, Flags{}, "file"},
		{"short secret", "", map[string]string{EnvSecret: "too-short"}, Flags{}, "secret"},
		{"bad url", "", map[string]string{EnvDatabaseURL: "mysql://x"}, Flags{}, "database.url"},
		{"url without secret", "", map[string]string{EnvDatabaseURL: "postgres://u@127.0.0.1/db"}, Flags{}, "secret"},
		{"bad notify url", "", map[string]string{EnvDatabaseURL: "postgres://u@127.0.0.1/db", EnvSecret: strings.Repeat("s", 32), EnvDatabaseNotifyURL: "http://x"}, Flags{}, "database.notifyURL"},
		{"notify url without url", "database:\n  notifyURL: postgres://u@127.0.0.1/db\n", nil, Flags{}, "database.notifyURL"},
		{"bad listen", "", nil, Flags{Listen: "nope"}, "host.listen"},
		{"unknown role", "", pg, Flags{Roles: "api,web"}, "roles"},
		{"split roles on sqlite", "", nil, Flags{Roles: "api"}, "roles"},
		{"bad proxy", "trustedProxies: [\"10.0.0.0/33\"]\n", nil, Flags{}, "trustedProxies[0]"},
		{"bad duration", "host:\n  gateway:\n    drainDelay: soon\n", nil, Flags{}, "host.gateway.drainDelay"},
		{"negative streams per token", "host:\n  limits:\n    eventStreamsPerToken: -1\n", nil, Flags{}, "host.limits.eventStreamsPerToken"},
		{"negative body timeout", "host:\n  limits:\n    bodyReadTimeout: -1s\n", nil, Flags{}, "host.limits.bodyReadTimeout"},
		{"short metrics token", "host:\n  metrics:\n    bearerToken: abc\n", nil, Flags{}, "host.metrics.bearerToken"},
		{"pprof without token", "host:\n  metrics:\n    pprof: true\n", nil, Flags{}, "host.metrics.pprof"},
		{"metrics listener without token", "host:\n  metrics:\n    listen: 127.0.0.1:9464\n", nil, Flags{}, "host.metrics.listen"},
		{"metrics listener without port", "host:\n  metrics:\n    bearerToken: 0123456789abcdef\n    listen: localhost\n", nil, Flags{}, "host.metrics.listen"},
		{"webhook without secret", "sinks:\n  webhooks:\n  - {name: hook, url: https://h.example/x}\n", nil, Flags{}, "sinks.webhooks[0].secret"},
		{"duplicate sink", "sinks:\n  files:\n  - {name: a, path: /x}\n  - {name: a, path: /y}\n", nil, Flags{}, "sinks.files[1].name"},
		{"short retention", "retention:\n  audit: 1m\n", nil, Flags{}, "retention.audit"},
		{"short history", "retention:\n  history: 30m\n", nil, Flags{}, "retention.history"},
		{"negative heartbeat", "host:\n  gateway:\n    heartbeatInterval: -10s\n", nil, Flags{}, "host.gateway.heartbeatInterval"},
		{"one missed heartbeat", "host:\n  gateway:\n    missedHeartbeats: 1\n", nil, Flags{}, "host.gateway.missedHeartbeats"},
		{"port out of range", "", nil, Flags{Listen: "127.0.0.1:99999"}, "host.listen"},
		{"relative file sink", "sinks:\n  files:\n  - {name: a, path: events.jsonl}\n", nil, Flags{}, "sinks.files[0].path"},
		// A sink's tenant is its id, never a name another tenant could take.
		{"file sink's tenant by name", "sinks:\n  files:\n  - {name: a, path: /x, tenant: team-a}\n", nil, Flags{}, "sinks.files[0].tenant"},
		{"webhook's tenant by name", "sinks:\n  webhooks:\n  - {name: h, url: https://h.example/x, secret: 0123456789abcdef0123, tenant: team-a}\n", nil, Flags{}, "sinks.webhooks[0].tenant"},
		{"sink's tenant an empty id", "sinks:\n  files:\n  - {name: a, path: /x, tenant: ten_}\n", nil, Flags{}, "sinks.files[0].tenant"},
		{"sink's tenant an id with a dash", "sinks:\n  files:\n  - {name: a, path: /x, tenant: ten_a-b}\n", nil, Flags{}, "sinks.files[0].tenant"},
		{"negative re-attestation grace", "pki:\n  reattestGrace: -1h\n", nil, Flags{}, "pki.reattestGrace"},
		{"negative node CA life", "pki:\n  nodeCAValidity: -1h\n", nil, Flags{}, "pki.nodeCAValidity"},
		{"node CA life too short for its certificates", "host:\n  gateway:\n    nodeCertTTL: 60s\npki:\n  nodeCAValidity: 149s\n", nil, Flags{}, "pki.nodeCAValidity"},
		{"node CA life too short for the default certificates", "pki:\n  nodeCAValidity: 47h\n", nil, Flags{}, "pki.nodeCAValidity"},
		{"certificate life too short", "host:\n  gateway:\n    nodeCertTTL: 1s\n", nil, Flags{}, "host.gateway.nodeCertTTL"},
		{"health gate alpha of 1", "rollouts:\n  healthGate:\n    alpha: 1\n", nil, Flags{}, "rollouts.healthGate.alpha"},
		{"negative health gate excess", "rollouts:\n  healthGate:\n    minExcess: -2\n", nil, Flags{}, "rollouts.healthGate.minExcess"},
		{"negative health gate node-hours", "rollouts:\n  healthGate:\n    minNodeHours: -1\n", nil, Flags{}, "rollouts.healthGate.minNodeHours"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			if tc.file != "" {
				path = writeFile(t, tc.file)
			}
			m := map[string]string{"HOME": t.TempDir()}
			for k, v := range tc.env {
				m[k] = v
			}
			_, err := Load(path, env(m), tc.flags)
			var ce *Error
			if !errors.As(err, &ce) || ce.Key != tc.key {
				t.Fatalf("err = %v, want a config error naming %q", err, tc.key)
			}
		})
	}
}

// TestSinkTenantByID: a sink's tenant is a tenant's id, ten_… or root.
func TestSinkTenantByID(t *testing.T) {
	for _, id := range []string{"ten_abc234xyz", "root"} {
		path := writeFile(t, "sinks:\n  files:\n  - {name: a, path: /x, tenant: "+id+"}\n")
		c, err := Load(path, env(map[string]string{"HOME": t.TempDir()}), Flags{})
		if err != nil || len(c.Sinks.Files) != 1 || c.Sinks.Files[0].Tenant != id {
			t.Errorf("tenant %s: %+v, %v", id, c, err)
		}
	}
}

func TestMissingFileNamesFlag(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "absent.yaml"), env(map[string]string{}), Flags{})
	var ce *Error
	if !errors.As(err, &ce) || ce.Key != "--config" {
		t.Fatalf("err = %v, want a config error naming --config", err)
	}
}

// TestNotifyURL: database.notifyURL from the file, the environment over
// it, and database.url where gateways LISTEN without it.
func TestNotifyURL(t *testing.T) {
	pg := map[string]string{EnvDatabaseURL: "postgres://pool@127.0.0.1:6432/db", EnvSecret: strings.Repeat("s", 32)}
	c, err := Load("", env(pg), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Database.NotifyURL != "" || c.Database.ListenURL() != pg[EnvDatabaseURL] {
		t.Fatalf("without notifyURL: %q, listen on %q; want database.url", c.Database.NotifyURL, c.Database.ListenURL())
	}
	path := writeFile(t, "database:\n  notifyURL: postgres://file@127.0.0.1:5432/db\n")
	if c, err = Load(path, env(pg), Flags{}); err != nil || c.Database.ListenURL() != "postgres://file@127.0.0.1:5432/db" {
		t.Fatalf("from the file: %+v, %v", c, err)
	}
	pg[EnvDatabaseNotifyURL] = "postgres://env@127.0.0.1:5432/db"
	if c, err = Load(path, env(pg), Flags{}); err != nil || c.Database.ListenURL() != "postgres://env@127.0.0.1:5432/db" {
		t.Fatalf("from the environment: %+v, %v", c, err)
	}
}

// TestEmbeddedSecretModes: an existing data directory and secret file with
// wider modes are tightened to 0700 and 0600.
func TestEmbeddedSecretModes(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, SecretFile)
	if err := os.WriteFile(path, []byte(strings.Repeat("x", 40)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load("", env(map[string]string{}), Flags{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureEmbeddedSecret(); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{dir: 0o700, path: 0o600} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want mode %o", p, fi.Mode().Perm(), err, want)
		}
	}
}

func TestEmbeddedSecretGeneratedOnce(t *testing.T) {
	dir := t.TempDir()
	c, err := Load("", env(map[string]string{}), Flags{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureEmbeddedSecret(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, SecretFile))
	if err != nil || fi.Mode().Perm() != 0o600 || len(c.Secret) < MinSecretLen {
		t.Fatalf("secret file %v %v, secret %d chars", fi, err, len(c.Secret))
	}
	c2, _ := Load("", env(map[string]string{}), Flags{DataDir: dir})
	if err := c2.EnsureEmbeddedSecret(); err != nil || c2.Secret != c.Secret {
		t.Fatalf("second start read a different secret (%v)", err)
	}
}

func FuzzLoad(f *testing.F) {
	f.Add("host:\n  listen: 127.0.0.1:1\n")
	f.Add("roles: [all]\ntrustedProxies: [\"::1\"]\n")
	f.Fuzz(func(t *testing.T, body string) {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(p, env(map[string]string{"HOME": "/nonexistent"}), Flags{})
		if err == nil && c.Host.Listen == "" {
			t.Fatal("loaded config without defaults")
		}
	})
}

// ${NAME} in any value expands from the environment before the value is
// read; $${ is a literal ${.
func TestExpandEnvironment(t *testing.T) {
	secret := strings.Repeat("k", 40)
	path := writeFile(t, "secret: ${BC_SECRET}\nhost:\n  metrics:\n    bearerToken: \"tok-${BC_PART}-$${literal}\"\n  gateway:\n    maxStreams: ${BC_STREAMS}\n")
	c, err := Load(path, env(map[string]string{"HOME": t.TempDir(), "BC_SECRET": secret, "BC_PART": "abcdefghijklmnop", "BC_STREAMS": "42"}), Flags{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Secret != secret || c.Host.Metrics.BearerToken != "tok-abcdefghijklmnop-${literal}" || c.Host.Gateway.MaxStreams != 42 {
		t.Fatalf("secret %q, bearerToken %q, maxStreams %d", c.Secret, c.Host.Metrics.BearerToken, c.Host.Gateway.MaxStreams)
	}
}

// TestListenHostPortFlags: --host and --port replace only their part of
// host.listen, over the file, the dev defaults or the built-in default
// (issue 41); --gateway-port only the gateway's port.
func TestListenHostPortFlags(t *testing.T) {
	file := writeFile(t, "host:\n  listen: 127.0.0.1:23100\n  gateway:\n    listen: 10.0.0.5:8443\n")
	e := env(map[string]string{"HOME": "/home/x"})
	for _, tc := range []struct {
		name, path             string
		flags                  Flags
		wantListen, wantGWList string
	}{
		{"port keeps the file's host", file, Flags{ListenPort: "23101"}, "127.0.0.1:23101", "10.0.0.5:8443"},
		{"host keeps the file's port", file, Flags{ListenHost: "::1"}, "[::1]:23100", "10.0.0.5:8443"},
		{"both", file, Flags{ListenHost: "0.0.0.0", ListenPort: "0"}, "0.0.0.0:0", "10.0.0.5:8443"},
		{"gateway port keeps its host", file, Flags{GatewayListenPort: "9443"}, "127.0.0.1:23100", "10.0.0.5:9443"},
		{"the file wins over dev's defaults", file, Flags{DefaultListen: "127.0.0.1:3000", DefaultGatewayListen: "127.0.0.1:8443"}, "127.0.0.1:23100", "10.0.0.5:8443"},
		{"dev's defaults without a file", "", Flags{DefaultListen: "127.0.0.1:3000", DefaultGatewayListen: "127.0.0.1:8443", ListenPort: "0"}, "127.0.0.1:0", "127.0.0.1:8443"},
		{"port over the built-in default", "", Flags{ListenPort: "4000"}, "0.0.0.0:4000", "0.0.0.0:8443"},
		{"Listen whole, then the port", "", Flags{Listen: "192.0.2.1:1", ListenPort: "2"}, "192.0.2.1:2", "0.0.0.0:8443"},
	} {
		c, err := Load(tc.path, e, tc.flags)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.Host.Listen != tc.wantListen || c.Host.Gateway.Listen != tc.wantGWList {
			t.Errorf("%s: host.listen %s, host.gateway.listen %s; want %s and %s", tc.name, c.Host.Listen, c.Host.Gateway.Listen, tc.wantListen, tc.wantGWList)
		}
	}
	bad := writeFile(t, "host:\n  listen: nonsense\n")
	var ce *Error
	if _, err := Load(bad, e, Flags{ListenPort: "1"}); !errors.As(err, &ce) || ce.Key != "host.listen" {
		t.Fatalf("--port over host.listen: nonsense = %v, want an error naming host.listen", err)
	}
}
