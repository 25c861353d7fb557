package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// poolsCmd groups the pool commands; they call pools.create, pools.list,
// pools.get, pools.setBudget and pools.move.
func poolsCmd(e *env) *cobra.Command {
	return apiGroup(e, "pools", "Create, list and show pools (groups of nodes at a site; join tokens bind to one) and set their disruption budget",
		poolsCreateCmd, poolsListCmd, poolsGetCmd, poolsSetBudgetCmd, poolsMoveCmd)
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
			if err := apiv1.CheckName(name); err != nil {
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

// poolBudgetTable prints a pool with its disruption budget.
func poolBudgetTable(e *env, c *client.Client, ctx context.Context, p *apiv1.Pool) error {
	b := p.GetBudget()
	return table(e.stdout, []string{"ID", "NAME", "SITE", "NODES", "BUDGET", "OUT OF SERVICE", "REMEDIATING"},
		[][]string{{p.Id, p.Name, orDash(siteNames(ctx, c)[p.SiteId]), fmt.Sprint(b.GetNodes()),
			fmt.Sprintf("%d (%s)", b.GetBudget(), p.DisruptionBudget), fmt.Sprint(b.GetOutOfService()),
			fmt.Sprintf("%d of %d", b.GetRemediating(), p.RemediationConcurrency)}})
}

func poolsGetCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "get POOL",
		Short: "Show a pool (id or name) with its disruption budget and the nodes out of service",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			return runAPI(ctx, e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Pool, error) {
					return c.PoolsGet(ctx, &apiv1.PoolRequest{Pool: args[0]})
				},
				func(c *client.Client, p *apiv1.Pool) error { return poolBudgetTable(e, c, ctx, p) })
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

func poolsSetBudgetCmd(e *env, af *apiFlags) *cobra.Command {
	var budget, out string
	var concurrency int32
	cmd := &cobra.Command{
		Use:   "set-budget POOL [--budget N|N%] [--remediation-concurrency N]",
		Short: "Set a pool's disruption budget (most nodes out of service at once) and remediation concurrency",
		Long: "Set a pool's disruption budget: the most nodes out of service at once, N nodes or N% of the pool\n" +
			"(at least one), shared by remediation, rollouts and drains (docs/disruption-budget.md), and how many\n" +
			"remediation actions may run at once on its quarantined nodes.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if budget == "" && !cmd.Flags().Changed("remediation-concurrency") {
				return usageError{errors.New("--budget, --remediation-concurrency or both are required")}
			}
			if budget != "" {
				if _, err := store.ParseBudget(budget); err != nil {
					return usageError{fmt.Errorf("--budget: %w", err)}
				}
			}
			if cmd.Flags().Changed("remediation-concurrency") && (concurrency < 1 || concurrency > 1000) {
				return usageError{fmt.Errorf("--remediation-concurrency %d: want 1 to 1000", concurrency)}
			}
			ctx := cmd.Context()
			return runAPI(ctx, e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Pool, error) {
					return c.PoolsSetBudget(ctx, &apiv1.SetPoolBudgetRequest{Pool: args[0], DisruptionBudget: budget,
						RemediationConcurrency: concurrency})
				},
				func(c *client.Client, p *apiv1.Pool) error { return poolBudgetTable(e, c, ctx, p) })
		},
	}
	cmd.Flags().StringVar(&budget, "budget", "", "most nodes out of service at once: N nodes or N% of the pool")
	cmd.Flags().Int32Var(&concurrency, "remediation-concurrency", 0, "remediation actions at once on quarantined nodes (1 to 1000)")
	outputFlag(cmd, &out)
	return cmd
}
