package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/config"
	"github.com/better-compute/better-compute/controlplane/store"
)

// poolJSON is a pool in -o json output.
type poolJSON struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	SiteID    string    `json:"siteId"`
	CreatedAt time.Time `json:"createdAt"`
}

func poolOut(p *store.Pool) poolJSON {
	return poolJSON{ID: p.ID, Name: p.Name, SiteID: p.SiteID, CreatedAt: p.CreatedAt.UTC()}
}

// poolsCmd groups the pool commands.
func poolsCmd(e *env) *cobra.Command {
	c := &cobra.Command{Use: "pools", Short: "Create and list pools (groups of nodes at a site; join tokens bind to one)"}
	c.AddCommand(poolsCreateCmd(e), poolsListCmd(e))
	return c
}

func poolsCreateCmd(e *env) *cobra.Command {
	var name, site, out string
	cmd := &cobra.Command{
		Use:   "create --name N --site S",
		Short: "Create a pool at a site (id or name)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if name == "" || site == "" {
				return usageError{errors.New("--name and --site are required")}
			}
			if err := api.CheckName(name); err != nil {
				return usageError{fmt.Errorf("--name %q: %w", name, err)}
			}
			return e.withStore(cmd.Context(), func(_ *config.Config, st store.Store) error {
				ctx := cmd.Context()
				s, err := st.SiteGet(ctx, site)
				if errors.Is(err, store.ErrNotFound) {
					return fmt.Errorf("no site %s (see better-compute sites list)", site)
				}
				if err != nil {
					return err
				}
				p, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: name, SiteID: s.ID})
				if errors.Is(err, store.ErrConflict) {
					return fmt.Errorf("a pool named %s exists already", name)
				}
				if err != nil {
					return err
				}
				details, _ := json.Marshal(poolOut(p))
				if err := audit(ctx, st, "pools.create", "pool/"+p.ID, details); err != nil {
					return err
				}
				if out == "json" {
					return printValue(e.stdout, poolOut(p))
				}
				return table(e.stdout, []string{"ID", "NAME", "SITE"}, [][]string{{p.ID, p.Name, s.Name}})
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "pool name, unique (required)")
	cmd.Flags().StringVar(&site, "site", "", "site id or name (required)")
	outputFlag(cmd, &out)
	return cmd
}

func poolsListCmd(e *env) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List pools",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			return e.withStore(cmd.Context(), func(_ *config.Config, st store.Store) error {
				ctx := cmd.Context()
				pools, err := listAll(ctx, st.PoolList, func(p *store.Pool) string { return p.ID })
				if err != nil {
					return err
				}
				if out == "json" {
					res := make([]poolJSON, 0, len(pools))
					for _, p := range pools {
						res = append(res, poolOut(p))
					}
					return printValue(e.stdout, res)
				}
				sites, err := listAll(ctx, st.SiteList, func(s *store.Site) string { return s.ID })
				if err != nil {
					return err
				}
				names := map[string]string{}
				for _, s := range sites {
					names[s.ID] = s.Name
				}
				rows := make([][]string, 0, len(pools))
				for _, p := range pools {
					rows = append(rows, []string{p.ID, p.Name, names[p.SiteID], timeCell(&p.CreatedAt)})
				}
				return table(e.stdout, []string{"ID", "NAME", "SITE", "CREATED"}, rows)
			})
		},
	}
	outputFlag(cmd, &out)
	return cmd
}
