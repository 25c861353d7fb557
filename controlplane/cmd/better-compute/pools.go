package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// poolsCmd groups the pool commands; they call pools.create and pools.list.
func poolsCmd(e *env) *cobra.Command {
	return apiGroup(e, "pools", "Create and list pools (groups of nodes at a site; join tokens bind to one)", poolsCreateCmd, poolsListCmd)
}

// siteNames maps site ids to names, for tables; empty when sites.list fails.
func siteNames(ctx context.Context, c *client.Client) map[string]string {
	names := map[string]string{}
	sites, _ := listSites(ctx, c)
	for _, s := range sites {
		names[s.Id] = s.Name
	}
	return names
}

func poolsCreateCmd(e *env, af *apiFlags) *cobra.Command {
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
			ctx := cmd.Context()
			return runAPI(ctx, e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Pool, error) {
					return c.PoolsCreate(ctx, &apiv1.CreatePoolRequest{Name: name, Site: site})
				},
				func(c *client.Client, p *apiv1.Pool) error {
					return table(e.stdout, []string{"ID", "NAME", "SITE"}, [][]string{{p.Id, p.Name, orDash(siteNames(ctx, c)[p.SiteId])}})
				})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "pool name, unique (required)")
	cmd.Flags().StringVar(&site, "site", "", "site id or name (required)")
	outputFlag(cmd, &out)
	return cmd
}

func poolsListCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List pools",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			return runAPI(ctx, e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListPoolsResponse, error) {
					pools, err := listPools(ctx, c)
					return &apiv1.ListPoolsResponse{Pools: pools}, err
				},
				func(c *client.Client, r *apiv1.ListPoolsResponse) error {
					names := siteNames(ctx, c)
					return tableOf(e.stdout, []string{"ID", "NAME", "SITE", "CREATED"}, r.Pools, func(p *apiv1.Pool) []string {
						return []string{p.Id, p.Name, orDash(names[p.SiteId]), when(p.CreateTime)}
					})
				})
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

// listPools is every pool, through pools.list.
func listPools(ctx context.Context, c *client.Client) ([]*apiv1.Pool, error) {
	return listAll(ctx, c.PoolsList,
		func(p *apiv1.Page) *apiv1.ListPoolsRequest { return &apiv1.ListPoolsRequest{Page: p} },
		(*apiv1.ListPoolsResponse).GetPools)
}
