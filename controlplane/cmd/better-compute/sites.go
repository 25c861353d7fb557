package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// sitesCmd groups the site commands; they call sites.create and sites.list.
func sitesCmd(e *env) *cobra.Command {
	var af apiFlags
	c := &cobra.Command{Use: "sites", Short: "Create and list sites (physical locations in a region)"}
	af.add(c)
	c.AddCommand(sitesCreateCmd(e, &af), sitesListCmd(e, &af))
	return c
}

func sitesCreateCmd(e *env, af *apiFlags) *cobra.Command {
	var name, region, out string
	cmd := &cobra.Command{
		Use:   "create --name N --region R",
		Short: "Create a site; its region picks the gateways its nodes dial",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if name == "" || region == "" {
				return usageError{errors.New("--name and --region are required")}
			}
			for flag, v := range map[string]string{"--name": name, "--region": region} {
				if err := api.CheckName(v); err != nil {
					return usageError{fmt.Errorf("%s %q: %w", flag, v, err)}
				}
			}
			c, err := e.client(af)
			if err != nil {
				return err
			}
			s := &apiv1.Site{}
			if err := c.Call(cmd.Context(), "sites.create", &apiv1.CreateSiteRequest{Name: name, Region: region}, s); err != nil {
				return err
			}
			if out == "json" {
				return printJSON(e.stdout, s)
			}
			return table(e.stdout, []string{"ID", "NAME", "REGION"}, [][]string{{s.Id, s.Name, s.Region}})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "site name, unique (required)")
	cmd.Flags().StringVar(&region, "region", "", "region, as gateways' host.gateway.region (required)")
	outputFlag(cmd, &out)
	return cmd
}

func sitesListCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List sites",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			c, err := e.client(af)
			if err != nil {
				return err
			}
			sites, err := listSites(cmd.Context(), c)
			if err != nil {
				return err
			}
			if out == "json" {
				return printJSON(e.stdout, &apiv1.ListSitesResponse{Sites: sites})
			}
			rows := make([][]string, 0, len(sites))
			for _, s := range sites {
				rows = append(rows, []string{s.Id, s.Name, s.Region, when(s.CreateTime)})
			}
			return table(e.stdout, []string{"ID", "NAME", "REGION", "CREATED"}, rows)
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

// listSites is every site, through sites.list.
func listSites(ctx context.Context, c *client.Client) ([]*apiv1.Site, error) {
	return listAllPages(ctx, c, "sites.list",
		func(cur string) proto.Message { return &apiv1.ListSitesRequest{Page: &apiv1.Page{Cursor: cur}} },
		func() *apiv1.ListSitesResponse { return &apiv1.ListSitesResponse{} },
		func(r *apiv1.ListSitesResponse) ([]*apiv1.Site, string) { return r.Sites, r.NextCursor })
}
