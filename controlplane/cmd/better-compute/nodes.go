package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

func nodesCmd(e *env) *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{Use: "nodes", Short: "List, inspect, cordon, drain, delete, upgrade and reinstall nodes"}
	af.add(cmd)

	var out, pool, state, gpuModel, gpuHealth string
	var minGPUs, limit int32
	list := &cobra.Command{
		Use:   "list",
		Short: "List nodes, optionally by pool, state and GPUs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAPI(cmd.Context(), e, &af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListNodesResponse, error) {
					req := &apiv1.ListNodesRequest{Pool: pool, State: state, GpuModel: gpuModel, MinGpus: minGPUs, GpuHealth: gpuHealth,
						Page: &apiv1.Page{Limit: limit}}
					if limit > 0 { // one page, with the cursor of the next
						return c.NodesList(ctx, req)
					}
					nodes, err := listAll(ctx, c.NodesList,
						func(p *apiv1.Page) *apiv1.ListNodesRequest { req.Page = p; return req },
						(*apiv1.ListNodesResponse).GetNodes)
					return &apiv1.ListNodesResponse{Nodes: nodes}, err
				},
				func(_ *client.Client, all *apiv1.ListNodesResponse) error {
					return tableOf(e.stdout, []string{"ID", "HOSTNAME", "STATE", "CORDONED", "GPUS", "BCD", "LAST SEEN"}, all.Nodes,
						func(n *apiv1.Node) []string {
							return []string{n.Id, n.Hostname, n.State, yesNo(n.Cordoned), gpuSummary(n.Gpus), n.BcdVersion, ago(n.LastSeenTime)}
						})
				})
		},
	}
	fl := list.Flags()
	fl.StringVar(&pool, "pool", "", "pool id or name")
	fl.StringVar(&state, "state", "", "joined, ready, unreachable, powered-off or draining")
	fl.StringVar(&gpuModel, "gpu-model", "", "keep nodes with a GPU whose name contains this")
	fl.Int32Var(&minGPUs, "min-gpus", 0, "keep nodes with at least this many GPUs (of --gpu-model)")
	fl.StringVar(&gpuHealth, "gpu-health", "", "keep nodes with a degraded or failed GPU")
	fl.Int32Var(&limit, "limit", 0, "at most this many (default: all)")
	outputFlag(list, &out)

	get := &cobra.Command{
		Use:   "get NODE_ID",
		Short: "Show a node: labels, clock skew, an inventory summary and its GPUs",
		Long: "Shows a node's state, labels, clock skew, an inventory summary (CPU, memory, GPUs by model, OS and\n" +
			"kernel) and each GPU with its health. -o json prints the API's Node with the whole inventory as an object.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return nodeCall(e, &af, cmd, (*client.Client).NodesGet, true, args[0], out)
		},
	}
	outputFlag(get, &out)
	cmd.AddCommand(list, get, nodesUpgradeCmd(e, &af), nodesReinstallCmd(e, &af), nodesAddCmd(e, &af), nodesMoveCmd(e, &af))
	cmd.AddCommand(nodesShellCmd(e, &af), nodesPortForwardCmd(e, &af))
	cmd.AddCommand(nodesRepairCmds(e, &af)...)
	setCount := &cobra.Command{
		Use:   "set-gpu-count NODE_ID COUNT",
		Short: "Set how many GPUs a node is expected to have",
		Long: "Sets the GPUs a node is expected to have (its label better-compute.io/gpu-count), acknowledging an\n" +
			"intended change such as a board sent for repair. The control plane takes the count from a node's first\n" +
			"full inventory; an inventory listing fewer GPUs is a gpu.missing finding (RESTART_BM) naming the missing\n" +
			"GPU (docs/gpu-health.md, \"GPU count\"). COUNT is 0 to 64. Audited.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.ParseInt(args[1], 10, 32)
			if err != nil {
				return usageError{fmt.Errorf("set-gpu-count: COUNT %q: want a number of GPUs, 0 to 64", args[1])}
			}
			set := func(c *client.Client, ctx context.Context, r *apiv1.NodeRequest) (*apiv1.NodeResponse, error) {
				return c.NodesSetGPUCount(ctx, &apiv1.SetGPUCountRequest{Id: r.GetId(), Count: int32(n)})
			}
			return nodeCall(e, &af, cmd, set, false, args[0], out)
		},
	}
	outputFlag(setCount, &out)
	cmd.AddCommand(setCount)
	for _, m := range []struct {
		use    string
		method nodeMethod
		short  string
	}{
		{"cordon", (*client.Client).NodesCordon, "Keep new commands off a node"},
		{"uncordon", (*client.Client).NodesUncordon, "Let commands reach a node again"},
		{"drain", (*client.Client).NodesDrain, "Cordon a node and mark it draining"},
		{"delete", (*client.Client).NodesDelete, "Delete a node and revoke its certificate"},
	} {
		c := &cobra.Command{
			Use:   m.use + " NODE_ID",
			Short: m.short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return nodeCall(e, &af, cmd, m.method, false, args[0], out)
			},
		}
		outputFlag(c, &out)
		cmd.AddCommand(c)
	}
	return cmd
}

// nodeMethod is a node method of the generated client: nodes.get,
// cordon, uncordon, drain or delete, each answering the node.
type nodeMethod func(*client.Client, context.Context, *apiv1.NodeRequest) (*apiv1.NodeResponse, error)

// nodeCall calls method on node id and prints the node: -o json the API's
// Node, else a FIELD/VALUE table, with the inventory summary when
// inventory is set (nodes get).
func nodeCall(e *env, af *apiFlags, cmd *cobra.Command, method nodeMethod, inventory bool, id, out string) error {
	return runAPI(cmd.Context(), e, af, out,
		func(ctx context.Context, c *client.Client) (*apiv1.Node, error) {
			resp, err := method(c, ctx, &apiv1.NodeRequest{Id: id})
			return resp.GetNode(), err
		},
		func(_ *client.Client, n *apiv1.Node) error {
			rows := [][]string{
				{"id", n.Id}, {"hostname", n.Hostname}, {"pool", n.PoolId}, {"state", n.State}, {"cordoned", yesNo(n.Cordoned)},
				{"gateway", orDash(n.GatewayId)}, {"bcd", orDash(n.BcdVersion)}, {"os/arch", n.Os + "/" + n.Arch},
				{"boot id", orDash(n.BootId)}, {"last seen", when(n.LastSeenTime)}, {"certificate expires", when(n.CertExpireTime)},
				{"clock skew", clockSkew(n)}, {"labels", labelsSummary(n.Labels)},
			}
			if inventory {
				rows = append(rows, inventoryRows(n)...)
			}
			for i, g := range n.Gpus {
				health := g.Health
				if len(g.HealthReasons) > 0 {
					health += " (" + strings.Join(g.HealthReasons, "; ") + ")"
				}
				rows = append(rows, []string{fmt.Sprintf("gpu %d", i), fmt.Sprintf("%s %s %d GiB %s", g.Name, g.Uuid, g.MemoryTotalBytes>>30, health)})
			}
			return table(e.stdout, []string{"FIELD", "VALUE"}, rows)
		})
}

func gpuSummary(gpus []*apiv1.GPU) string {
	if len(gpus) == 0 {
		return "-"
	}
	bad := 0
	for _, g := range gpus {
		if g.Health != "ok" {
			bad++
		}
	}
	s := strconv.Itoa(len(gpus)) + "x " + gpus[0].Name
	if bad > 0 {
		s += fmt.Sprintf(" (%d unhealthy)", bad)
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// clockSkew says how far the node's clock is from its gateway's, as the
// gateway last measured it: "5400 s behind (at 2031-03-04T05:06:07Z)", or
// "-" when not measured yet.
func clockSkew(n *apiv1.Node) string {
	if n.GetClockSkew() == nil {
		return "-"
	}
	s := n.GetClockSkew().AsDuration().Round(time.Second) / time.Second
	dir := "ahead"
	if s < 0 {
		s, dir = -s, "behind"
	}
	return fmt.Sprintf("%d s %s (at %s)", s, dir, when(n.GetClockSkewTime()))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
