// Package api is the api role: the HTTP API under basePath, health and
// readiness, and the well-known document (DESIGN.md, "api").
package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/iam"
	"github.com/better-compute/better-compute/controlplane/store"
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
	// Version is reported by the well-known document.
	Version string
	// Waker, when set, is told of new commands right after they commit.
	Waker Waker
	// Downloads, when set, serves {basePath}/downloads/.
	Downloads http.Handler
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
	// Pprof, with MetricsToken, serves net/http/pprof's profiles under
	// /debug/pprof/ behind the same token (host.metrics.pprof).
	Pprof bool
}

// Server serves the HTTP API.
type Server struct {
	cfg     Config
	store   store.Store
	auth    *iam.Authenticator
	waker   Waker
	log     *slog.Logger
	mux     *http.ServeMux
	handler http.Handler
	methods map[string]*method

	pinMu sync.Mutex
	pin   string    // gateway CA pin of the bundle version pinOf
	pinOf time.Time // the bundle's updated_at when pin was read
	// ready is closed once the listener is bound; Addr is valid after.
	ready chan struct{}
	addr  net.Addr
}

// New returns a Server on st (the API uses most of the storage seam); call
// Run to serve.
func New(cfg Config, st store.Store, log *slog.Logger) *Server {
	cfg.Listen = cmp.Or(cfg.Listen, "0.0.0.0:3000")
	cfg.BasePath = cmp.Or(cfg.BasePath, "/api")
	cfg.ShutdownGrace = cmp.Or(cfg.ShutdownGrace, 5*time.Second)
	s := &Server{cfg: cfg, store: st, log: logger(log), mux: http.NewServeMux(), ready: make(chan struct{}),
		auth: iam.NewAuthenticator(iam.Config{}, st), waker: cfg.Waker, methods: map[string]*method{}}
	s.registerMethods()
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.HandleFunc("GET "+cfg.BasePath+"/health", s.health)
	s.mux.HandleFunc("GET /.well-known/better-compute", s.wellKnown)
	s.mux.HandleFunc("POST "+cfg.BasePath+"/{group}/{method}", withOrigin(s.serveRPC))
	s.mux.HandleFunc(cfg.BasePath+"/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, notFound("no route %s %s", r.Method, r.URL.Path))
	})
	if cfg.Downloads != nil {
		// GET (and HEAD): a method-less pattern would clash with the RPC route.
		s.mux.Handle("GET "+cfg.BasePath+"/downloads/", cfg.Downloads)
	}
	s.mountMetrics()
	s.handler = &callerAddress{trusted: cfg.TrustedProxies, next: s.mux}
	return s
}

// Handler returns the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.handler }

// Ready is closed once the listener is bound.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Addr is the bound address, valid after Ready.
func (s *Server) Addr() net.Addr { return s.addr }

// Run serves until ctx ends, then closes the listener and lets in-flight
// requests finish within the shutdown grace.
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("api listen on %s: %w", s.cfg.Listen, err)
	}
	s.addr = ln.Addr()
	close(s.ready)
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.log.InfoContext(ctx, "API listening", "addr", s.addr.String(), "base_path", s.cfg.BasePath)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
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
