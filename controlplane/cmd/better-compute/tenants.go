package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// tenantsCmd groups the tenant commands; they call tenants.create,
// tenants.list, tenants.get, tenants.suspend, tenants.resume and
// tenants.delete (docs/tenants.md).
func tenantsCmd(e *env) *cobra.Command {
	return apiGroup(e, "tenants", "Create, list, show, suspend, resume and delete tenants (the tree each team or customer sees its own part of the fleet in)",
		tenantsCreateCmd, tenantsListCmd, tenantsGetCmd, tenantsSuspendCmd(true), tenantsSuspendCmd(false), tenantsDeleteCmd)
}

// tenantTable prints tenants for people.
func tenantTable(e *env, ts []*apiv1.Tenant) error {
	return tableOf(e.stdout, []string{"ID", "NAME", "PARENT", "STATE", "CREATED"}, ts, func(t *apiv1.Tenant) []string {
		state := "active"
		switch {
		case t.DeleteTime != nil:
			state = "deleted"
		case t.SuspendTime != nil:
			state = "suspended"
		case t.Suspended:
			state = "suspended (above)"
		}
		return []string{t.Id, t.Name, orDash(t.ParentId), state, when(t.CreateTime)}
	})
}

func tenantsCreateCmd(e *env, af *apiFlags) *cobra.Command {
	var parent, out string
	cmd := &cobra.Command{
		Use:   "create NAME [--parent P]",
		Short: "Create a tenant below P (id or name; default the token's own tenant)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if err := apiv1.CheckName(args[0]); err != nil {
				return usageError{fmt.Errorf("NAME %q: %w", args[0], err)}
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Tenant, error) {
					return c.TenantsCreate(ctx, &apiv1.CreateTenantRequest{Name: args[0], Parent: parent})
				},
				func(_ *client.Client, t *apiv1.Tenant) error { return tenantTable(e, []*apiv1.Tenant{t}) })
		},
	}
	cmd.Flags().StringVar(&parent, "parent", "", "parent tenant id or name (default the token's own tenant)")
	outputFlag(cmd, &out)
	return cmd
}

func tenantsListCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the live tenants of the token's subtree, its own included",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListTenantsResponse, error) {
					var all []*apiv1.Tenant
					cursor := ""
					for {
						r, err := c.TenantsList(ctx, &apiv1.ListTenantsRequest{Page: &apiv1.Page{Cursor: cursor, Limit: 1000}})
						if err != nil {
							return nil, err
						}
						all = append(all, r.Tenants...)
						if cursor = r.NextCursor; cursor == "" {
							return &apiv1.ListTenantsResponse{Tenants: all}, nil
						}
					}
				},
				func(_ *client.Client, r *apiv1.ListTenantsResponse) error { return tenantTable(e, r.Tenants) })
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

func tenantsGetCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "get TENANT",
		Short: "Show a tenant (id or name)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Tenant, error) {
					return c.TenantsGet(ctx, &apiv1.TenantRequest{Tenant: args[0]})
				},
				func(_ *client.Client, t *apiv1.Tenant) error { return tenantTable(e, []*apiv1.Tenant{t}) })
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

// tenantsSuspendCmd is `tenants suspend` (suspend) or `tenants resume`.
func tenantsSuspendCmd(suspend bool) func(*env, *apiFlags) *cobra.Command {
	return func(e *env, af *apiFlags) *cobra.Command {
		var out string
		use, short := "suspend TENANT", "Suspend a tenant and its subtree: their tokens, event streams and tunnels stop within 10 s"
		if !suspend {
			use, short = "resume TENANT", "Resume a suspended tenant"
		}
		cmd := &cobra.Command{
			Use:   use,
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return runAPI(cmd.Context(), e, af, out,
					func(ctx context.Context, c *client.Client) (*apiv1.Tenant, error) {
						req := &apiv1.TenantRequest{Tenant: args[0]}
						if suspend {
							return c.TenantsSuspend(ctx, req)
						}
						return c.TenantsResume(ctx, req)
					},
					func(_ *client.Client, t *apiv1.Tenant) error { return tenantTable(e, []*apiv1.Tenant{t}) })
			},
		}
		outputFlag(cmd, &out)
		return cmd
	}
}

func tenantsDeleteCmd(e *env, af *apiFlags) *cobra.Command {
	var moveTo, out string
	cmd := &cobra.Command{
		Use:   "delete TENANT [--move-nodes-to T]",
		Short: "Delete a tenant and its subtree; refused while their pools hold nodes, unless --move-nodes-to moves those pools",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Tenant, error) {
					return c.TenantsDelete(ctx, &apiv1.DeleteTenantRequest{Tenant: args[0], MoveNodesTo: moveTo})
				},
				func(_ *client.Client, t *apiv1.Tenant) error { return tenantTable(e, []*apiv1.Tenant{t}) })
		},
	}
	cmd.Flags().StringVar(&moveTo, "move-nodes-to", "", "tenant (id or name, outside the deleted subtree) that receives its pools and their nodes")
	outputFlag(cmd, &out)
	return cmd
}

func poolsMoveCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "move POOL TENANT",
		Short: "Move a pool, with its nodes, join tokens, reservations, rollouts and commands, to another tenant",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Pool, error) {
					return c.PoolsMove(ctx, &apiv1.MovePoolRequest{Pool: args[0], Tenant: args[1]})
				},
				func(_ *client.Client, p *apiv1.Pool) error {
					return table(e.stdout, []string{"ID", "NAME", "TENANT"}, [][]string{{p.Id, p.Name, p.TenantId}})
				})
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

func nodesMoveCmd(e *env, af *apiFlags) *cobra.Command {
	var out, tenant, pool string
	cmd := &cobra.Command{
		Use:   "move NODE --tenant T [--pool P]",
		Short: "Move a node, with its commands and events, into a pool of another tenant (needs an admin token)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if tenant == "" {
				return usageError{errors.New("--tenant is required")}
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.NodeResponse, error) {
					return c.NodesMove(ctx, &apiv1.MoveNodeRequest{Id: args[0], Tenant: tenant, Pool: pool})
				},
				func(_ *client.Client, r *apiv1.NodeResponse) error {
					return table(e.stdout, []string{"ID", "HOSTNAME", "POOL"}, [][]string{{r.Node.GetId(), r.Node.GetHostname(), r.Node.GetPoolId()}})
				})
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant (id or name) that receives the node")
	cmd.Flags().StringVar(&pool, "pool", "", "pool (id or name) of that tenant at the node's site; needed when it has several there")
	outputFlag(cmd, &out)
	return cmd
}
