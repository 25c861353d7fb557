package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// gpusCmd groups the GPU commands (docs/remediation.md, "A history that
// follows the board"); they call the gpus.* methods.
func gpusCmd(e *env) *cobra.Command {
	return apiGroup(e, "gpus", "See GPUs by UUID across the fleet, and where each has been", gpusListCmd, gpusGetCmd)
}

func gpusListCmd(e *env, af *apiFlags) *cobra.Command {
	var pool, model, out string
	var unhealthy bool
	cmd := &cobra.Command{
		Use:   "list [--unhealthy] [--pool P] [--model M]",
		Short: "List the GPUs the nodes' inventories list now",
		Long: `list calls gpus.list and prints each GPU some node's latest inventory lists:
its UUID, node, pool, model, board serial, health (ok, degraded, failed, or -
when not judged), the node that lists the same UUID at the same time (a UUID
conflict), and since when it is in its node. --unhealthy keeps the GPUs that
read degraded or failed and those in a conflict; --pool (id or name) and
--model (the product name as NVML gives it) narrow. -o json prints the API's
ListGPUsResponse.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListGPUsResponse, error) {
					gs, err := listAll(ctx, c.GpusList,
						func(p *apiv1.Page) *apiv1.ListGPUsRequest {
							return &apiv1.ListGPUsRequest{Page: p, Unhealthy: unhealthy, Pool: pool, Model: model}
						},
						(*apiv1.ListGPUsResponse).GetGpus)
					if err != nil {
						return nil, err
					}
					return &apiv1.ListGPUsResponse{Gpus: gs}, nil
				},
				func(_ *client.Client, r *apiv1.ListGPUsResponse) error {
					if len(r.Gpus) == 0 {
						fmt.Fprintln(e.stderr, "no GPUs")
						return nil
					}
					return tableOf(e.stdout, []string{"UUID", "NODE", "POOL", "MODEL", "SERIAL", "HEALTH", "SAME UUID ON", "SINCE"},
						r.Gpus, func(g *apiv1.GPUPlacement) []string {
							return []string{g.GpuUuid, g.NodeId, g.PoolId, orDash(g.Model), orDash(g.BoardSerial), orDash(g.Health),
								orDash(g.ConflictNodeId), when(g.FirstSeenTime)}
						})
				})
		},
	}
	cmd.Flags().BoolVar(&unhealthy, "unhealthy", false, "only GPUs that read degraded or failed, or are in a UUID conflict")
	cmd.Flags().StringVar(&pool, "pool", "", "only GPUs in this pool (id or name)")
	cmd.Flags().StringVar(&model, "model", "", `only GPUs of this model, such as "NVIDIA A100-SXM4-40GB"`)
	outputFlag(cmd, &out)
	return cmd
}

func gpusGetCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	var limit int
	cmd := &cobra.Command{
		Use:   "get UUID",
		Short: "Show a GPU: its node now, its health and every node it has been in",
		Long: `get calls gpus.get and prints one GPU by UUID: the node (or, in a UUID
conflict, the nodes) it is in now with its health, every node it has been in
(first and last seen, in the order its stays began), then its findings, cases
and actions on whichever node they were, newest first, as remediation history
--gpu prints them. A UUID no node's inventory has listed is not found (exit 1).
-o json prints the API's GPUDetail.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if len(args) != 1 || args[0] == "" {
				return usageError{errors.New("give one GPU UUID")}
			}
			req := &apiv1.GetGPURequest{Uuid: args[0], Limit: int32(limit)}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.GPUDetail, error) { return c.GpusGet(ctx, req) },
				func(_ *client.Client, g *apiv1.GPUDetail) error { return printGPU(e, g) })
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many findings, cases and actions (0: 100)")
	outputFlag(cmd, &out)
	return cmd
}

// printGPU draws a GPU for people: where it is now, where it has been,
// then its history.
func printGPU(e *env, g *apiv1.GPUDetail) error {
	fmt.Fprintf(e.stdout, "GPU %s\n", g.Uuid)
	if len(g.Current) == 0 {
		fmt.Fprintln(e.stdout, "now: in no node's latest inventory")
	}
	for _, c := range g.Current {
		line := fmt.Sprintf("now: node %s (%s), pool %s, %s, serial %s, health %s", c.NodeId, c.Hostname, c.PoolId,
			orDash(c.Model), orDash(c.BoardSerial), orDash(c.Health))
		if c.ConflictNodeId != "" {
			line += ", UUID CONFLICT with node " + c.ConflictNodeId
		}
		fmt.Fprintln(e.stdout, line)
	}
	fmt.Fprintln(e.stdout)
	if err := tableOf(e.stdout, []string{"NODE", "HOSTNAME", "POOL", "SERIAL", "HEALTH", "CURRENT", "FIRST SEEN", "LAST SEEN"},
		g.Placements, func(p *apiv1.GPUPlacement) []string {
			cur := "no"
			if p.Current {
				cur = "yes"
			}
			return []string{p.NodeId, p.Hostname, p.PoolId, orDash(p.BoardSerial), orDash(p.Health), cur,
				when(p.FirstSeenTime), when(p.LastSeenTime)}
		}); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout)
	return printHistory(e, g.GetHistory())
}
