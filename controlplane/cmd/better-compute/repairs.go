package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// nodesRepairCmds are nodes gpu-reset and nodes reboot: repairs an
// operator orders, carried out by the remediation reconciler
// (docs/remediation.md, "Repairs on order").
func nodesRepairCmds(e *env, af *apiFlags) []*cobra.Command {
	var out, gpu, note string
	reset := &cobra.Command{
		Use:   "gpu-reset NODE_ID --gpu G",
		Short: "Reset one of a node's GPUs, through its pool's disruption budget (needs an operator token)",
		Long: `gpu-reset calls nodes.gpuReset: the node is admitted against its pool's
disruption budget and cordoned, and a remediation case resets the GPU (by
UUID or index), verifies that it reads ok and returns the node to service,
with the same guarantees as the reconciler's own actions. Audited; the case
is the node's and the GPU's history (remediation list --node N).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.NodeRepairResponse, error) {
					return c.NodesGpuReset(ctx, &apiv1.NodeGPUResetRequest{Id: args[0], Gpu: gpu, Note: note})
				},
				func(_ *client.Client, r *apiv1.NodeRepairResponse) error {
					fmt.Fprintf(e.stdout, "node %s: reset of GPU %s ordered (remediation %s, %s)\n", r.NodeId, r.GpuUuid, r.RemediationId, r.State)
					return nil
				})
		},
	}
	reset.Flags().StringVar(&gpu, "gpu", "", "the GPU: its UUID or its index on the node (required)")
	reset.Flags().StringVar(&note, "note", "", "why, recorded in the case's reason")
	outputFlag(reset, &out)
	var rout, rnote string
	reboot := &cobra.Command{
		Use:   "reboot NODE_ID",
		Short: "Reboot a node, through its pool's disruption budget (needs an operator token)",
		Long: `reboot calls nodes.reboot: the node is admitted against its pool's disruption
budget and cordoned, and a remediation case reboots it, verifies that it came
back (a new boot) with healthy GPUs and returns it to service. Audited; the
case is the node's history (remediation list --node N).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runAPI(cmd.Context(), e, af, rout,
				func(ctx context.Context, c *client.Client) (*apiv1.NodeRepairResponse, error) {
					return c.NodesReboot(ctx, &apiv1.NodeRepairRequest{Id: args[0], Note: rnote})
				},
				func(_ *client.Client, r *apiv1.NodeRepairResponse) error {
					fmt.Fprintf(e.stdout, "node %s: reboot ordered (remediation %s, %s)\n", r.NodeId, r.RemediationId, r.State)
					return nil
				})
		},
	}
	reboot.Flags().StringVar(&rnote, "note", "", "why, recorded in the case's reason")
	outputFlag(reboot, &rout)
	return []*cobra.Command{reset, reboot}
}

func remediationStatsCmd(e *env, af *apiFlags) *cobra.Command {
	var pool, out string
	cmd := &cobra.Command{
		Use:   "stats [--pool P]",
		Short: "Show how fast remediation works, per pool",
		Long: `stats calls remediation.stats: per pool, the cases kept and, in seconds, the
time from detection to quarantine, the time to return (MTTR) and the time
between incidents per node and per GPU (count, p50, p90, p99, max).
-o json prints the API's RemediationStatsResponse.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.RemediationStatsResponse, error) {
					return c.RemediationStats(ctx, &apiv1.RemediationStatsRequest{Pool: pool})
				},
				func(_ *client.Client, r *apiv1.RemediationStatsResponse) error {
					type row struct {
						pool, what string
						d          *apiv1.DurationStats
					}
					var rows []row
					for _, p := range r.Pools {
						fmt.Fprintf(e.stdout, "pool %s: %d cases, %d open, %d returned, %d escalated\n", p.PoolId, p.Cases, p.Open, p.Returned, p.Escalated)
						rows = append(rows, row{p.PoolId, "detection to quarantine", p.TimeToQuarantine}, row{p.PoolId, "time to return", p.TimeToReturn},
							row{p.PoolId, "between incidents (node)", p.TimeBetweenIncidentsNode}, row{p.PoolId, "between incidents (GPU)", p.TimeBetweenIncidentsGpu})
					}
					sec := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) + "s" }
					return tableOf(e.stdout, []string{"POOL", "FIGURE", "COUNT", "P50", "P90", "P99", "MAX"}, rows, func(r row) []string {
						if r.d.GetCount() == 0 {
							return []string{r.pool, r.what, "0", "-", "-", "-", "-"}
						}
						return []string{r.pool, r.what, strconv.Itoa(int(r.d.Count)), sec(r.d.P50Seconds), sec(r.d.P90Seconds),
							sec(r.d.P99Seconds), sec(r.d.MaxSeconds)}
					})
				})
		},
	}
	cmd.Flags().StringVar(&pool, "pool", "", "only this pool (id or name)")
	outputFlag(cmd, &out)
	return cmd
}
