package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

func tokensCmd(e *env) *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{Use: "tokens", Short: "Create, list and revoke API tokens"}
	af.add(cmd)
	var out, role, desc, tenant string
	var ttl time.Duration
	var cidrs []string
	create := &cobra.Command{
		Use:   "create --role admin|operator|viewer",
		Short: "Create an API token; its secret is printed once",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			req := &apiv1.CreateAPITokenRequest{Role: role, Description: desc, AllowCidrs: cidrs, Tenant: tenant}
			if ttl < 0 {
				return usageError{fmt.Errorf("--ttl %s: must not be negative", ttl)}
			}
			if ttl > 0 {
				req.Ttl = durationpb.New(ttl)
			}
			return runAPI(cmd.Context(), e, &af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.CreateAPITokenResponse, error) {
					return c.TokensCreate(ctx, req)
				},
				func(_ *client.Client, resp *apiv1.CreateAPITokenResponse) error {
					fmt.Fprintln(e.stdout, resp.Token)
					fmt.Fprintf(e.stderr, "token %s (%s) created; the secret above is shown only once\n", resp.ApiToken.Id, resp.ApiToken.Role)
					return nil
				})
		},
	}
	create.Flags().StringVar(&role, "role", "", "admin, operator or viewer")
	create.Flags().StringVar(&desc, "description", "", "what the token is for")
	create.Flags().DurationVar(&ttl, "ttl", 0, "expire after this long (default never)")
	create.Flags().StringVar(&tenant, "tenant", "", "tenant id or name whose subtree the role holds in (default the calling token's own)")
	create.Flags().StringArrayVar(&cidrs, "allow-cidr", nil, "only accept calls from this address or CIDR (repeatable)")
	outputFlag(create, &out)

	list := &cobra.Command{
		Use:   "list",
		Short: "List API tokens",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAPI(cmd.Context(), e, &af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListAPITokensResponse, error) {
					return c.TokensList(ctx, &apiv1.ListAPITokensRequest{Page: &apiv1.Page{Limit: 1000}})
				},
				func(_ *client.Client, resp *apiv1.ListAPITokensResponse) error {
					return tableOf(e.stdout, []string{"ID", "ROLE", "TENANT", "ALLOW", "EXPIRES", "REVOKED", "DESCRIPTION"}, resp.ApiTokens,
						func(t *apiv1.APIToken) []string {
							return []string{t.Id, t.Role, orDash(t.TenantId), orDash(strings.Join(t.AllowCidrs, ",")), when(t.ExpireTime), when(t.RevokeTime), t.Description}
						})
				})
		},
	}
	outputFlag(list, &out)

	revoke := &cobra.Command{
		Use:   "revoke TOKEN_ID",
		Short: "Revoke an API token",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAPI(cmd.Context(), e, &af, "table", // no -o: always this line
				func(ctx context.Context, c *client.Client) (*apiv1.RevokeAPITokenResponse, error) {
					return c.TokensRevoke(ctx, &apiv1.RevokeAPITokenRequest{Id: args[0]})
				},
				func(*client.Client, *apiv1.RevokeAPITokenResponse) error {
					fmt.Fprintf(e.stdout, "revoked %s\n", args[0])
					return nil
				})
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}
