package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// nodesAddCmd is nodes add: the one line that installs bcd on a new
// machine and joins it to a pool (DESIGN.md, "Installer").
func nodesAddCmd(e *env, af *apiFlags) *cobra.Command {
	var (
		pool, site, out string
		ttl             time.Duration
		unprivileged    bool
		websocket       bool
		plugins         []string
	)
	cmd := &cobra.Command{
		Use:   "add --pool P [--site S] [--ttl 1h] [--unprivileged] [--install-plugins bcx-ipmi] [--websocket] [-o json]",
		Short: "Print the line that installs bcd on a new machine and joins it to a pool (a one-use join token inside)",
		Long: `add makes a one-use join token for the pool (nodes.add, audited) and prints
the line to paste, as root, on the new machine:

  curl -fsS -k --pinnedpubkey 'sha256//...' -o install-bcd.sh 'https://HOST:3000/api/install.sh' && BCD_JOIN_TOKEN='...' sh install-bcd.sh

curl fetches the install script from the API over HTTPS and accepts only the
API's own key (--pinnedpubkey; -k skips the CA check the pin replaces), so
neither the script nor the token can be read or swapped on the way; sh runs
the script only when curl got all of it, and a failed download fails the
line with curl's status (90: not the pinned key). The
token travels in the environment of sh, never in a URL; the script installs
bcd from the control plane's downloads folder, joins and starts it.

The API must serve HTTPS to other machines (serve --public-url, or
--api-tls auto|files): on plain HTTP off loopback add refuses. The token is
shown once; revoke it with join-tokens revoke ID.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if pool == "" {
				return usageError{errors.New("--pool is required")}
			}
			if ttl < apiv1.MinJoinTokenTTL || ttl > apiv1.MaxJoinTokenTTL {
				return usageError{fmt.Errorf("--ttl %s: want %s to %s", ttl, apiv1.MinJoinTokenTTL, apiv1.MaxJoinTokenTTL)}
			}
			req := &apiv1.AddNodeRequest{Pool: pool, Site: site, Ttl: durationpb.New(ttl), Unprivileged: unprivileged, Plugins: plugins,
				Websocket: websocket}
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.AddNodeResponse, error) {
					return c.NodesAdd(ctx, req)
				},
				func(_ *client.Client, resp *apiv1.AddNodeResponse) error {
					fmt.Fprintln(e.stdout, resp.InstallCommand)
					fmt.Fprintf(e.stderr, "On the new machine, as root, paste the line above: it installs bcd and joins pool %s.\n", resp.Pool)
					fmt.Fprintf(e.stderr, "It holds join token %s (one use, expires %s), shown only this once.\n",
						resp.JoinTokenId, resp.GetExpiresAt().AsTime().UTC().Format(time.RFC3339))
					return nil
				})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&pool, "pool", "", "pool id or name the machine joins (required)")
	fl.StringVar(&site, "site", "", "site of the pool, checked when given")
	fl.DurationVar(&ttl, "ttl", apiv1.DefaultAddNodeTTL, "how long the line admits the join (1m to 720h)")
	fl.BoolVar(&unprivileged, "unprivileged", false, "run bcd as the user bcd beside a root bcd helper")
	fl.BoolVar(&websocket, "websocket", false, "join through the gateway's WebSocket fallback (host.gateway.ws.publicURL), for a site whose proxy strips client certificates")
	fl.StringSliceVar(&plugins, "install-plugins", nil, "plugins to install beside bcd: bcx-ipmi")
	outputFlag(cmd, &out)
	return cmd
}
