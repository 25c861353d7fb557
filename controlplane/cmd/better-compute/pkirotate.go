package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// pkiRotateCmd is `pki rotate node-ca|gateway-ca|internal-ca
// start|status|advance|rollback` (docs/pki.md, "Rotating the node CA",
// "Rotating the gateway CA", "Rotating the internal CA").
func pkiRotateCmd(e *env) *cobra.Command {
	c := &cobra.Command{Use: "rotate", Short: "Rotate a CA in phases that advance on proof"}
	c.AddCommand(rotateCACmd(e, "node", &cobra.Command{
		Use:   "node-ca",
		Short: "Rotate the node CA: start, status, advance [--force], rollback",
		Long: `node-ca rotates the node CA in phases (docs/pki.md, "Rotating the node CA"):
start makes the next CA, which every gateway trusts at once beside the old
one, and sends it to every node in its session (propagating); the rotation
activates when the acknowledged share of live nodes reaches the threshold
(the new CA issues at each node's next renewal), and retires when no node
holds a valid certificate from another CA (or after pki.reattestGrace).
status prints the phase as one word, then the counts behind it.`,
	}), rotateCACmd(e, "gateway", &cobra.Command{
		Use:   "gateway-ca",
		Short: "Rotate the gateway serving CA: start, status, advance [--force], rollback",
		Long: `gateway-ca rotates the gateway serving CA in phases (docs/pki.md, "Rotating
the gateway CA"): start makes the next CA and sends its root to every node in
its session, and join tokens made from then on pin both CAs (propagating);
the rotation activates when the acknowledged share of live nodes reaches the
threshold, and every gateway then serves a certificate from the new CA, with
a chain that the old pin still verifies; it retires (gateways serve the new
CA's chain alone) once every live node acknowledged and no join token made
before start can still be used. advance to retired refuses while such tokens
are live, naming them; advance --force retires anyway and revokes them
(audited). status prints the phase as one word, then the counts behind it.`,
	}), rotateCACmd(e, "internal", &cobra.Command{
		Use:   "internal-ca",
		Short: "Rotate the internal CA of the internal control API: start, status, advance [--force], rollback",
		Long: `internal-ca rotates the internal CA in phases (docs/pki.md, "Rotating the
internal CA"): start makes the next CA, which every control-plane process with
the internal control API (host.gateway.internal) trusts beside the old one
within seconds, without a restart, and reports in its process row
(propagating); the rotation activates once every such registered process
trusts it (the threshold does not apply), and each process then presents a
certificate from the new CA, re-issued in memory for the key and names of
its files; it retires (the old CA is trusted no more) once every such process
presents one. The files keep working after a restart: a certificate from the
old CA is re-issued in memory the same way (pki issue-internal renews the
files). status prints the phase as one word, then the counts behind it.`,
	}))
	return c
}

// rotateCACmd adds the start, status, advance and rollback subcommands of
// CA ca ("node", "gateway" or "internal", the API's RotationStartRequest.ca)
// to c.
func rotateCACmd(e *env, ca string, c *cobra.Command) *cobra.Command {
	c.AddCommand(
		rotateCmd(e, "start", "Make the next CA and start a rotation (propagating)",
			func(cmd *cobra.Command) func(context.Context, *client.Client) (*apiv1.RotationResponse, error) {
				threshold, _ := cmd.Flags().GetFloat64("threshold")
				reason, _ := cmd.Flags().GetString("reason")
				return func(ctx context.Context, c *client.Client) (*apiv1.RotationResponse, error) {
					return c.PkiRotationStart(ctx, &apiv1.RotationStartRequest{Ca: ca, Threshold: threshold, Reason: reason})
				}
			}, func(cmd *cobra.Command) {
				cmd.Flags().Float64("threshold", 0, "share of live nodes (0 to 1) whose acknowledgement activates the rotation; 0: the default, 0.99")
				cmd.Flags().String("reason", "", "why, for the record")
			}),
		rotateCmd(e, "status", "Print the rotation's phase (one word), then the counts behind it",
			func(*cobra.Command) func(context.Context, *client.Client) (*apiv1.RotationResponse, error) {
				return func(ctx context.Context, c *client.Client) (*apiv1.RotationResponse, error) {
					return c.PkiRotationStatus(ctx, &apiv1.RotationStatusRequest{Ca: ca})
				}
			}, nil),
		rotateCmd(e, "advance", "Move the rotation on when its phase's condition holds (--force: anyway, audited)",
			func(cmd *cobra.Command) func(context.Context, *client.Client) (*apiv1.RotationResponse, error) {
				force, _ := cmd.Flags().GetBool("force")
				reason, _ := cmd.Flags().GetString("reason")
				return func(ctx context.Context, c *client.Client) (*apiv1.RotationResponse, error) {
					return c.PkiRotationAdvance(ctx, &apiv1.RotationAdvanceRequest{Ca: ca, Force: force, Reason: reason})
				}
			}, func(cmd *cobra.Command) {
				cmd.Flags().Bool("force", false, "move on although the phase's condition does not hold (audited)")
				cmd.Flags().String("reason", "", "why, for the record")
			}),
		rotateCmd(e, "rollback", "Return to the old CA (from propagating or activated)",
			func(cmd *cobra.Command) func(context.Context, *client.Client) (*apiv1.RotationResponse, error) {
				reason, _ := cmd.Flags().GetString("reason")
				return func(ctx context.Context, c *client.Client) (*apiv1.RotationResponse, error) {
					return c.PkiRotationRollback(ctx, &apiv1.RotationRollbackRequest{Ca: ca, Reason: reason})
				}
			}, func(cmd *cobra.Command) {
				cmd.Flags().String("reason", "", "why, for the record")
			}),
	)
	return c
}

// rotateCmd is one `pki rotate node-ca|gateway-ca|internal-ca` subcommand: call builds its API
// call from the parsed flags, flags adds them.
func rotateCmd(e *env, use, short string, call func(*cobra.Command) func(context.Context, *client.Client) (*apiv1.RotationResponse, error),
	flags func(*cobra.Command)) *cobra.Command {
	var af apiFlags
	var out string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			return runAPI(cmd.Context(), e, &af, out, call(cmd), func(_ *client.Client, res *apiv1.RotationResponse) error {
				printRotation(e, res.GetRotation())
				return nil
			})
		},
	}
	af.add(cmd)
	if flags != nil {
		flags(cmd)
	}
	outputFlag(cmd, &out)
	return cmd
}

// printRotation writes the phase as one word on the first line, then the
// counts behind it.
func printRotation(e *env, r *apiv1.CARotation) {
	fmt.Fprintln(e.stdout, r.GetPhase())
	fmt.Fprintf(e.stdout, "rotation   %s (%s CA %s -> %s)\n", r.GetId(), r.GetCa(), r.GetOldCaId(), r.GetNewCaId())
	if r.GetCa() == "internal" {
		fmt.Fprintf(e.stdout, "trusted by %d of %d processes with the internal control API\n", r.GetAckedNodes(), r.GetLiveNodes())
		if ids := r.GetMissingNodeIds(); len(ids) > 0 {
			fmt.Fprintf(e.stdout, "not yet    %s\n", listed(ids, int(r.GetLiveNodes()-r.GetAckedNodes())))
		}
		fmt.Fprintf(e.stdout, "on old CA  %d processes present a certificate from another internal CA\n", r.GetNodesOffNewCa())
		if ids := r.GetOffNewCaNodeIds(); len(ids) > 0 {
			fmt.Fprintf(e.stdout, "           %s\n", listed(ids, int(r.GetNodesOffNewCa())))
		}
		printRotationTimes(e, r)
		return
	}
	fmt.Fprintf(e.stdout, "acked      %d of %d live nodes (threshold %g %%)\n", r.GetAckedNodes(), r.GetLiveNodes(), r.GetThreshold()*100)
	if ids := r.GetMissingNodeIds(); len(ids) > 0 && r.GetPhase() == "propagating" {
		fmt.Fprintf(e.stdout, "not acked  %s\n", listed(ids, int(r.GetLiveNodes()-r.GetAckedNodes())))
	}
	if r.GetCa() == "gateway" && (r.GetPhase() == "propagating" || r.GetPhase() == "activated") {
		fmt.Fprintf(e.stdout, "old pin    %d join tokens pin only the old gateway CA and can still be used\n", r.GetOldPinTokens())
		if ids := r.GetOldPinTokenIds(); len(ids) > 0 {
			fmt.Fprintf(e.stdout, "           %s\n", listed(ids, int(r.GetOldPinTokens())))
		}
	}
	if r.GetCa() != "gateway" && (r.GetPhase() == "activated" || r.GetPhase() == "retired") {
		fmt.Fprintf(e.stdout, "on old CA  %d nodes with a valid certificate from another CA\n", r.GetNodesOffNewCa())
		if ids := r.GetOffNewCaNodeIds(); len(ids) > 0 {
			fmt.Fprintf(e.stdout, "           %s\n", listed(ids, int(r.GetNodesOffNewCa())))
		}
	}
	printRotationTimes(e, r)
}

// printRotationTimes writes the rotation's phase times and what it waits
// for.
func printRotationTimes(e *env, r *apiv1.CARotation) {
	for _, t := range []struct {
		name string
		at   interface{ AsTime() time.Time }
		set  bool
	}{
		{"started", r.GetStartedAt(), r.GetStartedAt() != nil},
		{"activated", r.GetActivatedAt(), r.GetActivatedAt() != nil},
		{"retired", r.GetRetiredAt(), r.GetRetiredAt() != nil},
		{"rolled back", r.GetRolledBackAt(), r.GetRolledBackAt() != nil},
	} {
		if t.set {
			fmt.Fprintf(e.stdout, "%-10s %s\n", t.name, t.at.AsTime().UTC().Format(time.RFC3339))
		}
	}
	if w := r.GetWaiting(); w != "" {
		fmt.Fprintf(e.stdout, "waiting    %s\n", w)
	}
}

// listed joins ids, saying how many more there are than listed.
func listed(ids []string, total int) string {
	s := strings.Join(ids, ", ")
	if more := total - len(ids); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}
