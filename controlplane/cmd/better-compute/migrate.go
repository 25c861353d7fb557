package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
)

func migrateCmd(e *env) *cobra.Command {
	var to string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply pending database migrations (safe to run from many processes at once)",
		Long: `Apply pending database migrations in order (safe to run from many processes at once).

An expand migration always runs. A contract migration runs only when no live
process runs a build that still needs the shape it drops; otherwise migrate
applies the migrations before it, names those processes and exits non-zero
(docs/upgrade-control-plane.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, st, err := e.loadStore(cmd.Context(), config.Flags{})
			if err != nil {
				return err
			}
			defer st.Close()
			applied, err := st.MigrateTo(cmd.Context(), to)
			if err != nil {
				// A refused contract migration (issue 40) comes after
				// the ones applied before it.
				if len(applied) > 0 {
					fmt.Fprintf(e.stdout, "applied %d migration(s): %s\n", len(applied), strings.Join(applied, ", "))
				}
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintln(e.stdout, "schema is up to date")
				return nil
			}
			fmt.Fprintf(e.stdout, "applied %d migration(s): %s\n", len(applied), strings.Join(applied, ", "))
			return nil
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "stop after this migration (e.g. 0004_commands_open_deadline); default every one")
	return cmd
}

// loadStore loads the configuration with f over it and opens its store
// (openStore): serve and migrate, which make a deployment where there is
// none. The caller closes the store.
func (e *env) loadStore(ctx context.Context, f config.Flags) (*config.Config, store.Store, error) {
	cfg, err := e.load(f)
	if err != nil {
		return nil, nil, err
	}
	st, err := openStore(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return cfg, st, nil
}

// openStore opens the configured store, generating the embedded default's
// secret on first use.
func openStore(ctx context.Context, cfg *config.Config) (store.Store, error) {
	if err := cfg.EnsureEmbeddedSecret(); err != nil {
		return nil, err
	}
	st, err := backend.Open(ctx, cfg.Database.URL, cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	return st, nil
}
