package main

import (
	"errors"
	"io"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// nodesUpgradeCmd is `nodes upgrade`: one upgrade command per node, followed
// to its result.
func nodesUpgradeCmd(e *env, af *apiFlags) *cobra.Command {
	var (
		f                runFlags
		version, baseURL string
	)
	cmd := &cobra.Command{
		Use:   "upgrade (--node N... | --pool P [--selector k=v]...) --version V [--base-url URL]",
		Short: "Upgrade bcd on nodes to a release this control plane serves, and wait for them",
		Long: `Upgrade creates one upgrade command per node. Each node downloads bcd V from
the downloads route (this control plane's, downloads.publicURL or the URL this
command reached; or --base-url), verifies the release manifest against the
release keys pinned on the node and the binary against the manifest, swaps the
binary (keeping the old one as bcd.prev), restarts into it and reconnects;
a binary that does not reach a gateway is rolled back. It prints each node's
version once its command ends and exits non-zero when any upgrade failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := f.request(sessionv1.KindUpgrade)
			if err != nil {
				return err
			}
			if version == "" {
				return usageError{errors.New("--version is required")}
			}
			req.Upgrade = &apiv1.UpgradeSpec{Version: version, BaseUrl: baseURL}
			ctx := cmd.Context()
			return e.startCommands(ctx, af, f.out, f.noWait, req, func(c *client.Client, cmds []*apiv1.Command) error {
				if f.out == "json" {
					return follow(ctx, c, cmds, e.stdout, e.stderr, f.out, 0)
				}
				ferr := follow(ctx, c, cmds, io.Discard, e.stderr, f.out, 0)
				var rows [][]string
				for _, x := range cmds {
					state, bcd := "?", "?"
					if got, err := c.CommandsGet(ctx, &apiv1.GetCommandRequest{Id: x.Id}); err == nil {
						state = got.Command.State
					}
					if n, err := c.NodesGet(ctx, &apiv1.NodeRequest{Id: x.NodeId}); err == nil {
						bcd = orDash(n.Node.BcdVersion)
					}
					rows = append(rows, []string{x.NodeId, x.Id, state, bcd})
				}
				if err := table(e.stdout, []string{"NODE", "COMMAND", "STATE", "BCD"}, rows); err != nil {
					return err
				}
				return ferr
			})
		},
	}
	f.add(cmd, "upgrade")
	fl := cmd.Flags()
	fl.StringVar(&version, "version", "", "release version to install, such as 0.2.0 (required)")
	fl.StringVar(&baseURL, "base-url", "", "downloads route the nodes fetch from (default this control plane's)")
	return cmd
}
