package gateway

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/better-compute/better-compute/controlplane/internal/accept"
	"github.com/better-compute/better-compute/controlplane/internal/certreload"
	"github.com/better-compute/better-compute/controlplane/internal/clock"
	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// DefaultCapabilities are the session capabilities this gateway supports
// (session.proto lists their meaning). Welcome carries those of them a node
// offers in Hello.
var DefaultCapabilities = sessionv1.Capabilities

// Store is what the gateway reads and writes outside transactions; each
// transaction it runs (store.InTx, store.InFencedTx) receives the small
// interface of what it touches (skewTx, claimTx, updateTx, inventoryTx,
// livenessTx, openTx).
type Store interface {
	store.Transactor
	store.FencedTransactor
	AuditInsert(ctx context.Context, e *store.AuditEntry) (int64, error)
	LeaseAcquire(ctx context.Context, p *store.LeaseAcquireParams) (*store.Lease, bool, error)
	LeaseRenew(ctx context.Context, p *store.LeaseRenewParams) (*store.Lease, bool, error)
	LeaseRelease(ctx context.Context, name, holder string, epoch int64) error
	GatewayUpsert(ctx context.Context, p *store.GatewayUpsertParams) (*store.Gateway, error)
	GatewayList(ctx context.Context) ([]*store.Gateway, error)
	GatewayDelete(ctx context.Context, id string) error
	SessionIDs(ctx context.Context, gatewayID string) ([]string, error)
	SessionDrain(ctx context.Context, p *store.SessionDrainParams) (int, error)
	NodeGet(ctx context.Context, id string) (*store.Node, error)
	NodeSetInventory(ctx context.Context, id string, inventory []byte, digest string) error
	NodeSetLabel(ctx context.Context, id, key, value string) error
	EventInsert(ctx context.Context, e *store.Event) (int64, error)
	RevocationList(ctx context.Context, since time.Time) ([]*store.Revocation, error)
	RevocationCheck(ctx context.Context, serial string) (bool, error)
	SecretGet(ctx context.Context, name string) (*store.Secret, error)
	SecretGrantTake(ctx context.Context, name, nodeID string, now *time.Time) (bool, error)
	bundleStore
	releasePinStore
	dispatchStore
}

// Metrics is what the gateway reports (a *metrics.Metrics satisfies it).
type Metrics interface {
	Handshake(gateway string)
	// SessionOpened counts a session opened (Welcome sent); reconnect is
	// whether its Hello resumed an earlier one.
	SessionOpened(gateway string, reconnect bool)
	Refused(gateway, reason string)
	HeartbeatReceived(gateway string, since, interval time.Duration)
	DispatchLatency(d time.Duration)
	CommandFinished(kind, state string)
	// Wakeup counts a dispatch wake-up of gateway from source (WakeInternal,
	// WakeBus).
	Wakeup(gateway, source string)
	// ClockSkewMax reports the largest node clock skew (either way) among
	// gateway's sessions, 0 when none was measured.
	ClockSkewMax(gateway string, d time.Duration)
	// XIDNoAction counts an XID whose resolution acts on nothing
	// (IGNORE, RESTART_APP), by code.
	XIDNoAction(code uint32)
}

// noMetrics reports nothing.
type noMetrics struct{}

func (noMetrics) Handshake(string)                                       {}
func (noMetrics) SessionOpened(string, bool)                             {}
func (noMetrics) Refused(string, string)                                 {}
func (noMetrics) HeartbeatReceived(string, time.Duration, time.Duration) {}
func (noMetrics) DispatchLatency(time.Duration)                          {}
func (noMetrics) CommandFinished(string, string)                         {}
func (noMetrics) Wakeup(string, string)                                  {}
func (noMetrics) ClockSkewMax(string, time.Duration)                     {}
func (noMetrics) XIDNoAction(uint32)                                     {}

// Refusal reasons reported to Metrics.
const (
	reasonTLS          = "tls"
	reasonUntrusted    = "untrusted"
	reasonFull         = "full"
	reasonDraining     = "draining"
	reasonHelloTimeout = "hello_timeout"
	reasonProtocol     = "protocol"
	reasonJoinRate     = "join_rate"
)

// Config configures a Gateway. Zero fields take the documented defaults.
type Config struct {
	// ID names the gateway; its lease is gateway:<ID>. Defaults to a new
	// "gw_" id, so every process is a new gateway.
	ID string
	// Listen is the gRPC address. Defaults to 0.0.0.0:8443.
	Listen string
	// PublicURL is what daemons dial, https://host:port, listed in
	// JoinResponse.gateways. Defaults to https://localhost:<bound port>.
	PublicURL string
	// Region is the gateway's region (sites.region). Defaults to "default".
	Region string
	// WebSocketListen, when set, also serves the WebSocket fallback at
	// GET /v1/session on this address (websocket.go): the same gRPC
	// connection inside a WebSocket, with the TLS handshake in-band, for
	// sites whose proxies strip client certificates. Empty: none.
	WebSocketListen string
	// WebSocketTLS serves the fallback's listener over TLS with the
	// gateway's certificate; false serves plain HTTP, for a TLS-terminating
	// proxy in front of it.
	WebSocketTLS bool
	// CertFile and KeyFile hold the PEM serving certificate (leaf, then the
	// gateway serving CA) and its key, as pki issue-gateway writes them.
	// Required.
	CertFile, KeyFile string
	// CertReloadInterval is how often the certificate files are re-read.
	// Defaults to 60 s.
	CertReloadInterval time.Duration
	// BundleReload is how often the PKI bundle is read from the database,
	// so that a node-CA rotation's roots and issuer are used without a
	// restart (needs Secret to open it). Defaults to DefaultBundleReload
	// (1 s).
	BundleReload time.Duration
	// MaxStreams caps open Connect streams. Defaults to 5,000.
	MaxStreams int
	// RetryAfter is the base of the retry hint given when full; the hint is
	// RetryAfter plus a random share of it, to spread retries. Defaults to
	// 5 s.
	RetryAfter time.Duration
	// HeartbeatInterval is told to daemons in Welcome. Defaults to 10 s.
	HeartbeatInterval time.Duration
	// GPUHealth are the thresholds told to daemons in Welcome (config
	// gpuHealth.*); nil sends none, and nodes keep their defaults.
	GPUHealth *sessionv1.GPUHealthThresholds
	// HelloTimeout is how long a new connection may take to finish its
	// TLS handshake, and a new stream to send Hello. Defaults to 5 s.
	HelloTimeout time.Duration
	// DrainDelay bounds the random delay sent in Drain on shutdown.
	// Defaults to 60 s.
	DrainDelay time.Duration
	// ShutdownGrace is how long streams may end on their own after Drain
	// before every connection is closed. Defaults to 2 s.
	ShutdownGrace time.Duration
	// NodeCertTTL is the life of issued node certificates. Defaults to
	// 24 h.
	NodeCertTTL time.Duration
	// ClockSkewLimit is the node clock skew (either way) past which a ready
	// node is moved to clock-skewed, and back to ready once within it
	// (storeSkews). Defaults to DefaultClockSkewLimit (5 min).
	ClockSkewLimit time.Duration
	// ReattestGrace is how long after expiry a node certificate may still
	// be renewed through Reattest (admission.Config.ReattestGrace). Zero
	// turns re-attestation off; serve passes pki.reattestGrace, 7 days
	// unless configured.
	ReattestGrace time.Duration
	// HandshakeRate is how many new connections (TLS handshakes) are
	// accepted per second. Defaults to 500.
	HandshakeRate float64
	// HandshakeBurst is how many new connections may be accepted at once
	// above HandshakeRate. Defaults to 50.
	HandshakeBurst int
	// MaxConnecting is how many accepted connections may be in setup at
	// once: from accept until Welcome is sent or the stream refused, until
	// a connection without a client certificate (a Join) has finished its
	// handshake, until the connection closes, or for HelloTimeout at most.
	// Defaults to 256.
	MaxConnecting int
	// MaxConnectingPerSource is how many of those may come from one source
	// address, so that junk from one address cannot starve the nodes of
	// others. Defaults to 8, or MaxConnecting when that is less; more than
	// MaxConnecting is refused.
	MaxConnectingPerSource int
	// MaxQueuedPerSource is how many more accepted connections of one
	// source address wait for one of its setup slots (many nodes can share
	// an address behind NAT); past it a new connection of that address is
	// closed at once. Defaults to 64.
	MaxQueuedPerSource int
	// MaxQueued is how many accepted connections may wait for a setup
	// slot in all; past it the gateway stops accepting and the rest wait in
	// the kernel's backlog. Defaults to 4,096.
	MaxQueued int
	// JoinRate is how many Join calls one source address may make per
	// second; past it (and JoinBurst) a Join is refused with
	// RESOURCE_EXHAUSTED and a retry hint. Defaults to 10.
	JoinRate float64
	// JoinBurst is how many Join calls one source address may make at once
	// above JoinRate. Defaults to 20.
	JoinBurst int
	// LeaseTTL is the life of the gateway:<id> lease. Defaults to 20 s.
	LeaseTTL time.Duration
	// LeaseRenewInterval is how often the lease and the gateways row are
	// renewed. Defaults to 5 s.
	LeaseRenewInterval time.Duration
	// FlushInterval is how often heartbeats and ended sessions are
	// written, in one transaction. Defaults to 1 s.
	FlushInterval time.Duration
	// RevocationPollInterval is how often the revocation feed is read.
	// Defaults to 1 s.
	RevocationPollInterval time.Duration
	// Capabilities are the session capabilities supported. Defaults to
	// DefaultCapabilities.
	Capabilities []string
	// Secret is the deployment secret, to open the sealed secrets
	// JoinService.Secret hands out. Without it Secret answers UNAVAILABLE.
	Secret string
	// Version is the build's version, written to the gateways row.
	Version string
	// InternalAddress is the host:port of this process's internal control
	// API (control.Server.Address), written to the gateways row so the api
	// can call this gateway. Empty: none is served.
	InternalAddress string
	// Clock is the gateway's clock: its loops (dispatch, results'
	// retries, flush, lease, revocation feed, inventory) wait on it and
	// everything it stamps reads it. Defaults to the system clock; tests
	// pass a fake one (controlplane/internal/clocktest). Connection
	// timeouts (hello, handshake, shutdown grace) stay on the real clock.
	Clock clock.Clock

	// Wakeups, when set, asks for a dispatch round on every receive (the
	// API's wake-ups after it commits commands).
	Wakeups <-chan struct{}
	// DispatchInterval is the fallback dispatch loop's period. Defaults to
	// 1 s.
	DispatchInterval time.Duration
	// DispatchBatch is the most commands claimed at once. Defaults to 1,000.
	DispatchBatch int
	// ResultFlushInterval bounds how long a node's update waits to be
	// written with others in one transaction. Defaults to 20 ms.
	ResultFlushInterval time.Duration
	// ResultRetryFor is how long a batch of command updates whose
	// transaction failed (the database unreachable, as during a failover)
	// is written again, with back-off from 100 ms doubling to 5 s, before
	// it is dropped and the nodes' next sessions resend their results.
	// Every update is idempotent (a command's first terminal result wins,
	// output chunks are keyed by their sequence), so a batch whose commit
	// was lost is safe to write twice. Defaults to 1 min.
	ResultRetryFor time.Duration
	// Metrics receives the gateway's counters and latencies. Defaults to
	// none.
	Metrics Metrics
	// NodeLogInterval is the least time between two log lines of one kind
	// about one node's session (a dropped event, a refused inventory); the
	// next line counts those dropped meanwhile. Defaults to
	// DefaultNodeLogInterval (1 min).
	NodeLogInterval time.Duration
	// Listeners watches the gateway's listeners (direct and WebSocket):
	// their accepts back off on temporary errors, and the process's
	// /readyz reports one that keeps failing (internal/accept). Defaults
	// to a watch of the gateway's own, logging to its logger.
	Listeners *accept.Watch
}

// Defaults of Config's bounds on connection setup (docs/gateway.md,
// "Connection setup"; host.gateway.limits.pending and .queued).
const (
	// DefaultMaxConnecting is MaxConnecting's default.
	DefaultMaxConnecting = 256
	// DefaultMaxQueued is MaxQueued's default.
	DefaultMaxQueued = 4096
)

func (c *Config) defaults() {
	c.ID = cmp.Or(c.ID, store.NewID("gw"))
	c.Listen = cmp.Or(c.Listen, "0.0.0.0:8443")
	c.Region = cmp.Or(c.Region, store.DefaultRegion)
	c.CertReloadInterval = cmp.Or(c.CertReloadInterval, 60*time.Second)
	c.BundleReload = cmp.Or(c.BundleReload, DefaultBundleReload)
	c.MaxStreams = cmp.Or(c.MaxStreams, 5000)
	c.RetryAfter = cmp.Or(c.RetryAfter, 5*time.Second)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, sessionv1.DefaultHeartbeatInterval)
	c.HelloTimeout = cmp.Or(c.HelloTimeout, 5*time.Second)
	c.DrainDelay = cmp.Or(c.DrainDelay, 60*time.Second)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, 2*time.Second)
	c.NodeCertTTL = cmp.Or(c.NodeCertTTL, pki.DefaultNodeTTL)
	c.HandshakeRate = cmp.Or(c.HandshakeRate, 500)
	c.HandshakeBurst = cmp.Or(c.HandshakeBurst, 50)
	c.MaxConnecting = cmp.Or(c.MaxConnecting, DefaultMaxConnecting)
	// At most the bound in all: a deployment that sets only that gets no
	// per-source bound above it.
	c.MaxConnectingPerSource = cmp.Or(c.MaxConnectingPerSource, min(8, c.MaxConnecting))
	c.MaxQueuedPerSource = cmp.Or(c.MaxQueuedPerSource, 64)
	c.MaxQueued = cmp.Or(c.MaxQueued, DefaultMaxQueued)
	c.JoinRate = cmp.Or(c.JoinRate, 10)
	c.JoinBurst = cmp.Or(c.JoinBurst, 20)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, 20*time.Second)
	c.LeaseRenewInterval = cmp.Or(c.LeaseRenewInterval, 5*time.Second)
	c.FlushInterval = cmp.Or(c.FlushInterval, time.Second)
	c.RevocationPollInterval = cmp.Or(c.RevocationPollInterval, time.Second)
	c.DispatchInterval = cmp.Or(c.DispatchInterval, time.Second)
	c.DispatchBatch = cmp.Or(c.DispatchBatch, 1000)
	c.ResultFlushInterval = cmp.Or(c.ResultFlushInterval, 20*time.Millisecond)
	c.ResultRetryFor = cmp.Or(c.ResultRetryFor, time.Minute)
	c.NodeLogInterval = cmp.Or(c.NodeLogInterval, DefaultNodeLogInterval)
	c.ClockSkewLimit = cmp.Or(c.ClockSkewLimit, DefaultClockSkewLimit)
	if c.Metrics == nil {
		c.Metrics = noMetrics{}
	}
	if c.Capabilities == nil {
		c.Capabilities = DefaultCapabilities
	}
	c.Clock = clock.Or(c.Clock)
}

func (c *Config) validate() error {
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen %q is not a host:port address", c.Listen)
	}
	if c.PublicURL != "" {
		if u, err := url.Parse(c.PublicURL); err != nil || u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("public URL %q is not an https://host:port URL", c.PublicURL)
		}
	}
	if c.CertFile == "" || c.KeyFile == "" {
		return errors.New("the serving certificate and key files are required (better-compute pki issue-gateway writes them)")
	}
	for name, d := range map[string]time.Duration{
		"cert reload interval": c.CertReloadInterval, "retry after": c.RetryAfter,
		"heartbeat interval": c.HeartbeatInterval, "hello timeout": c.HelloTimeout, "drain delay": c.DrainDelay,
		"shutdown grace": c.ShutdownGrace, "node certificate TTL": c.NodeCertTTL, "lease TTL": c.LeaseTTL,
		"lease renew interval": c.LeaseRenewInterval, "flush interval": c.FlushInterval,
		"revocation poll interval": c.RevocationPollInterval, "node log interval": c.NodeLogInterval,
	} {
		if d < 0 {
			return fmt.Errorf("%s %s is negative", name, d)
		}
	}
	switch {
	case c.MaxStreams < 0:
		return fmt.Errorf("max streams %d is negative", c.MaxStreams)
	case c.HandshakeRate < 0 || c.HandshakeBurst < 0:
		return errors.New("handshake rate and burst must be positive")
	case c.MaxConnecting < 0 || c.MaxConnectingPerSource < 0 || c.MaxQueuedPerSource < 0 || c.MaxQueued < 0:
		return fmt.Errorf("max connecting %d, per source %d, queued per source %d and queued %d must be positive",
			c.MaxConnecting, c.MaxConnectingPerSource, c.MaxQueuedPerSource, c.MaxQueued)
	case c.MaxConnectingPerSource > c.MaxConnecting:
		// Judged here, with the defaults filled: the configuration passes
		// only the keys that were set (host.gateway.limits).
		return fmt.Errorf("connections in setup per source %d (host.gateway.limits.pendingPerSource) is more than in all %d (host.gateway.limits.pending)",
			c.MaxConnectingPerSource, c.MaxConnecting)
	case c.JoinRate < 0 || c.JoinBurst < 0:
		return errors.New("join rate and burst must be positive")
	case c.LeaseRenewInterval >= c.LeaseTTL:
		return fmt.Errorf("lease renew interval %s must be shorter than the lease TTL %s", c.LeaseRenewInterval, c.LeaseTTL)
	}
	return nil
}

// Gateway is the gateway role of one process.
type Gateway struct {
	cfg   Config
	store Store
	// trust is the bundle in force and what derives from it (trust.go),
	// replaced by bundleLoop when the database's changes.
	trust   atomic.Pointer[trust]
	tlsBase *tls.Config
	acks    ackBatch // bundle acknowledgements not yet written (trust.go)
	// releasePins is the ReleasePins message in force (releasepins.go),
	// nil until releasePinLoop first read it.
	releasePins atomic.Pointer[releasePins]
	admit       *admission.Admitter
	log         *slog.Logger
	certs       *certreload.Reloader
	server      *grpc.Server
	caps        map[string]bool

	ready     chan struct{}
	addr      net.Addr
	publicURL string
	ln        *listener
	wsln      *wsListener // the WebSocket fallback's upgrades; nil without one
	wsAddr    net.Addr

	sessions registry
	streams  atomic.Int64 // open Connect streams, admitted against MaxStreams
	draining atomic.Bool
	// stopping is set when Run's context ends (shutdown): no undrain
	// clears draining after it.
	stopping atomic.Bool
	// commanded is an operator's drain in force (drain.go).
	commanded atomic.Bool
	// drains are the drainAll calls of drains on command, waited for by Run.
	drains  sync.WaitGroup
	fence   atomic.Pointer[store.Fence]
	pending pending
	// inventories are the reported inventories not yet stored
	// (inventoryLoop).
	inventories inventoryBatch
	skews       skewBatch // measured clock skews not yet stored (measureSkew)
	skewSeen    skewSeen  // the latest skew of each session, for ClockSkewMax
	flushMu     sync.Mutex
	flushes     int // under flushMu
	dispatch    *dispatcher
	gateways    gatewayCache
	nonces      *nonces
	revokeNow   chan struct{} // RevokeNow asks revocationLoop for a read
	tunnels     tunnelTable   // tunnels waiting for their node's stream (tunnel.go)
	joins       *joinLimiter  // Join calls per source address
}

// New returns a Gateway serving with bundle's node CA; call Run to serve.
// It reads the certificate files once and fails when they do not load.
func New(cfg Config, st Store, bundle *pki.Bundle, log *slog.Logger) (*Gateway, error) {
	cfg.defaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if st == nil || bundle == nil || log == nil {
		return nil, errors.New("gateway: store, bundle and logger are required")
	}
	if cfg.Listeners == nil {
		m, _ := cfg.Metrics.(accept.Metrics)
		cfg.Listeners = accept.NewWatch(accept.Config{Log: log, Metrics: m})
	}
	admit, err := admission.New(admission.Config{NodeCertTTL: cfg.NodeCertTTL, ReattestGrace: cfg.ReattestGrace, Now: cfg.Clock.Now}, st, bundle, log)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	nonces, err := newNonces()
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	certs, err := certreload.New(cfg.CertFile, cfg.KeyFile, log)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g := &Gateway{
		cfg: cfg, store: st, admit: admit, log: log.With("gateway_id", cfg.ID),
		certs: certs, ready: make(chan struct{}), caps: map[string]bool{}, dispatch: newDispatcher(), nonces: nonces,
		revokeNow: make(chan struct{}, 1), joins: newJoinLimiter(cfg.JoinRate, cfg.JoinBurst),
	}
	for _, c := range cfg.Capabilities {
		g.caps[c] = true
	}
	g.sessions.byNode = map[string]*session{}
	g.pending.beats = map[string]struct{}{}

	// Each handshake takes the roots in force (GetConfigForClient), so a
	// node-CA rotation needs no restart.
	g.tlsBase = &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: g.servingCertificate,
		ClientAuth:     tls.VerifyClientCertIfGiven,
		Time:           cfg.Clock.Now,
	}
	g.trust.Store(newTrust(bundle, nil, g.tlsBase))
	tlsCfg := g.tlsBase.Clone()
	tlsCfg.GetConfigForClient = g.configForClient
	g.server = grpc.NewServer(
		grpc.Creds(newLoggedCreds(credentials.NewTLS(tlsCfg), g.log, cfg.Metrics, cfg.ID)),
		// Memory per idle session: tls.Conn buffers reads already, so the
		// HTTP/2 framer reads it directly; the write buffer is pooled and
		// held only while writing (grpc-go's default); static windows stop
		// BDP probing; a header table of 0 asks daemons not to index their
		// headers in HPACK's dynamic table, which the gateway would keep for
		// the connection's life (a Connect's headers are sent once).
		grpc.ReadBufferSize(0),
		grpc.WriteBufferSize(16<<10),
		grpc.HeaderTableSize(0),
		grpc.StaticStreamWindowSize(64<<10),
		grpc.StaticConnWindowSize(64<<10),
		grpc.MaxConcurrentStreams(16),
		grpc.MaxRecvMsgSize(4<<20),
		grpc.MaxHeaderListSize(16<<10),
		grpc.ConnectionTimeout(cfg.HelloTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 3 * cfg.HeartbeatInterval, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WaitForHandlers(true),
	)
	sessionv1.RegisterJoinServiceServer(g.server, &joinService{g: g})
	sessionv1.RegisterSessionServiceServer(g.server, &sessionService{g: g})
	return g, nil
}

// ID is the gateway's id.
func (g *Gateway) ID() string { return g.cfg.ID }

// Ready is closed once the listener is bound and the lease held.
func (g *Gateway) Ready() <-chan struct{} { return g.ready }

// Addr is the bound address, valid after Ready.
func (g *Gateway) Addr() net.Addr { return g.addr }

// WebSocketAddr is the WebSocket fallback's bound address, valid after
// Ready; nil without Config.WebSocketListen.
func (g *Gateway) WebSocketAddr() net.Addr { return g.wsAddr }

// PublicURL is the URL daemons dial, valid after Ready.
func (g *Gateway) PublicURL() string { return g.publicURL }

// Sessions reports how many sessions the gateway holds.
func (g *Gateway) Sessions() int { return g.sessions.len() }

// Run serves until ctx ends, then drains and stops as the package
// documentation describes. It fails when the listener cannot be bound or the
// lease cannot be taken at start.
func (g *Gateway) Run(ctx context.Context) error {
	tcp, err := net.Listen("tcp", g.cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway listen on %s: %w", g.cfg.Listen, err)
	}
	// Accepts that fail for a moment (descriptors exhausted) back off and
	// retry, so neither port stops for good (internal/accept).
	var raw net.Listener = g.cfg.Listeners.Wrap("gateway", tcp)
	g.addr = raw.Addr()
	var wsRaw net.Listener
	if g.cfg.WebSocketListen != "" {
		wsTCP, err := net.Listen("tcp", g.cfg.WebSocketListen)
		if err != nil {
			raw.Close()
			if errors.Is(err, syscall.EACCES) {
				err = fmt.Errorf("%w (a port below 1024 needs CAP_NET_BIND_SERVICE: the drop-in low-port.conf, docs/websocket.md)", err)
			}
			return fmt.Errorf("gateway WebSocket fallback listen on %s: %w", g.cfg.WebSocketListen, err)
		}
		wsRaw = g.cfg.Listeners.Wrap("gateway_websocket", wsTCP)
		g.wsAddr = wsRaw.Addr()
		g.wsln = newWSListener(wsRaw.Addr())
		raw = mergeListeners(raw, g.wsln)
	}
	limit := rate.Limit(g.cfg.HandshakeRate)
	g.ln = newListener(raw, rate.NewLimiter(limit, g.cfg.HandshakeBurst), setupLimits{
		total: g.cfg.MaxConnecting, perSource: g.cfg.MaxConnectingPerSource,
		queuedPerSource: g.cfg.MaxQueuedPerSource, queued: g.cfg.MaxQueued, settleAfter: g.cfg.HelloTimeout,
	})
	g.publicURL = g.cfg.PublicURL
	if g.publicURL == "" {
		g.publicURL = "https://" + net.JoinHostPort("localhost", fmt.Sprint(raw.Addr().(*net.TCPAddr).Port))
	}
	closeListeners := func() {
		g.ln.Close()
		if wsRaw != nil {
			wsRaw.Close()
		}
	}
	if err := g.acquireLease(ctx); err != nil {
		closeListeners()
		return err
	}
	if _, err := g.upsertRow(ctx); err != nil {
		closeListeners()
		g.releaseLease()
		return err
	}
	close(g.ready)
	g.log.InfoContext(ctx, "Gateway listening", "addr", g.addr.String(), "public_url", g.publicURL,
		"region", g.cfg.Region, "max_streams", g.cfg.MaxStreams)

	serveErr := make(chan error, 1)
	go func() { serveErr <- g.server.Serve(g.ln) }()
	loopCtx, stopLoops := context.WithCancel(context.WithoutCancel(ctx))
	var loops sync.WaitGroup
	for _, loop := range []func(context.Context){func(ctx context.Context) { g.certs.Run(ctx, g.cfg.CertReloadInterval) }, g.leaseLoop, g.flushLoop, g.revocationLoop,
		g.bundleLoop, g.ackLoop, g.releasePinLoop, g.dispatchLoop, g.resultLoop, g.inventoryLoop} {
		loops.Go(func() { loop(loopCtx) })
	}
	if wsRaw != nil {
		// Until the drain is over, like the gRPC server: its sessions
		// get their Drain message as the direct ones do.
		loops.Go(func() {
			var tlsCfg *tls.Config
			if g.cfg.WebSocketTLS {
				tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: g.servingCertificate}
			}
			if err := g.serveWebSocket(loopCtx, wsRaw, g.wsln, tlsCfg); err != nil {
				g.log.ErrorContext(loopCtx, "WebSocket fallback stopped", logkey.Err, err)
			}
		})
	}

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		runErr = fmt.Errorf("gateway serve: %w", err)
	}
	g.shutdown(loopCtx)
	stopLoops()
	loops.Wait()
	g.drains.Wait()
	g.finish()
	return runErr
}

// shutdown drains the sessions and stops the gRPC server.
func (g *Gateway) shutdown(ctx context.Context) {
	g.stopping.Store(true)
	g.draining.Store(true)
	n := g.sessions.len()
	g.log.InfoContext(ctx, "Gateway draining", "sessions", n, "drain_delay", g.cfg.DrainDelay.String())
	if _, err := g.upsertRow(ctx); err != nil {
		g.log.WarnContext(ctx, "Gateway row not marked draining", logkey.Err, err)
	}
	g.recordDrain(ctx)
	g.drainAll("gateway shutting down")
	stopped := make(chan struct{})
	go func() {
		g.server.GracefulStop()
		close(stopped)
	}()
	t := time.NewTimer(g.cfg.ShutdownGrace)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		g.server.Stop()
		<-stopped
	}
}

// finish writes what is left (sessions, the counts of Join refusals),
// releases the lease and deletes the row.
func (g *Gateway) finish() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.flush(ctx, false); err != nil {
		g.log.ErrorContext(ctx, "Final session write failed", logkey.Err, err)
	}
	g.admit.FlushRefusals(ctx)
	if err := g.store.GatewayDelete(ctx, g.cfg.ID); err != nil {
		g.log.WarnContext(ctx, "Gateway row not deleted", logkey.Err, err)
	}
	g.releaseLease()
	g.log.InfoContext(ctx, "Gateway stopped")
}
