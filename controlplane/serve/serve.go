// Package serve runs the roles a configuration names in one process, and
// stops them in the order of DESIGN.md on cancellation: gateway drains, HTTP
// closes, workers release their leases.
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/config"
	"github.com/better-compute/better-compute/controlplane/gateway"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Options are serve's run-time switches.
type Options struct {
	// NoMigrate starts without migrating; pending migrations are then an
	// error.
	NoMigrate bool
	// Version is the build's version, reported by gateways and workers.
	Version string
	Log     *slog.Logger
	// APIReady, when set, receives the API server once it listens (tests
	// and dev use it to learn the bound address).
	APIReady func(*api.Server)
	// GatewayReady, when set, receives the gateway once it listens and
	// holds its lease (Addr and PublicURL are then valid).
	GatewayReady func(*gateway.Gateway)
}

// Run migrates (unless NoMigrate), then runs the configured roles until ctx
// ends or one fails.
func Run(ctx context.Context, cfg *config.Config, st store.Store, opts Options) error {
	log := opts.Log
	if err := prepareSchema(ctx, st, opts.NoMigrate, log); err != nil {
		return err
	}
	// The gateway is built first: a missing PKI stops serve before any
	// listener opens.
	var gw *gateway.Gateway
	if cfg.Runs("gateway") {
		var err error
		if gw, err = newGateway(ctx, cfg, st, opts); err != nil {
			return err
		}
	}
	g, ctx := errgroup.WithContext(ctx)
	if cfg.Runs("api") {
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
		srv := api.New(api.Config{Listen: cfg.Host.Listen, BasePath: cfg.BasePath, TrustedProxies: cfg.ParsedProxies,
			Secret: cfg.Secret, Version: opts.Version, Downloads: dl}, st, log)
		g.Go(func() error { return srv.Run(ctx) })
		if opts.APIReady != nil {
			g.Go(func() error {
				select {
				case <-srv.Ready():
					opts.APIReady(srv)
				case <-ctx.Done():
				}
				return nil
			})
		}
	}
	if gw != nil {
		g.Go(func() error { return gw.Run(ctx) })
		if opts.GatewayReady != nil {
			g.Go(func() error {
				select {
				case <-gw.Ready():
					opts.GatewayReady(gw)
				case <-ctx.Done():
				}
				return nil
			})
		}
	}
	log.InfoContext(ctx, "Serving", "roles", strings.Join(cfg.RolesList, ","), "store", string(st.Dialect()), "version", opts.Version)
	err := g.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	log.Info("Stopped")
	return nil
}

// prepareSchema migrates, or with noMigrate checks the schema is current.
func prepareSchema(ctx context.Context, st store.Store, noMigrate bool, log *slog.Logger) error {
	if !noMigrate {
		applied, err := st.Migrate(ctx)
		if err != nil {
			return err
		}
		if len(applied) > 0 {
			log.InfoContext(ctx, "Applied migrations", "migrations", strings.Join(applied, ","))
		}
		return nil
	}
	status, err := st.MigrationStatus(ctx)
	if err != nil {
		return err
	}
	if len(status.Pending) > 0 {
		return fmt.Errorf("schema is behind this build (pending %s): run better-compute migrate, or start without --no-migrate", strings.Join(status.Pending, ", "))
	}
	return nil
}
