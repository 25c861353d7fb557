package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// gatewaysCmd groups the gateway commands; they call gateways.list,
// gateways.drain and gateways.undrain.
func gatewaysCmd(e *env) *cobra.Command {
	return apiGroup(e, "gateways", "List gateways, and drain or undrain one (docs/gateway.md)",
		gatewaysListCmd, gatewaysDrainCmd(true), gatewaysDrainCmd(false))
}

func gatewaysListCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List gateways with their state (up, draining, drained)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListGatewaysResponse, error) {
					return c.GatewaysList(ctx, &apiv1.ListGatewaysRequest{})
				},
				func(_ *client.Client, r *apiv1.ListGatewaysResponse) error {
					return tableOf(e.stdout, []string{"ID", "REGION", "ADDRESS", "VERSION", "STATE", "SESSIONS", "LIVE", "HEARTBEAT"}, r.Gateways,
						func(g *apiv1.Gateway) []string {
							return []string{g.Id, g.Region, g.Address, g.Version, g.State, fmt.Sprint(g.Sessions), fmt.Sprint(g.Live), when(g.HeartbeatTime)}
						})
				})
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

// gatewaysDrainCmd is `gateways drain ID` (drain) or `gateways undrain ID`.
func gatewaysDrainCmd(drain bool) func(e *env, af *apiFlags) *cobra.Command {
	verb, short := "undrain", "Let a drained gateway take sessions again"
	if drain {
		verb, short = "drain", "Drain a gateway: it stays up, takes no new sessions and moves its nodes to the region's other gateways over host.gateway.drainDelay"
	}
	return func(e *env, af *apiFlags) *cobra.Command {
		var out string
		cmd := &cobra.Command{
			Use:   verb + " ID",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				if err := checkOutput(out); err != nil {
					return err
				}
				return runAPI(cmd.Context(), e, af, out,
					func(ctx context.Context, c *client.Client) (*apiv1.DrainGatewayResponse, error) {
						req := &apiv1.DrainGatewayRequest{Id: args[0]}
						if drain {
							return c.GatewaysDrain(ctx, req)
						}
						return c.GatewaysUndrain(ctx, req)
					},
					func(_ *client.Client, r *apiv1.DrainGatewayResponse) error {
						g := r.GetGateway()
						return table(e.stdout, []string{"ID", "REGION", "STATE", "SESSIONS"},
							[][]string{{g.GetId(), g.GetRegion(), g.GetState(), fmt.Sprint(g.GetSessions())}})
					})
			},
		}
		outputFlag(cmd, &out)
		return cmd
	}
}

// processesCmd groups the process commands; they call processes.list.
func processesCmd(e *env) *cobra.Command {
	return apiGroup(e, "processes", "List the registered control-plane processes (docs/upgrade-control-plane.md)", processesListCmd)
}

func processesListCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List every registered control-plane process with its roles, build version and schema",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListProcessesResponse, error) {
					return c.ProcessesList(ctx, &apiv1.ListProcessesRequest{})
				},
				func(_ *client.Client, r *apiv1.ListProcessesResponse) error {
					return tableOf(e.stdout, []string{"ID", "ROLES", "HOST", "PID", "VERSION", "SCHEMA", "STARTED", "HEARTBEAT"}, r.Processes,
						func(p *apiv1.Process) []string {
							return []string{p.Id, strings.Join(p.Roles, ","), p.Hostname, fmt.Sprint(p.Pid), p.Version, p.Schema,
								when(p.StartTime), when(p.HeartbeatTime)}
						})
				})
		},
	}
	outputFlag(cmd, &out)
	return cmd
}
