package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// remediationCmd groups the remediation commands (docs/remediation.md);
// they call the remediation.* methods.
func remediationCmd(e *env) *cobra.Command {
	return apiGroup(e, "remediation", "See and steer closed-loop GPU remediation", remediationListCmd, remediationGetCmd,
		remediationPauseCmd(true), remediationPauseCmd(false), remediationReturnCmd, remediationResetBreakerCmd, remediationHistoryCmd,
		remediationStatsCmd)
}

func remediationListCmd(e *env, af *apiFlags) *cobra.Command {
	var node, pool, state, out string
	var open bool
	cmd := &cobra.Command{
		Use:   "list [--node N] [--pool P] [--state S] [--open]",
		Short: "List remediation cases and the pools' breakers",
		Long: `list calls remediation.list and prints each node's remediation cases: the
finding (an XID with NVIDIA's resolution, a lost GPU, an unresponsive node...),
the policy's action, the state (detected, held, quarantined, draining,
remediating, verifying, returned, escalated), attempts and why the last move
was made. Every pool's breaker (remediation.breakers) follows the table: closed
or tripped, the distinct nodes acted on within its window, its limit, the
pool's GPU nodes, the cases it holds and when a tripped one closes by itself.
-o json prints the API's ListRemediationsResponse.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var breakers []*apiv1.RemediationBreaker
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListRemediationsResponse, error) {
					cs, err := listAll(ctx, c.RemediationList,
						func(p *apiv1.Page) *apiv1.ListRemediationsRequest {
							return &apiv1.ListRemediationsRequest{Page: p, NodeId: node, Pool: pool, State: state, OpenOnly: open}
						},
						(*apiv1.ListRemediationsResponse).GetRemediations)
					if err != nil {
						return nil, err
					}
					if out != "json" {
						b, err := c.RemediationBreakers(ctx, &apiv1.ListBreakersRequest{})
						if err != nil {
							return nil, err
						}
						breakers = b.GetBreakers()
					}
					return &apiv1.ListRemediationsResponse{Remediations: cs}, nil
				},
				func(_ *client.Client, r *apiv1.ListRemediationsResponse) error {
					if len(r.Remediations) == 0 {
						fmt.Fprintln(e.stderr, "no remediation cases")
					} else if err := tableOf(e.stdout, []string{"ID", "NODE", "STATE", "FINDING", "RESOLUTION", "ACTION", "ATTEMPTS", "SINCE", "REASON"},
						r.Remediations, func(c *apiv1.Remediation) []string {
							finding := c.Finding
							if c.Xid != 0 {
								finding += " " + strconv.Itoa(int(c.Xid))
							}
							state := c.State
							if c.Paused {
								state += " (paused)"
							}
							return []string{c.Id, c.NodeId, state, finding, orDash(c.Resolution), c.Action, strconv.Itoa(int(c.Attempts)),
								when(c.StateTime), oneLine(c.Reason)}
						}); err != nil {
						return err
					}
					if len(breakers) > 0 && len(r.Remediations) > 0 {
						fmt.Fprintln(e.stdout) // between the cases' table and the breakers'
					}
					return tableOf(e.stdout, []string{"POOL", "BREAKER", "ACTED", "LIMIT", "GPU NODES", "HELD", "WINDOW", "CLOSES"}, breakers,
						func(b *apiv1.RemediationBreaker) []string {
							state, closes := "closed", "-"
							if b.Tripped {
								state, closes = "tripped", when(b.CloseTime)
							}
							return []string{b.PoolId, state, strconv.Itoa(int(b.Acted)), strconv.Itoa(int(b.Limit)), strconv.Itoa(int(b.GpuNodes)),
								strconv.Itoa(int(b.Held)), (time.Duration(b.WindowSeconds) * time.Second).String(), closes}
						})
				})
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "only this node's cases")
	cmd.Flags().StringVar(&pool, "pool", "", "only this pool's cases (id or name)")
	cmd.Flags().StringVar(&state, "state", "", "only cases in this state")
	cmd.Flags().BoolVar(&open, "open", false, "only open cases (not returned)")
	outputFlag(cmd, &out)
	return cmd
}

// printRemediation draws one case for people.
func printRemediation(e *env, c *apiv1.Remediation) error {
	rows := [][2]string{{"id", c.Id}, {"node", c.NodeId}, {"pool", c.PoolId}, {"state", c.State},
		{"paused", strconv.FormatBool(c.Paused)}, {"finding", c.Finding}, {"kind", orDash(c.Kind)},
		{"resolution", orDash(c.Resolution)}, {"xid", strconv.Itoa(int(c.Xid))}, {"xid mnemonic", orDash(c.XidMnemonic)},
		{"gpu", orDash(c.GpuUuid)}, {"action", c.Action}, {"attempts", strconv.Itoa(int(c.Attempts))},
		{"command", orDash(c.CommandId)}, {"reason", orDash(c.Reason)}, {"since", when(c.StateTime)},
		{"opened", when(c.CreateTime)}}
	if c.CloseTime != nil {
		rows = append(rows, [2]string{"closed", when(c.CloseTime)})
	}
	for _, id := range c.CommandIds {
		rows = append(rows, [2]string{"commands", id})
	}
	return tableOf(e.stdout, []string{"FIELD", "VALUE"}, rows, func(r [2]string) []string { return r[:] })
}

// oneCase checks the one CASE argument.
func oneCase(args []string) error {
	if len(args) != 1 || args[0] == "" {
		return usageError{errors.New("give one remediation id (remediation list shows them)")}
	}
	return nil
}

func remediationGetCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Show one remediation case",
		Long:  `get calls remediation.get and prints the case. -o json prints the API's Remediation.`,
		Args:  cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if err := oneCase(args); err != nil {
				return err
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Remediation, error) {
					return c.RemediationGet(ctx, &apiv1.RemediationRequest{Id: args[0]})
				},
				func(_ *client.Client, r *apiv1.Remediation) error { return printRemediation(e, r) })
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

// remediationPauseCmd returns the pause (or resume) command.
func remediationPauseCmd(pause bool) func(*env, *apiFlags) *cobra.Command {
	return func(e *env, af *apiFlags) *cobra.Command {
		use, short, long := "pause ID", "Stop the reconciler from moving a case (needs an operator token)",
			`pause calls remediation.pause: the reconciler leaves the case where it is until
remediation resume (a command already running runs on). Audited.`
		if !pause {
			use, short, long = "resume ID", "Let the reconciler move a paused case again (needs an operator token)",
				`resume calls remediation.resume: the reconciler takes the case up where it was. Audited.`
		}
		var out string
		cmd := &cobra.Command{
			Use: use, Short: short, Long: long,
			Args: cobra.ArbitraryArgs,
			RunE: func(cmd *cobra.Command, args []string) error {
				if err := checkOutput(out); err != nil {
					return err
				}
				if err := oneCase(args); err != nil {
					return err
				}
				return runAPI(cmd.Context(), e, af, out,
					func(ctx context.Context, c *client.Client) (*apiv1.Remediation, error) {
						if pause {
							return c.RemediationPause(ctx, &apiv1.RemediationRequest{Id: args[0]})
						}
						return c.RemediationResume(ctx, &apiv1.RemediationRequest{Id: args[0]})
					},
					func(_ *client.Client, r *apiv1.Remediation) error {
						verb := "paused"
						if !pause {
							verb = "resumed"
						}
						fmt.Fprintf(e.stdout, "remediation %s of node %s %s (state %s)\n", r.Id, r.NodeId, verb, r.State)
						return nil
					})
			},
		}
		outputFlag(cmd, &out)
		return cmd
	}
}

func remediationReturnCmd(e *env, af *apiFlags) *cobra.Command {
	var note, out string
	var resetGPU, reboot, force bool
	cmd := &cobra.Command{
		Use:   "return ID [--reset-gpu | --reboot | --force] [--note TEXT]",
		Short: "Put a case's node back in service now (needs an operator token)",
		Long: `return calls remediation.return: the node is uncordoned and its disruption
hold released, the case's running command cancelled and the case closed,
whatever its state (an escalated case's answer once a person has fixed the
node). Audited, with the note as the reason. A case whose GPU still reads
failed or degraded is refused: --reset-gpu resets it (or --reboot reboots
the node), verifies it and then returns the node; --force returns it as it
is, recorded in the case's reason.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if err := oneCase(args); err != nil {
				return err
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Remediation, error) {
					return c.RemediationReturn(ctx, &apiv1.ReturnRemediationRequest{Id: args[0], Note: note, ResetGpu: resetGPU,
						Reboot: reboot, Force: force})
				},
				func(_ *client.Client, r *apiv1.Remediation) error {
					if r.State != "returned" {
						fmt.Fprintf(e.stdout, "node %s: %s of remediation %s ordered; it is returned once verified (remediation get %s)\n",
							r.NodeId, r.Action, r.Id, r.Id)
						return nil
					}
					fmt.Fprintf(e.stdout, "node %s is back in service (remediation %s returned)\n", r.NodeId, r.Id)
					return nil
				})
		},
	}
	cmd.Flags().StringVar(&note, "note", "", "why, recorded as the case's reason")
	cmd.Flags().BoolVar(&resetGPU, "reset-gpu", false, "reset the case's GPU, verify it, then return the node")
	cmd.Flags().BoolVar(&reboot, "reboot", false, "reboot the node, verify it, then return it")
	cmd.Flags().BoolVar(&force, "force", false, "return the node whatever its GPUs read (recorded)")
	outputFlag(cmd, &out)
	return cmd
}

func remediationResetBreakerCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "reset-breaker POOL",
		Short: "Reset a pool's remediation circuit breaker (needs an operator token)",
		Long: `reset-breaker calls remediation.resetBreaker: the pool's held cases are acted
on again and the quarantines before the reset no longer count against the
breaker (remediation.breaker in the configuration). doctor's
remediation.breaker check passes again. Audited.`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if len(args) != 1 || args[0] == "" {
				return usageError{errors.New("give one pool (id or name)")}
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.RemediationBreaker, error) {
					return c.RemediationResetBreaker(ctx, &apiv1.ResetBreakerRequest{Pool: args[0]})
				},
				func(_ *client.Client, b *apiv1.RemediationBreaker) error {
					fmt.Fprintf(e.stdout, "breaker of pool %s reset; held cases are acted on in the order they opened\n", b.PoolId)
					return nil
				})
		},
	}
	outputFlag(cmd, &out)
	return cmd
}
