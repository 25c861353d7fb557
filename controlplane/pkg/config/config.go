// Package config loads the one configuration every control-plane process
// reads: a YAML file (--config), then environment variables over it, then
// flags over both (DESIGN.md, "Operator CLI"). Unknown keys, a short secret,
// a malformed URL or address are errors that name the key.
package config

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
)

// Environment variables read over the file.
const (
	EnvDatabaseURL  = "BETTER_COMPUTE_DATABASE_URL"
	EnvSecret       = "BETTER_COMPUTE_SECRET"
	EnvRoles        = "BETTER_COMPUTE_ROLES"
	EnvDataDir      = "BETTER_COMPUTE_DATA_DIR"
	EnvDownloadsDir = "BETTER_COMPUTE_DOWNLOADS_DIR"
	EnvDownloadsURL = "BETTER_COMPUTE_DOWNLOADS_URL"
	// EnvPublicURL is host.gateway.publicURL (serve --public-url).
	EnvPublicURL = "BETTER_COMPUTE_PUBLIC_URL"
	// EnvGatewayListen is host.gateway.listen (serve --gateway-listen).
	EnvGatewayListen = "BETTER_COMPUTE_GATEWAY_LISTEN"
	// EnvAPITLS, EnvAPITLSCert and EnvAPITLSKey are host.tls.mode, .cert
	// and .key (serve --api-tls, --api-tls-cert, --api-tls-key).
	EnvAPITLS     = "BETTER_COMPUTE_API_TLS"
	EnvAPITLSCert = "BETTER_COMPUTE_API_TLS_CERT"
	EnvAPITLSKey  = "BETTER_COMPUTE_API_TLS_KEY"
)

// API TLS modes (host.tls.mode).
const (
	// TLSModeOff serves the API over plain HTTP.
	TLSModeOff = "off"
	// TLSModeAuto serves HTTPS with a certificate issued from the gateway
	// serving CA into DataDir/pki (api.crt, api.key).
	TLSModeAuto = "auto"
	// TLSModeFiles serves HTTPS with host.tls.cert and host.tls.key.
	TLSModeFiles = "files"
)

// EnvDatabaseNotifyURL is database.notifyURL, read over the file.
const EnvDatabaseNotifyURL = "BETTER_COMPUTE_DATABASE_NOTIFY_URL"

// MinNodeCertTTL is the shortest host.gateway.nodeCertTTL accepted.
const MinNodeCertTTL = 10 * time.Second

// MinSecretLen is the shortest deployment secret accepted (DESIGN.md, "PKI").
const MinSecretLen = 32

// Roles a process can run (DESIGN.md, "The control plane roles").
var Roles = []string{"api", "gateway", "controllers", "scheduler", "sinks", "iam"}

// Config is the whole configuration. Zero values are filled with the
// defaults documented on each field by Load.
type Config struct {
	// Database selects the store. An empty URL means the embedded SQLite
	// database in DataDir/state.db.
	Database Database `yaml:"database"`
	// Secret is the deployment secret (at least 32 characters, the same for
	// every process). The embedded default generates one into DataDir.
	Secret string `yaml:"secret"`
	// DataDir holds the embedded database, the generated secret and the
	// embedded PKI files. Defaults to /var/lib/better-compute as root,
	// $XDG_DATA_HOME/better-compute (or ~/.local/share/better-compute)
	// otherwise.
	DataDir string `yaml:"dataDir"`
	// RolesList is the roles this process runs; "all" (the default) is
	// every role.
	RolesList []string `yaml:"roles"`
	// BasePath prefixes the API's routes. Defaults to /api.
	BasePath string `yaml:"basePath"`
	// TrustedProxies lists the load balancers (addresses or CIDRs) whose
	// X-Forwarded-For is believed. Defaults to none.
	TrustedProxies []string `yaml:"trustedProxies"`
	// Host configures what serve runs around the control plane.
	Host Host `yaml:"host"`
	// Downloads serves bcd binaries to air-gapped sites.
	Downloads Downloads `yaml:"downloads"`
	// Sinks receive the outbox (webhooks, files).
	Sinks Sinks `yaml:"sinks"`
	// Retention bounds how long finished work is kept.
	Retention Retention `yaml:"retention"`
	// PKI configures node identities over time.
	PKI PKI `yaml:"pki"`
	// Remediation is closed-loop GPU remediation (docs/remediation.md).
	Remediation Remediation `yaml:"remediation"`
	// Rollouts is the rollout reconciler (docs/rollouts.md).
	Rollouts Rollouts `yaml:"rollouts"`
	// GPUHealth are the thresholds of bcd's GPU health readers, sent to
	// nodes in Welcome (docs/gpu-health.md).
	GPUHealth GPUHealth `yaml:"gpuHealth"`
	// IAM is how people sign in (docs/sso.md).
	IAM IAM `yaml:"iam"`

	// ParsedProxies is TrustedProxies parsed; filled by Load.
	ParsedProxies []netip.Prefix `yaml:"-"`
	// Embedded reports that the store is the embedded SQLite default.
	Embedded bool `yaml:"-"`
}

// Database configures the store.
type Database struct {
	// URL is a postgres:// URL; empty selects embedded SQLite.
	URL string `yaml:"url"`
	// NotifyURL is the postgres:// URL of a direct connection to the same
	// database (no transaction-pooling proxy between) that gateways LISTEN
	// on for wake-ups; NOTIFY still goes through URL. Defaults to URL. Set
	// it when URL goes through PgBouncer in transaction mode, which loses
	// LISTEN (docs/scaling.md).
	NotifyURL string `yaml:"notifyURL"`
}

// ListenURL is the URL gateways LISTEN on: NotifyURL, or URL without it.
func (d Database) ListenURL() string {
	if d.NotifyURL != "" {
		return d.NotifyURL
	}
	return d.URL
}

// Host configures the serve host.
type Host struct {
	// Listen is the API's HTTP address. Defaults to 0.0.0.0:3000.
	Listen string `yaml:"listen"`
	// PublicURL is the API's origin as other machines reach it
	// (https://compute.example.com:3000, no path): the install command of
	// nodes add and the install script's downloads use it. Defaults to the
	// host of host.gateway.publicURL on host.listen's port, https when
	// host.tls serves TLS, else http (docs/configuration.md).
	PublicURL string `yaml:"publicURL"`
	// TLS makes the API serve HTTPS.
	TLS APITLS `yaml:"tls"`
	// Gateway configures the gateway role.
	Gateway Gateway `yaml:"gateway"`
	// Metrics configures GET /metrics.
	Metrics Metrics `yaml:"metrics"`
	// Limits bounds what one API caller holds (issue 28).
	Limits APILimits `yaml:"limits"`
	// Processes configures this process's row in the processes table
	// (issue 40; docs/upgrade-control-plane.md).
	Processes Processes `yaml:"processes"`
}

// Processes configures how a process registers in the processes table,
// whatever its roles.
type Processes struct {
	// HeartbeatInterval is how often the process refreshes its row.
	// Defaults to 5 s; 100 ms to 1 min.
	HeartbeatInterval Duration `yaml:"heartbeatInterval"`
	// PruneAfter is how long a row may go without a heartbeat before
	// any live process deletes it (a process killed without warning).
	// Defaults to 1 min; at least 3 heartbeat intervals, at most 24 h.
	PruneAfter Duration `yaml:"pruneAfter"`
}

// APILimits bounds what one API caller holds at once; past a cap the API
// answers RESOURCE_EXHAUSTED (429 with Retry-After). Zero takes the
// default.
type APILimits struct {
	// EventStreamsPerToken caps the event streams (events/watch) one token
	// holds open. Defaults to 16.
	EventStreamsPerToken int `yaml:"eventStreamsPerToken"`
	// InFlightPerToken caps the API calls one token has in flight.
	// Defaults to 64.
	InFlightPerToken int `yaml:"inFlightPerToken"`
	// BodyReadTimeout bounds how long a request's whole body may take to
	// arrive; a slower one is cut. Defaults to 30 s.
	BodyReadTimeout Duration `yaml:"bodyReadTimeout"`
}

// Gateway configures the gateway role.
type Gateway struct {
	// Listen is the gRPC address. Defaults to 0.0.0.0:8443.
	Listen string `yaml:"listen"`
	// PublicURL is what daemons dial (https://host:port). Defaults to
	// https://localhost:<port of Listen> (the bound port when Listen's is 0).
	PublicURL string `yaml:"publicURL"`
	// Region is the gateway's region (sites.region). Defaults to "default".
	Region string `yaml:"region"`
	// TLSFiles names the serving certificate and key (from pki
	// issue-gateway); re-read every 60 s. The embedded default makes them in
	// DataDir/pki.
	TLSFiles TLSFiles `yaml:"tlsFiles"`
	// MaxStreams caps sessions on one gateway. Defaults to 5,000.
	MaxStreams int `yaml:"maxStreams"`
	// HeartbeatInterval is the interval told to daemons. Defaults to 10 s.
	HeartbeatInterval Duration `yaml:"heartbeatInterval"`
	// MissedHeartbeats is how many heartbeat intervals without a heartbeat
	// make a node unreachable (the liveness window is MissedHeartbeats ×
	// HeartbeatInterval). Defaults to 3; at least 2.
	MissedHeartbeats int `yaml:"missedHeartbeats"`
	// DrainDelay is the most a daemon waits before reconnecting elsewhere
	// after Drain. Defaults to 60 s.
	DrainDelay Duration `yaml:"drainDelay"`
	// NodeCertTTL is the life of node certificates. Defaults to 24 h.
	NodeCertTTL Duration `yaml:"nodeCertTTL"`
	// ClockSkewLimit is the node clock skew (either way, measured from its
	// heartbeats) past which a ready node is clock-skewed: it takes no new
	// commands and counts against its pool's disruption budget until its
	// clock is back within the limit (issue 36). Defaults to 5 min.
	ClockSkewLimit Duration `yaml:"clockSkewLimit"`
	// NodeLogInterval is the least time between two log lines of one kind
	// about one node's session (events dropped for their rate, an
	// inventory refused); the next line counts those dropped meanwhile.
	// Defaults to 1 min.
	NodeLogInterval Duration `yaml:"nodeLogInterval"`
	// Limits bounds what one source address can hold of the gateway
	// (issue 28).
	Limits GatewayLimits `yaml:"limits"`
	// Internal configures the internal control API (docs/tunnels.md).
	Internal InternalAPI `yaml:"internal"`
	// Tunnels configures shells and port forwards (docs/tunnels.md).
	Tunnels Tunnels `yaml:"tunnels"`
	// WS configures the WebSocket fallback (docs/websocket.md); off unless
	// ws.publicURL is set.
	WS WebSocketFallback `yaml:"ws"`
}

// GatewayLimits bounds the connections in setup (accepted, until the TLS
// handshake and Hello are done) and the Join calls, per source address and
// in all, so that junk from one address cannot starve the nodes of others.
// Zero takes the default.
type GatewayLimits struct {
	// PendingPerSource caps the connections of one source address in setup
	// at once. Defaults to 8.
	PendingPerSource int `yaml:"pendingPerSource"`
	// Pending caps the connections in setup at once in all. Defaults to
	// 256.
	Pending int `yaml:"pending"`
	// QueuedPerSource caps the connections of one source address waiting
	// for one of its setup slots (nodes behind one NAT address); past it a
	// new one is closed. Defaults to 64.
	QueuedPerSource int `yaml:"queuedPerSource"`
	// Queued caps the connections waiting for a setup slot in all; past it
	// the gateway stops accepting until some leave. Defaults to 4,096.
	Queued int `yaml:"queued"`
	// HandshakesPerSecond is how many new connections the gateway admits
	// (starts setting up) a second, in all: the rate a fleet comes back at
	// after a restart, and what its Welcome's reconnect window is sized by
	// (sessions held over this rate). Defaults to 500.
	HandshakesPerSecond float64 `yaml:"handshakesPerSecond"`
	// HandshakeTimeout bounds a new connection's TLS handshake, and a new
	// session's wait for Hello. Defaults to 5 s.
	HandshakeTimeout Duration `yaml:"handshakeTimeout"`
	// JoinsPerSecond caps the Join calls of one source address; past it
	// (and JoinBurst) a Join is refused with RESOURCE_EXHAUSTED and how long
	// to wait. Defaults to 10.
	JoinsPerSecond float64 `yaml:"joinsPerSecond"`
	// JoinBurst is how many Joins one source address may make at once
	// above JoinsPerSecond. Defaults to 20.
	JoinBurst int `yaml:"joinBurst"`
}

func (l *GatewayLimits) validate() error {
	for key, n := range map[string]int{"pendingPerSource": l.PendingPerSource, "pending": l.Pending,
		"queuedPerSource": l.QueuedPerSource, "queued": l.Queued, "joinBurst": l.JoinBurst} {
		if n < 0 {
			return &Error{Key: "host.gateway.limits." + key, Msg: "must be positive"}
		}
	}
	switch {
	case l.JoinsPerSecond < 0:
		return &Error{Key: "host.gateway.limits.joinsPerSecond", Msg: "must be positive"}
	case l.HandshakesPerSecond < 0:
		return &Error{Key: "host.gateway.limits.handshakesPerSecond", Msg: "must be positive"}
	case l.HandshakeTimeout.Duration < 0:
		return &Error{Key: "host.gateway.limits.handshakeTimeout", Msg: "must be positive"}
	case l.Pending > 0 && l.PendingPerSource > l.Pending:
		return &Error{Key: "host.gateway.limits.pendingPerSource", Msg: fmt.Sprintf("%d is more than pending (%d)", l.PendingPerSource, l.Pending)}
	}
	return nil
}

// InternalAPI configures the internal control API between control-plane
// processes (package control): the api wakes the gateway holding a node's
// session over it and pushes revocations. It is on when TLSFiles are set
// (both sides need a certificate of the internal CA, from pki
// issue-internal); without it gateways are woken by LISTEN/NOTIFY or their
// loop. The all-in-one process needs none: its api calls its gateway in
// memory.
type InternalAPI struct {
	// Listen is the gateway's TCP address for it. Defaults to :8444.
	Listen string `yaml:"listen"`
	// Address is the host:port other processes dial, advertised in the
	// gateway's row; its host must be named in the certificate. Defaults to
	// Listen's host and bound port, localhost when Listen's host is empty
	// or unspecified.
	Address string `yaml:"address"`
	// TLSFiles are this process's internal certificate and key (pki
	// issue-internal): the gateway serves with it, the api presents it as
	// a client; re-read every 60 s.
	TLSFiles TLSFiles `yaml:"tlsFiles"`
}

// Tunnels configures shells and port forwards to nodes.
type Tunnels struct {
	// IdleTimeout closes a tunnel through which nothing passed for that
	// long. Defaults to 15 min.
	IdleTimeout Duration `yaml:"idleTimeout"`
	// Recording configures the recording of every shell (docs/tunnels.md,
	// "Recorded shells").
	Recording TunnelRecording `yaml:"recording"`
}

// Values of TunnelRecording.OnFailure.
const (
	// RecordingOnFailureClose closes a shell whose recording fails.
	RecordingOnFailureClose = "close"
	// RecordingOnFailureContinue lets the shell go on unrecorded, its
	// recording marked failed.
	RecordingOnFailureContinue = "continue"
)

// TunnelRecording configures the recording of shells at the process that
// relays them.
type TunnelRecording struct {
	// OnFailure is what happens to a shell whose recording fails (the
	// database refuses a chunk, or the recording reaches MaxBytes): close
	// (the shell ends with a one-line reason, and a shell whose recording
	// cannot start is refused) or continue (it goes on unrecorded).
	// Defaults to close.
	OnFailure string `yaml:"onFailure"`
	// MaxBytes bounds one recording's data bytes, typed and printed
	// together; past it the recording fails (see OnFailure). 65536 to
	// 1073741824. Defaults to 67108864 (64 MiB).
	MaxBytes int64 `yaml:"maxBytes"`
}

// Enabled reports whether the internal control API is configured.
func (i InternalAPI) Enabled() bool { return i.TLSFiles.Cert != "" && i.TLSFiles.Key != "" }

// PKI configures node identities over time (DESIGN.md, "Identity over
// time").
type PKI struct {
	// ReattestGrace is how long after its expiry a node's certificate can
	// still be renewed by re-attestation (JoinService.Reattest), so that a
	// node back from an outage longer than its certificate's life needs no
	// operator. "0s" turns re-attestation off. Defaults to 168h (7 days).
	ReattestGrace *Duration `yaml:"reattestGrace"`
	// AutoRotate lets the rotation reconciler start a node-CA rotation by
	// itself once the node CA in force has passed half its life, and
	// activate it, whatever the acknowledgements, before the old CA can no
	// longer sign a full node certificate (docs/pki.md, "Rotating the node
	// CA"). false leaves starting rotations to operators. Defaults to true.
	AutoRotate *bool `yaml:"autoRotate"`
	// NodeCAValidity is the life of a node CA made by pki init, the
	// embedded default's first start and each rotation; at least twice
	// host.gateway.nodeCertTTL plus 30 s (MinNodeCAValidity). Defaults to
	// 87600h (ten years, pki.DefaultCAValidity); "0s" is the default too.
	NodeCAValidity Duration `yaml:"nodeCAValidity"`
}

// AutoRotates reports pki.autoRotate, true when unset.
func (p PKI) AutoRotates() bool { return p.AutoRotate == nil || *p.AutoRotate }

// MinNodeCAValidity is the shortest pki.nodeCAValidity accepted for node
// certificates of nodeCertTTL: the next CA is prepared at half the life,
// and the old one must still be able to sign a full certificate when the
// next is activated, with room for the reconciler's passes.
func MinNodeCAValidity(nodeCertTTL time.Duration) time.Duration {
	return 2*nodeCertTTL + 30*time.Second
}

// APITLS configures the API's HTTPS.
type APITLS struct {
	// Mode is off, auto or files. Defaults to auto when host.publicURL or
	// host.gateway.publicURL names a host that is not loopback, to files
	// when cert and key are set, else off (docs/configuration.md).
	Mode string `yaml:"mode"`
	// Cert and Key are the PEM files of mode files (the leaf first, then
	// any intermediates); re-read every 60 s.
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// TLSFiles names PEM files.
type TLSFiles struct {
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// Metrics configures GET /metrics.
type Metrics struct {
	// BearerToken (at least 16 characters) enables /metrics for scrapers
	// that send it.
	BearerToken string `yaml:"bearerToken"`
	// Pprof also serves the Go runtime's profiles (net/http/pprof) under
	// /debug/pprof/, behind the same bearer token. Off by default: a CPU
	// profile costs the process while it runs.
	Pprof bool `yaml:"pprof"`
	// Listen, when set (such as 0.0.0.0:9464), serves /metrics (and the
	// profiles) on a listener of its own, plain HTTP, behind the same bearer
	// token: for gateway-only and worker-only processes, which have no API
	// listener. Off by default; an api process keeps /metrics on the API
	// listener either way (docs/metrics.md).
	Listen string `yaml:"listen"`
}

// Sinks lists the event sinks; names are unique.
type Sinks struct {
	Webhooks []WebhookSink `yaml:"webhooks"`
	Files    []FileSink    `yaml:"files"`
}

// WebhookSink posts batches of events (CloudEvents JSON arrays), signed
// with HMAC-SHA256.
type WebhookSink struct {
	Name   string `yaml:"name"`
	URL    string `yaml:"url"`
	Secret string `yaml:"secret"`
	// Types are the event type prefixes it takes ("node.",
	// "com.better-compute.gpu."); none: every event (docs/events.md).
	Types []string `yaml:"types"`
	// Tenant, when set (a tenant's id: ten_… or root, never a name),
	// makes the sink the tenant's: it takes only the events of that
	// tenant's subtree (docs/tenants.md, "Sinks"). Empty: every event.
	Tenant string `yaml:"tenant"`
}

// FileSink appends each event as a CloudEvents JSON line.
type FileSink struct {
	Name string `yaml:"name"`
	Path string `yaml:"path"`
	// Types are as WebhookSink.Types.
	Types []string `yaml:"types"`
	// Tenant is as WebhookSink.Tenant.
	Tenant string `yaml:"tenant"`
}

// Retention windows: rows older than these are pruned.
type Retention struct {
	// Commands: finished commands. Defaults to 30 days (720h).
	Commands Duration `yaml:"commands"`
	// Events: node and GPU events. Defaults to 30 days.
	Events Duration `yaml:"events"`
	// Audit: audit rows. Defaults to 365 days (8760h).
	Audit Duration `yaml:"audit"`
	// Recordings: shell recordings, counted from the shell's start.
	// Defaults to 365 days (8760h).
	Recordings Duration `yaml:"recordings"`
	// History: closed reservations (ended, cancelled, failed), finished
	// rollouts (completed, aborted, failed) and closed remediation cases
	// (returned), counted from when they closed. Defaults to 90 days
	// (2160h).
	History Duration `yaml:"history"`
}

// Downloads configures the downloads route.
type Downloads struct {
	// Dir is a goreleaser dist folder or a mirror of it.
	Dir string `yaml:"dir"`
	// PublicURL is the downloads route as nodes reach it
	// (https://compute.example.com/api/downloads): upgrade commands that
	// name no base URL send nodes there. Defaults to the scheme and host the
	// commands.create request came to, with basePath + "/downloads" (set it
	// behind a proxy that rewrites the host).
	PublicURL string `yaml:"publicURL"`
	// ReleasePins are the pins (sha256/...) of the keys trusted to sign
	// releases. With them, GET {basePath}/install.sh pins every binary's
	// sha256 from the signed manifest (manifest.json and its .minisig) of
	// the release it installs, when the downloads folder holds one.
	ReleasePins []string `yaml:"releasePins"`
}

// Duration is a time.Duration written as "10s" in YAML.
type Duration struct{ time.Duration }

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration such as 10s or 2h", n.Line, s)
	}
	d.Duration = v
	return nil
}

// Error is a configuration error naming the key at fault.
type Error struct {
	Key string
	Msg string
}

func (e *Error) Error() string { return "invalid config: " + e.Key + ": " + e.Msg }

// Flags are command-line values that override the file and environment;
// empty fields override nothing.
type Flags struct {
	DataDir     string
	DatabaseURL string
	Roles       string
	// Listen replaces host.listen whole.
	Listen string
	// ListenHost and ListenPort replace only the host or only the port of
	// host.listen (serve --host, serve --port, dev --port), keeping the
	// other part of the configured address (issue 41): --port 3001 with
	// host.listen 127.0.0.1:3000 listens on 127.0.0.1:3001, never on every
	// address.
	ListenHost, ListenPort string
	// DefaultListen replaces host.listen's default (0.0.0.0:3000) when
	// neither the file nor Listen sets it (dev: 127.0.0.1:3000).
	DefaultListen string
	// PublicURL is host.gateway.publicURL (--public-url).
	PublicURL string
	// GatewayListen is host.gateway.listen (--gateway-listen).
	GatewayListen string
	// GatewayListenPort replaces only the port of host.gateway.listen (dev
	// --gateway-port), keeping its host.
	GatewayListenPort string
	// DefaultGatewayListen replaces host.gateway.listen's default
	// (0.0.0.0:8443) when nothing else sets it (dev: 127.0.0.1:8443).
	DefaultGatewayListen string
	// APITLS, APITLSCert and APITLSKey are host.tls (--api-tls,
	// --api-tls-cert, --api-tls-key).
	APITLS, APITLSCert, APITLSKey string
}

// Load reads the file at path (none when empty), then the environment
// (getenv), then flags, fills defaults and validates.
func Load(path string, getenv func(string) string, flags Flags) (*Config, error) {
	c := &Config{}
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, &Error{Key: "--config", Msg: err.Error()}
		}
		if err := decode(b, c, getenv); err != nil {
			return nil, err
		}
	}
	over := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	over(&c.Database.URL, getenv(EnvDatabaseURL))
	over(&c.Database.NotifyURL, getenv(EnvDatabaseNotifyURL))
	over(&c.Secret, getenv(EnvSecret))
	over(&c.DataDir, getenv(EnvDataDir))
	over(&c.Downloads.Dir, getenv(EnvDownloadsDir))
	over(&c.Downloads.PublicURL, getenv(EnvDownloadsURL))
	over(&c.Host.Gateway.PublicURL, getenv(EnvPublicURL))
	over(&c.Host.Gateway.Listen, getenv(EnvGatewayListen))
	over(&c.Host.TLS.Mode, getenv(EnvAPITLS))
	over(&c.Host.TLS.Cert, getenv(EnvAPITLSCert))
	over(&c.Host.TLS.Key, getenv(EnvAPITLSKey))
	if r := getenv(EnvRoles); r != "" {
		c.RolesList = splitList(r)
	}
	over(&c.DataDir, flags.DataDir)
	over(&c.Database.URL, flags.DatabaseURL)
	over(&c.Host.Listen, flags.Listen)
	over(&c.Host.Gateway.PublicURL, flags.PublicURL)
	over(&c.Host.Gateway.Listen, flags.GatewayListen)
	over(&c.Host.TLS.Mode, flags.APITLS)
	over(&c.Host.TLS.Cert, flags.APITLSCert)
	over(&c.Host.TLS.Key, flags.APITLSKey)
	if flags.Roles != "" {
		c.RolesList = splitList(flags.Roles)
	}
	over(&c.Host.Listen, cmp.Or(c.Host.Listen, flags.DefaultListen))
	over(&c.Host.Gateway.Listen, cmp.Or(c.Host.Gateway.Listen, flags.DefaultGatewayListen))
	if err := replaceHostPort(&c.Host.Listen, "host.listen", defaultListen, flags.ListenHost, flags.ListenPort); err != nil {
		return nil, err
	}
	if err := replaceHostPort(&c.Host.Gateway.Listen, "host.gateway.listen", defaultGatewayListen, "", flags.GatewayListenPort); err != nil {
		return nil, err
	}
	c.defaults(getenv)
	if err := c.validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Built-in listen addresses of the api and gateway roles.
const (
	defaultListen        = "0.0.0.0:3000"
	defaultGatewayListen = "0.0.0.0:8443"
)

// replaceHostPort sets the host and the port of *addr (def when empty) to
// host and port where they are not empty, keeping the other part. key
// names the address in the error for one that is not host:port.
func replaceHostPort(addr *string, key, def, host, port string) error {
	if host == "" && port == "" {
		return nil
	}
	h, p, err := net.SplitHostPort(cmp.Or(*addr, def))
	if err != nil {
		return &Error{Key: key, Msg: fmt.Sprintf("%q is not a host:port address", *addr)}
	}
	*addr = net.JoinHostPort(cmp.Or(host, h), cmp.Or(port, p))
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// DefaultDataDir is /var/lib/better-compute as root and the XDG data home
// otherwise.
func DefaultDataDir(getenv func(string) string) string {
	if os.Geteuid() == 0 {
		return "/var/lib/better-compute"
	}
	if x := getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, "better-compute")
	}
	return filepath.Join(getenv("HOME"), ".local", "share", "better-compute")
}

func (c *Config) defaults(getenv func(string) string) {
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir(getenv)
	}
	if len(c.RolesList) == 0 {
		c.RolesList = []string{"all"}
	}
	if c.BasePath == "" {
		c.BasePath = "/api"
	}
	c.Host.Listen = cmp.Or(c.Host.Listen, defaultListen)
	c.Host.Processes.HeartbeatInterval.Duration = cmp.Or(c.Host.Processes.HeartbeatInterval.Duration, 5*time.Second)
	c.Host.Processes.PruneAfter.Duration = cmp.Or(c.Host.Processes.PruneAfter.Duration, time.Minute)
	g := &c.Host.Gateway
	g.Listen = cmp.Or(g.Listen, defaultGatewayListen)
	if g.Tunnels.IdleTimeout.Duration == 0 {
		g.Tunnels.IdleTimeout.Duration = 15 * time.Minute
	}
	g.Tunnels.Recording.OnFailure = cmp.Or(g.Tunnels.Recording.OnFailure, RecordingOnFailureClose)
	g.Tunnels.Recording.MaxBytes = cmp.Or(g.Tunnels.Recording.MaxBytes, 64<<20)
	if g.Internal.Listen == "" {
		g.Internal.Listen = ":8444"
	}
	g.WS.setDefaults()
	if g.PublicURL == "" {
		// Port 0 is chosen at listen time; the gateway then derives it.
		if _, port, err := net.SplitHostPort(g.Listen); err == nil && port != "0" {
			g.PublicURL = "https://localhost:" + port
		}
	}
	if c.Host.TLS.Mode == "" {
		switch {
		case c.Host.TLS.Cert != "" || c.Host.TLS.Key != "":
			c.Host.TLS.Mode = TLSModeFiles
		case publicOffLoopback(c.Host.PublicURL) || publicOffLoopback(g.PublicURL):
			c.Host.TLS.Mode = TLSModeAuto
		default:
			c.Host.TLS.Mode = TLSModeOff
		}
	}
	if c.Host.PublicURL == "" {
		c.Host.PublicURL = c.defaultAPIPublicURL()
	}
	if c.PKI.ReattestGrace == nil {
		c.PKI.ReattestGrace = &Duration{7 * 24 * time.Hour}
	}
	if c.PKI.AutoRotate == nil {
		on := true
		c.PKI.AutoRotate = &on
	}
	c.PKI.NodeCAValidity.Duration = cmp.Or(c.PKI.NodeCAValidity.Duration, pki.DefaultCAValidity)
	r := &c.Retention
	if r.Commands.Duration == 0 {
		r.Commands.Duration = 30 * 24 * time.Hour
	}
	if r.Events.Duration == 0 {
		r.Events.Duration = 30 * 24 * time.Hour
	}
	if r.Audit.Duration == 0 {
		r.Audit.Duration = 365 * 24 * time.Hour
	}
	if r.Recordings.Duration == 0 {
		r.Recordings.Duration = 365 * 24 * time.Hour
	}
	if r.History.Duration == 0 {
		r.History.Duration = 90 * 24 * time.Hour
	}
	c.GPUHealth.defaults()
	c.IAM.OIDC.defaults()
	c.Embedded = c.Database.URL == ""
}

func (c *Config) validate() error {
	if u := c.Database.URL; u != "" {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "postgres" && p.Scheme != "postgresql") || p.Host == "" {
			return &Error{Key: "database.url", Msg: "want a postgres://user@host:port/db URL"}
		}
	}
	if u := c.Database.NotifyURL; u != "" {
		p, err := url.Parse(u)
		if err != nil || (p.Scheme != "postgres" && p.Scheme != "postgresql") || p.Host == "" {
			return &Error{Key: "database.notifyURL", Msg: "want a postgres://user@host:port/db URL"}
		}
		if c.Database.URL == "" {
			return &Error{Key: "database.notifyURL", Msg: "needs database.url (set " + EnvDatabaseURL + ")"}
		}
	}
	if c.Secret != "" && len(c.Secret) < MinSecretLen {
		return &Error{Key: "secret", Msg: fmt.Sprintf("is %d characters, want at least %d", len(c.Secret), MinSecretLen)}
	}
	if !c.Embedded && c.Secret == "" {
		return &Error{Key: "secret", Msg: "required with a database URL (set " + EnvSecret + ")"}
	}
	for _, r := range c.RolesList {
		if r != "all" && !slices.Contains(Roles, r) {
			return &Error{Key: "roles", Msg: fmt.Sprintf("unknown role %q (want all or %s)", r, strings.Join(Roles, ", "))}
		}
	}
	if c.Embedded && !c.AllRoles() {
		return &Error{Key: "roles", Msg: "split roles need PostgreSQL: the embedded SQLite database serves one process running all roles; set " + EnvDatabaseURL + " or run --roles all"}
	}
	if !strings.HasPrefix(c.BasePath, "/") || strings.HasSuffix(c.BasePath, "/") {
		return &Error{Key: "basePath", Msg: "want an absolute path without a trailing slash, such as /api"}
	}
	if in := c.Host.Gateway.Internal; (in.TLSFiles.Cert == "") != (in.TLSFiles.Key == "") {
		return &Error{Key: "host.gateway.internal.tlsFiles", Msg: "set both cert and key (better-compute pki issue-internal writes them), or neither"}
	}
	if a := c.Host.Gateway.Internal.Address; a != "" {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return &Error{Key: "host.gateway.internal.address", Msg: fmt.Sprintf("%q is not a host:port address", a)}
		}
	}
	for key, addr := range map[string]string{"host.listen": c.Host.Listen, "host.gateway.listen": c.Host.Gateway.Listen,
		"host.gateway.internal.listen": c.Host.Gateway.Internal.Listen} {
		_, port, err := net.SplitHostPort(addr)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil || n < 0 || n > 65535 {
			return &Error{Key: key, Msg: fmt.Sprintf("%q is not a host:port address with a port of 0 to 65535", addr)}
		}
	}
	if d := c.Host.Gateway.Tunnels.IdleTimeout.Duration; d <= 0 {
		return &Error{Key: "host.gateway.tunnels.idleTimeout", Msg: fmt.Sprintf("%v: want a positive duration", d)}
	}
	// The gateway's own keys: zero (unset) takes the gateway's default
	// (gateway.Config), anything else must be positive.
	for key, d := range map[string]time.Duration{"host.gateway.heartbeatInterval": c.Host.Gateway.HeartbeatInterval.Duration,
		"host.gateway.drainDelay": c.Host.Gateway.DrainDelay.Duration, "host.gateway.nodeCertTTL": c.Host.Gateway.NodeCertTTL.Duration,
		"host.gateway.nodeLogInterval": c.Host.Gateway.NodeLogInterval.Duration,
		"host.gateway.clockSkewLimit":  c.Host.Gateway.ClockSkewLimit.Duration} {
		if d < 0 {
			return &Error{Key: key, Msg: fmt.Sprintf("%v: want a positive duration (or none, for the default)", d)}
		}
	}
	if r := c.Host.Gateway.Tunnels.Recording; r.OnFailure != RecordingOnFailureClose && r.OnFailure != RecordingOnFailureContinue {
		return &Error{Key: "host.gateway.tunnels.recording.onFailure", Msg: fmt.Sprintf("%q: want close or continue", r.OnFailure)}
	} else if r.MaxBytes < 64<<10 || r.MaxBytes > 1<<30 {
		return &Error{Key: "host.gateway.tunnels.recording.maxBytes", Msg: fmt.Sprintf("%d: want 65536 (64 KiB) to 1073741824 (1 GiB)", r.MaxBytes)}
	}
	if p := c.Host.Processes; p.HeartbeatInterval.Duration < 100*time.Millisecond || p.HeartbeatInterval.Duration > time.Minute {
		return &Error{Key: "host.processes.heartbeatInterval", Msg: fmt.Sprintf("%v: want 100ms to 1m", p.HeartbeatInterval.Duration)}
	} else if p.PruneAfter.Duration < 3*p.HeartbeatInterval.Duration || p.PruneAfter.Duration > 24*time.Hour {
		return &Error{Key: "host.processes.pruneAfter", Msg: fmt.Sprintf("%v: want at least 3 heartbeat intervals (%v) and at most 24h", p.PruneAfter.Duration, 3*p.HeartbeatInterval.Duration)}
	}
	if m := c.Host.Gateway.MissedHeartbeats; m != 0 && m < 2 {
		return &Error{Key: "host.gateway.missedHeartbeats", Msg: fmt.Sprintf("%d: want at least 2 (one late heartbeat must not make a node unreachable)", m)}
	}
	if ttl := c.Host.Gateway.NodeCertTTL.Duration; ttl > 0 && ttl < MinNodeCertTTL {
		return &Error{Key: "host.gateway.nodeCertTTL", Msg: fmt.Sprintf("%v is too short: at least %v (a node renews at two thirds of it, each time on a new connection)", ttl, MinNodeCertTTL)}
	}
	if g := c.PKI.ReattestGrace; g != nil && g.Duration < 0 {
		return &Error{Key: "pki.reattestGrace", Msg: fmt.Sprintf("%v: want 0 (off) or a positive duration such as 168h", g.Duration)}
	}
	if v, least := c.PKI.NodeCAValidity.Duration, MinNodeCAValidity(cmp.Or(c.Host.Gateway.NodeCertTTL.Duration, pki.DefaultNodeTTL)); v < 0 {
		return &Error{Key: "pki.nodeCAValidity", Msg: fmt.Sprintf("%v: want a positive duration such as 87600h", v)}
	} else if v > 0 && v < least {
		return &Error{Key: "pki.nodeCAValidity", Msg: fmt.Sprintf("%v is too short: at least %v, twice host.gateway.nodeCertTTL plus 30s (the next node CA is prepared at half the life, and the old one must still sign a full certificate when the next is activated)", v, least)}
	}
	if raw := c.Host.Gateway.PublicURL; raw != "" {
		u, err := checkOrigin(raw, "https")
		if err != nil {
			return &Error{Key: "host.gateway.publicURL", Msg: fmt.Sprintf("%q: %v", raw, err)}
		}
		c.Host.Gateway.PublicURL = u
	}
	if err := c.validateAPITLS(); err != nil {
		return err
	}
	if err := c.Host.Gateway.Limits.validate(); err != nil {
		return err
	}
	if err := c.Host.Gateway.WS.validate(); err != nil {
		return err
	}
	if err := c.Remediation.validate(); err != nil {
		return err
	}
	if err := c.Rollouts.validate(); err != nil {
		return err
	}
	if err := c.GPUHealth.validate(); err != nil {
		return err
	}
	if err := c.IAM.OIDC.validate(); err != nil {
		return err
	}
	for i, p := range c.Downloads.ReleasePins {
		if !strings.HasPrefix(p, "sha256/") || len(p) < len("sha256/")+16 {
			return &Error{Key: fmt.Sprintf("downloads.releasePins[%d]", i), Msg: "want a release key pin sha256/... as release keygen prints it"}
		}
	}
	if u, err := url.Parse(c.Downloads.PublicURL); c.Downloads.PublicURL != "" && (err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "") {
		return &Error{Key: "downloads.publicURL", Msg: "want an http(s)://host/path URL, such as https://compute.example.com/api/downloads"}
	}
	if l := c.Host.Limits; l.EventStreamsPerToken < 0 || l.InFlightPerToken < 0 || l.BodyReadTimeout.Duration < 0 {
		key := "host.limits.eventStreamsPerToken"
		switch {
		case l.InFlightPerToken < 0:
			key = "host.limits.inFlightPerToken"
		case l.BodyReadTimeout.Duration < 0:
			key = "host.limits.bodyReadTimeout"
		}
		return &Error{Key: key, Msg: "must be positive"}
	}
	if c.Host.Gateway.MaxStreams < 0 {
		return &Error{Key: "host.gateway.maxStreams", Msg: "must be positive"}
	}
	if t := c.Host.Metrics.BearerToken; t != "" && len(t) < 16 {
		return &Error{Key: "host.metrics.bearerToken", Msg: "want at least 16 characters"}
	}
	if l := c.Host.Metrics.Listen; l != "" {
		if c.Host.Metrics.BearerToken == "" {
			return &Error{Key: "host.metrics.listen", Msg: "needs host.metrics.bearerToken: metrics are served only behind it"}
		}
		if _, _, err := net.SplitHostPort(l); err != nil {
			return &Error{Key: "host.metrics.listen", Msg: fmt.Sprintf("%q: want host:port, such as 0.0.0.0:9464", l)}
		}
	}
	if c.Host.Metrics.Pprof && c.Host.Metrics.BearerToken == "" {
		return &Error{Key: "host.metrics.pprof", Msg: "needs host.metrics.bearerToken: profiles are served only behind it"}
	}
	names := map[string]bool{}
	for i, w := range c.Sinks.Webhooks {
		key := fmt.Sprintf("sinks.webhooks[%d]", i)
		if err := sinkName(key, w.Name, names); err != nil {
			return err
		}
		if u, err := url.Parse(w.URL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return &Error{Key: key + ".url", Msg: "want an http(s):// URL"}
		}
		if len(w.Secret) < 16 {
			return &Error{Key: key + ".secret", Msg: "want at least 16 characters to sign with"}
		}
		if err := sinkTypes(key, w.Types); err != nil {
			return err
		}
		if err := sinkTenant(key, w.Tenant); err != nil {
			return err
		}
	}
	for i, f := range c.Sinks.Files {
		key := fmt.Sprintf("sinks.files[%d]", i)
		if err := sinkName(key, f.Name, names); err != nil {
			return err
		}
		if !filepath.IsAbs(f.Path) {
			return &Error{Key: key + ".path", Msg: "want an absolute path"}
		}
		if err := sinkTypes(key, f.Types); err != nil {
			return err
		}
		if err := sinkTenant(key, f.Tenant); err != nil {
			return err
		}
	}
	for key, d := range map[string]time.Duration{"retention.commands": c.Retention.Commands.Duration,
		"retention.events": c.Retention.Events.Duration, "retention.audit": c.Retention.Audit.Duration,
		"retention.history": c.Retention.History.Duration, "retention.recordings": c.Retention.Recordings.Duration} {
		if d < time.Hour {
			return &Error{Key: key, Msg: "want at least 1h"}
		}
	}
	for i, p := range c.TrustedProxies {
		pfx, err := parseProxy(p)
		if err != nil {
			return &Error{Key: fmt.Sprintf("trustedProxies[%d]", i), Msg: err.Error()}
		}
		c.ParsedProxies = append(c.ParsedProxies, pfx)
	}
	return nil
}

// parseProxy parses an address or CIDR; IPv4-mapped IPv6 becomes IPv4.
func parseProxy(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not an address or CIDR", s)
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not an address or CIDR", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// AllRoles reports whether the process runs every role.
func (c *Config) AllRoles() bool {
	return slices.Contains(c.RolesList, "all")
}

// Runs reports whether the process runs role.
func (c *Config) Runs(role string) bool {
	return c.AllRoles() || slices.Contains(c.RolesList, role)
}

// sinkTypes checks a sink's type prefixes: each non-empty, of the
// characters event types use (a-z, 0-9, '.', '-').
func sinkTypes(key string, types []string) error {
	for i, t := range types {
		if t == "" || strings.Trim(t, "abcdefghijklmnopqrstuvwxyz0123456789.-") != "" {
			return &Error{Key: fmt.Sprintf("%s.types[%d]", key, i), Msg: fmt.Sprintf("%q: want a type prefix such as node. or com.better-compute.gpu. (a-z, 0-9, '.', '-')", t)}
		}
	}
	return nil
}

// sinkName checks a sink's name: 1 to 63 of a-z, 0-9, '-', unique.
// sinkTenant checks a sink's tenant: empty, or a tenant's id (ten_…, or
// root). Never a name: a name is free again once its tenant is deleted
// (and free before it is made), so any tenant's admin could make a tenant
// of that name in its own subtree and take the sink's events; an id is
// never given twice (docs/tenants.md, "Sinks").
func sinkTenant(key, tenant string) error {
	rest, isID := strings.CutPrefix(tenant, "ten_")
	if tenant == "" || tenant == "root" ||
		isID && rest != "" && len(tenant) <= 63 && strings.Trim(rest, "abcdefghijklmnopqrstuvwxyz0123456789") == "" {
		return nil
	}
	return &Error{Key: key + ".tenant", Msg: fmt.Sprintf("%q: want a tenant's id (ten_…, as better-compute tenants get NAME prints, or root), "+
		"not its name: a name is free again once its tenant is deleted, and another tenant's admin could take it", tenant)}
}

func sinkName(key, name string, seen map[string]bool) error {
	if name == "" || len(name) > 63 || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" {
		return &Error{Key: key + ".name", Msg: "want 1 to 63 of a-z, 0-9 and '-'"}
	}
	if seen[name] {
		return &Error{Key: key + ".name", Msg: "sink " + name + " is configured twice"}
	}
	seen[name] = true
	return nil
}
