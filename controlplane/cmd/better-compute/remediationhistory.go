package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

func remediationHistoryCmd(e *env, af *apiFlags) *cobra.Command {
	var gpu, out string
	var window time.Duration
	var limit int
	cmd := &cobra.Command{
		Use:   "history NODE | history --gpu UUID",
		Short: "Show a node's or a GPU's remediation memory",
		Long: `history calls remediation.history and prints a node's (or, with --gpu, a
GPU's, on whichever node it was) memory, newest first: how often each code came
back on each GPU (codes that do not act included), then every finding the
reconciler took (with what it made of it: none, opened, held, joined, failed,
other-gpu), every case and every action (gpu.reset, reboot, power.cycle). NODE
and --gpu together: that GPU on that node. --window leaves out what is older.
-o json prints the API's RemediationHistory.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if len(args) > 1 || (len(args) == 0 && gpu == "") || (len(args) == 1 && args[0] == "") {
				return usageError{errors.New("give one node id, or --gpu UUID")}
			}
			req := &apiv1.RemediationHistoryRequest{GpuUuid: gpu, Limit: int32(limit)}
			if len(args) == 1 {
				req.NodeId = args[0]
			}
			if window > 0 {
				req.Window = durationpb.New(window)
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.RemediationHistory, error) {
					return c.RemediationHistory(ctx, req)
				},
				func(_ *client.Client, h *apiv1.RemediationHistory) error { return printHistory(e, h) })
		},
	}
	cmd.Flags().StringVar(&gpu, "gpu", "", "a GPU's UUID: its memory only")
	cmd.Flags().DurationVar(&window, "window", 0, "only what came within this long (0: everything kept)")
	cmd.Flags().IntVar(&limit, "limit", 0, "at most this many of each: findings, cases, actions (0: 100)")
	outputFlag(cmd, &out)
	return cmd
}

// historyLine is one line of a history's timeline.
type historyLine struct {
	at   *timestamppb.Timestamp
	what string
	gpu  string
	rem  string
	note string
}

// printHistory draws a history for people: the counts, then one timeline
// of findings, cases and actions, newest first.
func printHistory(e *env, h *apiv1.RemediationHistory) error {
	if len(h.Counts) > 0 {
		if err := tableOf(e.stdout, []string{"NODE", "GPU", "KIND", "XID", "RESOLUTION", "COUNT", "FIRST", "LAST"}, h.Counts,
			func(c *apiv1.GPUFindingCount) []string {
				return []string{c.NodeId, orDash(c.GpuUuid), c.Kind, strconv.Itoa(int(c.Xid)), orDash(c.Resolution),
					strconv.Itoa(int(c.Count)), when(c.FirstTime), when(c.LastTime)}
			}); err != nil {
			return err
		}
		fmt.Fprintln(e.stdout)
	}
	var lines []historyLine
	for _, f := range h.Findings {
		what := "finding " + f.Kind
		if f.Xid != 0 {
			what += " " + strconv.Itoa(int(f.Xid))
		}
		lines = append(lines, historyLine{f.TakeTime, what, f.GpuUuid, f.RemediationId,
			f.Outcome + " (" + orDash(f.Resolution) + "; investigatory " + orDash(f.Investigatory) + ")"})
	}
	for _, c := range h.Cases {
		lines = append(lines, historyLine{c.CreateTime, "case " + c.Action, c.GpuUuid, c.Id, c.State + ": " + oneLine(c.Reason)})
	}
	for _, a := range h.Actions {
		lines = append(lines, historyLine{a.CreateTime, "action " + orDash(a.Kind), a.GpuUuid, a.RemediationId,
			a.CommandId + " " + orDash(a.State)})
	}
	if len(lines) == 0 {
		fmt.Fprintln(e.stderr, "no remediation history")
		return nil
	}
	slices.SortStableFunc(lines, func(a, b historyLine) int {
		return cmp.Compare(b.at.AsTime().UnixNano(), a.at.AsTime().UnixNano())
	})
	return tableOf(e.stdout, []string{"TIME", "WHAT", "GPU", "CASE", "DETAIL"}, lines, func(l historyLine) []string {
		return []string{when(l.at), l.what, orDash(l.gpu), orDash(l.rem), l.note}
	})
}
