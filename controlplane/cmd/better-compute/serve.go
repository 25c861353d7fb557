package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/serve"
)

func serveCmd(e *env) *cobra.Command {
	var (
		roles     string
		host      string
		port      int
		noMigrate bool
		pub       publicFlags
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run control-plane roles (all by default) until SIGINT or SIGTERM",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := config.Flags{Roles: roles}
			pub.apply(&f)
			// --host and --port each replace only their part of
			// host.listen (issue 41): --port alone keeps the configured
			// host, so an API meant for one address stays on it.
			f.ListenHost = host
			if cmd.Flags().Changed("port") {
				if port < 0 || port > 65535 {
					return usageError{fmt.Errorf("--port %d is out of range 0-65535", port)}
				}
				f.ListenPort = strconv.Itoa(port)
			}
			cfg, st, err := e.loadStore(cmd.Context(), f)
			if err != nil {
				return err
			}
			defer st.Close()
			banner := serveBanner{w: e.stdout, cfg: cfg}
			banner.header()
			return portInUse(serve.Run(cmd.Context(), cfg, st, serve.Options{NoMigrate: noMigrate, Version: version, Commit: commit, Log: e.log, Now: testNow,
				APIReady: func(s *api.Server) { banner.api(s) }, GatewayReady: banner.gateway}),
				listenFlag{cfg.Host.Listen, "choose another with --port N (host.listen)"},
				listenFlag{cfg.Host.Gateway.Listen, "choose another with --gateway-listen HOST:PORT (host.gateway.listen)"})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&roles, "roles", "", "roles to run: all, or a comma list of "+strings.Join(config.Roles, ", ")+" (env "+config.EnvRoles+")")
	fl.StringVar(&host, "host", "", "API listen host; replaces only the host of host.listen (default 0.0.0.0)")
	fl.IntVar(&port, "port", 3000, "API listen port; replaces only the port of host.listen, keeping its host (0 picks a free one)")
	fl.BoolVar(&noMigrate, "no-migrate", false, "do not apply migrations; refuse to start when any are pending")
	pub.add(cmd)
	return cmd
}
