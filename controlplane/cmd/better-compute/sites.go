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

// siteJSON is a site in -o json output.
type siteJSON struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Region    string    `json:"region"`
	CreatedAt time.Time `json:"createdAt"`
}

func siteOut(s *store.Site) siteJSON {
	return siteJSON{ID: s.ID, Name: s.Name, Region: s.Region, CreatedAt: s.CreatedAt.UTC()}
}

// sitesCmd groups the site commands.
func sitesCmd(e *env) *cobra.Command {
	c := &cobra.Command{Use: "sites", Short: "Create and list sites (physical locations in a region)"}
	c.AddCommand(sitesCreateCmd(e), sitesListCmd(e))
	return c
}

func sitesCreateCmd(e *env) *cobra.Command {
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
			return e.withStore(cmd.Context(), func(_ *config.Config, st store.Store) error {
				ctx := cmd.Context()
				s, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: name, Region: region})
				if errors.Is(err, store.ErrConflict) {
					return fmt.Errorf("a site named %s exists already", name)
				}
				if err != nil {
					return err
				}
				details, _ := json.Marshal(siteOut(s))
				if err := audit(ctx, st, "sites.create", "site/"+s.ID, details); err != nil {
					return err
				}
				if out == "json" {
					return printValue(e.stdout, siteOut(s))
				}
				return table(e.stdout, []string{"ID", "NAME", "REGION"}, [][]string{{s.ID, s.Name, s.Region}})
			})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "site name, unique (required)")
	cmd.Flags().StringVar(&region, "region", "", "region, as gateways' host.gateway.region (required)")
	outputFlag(cmd, &out)
	return cmd
}

func sitesListCmd(e *env) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List sites",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			return e.withStore(cmd.Context(), func(_ *config.Config, st store.Store) error {
				sites, err := listAll(cmd.Context(), st.SiteList, func(s *store.Site) string { return s.ID })
				if err != nil {
					return err
				}
				if out == "json" {
					res := make([]siteJSON, 0, len(sites))
					for _, s := range sites {
						res = append(res, siteOut(s))
					}
					return printValue(e.stdout, res)
				}
				rows := make([][]string, 0, len(sites))
				for _, s := range sites {
					rows = append(rows, []string{s.ID, s.Name, s.Region, timeCell(&s.CreatedAt)})
				}
				return table(e.stdout, []string{"ID", "NAME", "REGION", "CREATED"}, rows)
			})
		},
	}
	outputFlag(cmd, &out)
	return cmd
}
