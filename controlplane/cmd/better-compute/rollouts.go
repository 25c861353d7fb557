package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// rolloutsCmd groups the rollout commands; they call rollouts.* (docs/rollouts.md).
func rolloutsCmd(e *env) *cobra.Command {
	return apiGroup(e, "rollouts", "Roll bcd out to a pool in waves: canary, budget, soak, health gate, bake, halt and roll back",
		rolloutsCreateCmd, rolloutsListCmd, rolloutsGetCmd,
		rolloutsActionCmd("pause", "Start no new node or wave of a running rollout (needs an operator token)",
			`pause calls rollouts.pause: no new node is taken out and no new wave starts;
nodes already out finish their upgrade and soak, and a bake's clock stops (every
upgraded node is still watched). Audited.`),
		rolloutsActionCmd("resume", "Let a paused rollout go on (needs an operator token)",
			`resume calls rollouts.resume: the rollout takes up where it paused. Audited.`),
		rolloutsActionCmd("abort", "Stop a rollout for good (needs an operator token)",
			`abort calls rollouts.abort: the rollout ends, its holds on the pool's disruption
budget are released (nodes mid-upgrade finish on their own) and it never
touches another node. A halted rollout waits for this. Audited.`))
}

func rolloutsCreateCmd(e *env, af *apiFlags) *cobra.Command {
	var (
		version, pool, wave, maxOut, baseURL, out string
		canary                                    int
		soak, timeout, bake                       time.Duration
		drain, requireEvidence                    bool
	)
	cmd := &cobra.Command{
		Use:   "create --version V --pool P [--canary N] [--wave N|N%] [--max-unavailable N|N%] [--soak D] [--bake D] [--timeout D] [--drain=true|false] [--require-evidence]",
		Short: "Roll bcd version V out to pool P in waves (needs an operator token)",
		Long: `create calls rollouts.create. The release must be in the downloads folder with a
signed manifest that verifies against downloads.releasePins, or nothing is
created. The reconciler then upgrades the canary (--canary nodes, default 1),
then waves of --wave nodes (default 10% of the pool), never more than
--max-unavailable of them out at once (default the wave's size) and always
within the pool's disruption budget. A node is done when it reconnects on V
and stays ready for --soak (default 5m). A node that fails its trial, does not
come back within --timeout (default 10m) or turns unhealthy in its soak halts
the rollout. The rollout keeps watching every node it upgraded, of every wave,
until it ends and for --bake after the last wave (default 10m; the bake's clock
stops while the rollout is paused): a node that restarts bcd, leaves ready, is
quarantined, runs another version, or drops its session more than once
(reconnects after a gateway's drain do not count) halts it too. A halt rolls
back every node the rollout upgraded, of every wave, to the release it kept,
within the pool's disruption budget; rollouts get and the rollout.halted event
name each node and why. Each wave is health-gated: over its soak its upgraded
nodes are compared with the pool's nodes not yet upgraded (bcd restarts and
session drops per node-hour, GPU findings per GPU-hour, failed commands per
command; a one-sided Poisson test, rollouts.healthGate), and a wave clearly
worse halts the rollout. With too few node-hours to decide the soak is extended
once and the wave then advances, or halts with --require-evidence. By default each node's running commands finish first (--drain); with
--drain=false they are reported as ended by the restart. rollouts get ID
--watch follows it. Audited.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if version == "" || pool == "" {
				return usageError{errors.New("give --version (the release) and --pool (whose nodes to upgrade)")}
			}
			req := &apiv1.CreateRolloutRequest{Version: version, Pool: pool, Canary: int32(canary), Wave: wave,
				MaxUnavailable: maxOut, BaseUrl: baseURL, Drain: &drain, RequireEvidence: requireEvidence}
			if cmd.Flags().Changed("soak") {
				req.Soak = durationpb.New(soak)
			}
			if cmd.Flags().Changed("timeout") {
				req.Timeout = durationpb.New(timeout)
			}
			if cmd.Flags().Changed("bake") {
				req.Bake = durationpb.New(bake)
			}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.RolloutResponse, error) {
					return c.RolloutsCreate(ctx, req)
				},
				func(_ *client.Client, r *apiv1.RolloutResponse) error {
					ro := r.GetRollout()
					fmt.Fprintf(e.stdout, "rollout %s: bcd %s to %d node(s) of pool %s, canary %d, waves of %s, at most %s out, soak %v, bake %v\n",
						ro.Id, ro.Version, len(r.Nodes), pool, ro.Canary, ro.Wave, ro.MaxUnavailable, ro.GetSoak().AsDuration(), ro.GetBake().AsDuration())
					fmt.Fprintf(e.stdout, "follow it with: better-compute rollouts get %s --watch\n", ro.Id)
					return nil
				})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&version, "version", "", "the bcd release to roll out (in the downloads folder, signed)")
	fl.StringVar(&pool, "pool", "", "the pool (id or name) whose nodes to upgrade")
	fl.IntVar(&canary, "canary", 0, "nodes in the first wave (default 1)")
	fl.StringVar(&wave, "wave", "", "nodes in each later wave: N or N% of the pool (default 10%)")
	fl.StringVar(&maxOut, "max-unavailable", "", "most of the rollout's nodes out at once: N or N% (default the wave's size)")
	fl.DurationVar(&soak, "soak", 0, "how long an upgraded node must stay ready (default 5m)")
	fl.DurationVar(&bake, "bake", 0, "how long to keep watching every upgraded node after the last wave (default 10m)")
	fl.DurationVar(&timeout, "timeout", 0, "how long a node has to come back on the new version, and to drain (default 10m)")
	fl.BoolVar(&drain, "drain", true, "wait for each node's running commands before its upgrade")
	fl.BoolVar(&requireEvidence, "require-evidence", false, "halt a wave whose health gate is still inconclusive after its extended soak")
	fl.StringVar(&baseURL, "base-url", "", "downloads route the nodes fetch from (default this control plane's)")
	outputFlag(cmd, &out)
	return cmd
}

func rolloutsListCmd(e *env, af *apiFlags) *cobra.Command {
	var pool, out string
	var active bool
	cmd := &cobra.Command{
		Use:   "list [--pool P] [--active]",
		Short: "List rollouts with their progress",
		Long:  `list calls rollouts.list. -o json prints the API's ListRolloutsResponse.`,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListRolloutsResponse, error) {
					ros, err := listAll(ctx, c.RolloutsList,
						func(p *apiv1.Page) *apiv1.ListRolloutsRequest {
							return &apiv1.ListRolloutsRequest{Page: p, Pool: pool, Active: active}
						},
						(*apiv1.ListRolloutsResponse).GetRollouts)
					return &apiv1.ListRolloutsResponse{Rollouts: ros}, err
				},
				func(_ *client.Client, r *apiv1.ListRolloutsResponse) error {
					if len(r.Rollouts) == 0 {
						fmt.Fprintln(e.stderr, "no rollouts")
						return nil
					}
					return tableOf(e.stdout, []string{"ID", "POOL", "VERSION", "STATE", "WAVE", "PROGRESS", "CREATED"}, r.Rollouts,
						func(ro *apiv1.Rollout) []string {
							return []string{ro.Id, ro.PoolId, ro.Version, ro.State, strconv.Itoa(int(ro.CurrentWave)), progressLine(ro), when(ro.CreateTime)}
						})
				})
		},
	}
	cmd.Flags().StringVar(&pool, "pool", "", "only this pool's rollouts (id or name)")
	cmd.Flags().BoolVar(&active, "active", false, "only rollouts in progress or halted")
	outputFlag(cmd, &out)
	return cmd
}

// progressLine is a rollout's progress in one line.
func progressLine(ro *apiv1.Rollout) string {
	p := ro.GetProgress()
	s := fmt.Sprintf("%d/%d upgraded, %d out, %d pending", p.GetUpgraded(), p.GetNodes(), p.GetOut(), p.GetPending())
	if p.GetSkipped() > 0 {
		s += fmt.Sprintf(", %d skipped", p.GetSkipped())
	}
	if p.GetFailed() > 0 {
		s += fmt.Sprintf(", %d failed", p.GetFailed())
	}
	if p.GetRolledBack() > 0 {
		s += fmt.Sprintf(", %d rolled back", p.GetRolledBack())
	}
	return s
}

// rolloutDone reports whether a rollout will not move on by itself.
func rolloutDone(state string) bool {
	switch state {
	case "completed", "aborted", "failed", "halted":
		return true
	}
	return false
}

func oneRollout(args []string) error {
	if len(args) != 1 || args[0] == "" {
		return usageError{errors.New("give one rollout id (rollouts list shows them)")}
	}
	return nil
}

func rolloutsGetCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	var watch bool
	var every time.Duration
	cmd := &cobra.Command{
		Use:   "get ID [--watch]",
		Short: "Show a rollout and its nodes; --watch follows it with a progress line",
		Long: `get calls rollouts.get and prints the rollout and its nodes. With --watch it
prints a progress line each time the rollout changes until it completes,
halts, fails or is aborted, and exits 0 only when it completed. -o json prints
the API's RolloutResponse (with --watch, the last one).`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if err := oneRollout(args); err != nil {
				return err
			}
			if every <= 0 {
				return usageError{errors.New("--every must be positive")}
			}
			if !watch {
				return runAPI(cmd.Context(), e, af, out,
					func(ctx context.Context, c *client.Client) (*apiv1.RolloutResponse, error) {
						return c.RolloutsGet(ctx, &apiv1.GetRolloutRequest{Id: args[0]})
					},
					func(_ *client.Client, r *apiv1.RolloutResponse) error { return printRollout(e, r) })
			}
			c, err := e.client(af)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			last := ""
			for {
				r, err := c.RolloutsGet(ctx, &apiv1.GetRolloutRequest{Id: args[0]})
				if err != nil {
					return err
				}
				ro := r.GetRollout()
				line := fmt.Sprintf("%s wave %d: %s", ro.State, ro.CurrentWave, progressLine(ro))
				if ro.Phase == "bake" && (ro.State == "running" || ro.State == "paused") {
					line = fmt.Sprintf("%s, baking (%v of %v): %s", ro.State, ro.GetBakeElapsed().AsDuration().Truncate(time.Second),
						ro.GetBake().AsDuration(), progressLine(ro))
				}
				if line != last && out != "json" {
					fmt.Fprintf(e.stdout, "%s %s\n", time.Now().UTC().Format(time.TimeOnly), line)
					last = line
				}
				if rolloutDone(ro.State) {
					if out == "json" {
						if err := printJSON(e.stdout, r); err != nil {
							return err
						}
					}
					if ro.State != "completed" {
						return fmt.Errorf("rollout %s %s: %s", ro.Id, ro.State, ro.Reason)
					}
					return nil
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(every):
				}
			}
		},
	}
	cmd.Flags().BoolVar(&watch, "watch", false, "follow the rollout until it completes, halts, fails or is aborted")
	cmd.Flags().DurationVar(&every, "every", time.Second, "with --watch, how often to read the rollout")
	outputFlag(cmd, &out)
	return cmd
}

// printRollout draws a rollout and its nodes for people.
func printRollout(e *env, r *apiv1.RolloutResponse) error {
	ro := r.GetRollout()
	drain := "drain first"
	if !ro.Drain {
		drain = "no drain"
	}
	fmt.Fprintf(e.stdout, "rollout %s: bcd %s to pool %s, %s, wave %d\n", ro.Id, ro.Version, ro.PoolId, ro.State, ro.CurrentWave)
	fmt.Fprintf(e.stdout, "canary %d, waves of %s, at most %s out, soak %v, bake %v, timeout %v, %s\n", ro.Canary, ro.Wave, ro.MaxUnavailable,
		ro.GetSoak().AsDuration(), ro.GetBake().AsDuration(), ro.GetTimeout().AsDuration(), drain)
	switch ro.Phase {
	case "bake":
		fmt.Fprintf(e.stdout, "phase: bake, %v of %v (every node it upgraded is still watched)\n",
			ro.GetBakeElapsed().AsDuration().Round(time.Second), ro.GetBake().AsDuration())
	case "waves":
		fmt.Fprintf(e.stdout, "phase: waves\n")
	}
	fmt.Fprintf(e.stdout, "progress: %s\n", progressLine(ro))
	if ro.Reason != "" {
		fmt.Fprintf(e.stdout, "reason: %s\n", ro.Reason)
	}
	for _, g := range ro.HealthGates {
		printHealthGate(e, g)
	}
	fmt.Fprintln(e.stdout)
	return tableOf(e.stdout, []string{"NODE", "HOSTNAME", "WAVE", "STATE", "FROM", "NOW", "SINCE", "REASON"}, r.Nodes,
		func(n *apiv1.RolloutNode) []string {
			return []string{n.NodeId, n.Hostname, strconv.Itoa(int(n.Wave)), n.State, orDash(n.PreviousVersion), orDash(n.BcdVersion),
				when(n.StateTime), orDash(oneLine(n.Reason))}
		})
}

// printHealthGate draws a wave's health gate: the verdict, then a line per
// measure with both groups' figures.
func printHealthGate(e *env, g *apiv1.RolloutHealthGate) {
	verdict := g.Verdict
	switch {
	case g.Pending:
		verdict += " so far, soak extended to " + when(g.ExtendedUntil)
	case g.ExtendedUntil != nil:
		verdict += " after its extended soak"
	}
	fmt.Fprintf(e.stdout, "health gate, wave %d: %s; %d upgraded node(s), %.3g node-hour(s), against %d %s node(s), %.3g node-hour(s)\n",
		g.Wave, verdict, g.UpgradedNodes, g.UpgradedNodeHours, g.ComparisonNodes, g.Comparison, g.ComparisonNodeHours)
	for _, m := range g.Measures {
		mark := ""
		switch {
		case m.Worse:
			mark = "  WORSE"
		case m.Skipped:
			mark = "  (no exposure)"
		}
		fmt.Fprintf(e.stdout, "  %-16s upgraded %d in %.3g %s(s), comparison %d in %.3g, expected %.2f, p %.2g%s\n", m.Name,
			m.UpgradedCount, m.UpgradedExposure, m.Unit, m.ComparisonCount, m.ComparisonExposure, m.Expected, m.PValue, mark)
	}
}

// rolloutsActionCmd is pause, resume or abort.
func rolloutsActionCmd(verb, short, long string) func(*env, *apiFlags) *cobra.Command {
	return func(e *env, af *apiFlags) *cobra.Command {
		var out, reason string
		cmd := &cobra.Command{
			Use: verb + " ID", Short: short, Long: long,
			Args: cobra.ArbitraryArgs,
			RunE: func(cmd *cobra.Command, args []string) error {
				if err := checkOutput(out); err != nil {
					return err
				}
				if err := oneRollout(args); err != nil {
					return err
				}
				req := &apiv1.RolloutActionRequest{Id: args[0], Reason: reason}
				return runAPI(cmd.Context(), e, af, out,
					func(ctx context.Context, c *client.Client) (*apiv1.RolloutResponse, error) {
						switch verb {
						case "pause":
							return c.RolloutsPause(ctx, req)
						case "resume":
							return c.RolloutsResume(ctx, req)
						}
						return c.RolloutsAbort(ctx, req)
					},
					func(_ *client.Client, r *apiv1.RolloutResponse) error {
						fmt.Fprintf(e.stdout, "rollout %s: %s (%s)\n", r.GetRollout().GetId(), r.GetRollout().GetState(), progressLine(r.GetRollout()))
						return nil
					})
			},
		}
		if verb == "abort" {
			cmd.Flags().StringVar(&reason, "reason", "", "why, recorded with the rollout and its event")
		}
		outputFlag(cmd, &out)
		return cmd
	}
}
