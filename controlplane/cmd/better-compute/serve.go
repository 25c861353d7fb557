package main

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/config"
	"github.com/better-compute/better-compute/controlplane/serve"
)

func serveCmd(e *env) *cobra.Command {
	var (
		roles     string
		host      string
		port      int
		noMigrate bool
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run control-plane roles (all by default) until SIGINT or SIGTERM",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := config.Flags{Roles: roles}
			if port != 0 || host != "" {
				if port < 0 || port > 65535 {
					return usageError{fmt.Errorf("--port %d is out of range", port)}
				}
				f.Listen = net.JoinHostPort(cmpOr(host, "0.0.0.0"), strconv.Itoa(cmpOr(port, 3000)))
			}
			cfg, err := e.load(f)
			if err != nil {
				return err
			}
			st, err := openStore(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer st.Close()
			return serve.Run(cmd.Context(), cfg, st, serve.Options{NoMigrate: noMigrate, Version: version, Log: e.log})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&roles, "roles", "", "roles to run: all, or a comma list of "+strings.Join(config.Roles, ", ")+" (env "+config.EnvRoles+")")
	fl.StringVar(&host, "host", "", "API listen host (default 0.0.0.0)")
	fl.IntVar(&port, "port", 0, "API listen port (default 3000)")
	fl.BoolVar(&noMigrate, "no-migrate", false, "do not apply migrations; refuse to start when any are pending")
	return cmd
}

func cmpOr[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
