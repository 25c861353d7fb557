package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// reinstallJSON is nodes reinstall's -o json output. Token is set only
// without --out: the secret is shown once.
type reinstallJSON struct {
	TokenID     string    `json:"tokenId"`
	NodeID      string    `json:"nodeId"`
	PoolID      string    `json:"poolId"`
	ExpiresAt   time.Time `json:"expiresAt"`
	GatewayURLs []string  `json:"gatewayUrls"`
	JoinCommand string    `json:"joinCommand"`
	Token       string    `json:"token,omitempty"`
	File        string    `json:"file,omitempty"`
}

// placeholderGateway stands in the join command when no gateway of the
// node's region is live.
const placeholderGateway = "https://GATEWAY:8443"

// nodesReinstallCmd is nodes reinstall: a one-use join token bound to a
// node, for a machine whose disk was wiped (DESIGN.md, "Re-join needs proof,
// never a name").
func nodesReinstallCmd(e *env, af *apiFlags) *cobra.Command {
	var (
		outFile, out string
		ttl          time.Duration
	)
	cmd := &cobra.Command{
		Use:   "reinstall NODE_ID [--ttl 2h] [--out FILE]",
		Short: "Make a one-use join token that lets a reinstalled (wiped) machine take NODE_ID's id, labels and history",
		Long: `Reinstall makes a one-use join token bound to the node, in its pool. A machine
whose disk was wiped (so it lost its key) that joins with it becomes that node:
the same node id, labels and command history. A machine that still holds the
node's key needs no token: it re-joins or re-attests by proof.

The token is shown once, with the bcd join command to run on the machine as
root; with --out it is written to FILE (mode 0600) instead. The install script
takes it too (BCD_JOIN_TOKEN or its token file). A matching hostname alone
never makes a machine an existing node.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if ttl <= 0 || ttl > apiv1.MaxJoinTokenTTL {
				return usageError{fmt.Errorf("--ttl %s: want more than 0 and at most %s", ttl, apiv1.MaxJoinTokenTTL)}
			}
			if err := checkOutFolder(outFile); err != nil {
				return err
			}
			c, err := e.client(af)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			resp, err := c.NodesReinstall(ctx, &apiv1.ReinstallNodeRequest{Node: args[0], Ttl: durationpb.New(ttl)})
			if err != nil {
				return err
			}
			t := resp.GetJoinToken()
			gateway := placeholderGateway
			if len(resp.GatewayUrls) > 0 {
				gateway = resp.GatewayUrls[0]
			}
			res := reinstallJSON{TokenID: t.GetId(), NodeID: t.GetNodeId(), PoolID: t.GetPoolId(),
				ExpiresAt: t.GetExpireTime().AsTime().UTC(), GatewayURLs: append([]string{}, resp.GatewayUrls...)}
			if outFile != "" {
				if err := writeTokenFile(ctx, c, outFile, resp.Token, t.GetId()); err != nil {
					return err
				}
				res.File = outFile
				res.JoinCommand = "bcd join --gateway " + gateway + " --token-file " + outFile
			} else {
				res.Token = resp.Token
				res.JoinCommand = "BCD_JOIN_TOKEN=" + resp.Token + " bcd join --gateway " + gateway
			}
			if out == "json" {
				return printValue(e.stdout, res)
			}
			expires := res.ExpiresAt.Format(time.RFC3339)
			note := ""
			if len(resp.GatewayUrls) == 0 {
				note = fmt.Sprintf("(no gateway of the node's region is live now: put your gateway's URL for %s)\n", placeholderGateway)
			}
			if outFile != "" {
				fmt.Fprintf(e.stdout, "reinstall token %s for node %s written to %s (mode 0600); one use, expires %s\n",
					t.GetId(), res.NodeID, outFile, expires)
				fmt.Fprintf(e.stdout, "Copy %s to the wiped machine and run there, as root:\n  %s\n%s", outFile, res.JoinCommand, note)
				fmt.Fprintln(e.stdout, "or run the install script with that token file; the machine becomes node "+res.NodeID+".")
				return nil
			}
			fmt.Fprintln(e.stdout, resp.Token)
			fmt.Fprintf(e.stderr, "reinstall token %s for node %s: one use, expires %s; it is shown only this once\n",
				t.GetId(), res.NodeID, expires)
			fmt.Fprintf(e.stderr, "On the wiped machine, as root:\n  %s\n%s", res.JoinCommand, note)
			fmt.Fprintln(e.stderr, "or run the install script with BCD_JOIN_TOKEN set to the token; the machine becomes node "+res.NodeID+".")
			return nil
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&ttl, "ttl", apiv1.DefaultJoinTokenTTL, "how long the token admits the join")
	fl.StringVar(&outFile, "out", "", "write the token to this file (mode 0600) instead of printing it")
	outputFlag(cmd, &out)
	return cmd
}
