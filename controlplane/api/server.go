// Package api is the api role: the HTTP API under basePath, health and
// readiness, and the well-known document (DESIGN.md, "api").
package api

import (
	"cmp"
	"context"
	"crypto/cipher"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/accept"
	"github.com/better-compute/better-compute/controlplane/internal/certreload"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/feed"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/sso"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	"github.com/better-compute/better-compute/controlplane/reconcilers/placer"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// Config configures the api role.
type Config struct {
	// Listen is the HTTP address. Defaults to 0.0.0.0:3000.
	Listen string
	// BasePath prefixes the API routes. Defaults to /api.
	BasePath string
	// ShutdownGrace bounds how long in-flight requests may finish on
	// shutdown. Defaults to 5 s.
	ShutdownGrace time.Duration
	// TrustedProxies are the peers whose X-Forwarded-For is believed.
	TrustedProxies []netip.Prefix
	// Secret is the deployment secret, to open the PKI bundle.
	Secret string
	// RotationThreshold is the share of live nodes whose acknowledgement
	// activates a node-CA rotation started without one. Defaults to
	// rotation.DefaultThreshold (0.99).
	RotationThreshold float64
	// RotationRetireGrace is how long after activation a node-CA rotation
	// retires even with nodes on the old CA (pki.reattestGrace). Defaults
	// to rotation.DefaultRetireGrace (7 days).
	RotationRetireGrace time.Duration
	// RotationCAValidity is the life of the node CA a rotation makes
	// (pki.nodeCAValidity). Defaults to pki.DefaultCAValidity (ten years).
	RotationCAValidity time.Duration
	// Version is reported by the well-known document.
	Version string
	// Waker, when set, is told of new commands right after they commit.
	Waker Waker
	// Revoker, when set, is told of each revocation right after it
	// commits (the internal control API's push, control.Client).
	Revoker Revoker
	// Tunnels, when set, opens the tunnels GET {basePath}/tunnels/{ticket}
	// relays (the gateway in the all-in-one process, the internal control
	// API's client otherwise). Without it tunnels are refused UNAVAILABLE.
	Tunnels tunnel.Opener
	// TunnelIdleTimeout closes a tunnel through which no frame passed for
	// that long. Defaults to DefaultTunnelIdleTimeout (15 min).
	TunnelIdleTimeout time.Duration
	// Recording configures the recording of every shell this process
	// relays (host.gateway.tunnels.recording; docs/tunnels.md, "Recorded
	// shells"); chunks are sealed under Secret. Its zero value is the
	// default: recordings of at most 64 MiB, a shell closed when its
	// recording fails.
	Recording config.TunnelRecording
	// Downloads, when set, serves {basePath}/downloads/.
	Downloads http.Handler
	// EmbeddedDir is the directory of the embedded database ("" on
	// PostgreSQL): /readyz answers not ready, "database disk full", while
	// its filesystem has less than MinFreeBytes free (issue 29).
	EmbeddedDir string
	// Sinks are the names of the configured event sinks (sinks.webhooks and
	// sinks.files): sinks.replay for any other sink is NOT_FOUND (issue 29).
	Sinks []string
	// SinkTenants are the configured sinks' tenants (a tenant's id) by sink
	// name; a sink not in it is deployment-wide, its dead letters the
	// root's only (docs/tenants.md, "Sinks").
	SinkTenants map[string]string
	// DownloadsURL is the downloads route as nodes reach it, for upgrade
	// commands that name no base URL (downloads.publicURL). Defaults to
	// the scheme and host each commands.create request came to, with
	// BasePath + "/downloads", when Downloads is set.
	DownloadsURL string
	// Metrics, when set together with MetricsToken, serves GET /metrics
	// (package metrics).
	Metrics http.Handler
	// MetricsToken is host.metrics.bearerToken: /metrics answers only
	// requests carrying "Authorization: Bearer <MetricsToken>". Shorter
	// than 16 characters, /metrics is not mounted.
	MetricsToken string
	// Remediation is the configuration's remediation key (the breakers'
	// sizes and window for remediation.breakers).
	Remediation config.Remediation
	// Pprof, with MetricsToken, serves net/http/pprof's profiles under
	// /debug/pprof/ behind the same token (host.metrics.pprof).
	Pprof bool
	// TLSCertFile and TLSKeyFile, when both set, make the API serve HTTPS
	// with the certificate in them (leaf first), re-read every 60 s
	// (host.tls; mode auto issues them into DataDir/pki).
	TLSCertFile, TLSKeyFile string
	// PublicURL is the API's origin as other machines reach it
	// (host.publicURL), for nodes.add's install command and the install
	// script's downloads. Defaults to PublicHost on the bound port, https
	// when TLSCertFile is set.
	PublicURL string
	// PublicHost is the host of the default PublicURL. Defaults to
	// localhost.
	PublicHost string
	// GatewayURL is the gateway the install script joins through
	// (host.gateway.publicURL). Defaults to a live gateway's address.
	GatewayURL string
	// WebSocketURL is the WebSocket fallback's URL
	// (host.gateway.ws.publicURL), for install scripts asked for with
	// ?transport=websocket; empty when the fallback is off.
	WebSocketURL string
	// SSO, when set, signs people in through the OpenID provider
	// (iam.oidc): the endpoints {basePath}/sso/* and the fleet page's
	// sign-in. Nil: people use API tokens.
	SSO *sso.Service
	// Releases, when set, is the downloads folder the install script route
	// ({basePath}/install.sh) installs bcd from.
	Releases Releases
	// ReleasePins are downloads.releasePins: with them the install script
	// pins the signed release manifest of the version it installs.
	ReleasePins []string
	// Refusals, when set, counts calls refused for their token.
	Refusals RefusalCounter
	// Now is the clock of the unauthenticated-refusal summary rows.
	// Defaults to time.Now.
	Now func() time.Time
	// Feed, when set, is the process's outbox reader the event stream
	// reads; the caller runs it. Defaults to a feed.New of the store's
	// outbox that Run runs (Server.Feed returns it, for other readers in
	// the process such as the fleet page).
	Feed *feed.Feed
	// EventWakeups, when set, wakes the feed Run runs when another process
	// wrote to the outbox (serve: a wake.Bus that LISTENs on
	// postgres.OutboxChannel); this process's own writes wake it through
	// the store's OutboxWritten.
	EventWakeups <-chan struct{}
	// Listeners watches the process's listeners, the API's among them:
	// accepts back off on temporary errors, and /readyz answers 503 while
	// one has failed to accept for more than 10 s in a row
	// (internal/accept). Defaults to a watch of the API's listener alone.
	Listeners *accept.Watch
	// Clock, when set, is the process's clock check (package clockcheck):
	// /readyz answers 503 with its reason while Check returns an error.
	Clock Checker
	// EventPoll is how often the feed Run runs reads the outbox without a
	// wake-up (feed.Config.Poll). Defaults to 500 ms.
	EventPoll time.Duration
	// EventHeartbeat is how often an idle event stream sends a comment.
	// Defaults to 15 s.
	EventHeartbeat time.Duration
	// RevocationCheck is how often the event streams and tunnels this
	// process holds are checked against the database, so that a revoked
	// or expired token, or a revoked or deleted node, ends them whichever
	// process revoked it. Defaults to DefaultRevocationCheck (1 s).
	RevocationCheck time.Duration
	// EventStreamsPerToken caps the event streams one token holds open at
	// once; more are refused RESOURCE_EXHAUSTED (host.limits). Defaults to
	// DefaultEventStreamsPerToken (16).
	EventStreamsPerToken int
	// InFlightPerToken caps the API calls one token has in flight at once;
	// more are refused RESOURCE_EXHAUSTED (host.limits). Defaults to
	// DefaultInFlightPerToken (64).
	InFlightPerToken int
	// BodyReadTimeout bounds how long a request's whole body may take to
	// arrive (host.limits). Defaults to DefaultBodyReadTimeout (30 s).
	BodyReadTimeout time.Duration
}

// Store is what the API reads and writes: most of the storage seam,
// composed of its domain interfaces. Its transactions (store.InTx) receive
// the small interfaces of tx.go, never the whole store.
type Store interface {
	store.Transactor
	Ping(ctx context.Context) error
	store.Migrator
	store.TenantStore
	store.PKIRotationStore
	store.RecordingStore
	store.ReleasePinStore
	store.SiteStore
	store.PoolStore
	store.NodeStore
	store.JoinTokenStore
	store.GatewayStore
	store.TunnelStore
	store.SessionStore
	store.ProcessStore
	store.CommandStore
	store.OutboxStore
	store.DeadLetterStore
	store.EventStore
	store.AuditStore
	store.PKIStore
	store.APITokenStore
	store.OIDCSessionStore
	store.SecretStore
	store.DisruptionStore
	store.ReservationStore
	store.RemediationStore
	store.RolloutStore
	store.GPUStore
	store.PolicyStore
	store.AccessStore
}

// Server serves the HTTP API.
type Server struct {
	cfg   Config
	store Store
	auth  *iam.Authenticator
	// policies decide every call, page action and tunnel (authorize.go).
	policies *policies
	// ssoLimit bounds the sign-in calls of each address (sso.go).
	ssoLimit ssoLimiter
	waker    Waker
	log      *slog.Logger
	mux      *http.ServeMux
	handler  http.Handler
	methods  map[string]*method
	// cursorAEAD seals the list cursors of a tenant's callers (cursor.go).
	cursorAEAD cipher.AEAD
	certs      *certreload.Reloader // nil: plain HTTP
	unauth     unauthSummary

	// streams and inFlight count each token's event streams and calls in
	// flight against their caps.
	streams, inFlight *holdings

	// feed is the event stream's outbox reader; ownFeed when Run runs it.
	feed    *feed.Feed
	ownFeed bool
	// stopping is closed when shutdown begins: event streams end then
	// rather than hold the shutdown for its whole grace.
	stopping chan struct{}
	stopOnce sync.Once
	// live are the event streams and tunnels open now, for checkLiveLoop.
	live *liveCalls
	// accessSwept is when checkLiveLoop last swept the expired access
	// requests (sweepAccess); its goroutine alone reads and writes it.
	accessSwept time.Time

	// table is apiv1.Methods by name, what handle registers against;
	// bindErrs what it refused.
	table    map[string]apiv1.Method
	bindErrs []error
	openAPI  []byte // {basePath}/openapi.json

	// capacity keeps the GPUs of node inventories decoded for
	// capacity.summary, by inventory digest (placer.Facts).
	capacity *placer.Facts

	pinMu sync.Mutex
	pin   string    // gateway CA pin of the bundle version pinOf
	pins  []string  // the pins a join token carries (pki.Bundle.GatewayPins) of that version
	pinOf time.Time // the bundle's updated_at when pin was read
	// ready is closed once the listener is bound; Addr is valid after.
	ready chan struct{}
	addr  net.Addr
}

// New returns a Server on st (the API uses most of the storage seam); call
// Run to serve.
func New(cfg Config, st Store, log *slog.Logger) *Server {
	cfg.Listen = cmp.Or(cfg.Listen, "0.0.0.0:3000")
	cfg.BasePath = cmp.Or(cfg.BasePath, "/api")
	cfg.ShutdownGrace = cmp.Or(cfg.ShutdownGrace, 5*time.Second)
	cfg.EventStreamsPerToken = cmp.Or(cfg.EventStreamsPerToken, DefaultEventStreamsPerToken)
	cfg.InFlightPerToken = cmp.Or(cfg.InFlightPerToken, DefaultInFlightPerToken)
	cfg.BodyReadTimeout = cmp.Or(cfg.BodyReadTimeout, DefaultBodyReadTimeout)
	s := &Server{cfg: cfg, store: st, log: logger(log), mux: http.NewServeMux(), ready: make(chan struct{}),
		auth: iam.NewAuthenticator(iam.Config{}, st), waker: cfg.Waker, methods: map[string]*method{},
		capacity: placer.NewFacts(), streams: newHoldings(cfg.EventStreamsPerToken), inFlight: newHoldings(cfg.InFlightPerToken)}
	s.unauth.now = cfg.Now
	var err error
	if s.cursorAEAD, err = newCursorAEAD(cfg.Secret); err != nil {
		panic("api: " + err.Error()) // AES-256-GCM with a 32-byte key does not fail
	}
	if s.cfg.Listeners == nil {
		s.cfg.Listeners = accept.NewWatch(accept.Config{Log: s.log})
	}
	s.stopping = make(chan struct{})
	s.live = newLiveCalls()
	if s.feed = cfg.Feed; s.feed == nil {
		s.feed, s.ownFeed = feed.New(feed.Config{Poll: cfg.EventPoll}, st, s.log), true
	}
	if s.unauth.now == nil {
		s.unauth.now = time.Now
	}
	s.table = map[string]apiv1.Method{}
	for _, m := range apiv1.Methods {
		s.table[m.Name] = m
	}
	s.policies = newPolicies(s.table, st, s.log, s.now)
	s.registerMethods()
	// A handler without an rpc or an rpc without a handler is a build
	// mistake (TestMethodsMatchProto): refuse to start rather than serve
	// another API than the one api.proto and openapi.json describe.
	if err := s.checkMethods(); err != nil {
		panic("api: the handlers do not match api.proto: " + err.Error())
	}
	s.openAPI = openAPIDocument(cfg.BasePath)
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.HandleFunc("GET "+cfg.BasePath+"/health", s.health)
	s.mux.HandleFunc("GET /.well-known/better-compute", s.wellKnown)
	s.mux.HandleFunc("GET "+cfg.BasePath+InstallScriptPath, s.serveInstallScript)
	s.mux.HandleFunc("GET "+cfg.BasePath+OpenAPIPath, s.serveOpenAPI)
	s.mux.HandleFunc("POST "+cfg.BasePath+"/{group}/{method}", withOrigin(s.serveRPC))
	s.mux.HandleFunc("GET "+cfg.BasePath+EventsWatchPath, s.serveEventsWatch)
	s.mux.HandleFunc("GET "+cfg.BasePath+TunnelsPath+"{ticket}", s.serveTunnel)
	s.mux.HandleFunc(cfg.BasePath+"/", s.noRoute)
	if cfg.Downloads != nil {
		// GET (and HEAD): a method-less pattern would clash with the RPC route.
		s.mux.Handle("GET "+cfg.BasePath+"/downloads/", cfg.Downloads)
	}
	s.mountMetrics()
	s.mountSSO()
	s.mountWatch()
	s.handler = &callerAddress{trusted: cfg.TrustedProxies, next: bodyDeadline(cfg.BodyReadTimeout, http.HandlerFunc(s.route))}
	return s
}

// route hands a request to the mux, except a download path that is not
// clean (".", ".." or empty segments): the mux would redirect it (307) to
// its cleaned form, and docs/install.md promises 400 INVALID_ARGUMENT, which
// the downloads handler answers (issue 29).
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Downloads != nil {
		if rest, ok := strings.CutPrefix(r.URL.Path, s.cfg.BasePath+"/downloads/"); ok && path.Clean("/"+rest) != "/"+strings.TrimSuffix(rest, "/") {
			s.cfg.Downloads.ServeHTTP(w, r)
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// noRoute answers what no route took under basePath: 405 with "Allow:
// POST" for an API method's path called with another HTTP method, 405 with
// "Allow: GET, HEAD" for a GET route called with another (RFC 9110
// §15.5.6), 404 otherwise.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, s.cfg.BasePath+"/")
	if group, method, ok := strings.Cut(rest, "/"); ok && s.methods[group+"."+method] != nil {
		w.Header().Set("Allow", http.MethodPost)
		s.writeError(w, r, &Error{Code: apiv1.CodeMethodNotAllowed,
			Message: fmt.Sprintf("%s %s: API methods are called with POST", r.Method, r.URL.Path)})
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		// A path served to GET only (install.sh, downloads, openapi.json,
		// health) called with another method.
		probe := r.Clone(r.Context())
		probe.Method = http.MethodGet
		if _, pattern := s.mux.Handler(probe); pattern != "" && pattern != s.cfg.BasePath+"/" {
			w.Header().Set("Allow", "GET, HEAD")
			s.writeError(w, r, &Error{Code: apiv1.CodeMethodNotAllowed, Message: fmt.Sprintf("%s %s: this path answers GET and HEAD", r.Method, r.URL.Path)})
			return
		}
	}
	s.writeError(w, r, notFound("no route %s %s", r.Method, r.URL.Path))
}

// certReloadInterval is how often the API re-reads its certificate files,
// as the gateway does.
const certReloadInterval = 60 * time.Second

// loopbackListen reports whether addr accepts connections from this
// machine only.
func loopbackListen(addr net.Addr) bool {
	a, ok := addr.(*net.TCPAddr)
	return ok && a.IP.IsLoopback()
}

// Feed returns the process's outbox reader, which the event stream reads
// (for other readers in the process, such as the fleet page).
func (s *Server) Feed() *feed.Feed { return s.feed }

// Handler returns the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Ready is closed once the listener is bound.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr is the bound address, valid after Ready.
func (s *Server) Addr() net.Addr { return s.addr }

// background starts the server's own loops (its event feed, when it owns
// one, and the liveness check) under ctx and returns the function that
// stops them and waits until they have returned, so that nothing of the
// server reads the store once Run or RunHandler has returned.
func (s *Server) background(ctx context.Context) (stop func()) {
	bctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	unsubscribe := func() {}
	if s.ownFeed {
		var written <-chan struct{}
		written, unsubscribe = s.store.OutboxWritten()
		wg.Go(func() { _ = s.feed.Run(bctx, written, s.cfg.EventWakeups) })
	}
	wg.Go(func() { s.checkLiveLoop(bctx) })
	return func() {
		cancel()
		wg.Wait()
		unsubscribe()
	}
}

// RunHandler runs what Handler needs besides a listener until ctx ends:
// the event feed (when the server owns it) and the checks that end the
// event streams and tunnels of revoked tokens and nodes. It is for a
// caller that serves Handler on its own http.Server or mux (package
// compute) instead of calling Run: Listen and the TLS files are not used,
// Ready is closed at once and Addr stays nil. Event streams end when ctx
// does.
func (s *Server) RunHandler(ctx context.Context) error {
	defer s.background(ctx)()
	close(s.ready)
	s.log.InfoContext(ctx, "API serving through the caller's handler", "base_path", s.cfg.BasePath)
	<-ctx.Done()
	s.stopOnce.Do(func() { close(s.stopping) })
	return nil
}

// Run serves until ctx ends, then closes the listener and lets in-flight
// requests finish within the shutdown grace.
func (s *Server) Run(ctx context.Context) error {
	var tlsCfg *tls.Config
	if s.cfg.TLSCertFile != "" || s.cfg.TLSKeyFile != "" {
		certs, err := certreload.New(s.cfg.TLSCertFile, s.cfg.TLSKeyFile, s.log)
		if err != nil {
			return fmt.Errorf("api: %w", err)
		}
		s.certs = certs
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate}
		rctx, stopReload := context.WithCancel(ctx)
		defer stopReload()
		go certs.Run(rctx, certReloadInterval)
	}
	tcp, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("api listen on %s: %w", s.cfg.Listen, err)
	}
	ln := s.cfg.Listeners.Wrap("api", tcp)
	s.addr = ln.Addr()
	defer s.background(ctx)()
	close(s.ready)
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		TLSConfig:         tlsCfg,
	}
	srv.RegisterOnShutdown(func() { s.stopOnce.Do(func() { close(s.stopping) }) })
	scheme := "http"
	if tlsCfg != nil {
		scheme = "https"
	}
	s.log.InfoContext(ctx, "API listening", "addr", s.addr.String(), "base_path", s.cfg.BasePath, "scheme", scheme,
		"public_url", s.PublicURL())
	if tlsCfg == nil && !loopbackListen(s.addr) {
		s.log.WarnContext(ctx, "The API serves plain HTTP on an address other machines reach: API tokens and join tokens cross the network in clear text; serve HTTPS with --api-tls auto (or files)",
			"addr", s.addr.String())
	}
	errc := make(chan error, 1)
	go func() {
		if tlsCfg != nil {
			errc <- srv.ServeTLS(ln, "", "")
			return
		}
		errc <- srv.Serve(ln)
	}()
	select {
	case err := <-errc:
		return fmt.Errorf("api serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("api shutdown: %w", err)
	}
	return nil
}
