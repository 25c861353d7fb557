package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// poolsCmd groups the pool commands; they call pools.create and pools.list.
func poolsCmd(e *env) *cobra.Command {
	var af apiFlags
	c := &cobra.Command{Use: "pools", Short: "Create and list pools (groups of nodes at a site; join tokens bind to one)"}
	af.add(c)
	c.AddCommand(poolsCreateCmd(e, &af), poolsListCmd(e, &af))
	return c
}

// siteNames maps site ids to names, for tables; empty when sites.list fails.
func siteNames(cmd *cobra.Command, c *client.Client) map[string]string {
	names := map[string]string{}
	sites, _ := listSites(cmd.Context(), c)
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
			c, err := e.client(af)
			if err != nil {
				return err
			}
			p := &apiv1.Pool{}
			if err := c.Call(cmd.Context(), "pools.create", &apiv1.CreatePoolRequest{Name: name, Site: site}, p); err != nil {
				return err
			}
			if out == "json" {
				return printJSON(e.stdout, p)
			}
			return table(e.stdout, []string{"ID", "NAME", "SITE"}, [][]string{{p.Id, p.Name, orDash(siteNames(cmd, c)[p.SiteId])}})
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
			if err := checkOutput(out); err != nil {
				return err
			}
			c, err := e.client(af)
			if err != nil {
				return err
			}
			pools, err := listAllPages(cmd.Context(), c, "pools.list",
				func(cur string) proto.Message { return &apiv1.ListPoolsRequest{Page: &apiv1.Page{Cursor: cur}} },
				func() *apiv1.ListPoolsResponse { return &apiv1.ListPoolsResponse{} },
				func(r *apiv1.ListPoolsResponse) ([]*apiv1.Pool, string) { return r.Pools, r.NextCursor })
			if err != nil {
				return err
			}
			if out == "json" {
				return printJSON(e.stdout, &apiv1.ListPoolsResponse{Pools: pools})
			}
			names := siteNames(cmd, c)
			rows := make([][]string, 0, len(pools))
			for _, p := range pools {
				rows = append(rows, []string{p.Id, p.Name, orDash(names[p.SiteId]), when(p.CreateTime)})
			}
			return table(e.stdout, []string{"ID", "NAME", "SITE", "CREATED"}, rows)
		},
	}
	outputFlag(cmd, &out)
	return cmd
}
