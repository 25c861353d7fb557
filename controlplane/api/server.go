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
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// Store is what the API reads and writes.
type Store interface {
	Ping(ctx context.Context) error
	MigrationStatus(ctx context.Context) (*store.MigrationStatus, error)
}

// Config configures the api role.
type Config struct {
	// Listen is the HTTP address. Defaults to 0.0.0.0:3000.
	Listen string
	// BasePath prefixes the API routes. Defaults to /api.
	BasePath string
	// ShutdownGrace bounds how long in-flight requests may finish on
	// shutdown. Defaults to 5 s.
	ShutdownGrace time.Duration
}

// Server serves the HTTP API.
type Server struct {
	cfg   Config
	store Store
	log   *slog.Logger
	mux   *http.ServeMux
	// ready is closed once the listener is bound; Addr is valid after.
	ready chan struct{}
	addr  net.Addr
}

// New returns a Server; call Run to serve.
func New(cfg Config, st Store, log *slog.Logger) *Server {
	cfg.Listen = cmp.Or(cfg.Listen, "0.0.0.0:3000")
	cfg.BasePath = cmp.Or(cfg.BasePath, "/api")
	cfg.ShutdownGrace = cmp.Or(cfg.ShutdownGrace, 5*time.Second)
	s := &Server{cfg: cfg, store: st, log: log, mux: http.NewServeMux(), ready: make(chan struct{})}
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.HandleFunc("GET "+cfg.BasePath+"/health", s.health)
	return s
}

// Handler returns the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.mux }

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
		Handler:           s.mux,
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
