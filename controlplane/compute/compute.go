package compute

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/serve"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
)

// Config configures an embedded control plane.
type Config struct {
	// Config is the control plane's configuration, as config.Load returns
	// it (file, environment, flags, defaults, validated). Required.
	Config *config.Config
	// Store, when set, is the store Run runs on; the caller opens and
	// closes it. Defaults to the configuration's (database.url, or the
	// embedded SQLite database in dataDir), which Run opens and closes.
	Store store.Store
	// Log receives the control plane's logs. Defaults to discarding them.
	Log *slog.Logger
	// Version is the build's version, reported by gateways, workers and
	// the well-known document. Defaults to "embedded".
	Version string
	// NoMigrate makes Run refuse to start while migrations are pending
	// (serve --no-migrate) instead of applying them.
	NoMigrate bool
}

// ControlPlane is an embedded control plane: Handler serves its API, Run
// runs its roles.
type ControlPlane struct {
	cfg     Config
	api     atomic.Pointer[api.Server]
	ready   chan struct{}
	running atomic.Bool
	handler http.Handler
}

// ErrRunning is returned by a second Run on one ControlPlane.
var ErrRunning = errors.New("compute: Run was already called")

// New validates cfg and returns a control plane that runs nothing yet:
// call Run. It fails when cfg.Config is nil.
func New(cfg Config) (*ControlPlane, error) {
	if cfg.Config == nil {
		return nil, errors.New("compute: Config.Config is required (config.Load returns it)")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Version == "" {
		cfg.Version = "embedded"
	}
	c := &ControlPlane{cfg: cfg, ready: make(chan struct{})}
	c.handler = http.HandlerFunc(c.serveHTTP)
	return c, nil
}

// Handler returns the HTTP API: POST {basePath}/{group}/{method}, the
// event stream, the install script, /healthz, /readyz and the other routes
// of docs/api.md. Mount it at basePath ("/api/" by default) or at "/" on
// the program's own server. The caller's address is the request's
// RemoteAddr; forwarding headers count only from trustedProxies (see the
// package documentation). Until Run has started the api role it answers
// 503 UNAVAILABLE.
func (c *ControlPlane) Handler() http.Handler { return c.handler }

// Ready is closed once Run has started the api role and Handler serves the
// API.
func (c *ControlPlane) Ready() <-chan struct{} { return c.ready }

func (c *ControlPlane) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if s := c.api.Load(); s != nil {
		s.Handler().ServeHTTP(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", "1")
	w.WriteHeader(http.StatusServiceUnavailable)
	fmt.Fprintln(w, `{"code":"UNAVAILABLE","message":"the control plane's api role is not running here: Run it with the api role"}`)
}

// Run runs roles (nil: the configuration's roles; "all" or any of
// config.Roles) until ctx ends or one fails, then stops them and returns;
// a clean stop returns nil. It migrates first unless Config.NoMigrate. The
// api role serves through Handler only. Run fails at once for an unknown
// role, for split roles on the embedded SQLite database, and when called a
// second time (ErrRunning).
func (c *ControlPlane) Run(ctx context.Context, roles []string) error {
	cfg := *c.cfg.Config
	if roles != nil {
		for _, r := range roles {
			if r != "all" && !slices.Contains(config.Roles, r) {
				return fmt.Errorf("compute: unknown role %q (want all or %s)", r, strings.Join(config.Roles, ", "))
			}
		}
		cfg.RolesList = slices.Clone(roles)
	}
	if cfg.Embedded && !cfg.AllRoles() {
		return errors.New("compute: split roles need PostgreSQL (database.url): the embedded SQLite database serves one process running all roles")
	}
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	st := c.cfg.Store
	if st == nil {
		if err := cfg.EnsureEmbeddedSecret(); err != nil {
			return fmt.Errorf("compute: %w", err)
		}
		var err error
		if st, err = backend.Open(ctx, cfg.Database.URL, cfg.DataDir); err != nil {
			return fmt.Errorf("compute: open store: %w", err)
		}
		defer st.Close()
	}
	err := serve.Run(ctx, &cfg, st, serve.Options{NoMigrate: c.cfg.NoMigrate, Version: c.cfg.Version, Log: c.cfg.Log,
		ExternalAPI: true, APIReady: func(s *api.Server) {
			c.api.Store(s)
			close(c.ready)
		}})
	c.api.Store(nil)
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("compute: %w", err)
	}
	return nil
}
