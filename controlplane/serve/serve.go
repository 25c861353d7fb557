// Package serve runs the roles a configuration names in one process, and
// stops them in the order of DESIGN.md on cancellation: gateway drains, HTTP
// closes, workers release their leases.
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/gateway"
	"github.com/better-compute/better-compute/controlplane/internal/accept"
	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/clockcheck"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/control"
	"github.com/better-compute/better-compute/controlplane/pkg/metrics"
	"github.com/better-compute/better-compute/controlplane/pkg/process"
	"github.com/better-compute/better-compute/controlplane/pkg/sso"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	"github.com/better-compute/better-compute/controlplane/pkg/wake"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/workers"
)

// Options are serve's run-time switches.
type Options struct {
	// NoMigrate starts without migrating; pending migrations are then an
	// error.
	NoMigrate bool
	// Version is the build's version, reported by gateways and workers.
	Version string
	// Commit is the build's commit, for bettercompute_build_info.
	Commit string
	Log    *slog.Logger
	// APIReady, when set, receives the API server once it listens (tests
	// and dev use it to learn the bound address).
	APIReady func(*api.Server)
	// GatewayReady, when set, receives the gateway once it listens and
	// holds its lease (Addr and PublicURL are then valid).
	GatewayReady func(*gateway.Gateway)
	// ExternalAPI makes the api role serve only through the API server's
	// Handler, which the caller mounts on its own server (package
	// compute, through APIReady): no listener opens on host.listen, host.tls
	// is the caller's server's business, and no api-url is recorded in the
	// data directory.
	ExternalAPI bool
	// Now is this process's wall clock: the gateway judges certificates by
	// it, and the clock check (package clockcheck) holds the gateway and
	// workers back while it is wrong. Defaults to time.Now; the clockshift
	// test build of better-compute shifts it.
	Now func() time.Time
}

// Run migrates (unless NoMigrate), then runs the configured roles until ctx
// ends or one fails, and then stops them in the order of DESIGN.md: the
// gateway drains first (Drain to every daemon, listeners closed, lease
// released), then the HTTP listener closes, then the worker roles release
// their leases and leave the workers table.
func Run(ctx context.Context, cfg *config.Config, st store.Store, opts Options) error {
	log := opts.Log
	if cfg.Embedded {
		// Held until serve returns, so that store copy and restore refuse
		// to work on a deployment that runs, naming this process.
		lock, err := backend.LockDataDir(cfg.DataDir, false, fmt.Sprintf("better-compute serve (pid %d)", os.Getpid()))
		if err != nil {
			return fmt.Errorf("serve the embedded deployment: %w", err)
		}
		defer lock.Release()
	}
	sd := notifier{log: log}
	sd.status(ctx, "Starting: checking the schema, then starting "+strings.Join(cfg.RolesList, ","))
	if err := prepareSchema(ctx, st, opts.NoMigrate, log); err != nil {
		return err
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	// The gateway and the workers start once this process's clock is
	// found right; /readyz says why until then.
	clock, err := clockcheck.New(clockcheck.Config{Store: st, Now: opts.Now, Logger: log})
	if err != nil {
		return err
	}
	bus, stopWake, err := wakeBus(ctx, cfg)
	if err != nil {
		return err
	}
	defer stopWake()
	m := metrics.New(metrics.Config{Sinks: sinkNames(cfg), Log: log, Version: opts.Version, Commit: opts.Commit,
		Breaker: cfg.Remediation.Breaker, Secret: cfg.Secret}, st)
	// Every listener of the process goes through one watch: accepts back
	// off on temporary errors, and /readyz reports a listener that keeps
	// failing (internal/accept).
	listeners := accept.NewWatch(accept.Config{Log: log, Metrics: m})
	// The gateway is built first: a missing PKI stops serve before any
	// listener opens.
	var gw *gateway.Gateway
	var ctrl *control.Server // the gateway's internal control API, when configured
	if cfg.Runs("gateway") {
		wakeups, unsubscribe := bus.Subscribe()
		defer unsubscribe()
		if gw, ctrl, err = newGateway(ctx, cfg, st, opts, wakeups, m, listeners); err != nil {
			return err
		}
		if ctrl != nil {
			defer ctrl.Close()
		}
	}
	// listen are the wake-up channels this process LISTENs on (PostgreSQL):
	// the gateway's command wake-ups, the api's event feed's outbox writes
	// of other processes.
	listen := map[string]*wake.Bus{}
	if gw != nil {
		listen[wake.Channel] = bus
	}
	// Outbox writes of other processes wake the api's event feed and the
	// sinks' dispatchers.
	var outboxWakeups func() (<-chan struct{}, func())
	if cfg.Runs("api") || cfg.Runs("sinks") {
		outbox := wake.NewBus(nil)
		listen[postgres.OutboxChannel] = outbox
		outboxWakeups = outbox.Subscribe
	}
	// internalID is the process's one identity on the internal control
	// API (the gateway's server and the api's client share it): it follows
	// the bundle through an internal-CA rotation and reports what it
	// trusts in the process's row.
	var internalID *control.Identity
	if ctrl != nil {
		internalID = ctrl.Identity()
	}
	var srv *api.Server
	if cfg.Runs("api") {
		eventWakeups, unsubscribeEvents := outboxWakeups()
		defer unsubscribeEvents()
		if cfg.Embedded {
			if err := ensureAdminToken(ctx, cfg.DataDir, st, log); err != nil {
				return err
			}
		}
		dl, closeDownloads, err := downloadsHandler(cfg, log)
		if err != nil {
			return err
		}
		defer closeDownloads()
		var certFile, keyFile string
		if !opts.ExternalAPI {
			if certFile, keyFile, err = apiCertFiles(ctx, cfg, st, opts); err != nil {
				return err
			}
			m.WatchCertificate(metrics.CertKindServing, "api", certFile)
		}
		// With the internal control API the api wakes only the gateway
		// holding each node's session, and the bus (NOTIFY) only for what
		// it cannot reach that way.
		var waker api.Waker = bus
		var revoker api.Revoker
		var gwID *control.Identity
		if ctrl != nil {
			gwID = ctrl.Identity()
		}
		internal, err := internalClient(ctx, cfg, st, bus, gwID, log)
		if err != nil {
			return err
		}
		if internal != nil {
			defer internal.Close()
			internalID = internal.Identity()
			m.WatchCertificate(metrics.CertKindInternal, "client", cfg.Host.Gateway.Internal.TLSFiles.Cert)
			waker, revoker = internal, internal
		}
		if internal == nil && gw != nil {
			revoker = localRevoker{gw}
		}
		// Tunnels go to this process's gateway when it holds the node's
		// session, else through the internal control API.
		var tunnels tunnel.Opener
		if gw != nil || internal != nil {
			tunnels = &tunnelRouter{st: st, local: gw, remote: internal}
		}
		srv = api.New(withInstall(api.Config{Listen: cfg.Host.Listen, BasePath: cfg.BasePath, TrustedProxies: cfg.ParsedProxies,
			Secret: cfg.Secret, Version: opts.Version, Downloads: dl, Sinks: sinkNames(cfg), SinkTenants: sinkTenants(cfg), EmbeddedDir: embeddedDir(cfg), DownloadsURL: cfg.Downloads.PublicURL, Waker: waker, Revoker: revoker,
			Tunnels: tunnels, TunnelIdleTimeout: cfg.Host.Gateway.Tunnels.IdleTimeout.Duration, Recording: cfg.Host.Gateway.Tunnels.Recording,
			EventWakeups: eventWakeups, Listeners: listeners, Clock: clock, Metrics: m.Handler(), MetricsToken: cfg.Host.Metrics.BearerToken, Pprof: cfg.Host.Metrics.Pprof, Remediation: cfg.Remediation, Refusals: m,
			EventStreamsPerToken: cfg.Host.Limits.EventStreamsPerToken, InFlightPerToken: cfg.Host.Limits.InFlightPerToken,
			BodyReadTimeout: cfg.Host.Limits.BodyReadTimeout.Duration, RotationRetireGrace: cfg.PKI.ReattestGrace.Duration,
			RotationCAValidity: cfg.PKI.NodeCAValidity.Duration, SSO: ssoService(cfg, st, log)},
			cfg, dl, certFile, keyFile), st, log)
	}

	// Every process registers in the processes table, whatever its roles
	// (issue 40); its row and its worker row share one id.
	processID := workers.NewWorkerID()
	var roles []string
	for _, r := range config.Roles {
		if cfg.Runs(r) {
			roles = append(roles, r)
		}
	}
	host, _ := os.Hostname()
	pc := process.Config{ID: processID, Roles: roles, Hostname: host, PID: os.Getpid(), Version: opts.Version,
		HeartbeatInterval: cfg.Host.Processes.HeartbeatInterval.Duration, PruneAfter: cfg.Host.Processes.PruneAfter.Duration}
	if internalID != nil {
		pc.Internal = internalID
	}
	reg, err := process.New(pc, st, log)
	if err != nil {
		return err
	}

	failed := make(chan error, 16)
	var stages []*stage
	// READY=1 waits for the listeners (gateway also holds its lease) and the
	// workers table (the workers' Ready).
	workersReady := make(chan struct{})
	ready := []<-chan struct{}{workersReady}
	if gw != nil {
		ready = append(ready, gw.Ready())
	}
	if srv != nil {
		ready = append(ready, srv.Ready())
	}
	// afterClock runs fn once the clock check passed.
	afterClock := func(fn func(context.Context) error) func(context.Context) error {
		return func(ctx context.Context) error {
			select {
			case <-clock.Ready():
				return fn(ctx)
			case <-ctx.Done():
				return nil
			}
		}
	}
	stages = append(stages, start(ctx, failed, clock.Run, nil, nil))
	// The serving certificates serve issues for itself are renewed while
	// it runs; the gateway and the API re-read them every 60 s.
	if renewer, err := servingRenewer(cfg, st, gw != nil, srv != nil && !opts.ExternalAPI, log); err != nil {
		return err
	} else if renewer != nil {
		stages = append(stages, start(ctx, failed, renewer.Run, nil, nil))
	}
	if gw != nil {
		stages = append(stages, start(ctx, failed, afterClock(gw.Run), gw.Ready(), func() {
			if opts.GatewayReady != nil {
				opts.GatewayReady(gw)
			}
		}))
	}
	if ctrl != nil {
		stages = append(stages, start(ctx, failed, func(ctx context.Context) error { return ctrl.Run(ctx, gw) }, nil, nil))
	}
	if cfg.Database.URL != "" && len(listen) > 0 {
		stages = append(stages, start(ctx, failed, func(ctx context.Context) error {
			// LISTEN needs a session: database.notifyURL, a direct
			// connection, when database.url is a transaction pooler.
			return wake.ListenChannels(ctx, cfg.Database.ListenURL(), listen, log)
		}, nil, nil))
	}
	if srv != nil {
		run := srv.Run
		if opts.ExternalAPI {
			run = srv.RunHandler
		}
		stages = append(stages, start(ctx, failed, run, srv.Ready(), func() {
			if opts.ExternalAPI {
				if opts.APIReady != nil {
					opts.APIReady(srv)
				}
				return
			}
			if err := writeAPIURL(cfg.DataDir, srv.LocalURL()+cfg.BasePath, srv.Addr().String()); err != nil {
				log.WarnContext(ctx, "The CLI on this machine will not find the API by itself", logkey.Err, err)
			}
			if opts.APIReady != nil {
				opts.APIReady(srv)
			}
		}))
	}
	stages = append(stages, start(ctx, failed, afterClock(func(ctx context.Context) error {
		return workers.Run(ctx, cfg, st, workers.Options{WorkerID: processID, Version: opts.Version, Metrics: m, OutboxWakeups: outboxWakeups, Waker: bus,
			Ready: func() { close(workersReady) }}, log)
	}), nil, nil))
	if cfg.Host.Metrics.Listen != "" {
		// A listener of its own (host.metrics.listen), for processes
		// without the API's; it closes last, after the workers.
		stages = append(stages, start(ctx, failed, func(ctx context.Context) error {
			return m.Serve(ctx, metrics.ListenConfig{Addr: cfg.Host.Metrics.Listen, Token: cfg.Host.Metrics.BearerToken,
				Pprof: cfg.Host.Metrics.Pprof, Listeners: listeners})
		}, nil, nil))
	}
	// The internal control API's identity follows the bundle until the
	// gateway and the api have stopped (stages stop in order), and the row
	// that reports it goes last.
	if internalID != nil {
		stages = append(stages, start(ctx, failed, func(ctx context.Context) error {
			return internalID.Run(ctx, st, cfg.Secret, 0, 0)
		}, nil, nil))
	}
	// Every process registers, whatever its roles; its row goes last.
	stages = append(stages, start(ctx, failed, reg.Run, nil, nil))
	log.InfoContext(ctx, "Serving", "roles", strings.Join(cfg.RolesList, ","), "store", string(st.Dialect()), "version", opts.Version)

	runErr := sd.supervise(ctx, failed, ready, func() string { return readyStatus(cfg, gw, srv) })
	for _, st := range stages {
		if err := st.stop(); err != nil && runErr == nil {
			runErr = err
		}
	}
	if runErr != nil {
		return runErr
	}
	log.Info("Stopped")
	return nil
}

// readyStatus is the STATUS= line sent with READY=1: the roles and the
// bound addresses.
func readyStatus(cfg *config.Config, gw *gateway.Gateway, srv *api.Server) string {
	s := "Serving " + strings.Join(cfg.RolesList, ",")
	switch {
	case srv != nil && srv.Addr() != nil:
		s += "; API on " + srv.Addr().String()
	case srv != nil:
		s += "; API through the caller's handler"
	}
	if gw != nil {
		s += "; gateway on " + gw.Addr().String() + " (" + gw.PublicURL() + ")"
	}
	return s
}

// stage is one running component with its own context, so components stop
// one after another.
type stage struct {
	cancel context.CancelFunc
	done   chan error
}

// start runs fn in its own context; a failure is reported on failed. When
// ready is set, onReady runs once it is closed.
func start(parent context.Context, failed chan<- error, fn func(context.Context) error, ready <-chan struct{}, onReady func()) *stage {
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	s := &stage{cancel: cancel, done: make(chan error, 1)}
	go func() {
		err := fn(ctx)
		if err != nil && ctx.Err() == nil {
			failed <- err
		}
		s.done <- err
	}()
	if ready != nil && onReady != nil {
		go func() {
			select {
			case <-ready:
				onReady()
			case <-ctx.Done():
			}
		}()
	}
	return s
}

// stop cancels the component and waits for it.
func (s *stage) stop() error {
	s.cancel()
	err := <-s.done
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// sinkNames lists the configured sinks, for the outbox backlog metric.
// embeddedDir is the directory of the embedded database, "" on PostgreSQL.
func embeddedDir(cfg *config.Config) string {
	if !cfg.Embedded {
		return ""
	}
	return cfg.DataDir
}

// sinkTenants are the configured sinks' tenants by sink name, for the
// sinks that name one.
func sinkTenants(cfg *config.Config) map[string]string {
	out := map[string]string{}
	for _, w := range cfg.Sinks.Webhooks {
		if w.Tenant != "" {
			out[w.Name] = w.Tenant
		}
	}
	for _, f := range cfg.Sinks.Files {
		if f.Tenant != "" {
			out[f.Name] = f.Tenant
		}
	}
	return out
}

func sinkNames(cfg *config.Config) []string {
	var out []string
	for _, w := range cfg.Sinks.Webhooks {
		out = append(out, w.Name)
	}
	for _, f := range cfg.Sinks.Files {
		out = append(out, f.Name)
	}
	return out
}

// wakeBus makes the wake-up bus: in memory, plus PostgreSQL NOTIFY when the
// store is PostgreSQL and this process runs the api role.
func wakeBus(ctx context.Context, cfg *config.Config) (*wake.Bus, func(), error) {
	if cfg.Database.URL == "" || !cfg.Runs("api") {
		return wake.NewBus(nil), func() {}, nil
	}
	n, err := wake.NewPGNotifier(ctx, cfg.Database.URL)
	if err != nil {
		return nil, nil, err
	}
	return wake.NewBus(n), n.Close, nil
}

// prepareSchema migrates, or with noMigrate checks the schema is current.
func prepareSchema(ctx context.Context, st store.Store, noMigrate bool, log *slog.Logger) error {
	if !noMigrate {
		applied, err := st.Migrate(ctx)
		if len(applied) > 0 {
			log.InfoContext(ctx, "Applied migrations", "migrations", strings.Join(applied, ","))
		}
		var refused *store.ContractRefusedError
		if !errors.As(err, &refused) {
			return err
		}
		// A contract migration waits for the older builds to go (issue
		// 40): this build runs without it, unless an expand one it needs
		// waits behind it.
		status, serr := st.MigrationStatus(ctx)
		if serr != nil {
			return serr
		}
		if len(status.PendingExpand()) > 0 {
			return fmt.Errorf("%w; expand migrations this build needs wait behind it: %s", err, strings.Join(status.PendingExpand(), ", "))
		}
		log.WarnContext(ctx, "Contract migrations wait for older builds to stop; run better-compute migrate once they have",
			"migration", refused.Migration, "processes", strings.Join(refused.Processes, "; "))
		return nil
	}
	status, err := st.MigrationStatus(ctx)
	if err != nil {
		return err
	}
	if pending := status.PendingExpand(); len(pending) > 0 {
		return fmt.Errorf("schema is behind this build (pending %s): run better-compute migrate, or start without --no-migrate", strings.Join(pending, ", "))
	}
	return nil
}

// ssoService is the single sign-on of iam.oidc (docs/sso.md); nil when it
// is not configured.
func ssoService(cfg *config.Config, st sso.Store, log *slog.Logger) *sso.Service {
	if !cfg.IAM.OIDC.Enabled() {
		return nil
	}
	return sso.New(sso.Config{OIDC: cfg.IAM.OIDC}, st, log)
}
