package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// sitesCmd groups the site commands; they call sites.create and sites.list.
func sitesCmd(e *env) *cobra.Command {
	return apiGroup(e, "sites", "Create and list sites (physical locations in a region)", sitesCreateCmd, sitesListCmd)
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
				if err := apiv1.CheckName(v); err != nil {
					return usageError{fmt.Errorf("%s %q: %w", flag, v, err)}
				}
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Site, error) {
					return c.SitesCreate(ctx, &apiv1.CreateSiteRequest{Name: name, Region: region})
				},
				func(_ *client.Client, s *apiv1.Site) error {
					return table(e.stdout, []string{"ID", "NAME", "REGION"}, [][]string{{s.Id, s.Name, s.Region}})
				})
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
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListSitesResponse, error) {
					sites, err := listSites(ctx, c)
					return &apiv1.ListSitesResponse{Sites: sites}, err
				},
				func(_ *client.Client, r *apiv1.ListSitesResponse) error {
					return tableOf(e.stdout, []string{"ID", "NAME", "REGION", "CREATED"}, r.Sites, func(s *apiv1.Site) []string {
						return []string{s.Id, s.Name, s.Region, when(s.CreateTime)}
					})
				})
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

// listSites is every site, through sites.list.
func listSites(ctx context.Context, c *client.Client) ([]*apiv1.Site, error) {
	return listAll(ctx, c.SitesList,
		func(p *apiv1.Page) *apiv1.ListSitesRequest { return &apiv1.ListSitesRequest{Page: p} },
		(*apiv1.ListSitesResponse).GetSites)
}
