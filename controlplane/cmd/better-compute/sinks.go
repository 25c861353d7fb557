package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// sinksCmd groups the event sink commands; they call sinks.deadLetters and
// sinks.replay.
func sinksCmd(e *env) *cobra.Command {
	return apiGroup(e, "sinks", "See the events sinks gave up on, and deliver them again", sinksDeadLettersCmd, sinksReplayCmd)
}

func sinksDeadLettersCmd(e *env, af *apiFlags) *cobra.Command {
	var sink, out string
	cmd := &cobra.Command{
		Use:   "dead-letters [--sink S]",
		Short: "List the events sinks gave up on, oldest first (needs an admin token)",
		Long: `dead-letters calls sinks.deadLetters and prints every dead letter, oldest
first: an event whose delivery to a sink failed 10 times in a row, moved out of
the way so that the events after it flow (docs/events.md, "Sinks"). REPLAY is
"pending" while a replay waits for the sink to deliver it. -o json prints the
API's ListDeadLettersResponse, each dead letter with its event as the sink
receives it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListDeadLettersResponse, error) {
					dls, err := listAll(ctx, c.SinksDeadLetters,
						func(p *apiv1.Page) *apiv1.ListDeadLettersRequest {
							return &apiv1.ListDeadLettersRequest{Page: p, Sink: sink}
						},
						(*apiv1.ListDeadLettersResponse).GetDeadLetters)
					return &apiv1.ListDeadLettersResponse{DeadLetters: dls}, err
				},
				func(_ *client.Client, r *apiv1.ListDeadLettersResponse) error {
					if len(r.DeadLetters) == 0 {
						fmt.Fprintln(e.stderr, "no dead letters")
						return nil
					}
					return tableOf(e.stdout, []string{"ID", "SINK", "TYPE", "SUBJECT", "ATTEMPTS", "FAILED", "REPLAY", "ERROR"}, r.DeadLetters,
						func(d *apiv1.DeadLetter) []string {
							replay := "-"
							if d.Replay {
								replay = "pending"
							}
							return []string{d.Id, d.Sink, strings.TrimPrefix(d.GetEvent().GetType(), "com.better-compute."),
								orDash(d.GetEvent().GetSubject()), strconv.Itoa(int(d.Attempts)), when(d.FailTime), replay, oneLine(d.LastError)}
						})
				})
		},
	}
	cmd.Flags().StringVar(&sink, "sink", "", "only this sink's dead letters (its name in sinks.webhooks or sinks.files)")
	outputFlag(cmd, &out)
	return cmd
}

func sinksReplayCmd(e *env, af *apiFlags) *cobra.Command {
	var (
		sink, out string
		all       bool
	)
	cmd := &cobra.Command{
		Use:   "replay ID... | --all --sink S",
		Short: "Deliver dead letters again (needs an admin token)",
		Long: `replay calls sinks.replay: it marks the dead letters named by ID (as
sinks dead-letters lists them; with --sink, they must be that sink's), or with
--all every dead letter of --sink, for redelivery. The sink's dispatcher
delivers them before the outbox (so out of order with their subject's later
events), and each leaves the table once delivered; one that fails 10 more
times waits for another replay. An ID that is not a dead letter fails the
command and nothing is marked.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			switch {
			case all && len(args) > 0:
				return usageError{errors.New("give dead letter ids or --all, not both")}
			case all && sink == "":
				return usageError{errors.New("--all needs --sink: the sink whose dead letters to replay")}
			case !all && len(args) == 0:
				return usageError{errors.New("give the ids of dead letters to replay (sinks dead-letters lists them), or --all --sink S")}
			}
			for _, a := range args {
				if n, err := strconv.ParseInt(a, 10, 64); err != nil || n <= 0 {
					return usageError{fmt.Errorf("%q is not a dead letter id (sinks dead-letters lists them)", a)}
				}
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ReplayDeadLettersResponse, error) {
					return c.SinksReplay(ctx, &apiv1.ReplayDeadLettersRequest{Sink: sink, Ids: args, All: all})
				},
				func(_ *client.Client, r *apiv1.ReplayDeadLettersResponse) error {
					if r.Replayed == 0 {
						fmt.Fprintf(e.stdout, "sink %s has no dead letters to replay\n", sink)
						return nil
					}
					fmt.Fprintf(e.stdout, "%d dead letter(s) marked for replay; the sink delivers them next (sinks dead-letters shows what is left)\n", r.Replayed)
					return nil
				})
		},
	}
	cmd.Flags().StringVar(&sink, "sink", "", "the sink: required with --all; with ids, they must be its dead letters")
	cmd.Flags().BoolVar(&all, "all", false, "replay every dead letter of --sink")
	outputFlag(cmd, &out)
	return cmd
}

// oneLine is s on one line, for a table cell.
func oneLine(s string) string {
	if s == "" {
		return "-"
	}
	return strings.Join(strings.Fields(s), " ")
}
