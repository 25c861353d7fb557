package session

import (
	"cmp"
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Defaults of Config. DESIGN.md ("bcd") and STYLE.md ("Leases and loops")
// are the source of the backoff rules.
const (
	// DefaultBackoffBase is the first reconnect delay's upper bound.
	DefaultBackoffBase = time.Second
	// DefaultBackoffMax caps every reconnect delay, unless the gateway's
	// reconnect window (Welcome.reconnect_window) is longer: short enough
	// that a node is back within seconds of its gateway's return (issue
	// 37), while a large fleet is spread by the window.
	DefaultBackoffMax = 8 * time.Second
	// MaxReconnectWindow caps a gateway's reconnect window.
	MaxReconnectWindow = 5 * time.Minute
	// DefaultStableAfter is how long a session must last for the backoff
	// to start over.
	DefaultStableAfter = 30 * time.Second
	// DefaultStartJitter bounds the random delay before the first connect.
	DefaultStartJitter = 2 * time.Second
	// DefaultHandshakeTimeout bounds dial, TLS, Hello and Welcome together.
	DefaultHandshakeTimeout = 15 * time.Second
	// DefaultHeartbeatInterval is used when Welcome carries no usable
	// interval.
	DefaultHeartbeatInterval = sessionv1.DefaultHeartbeatInterval
	// MinHeartbeatInterval is the shortest heartbeat interval honoured; a
	// shorter one from a gateway is raised to it.
	MinHeartbeatInterval = 10 * time.Millisecond
	// DefaultRenewTimeout bounds one Renew call.
	DefaultRenewTimeout = 30 * time.Second
	// DefaultRenewRetry is the wait before retrying a failed renewal.
	DefaultRenewRetry = time.Minute
	// DefaultKeepalive is the interval of gRPC keepalive pings. It equals
	// grpc-go servers' default minimum ping interval, so an unconfigured
	// gateway accepts it.
	DefaultKeepalive = 5 * time.Minute
	// DefaultKeepaliveTimeout is how long a keepalive ping, or any data
	// sent, may stay unacknowledged before the connection is closed.
	DefaultKeepaliveTimeout = 20 * time.Second
	// DefaultBufferSize is the gRPC write buffer size of a connection.
	DefaultBufferSize = 8 << 10
	// MaxRetryHint caps a gateway's retry-after-ms hint.
	MaxRetryHint = 10 * time.Minute
	// MaxDrainDelay caps a Drain's delay.
	MaxDrainDelay = 10 * time.Minute
)

// Handler runs the work a gateway sends. Its methods are called on the
// Client's receive goroutine, one at a time and in the order the gateway
// sent the messages: they must return quickly and start long work in a
// goroutine of their own. ctx is Run's: it ends when the agent stops, not
// when a session does, so a reconnect does not stop running commands.
type Handler interface {
	// HandleCommand takes a Command. send sends an update for it on the
	// session it arrived on; it fails with ErrNotConnected once that session
	// has ended (a result then goes into the next Hello, see
	// Config.PendingResults). send is safe for concurrent use.
	HandleCommand(ctx context.Context, cmd *sessionv1.Command, send func(*sessionv1.CommandUpdate) error)
	// HandleCancel takes a Cancel. Unknown or finished command ids are
	// ignored.
	HandleCancel(ctx context.Context, c *sessionv1.Cancel)
}

// IdentityKeeper keeps what a Client learns about its node's identity, so
// that the next start begins from it (bcd's identity.Keeper writes it to
// the data directory). Its methods are called on the Client's goroutines;
// an error leaves the change unused.
type IdentityKeeper interface {
	// KeepRenewal persists a renewed certificate. It is called before the
	// new certificate is used; an error fails the renewal, which is retried
	// after Config.RenewRetry.
	KeepRenewal(ctx context.Context, r *Renewal) error
	// KeepGateways persists the node's gateway list when a Welcome changed
	// it (MergeGateways); an error is logged and the list used in memory.
	KeepGateways(ctx context.Context, known []KnownGateway) error
	// KeepBundle persists the node CA roots a Bundle message carried
	// during a node-CA rotation; the session acknowledges the bundle
	// (BundleAck) only after it returned nil.
	KeepBundle(ctx context.Context, roots []*x509.Certificate) error
}

// Reporter gives the readings a Client sends about its node, in Hello and
// in every Heartbeat. Its methods are called on the Client's goroutines
// just before the message is sent, and must return quickly. bcd's agent
// implements it.
type Reporter interface {
	// InventoryDigest returns the digest of the node's current inventory,
	// sent in Hello and in every Heartbeat.
	InventoryDigest() string
	// FillHeartbeat fills the readings of a Heartbeat (load, uptime,
	// memory, running commands); sent_at and inventory_digest are already
	// set.
	FillHeartbeat(hb *sessionv1.Heartbeat)
	// PendingResults returns the results of commands that finished while
	// there was no session, sent in Hello.
	PendingResults() []*sessionv1.CommandResult
	// LocalRollback returns the rollback bcd made by itself after a crash
	// loop that no Welcome has acknowledged yet, sent in Hello; nil when
	// none.
	LocalRollback() *sessionv1.LocalRollback
}

// GatewayRootsKeeper is what an IdentityKeeper implements to take part in
// gateway-CA rotations: a Client whose Config.Identity implements it offers
// the capability "gateway.bundle", trusts the gateway serving CAs a Bundle
// carries from then on (Config.Trust plus them) and acknowledges the
// bundle only after KeepGatewayRoots returned nil.
type GatewayRootsKeeper interface {
	// KeepGatewayRoots persists the gateway serving CA roots of a
	// gateway-CA rotation's Bundle, so that the node trusts them after a
	// restart too.
	KeepGatewayRoots(ctx context.Context, roots []*x509.Certificate) error
}

// memoryIdentity is the IdentityKeeper of a Config without one: the
// Client keeps what it learns in memory only.
type memoryIdentity struct{}

func (memoryIdentity) KeepRenewal(context.Context, *Renewal) error           { return nil }
func (memoryIdentity) KeepGateways(context.Context, []KnownGateway) error    { return nil }
func (memoryIdentity) KeepBundle(context.Context, []*x509.Certificate) error { return nil }

// noReadings is the Reporter of a Config without one: an empty digest, no
// readings, nothing pending.
type noReadings struct{}

func (noReadings) InventoryDigest() string                    { return "" }
func (noReadings) FillHeartbeat(*sessionv1.Heartbeat)         {}
func (noReadings) PendingResults() []*sessionv1.CommandResult { return nil }
func (noReadings) LocalRollback() *sessionv1.LocalRollback    { return nil }

// Renewal is a certificate Renew returned.
type Renewal struct {
	// Chain is the new certificate chain, leaf first, without the root.
	Chain []*x509.Certificate
	// NodeCARoots is the current set of node CA roots.
	NodeCARoots []*x509.Certificate
	// RenewAfter is when to renew next.
	RenewAfter time.Time
	// ReattestGrace is how long after the certificate's expiry the
	// gateway still re-attests it, as the gateway last said (zero: off, or
	// never said).
	ReattestGrace time.Duration
}

// Config configures a Client. Fields marked required have no default;
// every other zero value means the documented default.
type Config struct {
	// Gateways are the URLs ("https://host[:port]", port 443 when absent) of
	// the region's gateways as the node joined, in order of preference: the
	// last resort after KnownGateways. Required.
	Gateways []string
	// KnownGateways are the gateways Welcomes listed, as last persisted
	// through Identity.KeepGateways; tried first, in order. Defaults to
	// none.
	KnownGateways []KnownGateway
	// Identity keeps the renewed certificates, gateway lists and node CA
	// bundles the Client learns. Defaults to keeping them in memory only.
	Identity IdentityKeeper
	// Trust says how gateways are authenticated. Required.
	Trust Trust
	// Key is the node's private key, the one its certificate certifies.
	// Renew keeps it. Required.
	Key crypto.Signer
	// Chain is the node's certificate chain, leaf first. Required.
	Chain []*x509.Certificate
	// RenewAfter is when to renew Chain. Defaults to two thirds of the
	// way from the leaf's NotBefore to its NotAfter.
	RenewAfter time.Time
	// ReattestGrace is how long after its expiry the certificate can still
	// be re-attested, as the gateway last said (JoinResponse or
	// RenewResponse.reattest_grace); only reported (Client.ReattestGrace,
	// logs), the gateway decides. Zero: unknown.
	ReattestGrace time.Duration
	// JoinFlags are added to the `bcd join` command Run prints when the
	// node must be joined again (re-attestation grace passed), such as
	// "--data-dir /srv/bcd". Defaults to none.
	JoinFlags string

	// BCDVersion is sent in Hello, semantic version without a leading "v".
	// Defaults to "0.0.0-dev".
	BCDVersion string
	// OS is sent in Hello. Defaults to runtime.GOOS.
	OS string
	// Arch is sent in Hello. Defaults to runtime.GOARCH.
	Arch string
	// BootID is sent in Hello. Defaults to empty.
	BootID string
	// Capabilities are offered in Hello (see session.proto). Defaults to
	// none.
	Capabilities []string
	// ReleasePins applies the release pin statements gateways send; with
	// one, Hello offers sessionv1.CapabilityReleasePins too. Defaults to
	// none: ReleasePins messages are ignored.
	ReleasePins ReleasePinKeeper
	// Tunnels opens the tunnels the gateway asks for (offer capability
	// "tunnel" with it). Without it a TunnelOpen is answered with an error
	// frame.
	Tunnels TunnelHandler
	// Reporter gives the node's readings for Hello and every Heartbeat.
	// Defaults to an empty digest and no readings.
	Reporter Reporter
	// Handler runs commands. Defaults to answering each Command with a
	// FAILED result ("commands not supported") and ignoring Cancel.
	Handler Handler
	// OnEvent receives every Event, synchronously and in order, on the
	// goroutine that caused it; it must not block. Defaults to none.
	OnEvent func(Event)

	// BackoffBase is the upper bound of the first reconnect delay; the
	// bound doubles with every failed attempt. Defaults to 1 s.
	BackoffBase time.Duration
	// BackoffMax caps the reconnect delay bound, or the last Welcome's
	// reconnect window when that is longer. Defaults to 8 s.
	BackoffMax time.Duration
	// StableAfter is how long a session whose connection is lost must
	// have lasted, from its Welcome, for the backoff to start over; one
	// lost sooner counts as a failed attempt, so a node whose sessions keep
	// ending at once (two bcd processes sharing one identity supersede each
	// other, and a session superseded from another connection loses its
	// connection) backs off instead of reconnecting in a loop. A session
	// drained or closed by the gateway starts the backoff over however
	// short; one ended as superseded (ABORTED) counts however long.
	// Defaults to 30 s.
	StableAfter time.Duration
	// StartJitter bounds the random delay before the first connect; a
	// negative value connects at once. Defaults to 2 s.
	StartJitter time.Duration
	// HandshakeTimeout bounds dialling, TLS, Hello and Welcome. Defaults
	// to 15 s.
	HandshakeTimeout time.Duration
	// RenewTimeout bounds one Renew call. Defaults to 30 s.
	RenewTimeout time.Duration
	// RenewRetry is the wait before a failed renewal is tried again.
	// Defaults to 1 min.
	RenewRetry time.Duration
	// Keepalive is the interval of gRPC keepalive pings; a negative value
	// turns them off. Defaults to 5 min.
	Keepalive time.Duration
	// KeepaliveTimeout is how long a ping or sent data may stay
	// unacknowledged before the connection is dropped. Defaults to 20 s.
	KeepaliveTimeout time.Duration
	// ReadBufferSize is gRPC's per-connection read buffer in bytes.
	// Defaults to none: TLS already holds each record it decrypts, so a
	// second buffer above it only costs memory.
	ReadBufferSize int
	// WriteBufferSize is how much gRPC batches before writing, in bytes;
	// the buffer is taken from a shared pool for each flush. Defaults to
	// 8 KiB.
	WriteBufferSize int

	// Logger receives the Client's logs. Defaults to discarding them.
	Logger *slog.Logger
	// Clock is the time source. Defaults to the system clock.
	Clock Clock
	// Jitter returns a uniformly random duration in [0, max]; max ≥ 0.
	// Defaults to math/rand/v2.
	Jitter func(max time.Duration) time.Duration
}

// withDefaults returns cfg with its defaults filled in.
func (cfg Config) withDefaults() Config {
	cfg.BCDVersion = cmp.Or(cfg.BCDVersion, "0.0.0-dev")
	cfg.OS = cmp.Or(cfg.OS, runtime.GOOS)
	cfg.Arch = cmp.Or(cfg.Arch, runtime.GOARCH)
	cfg.BackoffBase = cmp.Or(cfg.BackoffBase, DefaultBackoffBase)
	cfg.BackoffMax = cmp.Or(cfg.BackoffMax, DefaultBackoffMax)
	cfg.StableAfter = cmp.Or(cfg.StableAfter, DefaultStableAfter)
	cfg.StartJitter = cmp.Or(cfg.StartJitter, DefaultStartJitter)
	cfg.HandshakeTimeout = cmp.Or(cfg.HandshakeTimeout, DefaultHandshakeTimeout)
	cfg.RenewTimeout = cmp.Or(cfg.RenewTimeout, DefaultRenewTimeout)
	cfg.RenewRetry = cmp.Or(cfg.RenewRetry, DefaultRenewRetry)
	cfg.Keepalive = cmp.Or(cfg.Keepalive, DefaultKeepalive)
	cfg.KeepaliveTimeout = cmp.Or(cfg.KeepaliveTimeout, DefaultKeepaliveTimeout)
	cfg.WriteBufferSize = cmp.Or(cfg.WriteBufferSize, DefaultBufferSize)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	if cfg.Jitter == nil {
		cfg.Jitter = randomJitter
	}
	if cfg.Handler == nil {
		cfg.Handler = refuseCommands{}
	}
	if cfg.Identity == nil {
		cfg.Identity = memoryIdentity{}
	}
	if cfg.Reporter == nil {
		cfg.Reporter = noReadings{}
	}
	if cfg.RenewAfter.IsZero() && len(cfg.Chain) > 0 && cfg.Chain[0] != nil {
		cfg.RenewAfter = defaultRenewAfter(cfg.Chain[0])
	}
	return cfg
}

// validate checks a Config that has its defaults.
func (cfg *Config) validate() ([]gatewayAddr, error) {
	if len(cfg.Gateways) == 0 {
		return nil, fmt.Errorf("%w: no gateways", ErrConfig)
	}
	for _, k := range cfg.KnownGateways {
		if _, err := parseGatewayURL(k.URL); err != nil {
			return nil, err
		}
	}
	// One transport: the configured gateways' (IsWebSocketURL). Known
	// gateways of the other are left out, never dialled.
	ws := IsWebSocketURL(cfg.Gateways[0])
	for _, g := range cfg.Gateways[1:] {
		if IsWebSocketURL(g) != ws {
			return nil, fmt.Errorf("%w: gateways %q and %q: the list mixes the WebSocket fallback (wss://) with direct gateways (https://); configure one", ErrConfig, cfg.Gateways[0], g)
		}
	}
	order := gatewayOrder(cfg.KnownGateways, cfg.Gateways)
	gws := make([]gatewayAddr, 0, len(order))
	for _, s := range order {
		gw, err := parseGatewayURL(s)
		if err != nil {
			return nil, err
		}
		if (gw.ws != "") == ws {
			gws = append(gws, gw)
		}
	}
	if err := cfg.Trust.validate(); err != nil {
		return nil, err
	}
	if cfg.Key == nil {
		return nil, fmt.Errorf("%w: no key", ErrConfig)
	}
	if len(cfg.Chain) == 0 || cfg.Chain[0] == nil {
		return nil, fmt.Errorf("%w: no certificate", ErrConfig)
	}
	if err := matchKey(cfg.Chain[0], cfg.Key); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if cfg.BackoffBase < 0 || cfg.BackoffMax < cfg.BackoffBase {
		return nil, fmt.Errorf("%w: backoff base %v and cap %v", ErrConfig, cfg.BackoffBase, cfg.BackoffMax)
	}
	if cfg.HandshakeTimeout < 0 || cfg.RenewTimeout < 0 || cfg.RenewRetry < 0 || cfg.KeepaliveTimeout < 0 {
		return nil, fmt.Errorf("%w: negative timeout", ErrConfig)
	}
	if cfg.ReadBufferSize < 0 || cfg.WriteBufferSize < 0 {
		return nil, fmt.Errorf("%w: negative buffer size", ErrConfig)
	}
	return gws, nil
}

// defaultRenewAfter is two thirds of the way through leaf's validity.
func defaultRenewAfter(leaf *x509.Certificate) time.Time {
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	return leaf.NotBefore.Add(life * 2 / 3)
}
