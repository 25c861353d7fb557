package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// nodesUpgradeCmd is `nodes upgrade`: one upgrade command per node, followed
// to its result.
func nodesUpgradeCmd(e *env, af *apiFlags) *cobra.Command {
	var (
		nodes     []string
		pool      string
		selectors []string
		version   string
		baseURL   string
		timeout   time.Duration
		idemKey   string
		out       string
		noWait    bool
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
			if err := checkOutput(out); err != nil {
				return err
			}
			if (len(nodes) == 0) == (pool == "") {
				return usageError{errors.New("give --node (one or more) or --pool")}
			}
			if version == "" {
				return usageError{errors.New("--version is required")}
			}
			sel := map[string]string{}
			for _, s := range selectors {
				k, v, ok := strings.Cut(s, "=")
				if !ok || k == "" {
					return usageError{fmt.Errorf("--selector %q: want key=value", s)}
				}
				sel[k] = v
			}
			c, err := e.client(af)
			if err != nil {
				return err
			}
			req := &apiv1.CreateCommandsRequest{NodeIds: nodes, Pool: pool, Selector: sel, Kind: sessionv1.KindUpgrade,
				Upgrade: &apiv1.UpgradeSpec{Version: version, BaseUrl: baseURL}, IdempotencyKey: idemKey}
			if timeout > 0 {
				req.Timeout = durationpb.New(timeout)
			}
			resp := &apiv1.CreateCommandsResponse{}
			if err := c.Call(cmd.Context(), "commands.create", req, resp); err != nil {
				return err
			}
			if noWait {
				if out == "json" {
					return printJSON(e.stdout, resp)
				}
				for _, x := range resp.Commands {
					fmt.Fprintf(e.stdout, "%s\t%s\n", x.Id, x.NodeId)
				}
				return nil
			}
			if out == "json" {
				return follow(cmd.Context(), c, resp.Commands, e.stdout, e.stderr, out)
			}
			ferr := follow(cmd.Context(), c, resp.Commands, io.Discard, e.stderr, out)
			var rows [][]string
			for _, x := range resp.Commands {
				got := &apiv1.GetCommandResponse{}
				state := "?"
				if err := c.Call(cmd.Context(), "commands.get", &apiv1.GetCommandRequest{Id: x.Id}, got); err == nil {
					state = got.Command.State
				}
				n := &apiv1.NodeResponse{}
				bcd := "?"
				if err := c.Call(cmd.Context(), "nodes.get", &apiv1.NodeRequest{Id: x.NodeId}, n); err == nil {
					bcd = orDash(n.Node.BcdVersion)
				}
				rows = append(rows, []string{x.NodeId, x.Id, state, bcd})
			}
			if err := table(e.stdout, []string{"NODE", "COMMAND", "STATE", "BCD"}, rows); err != nil {
				return err
			}
			return ferr
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&nodes, "node", nil, "target node id (repeatable)")
	fl.StringVar(&pool, "pool", "", "target every uncordoned node of this pool (id or name)")
	fl.StringArrayVar(&selectors, "selector", nil, "with --pool, only nodes with this label key=value (repeatable)")
	fl.StringVar(&version, "version", "", "release version to install, such as 0.2.0 (required)")
	fl.StringVar(&baseURL, "base-url", "", "downloads route the nodes fetch from (default this control plane's)")
	fl.DurationVar(&timeout, "timeout", 0, "deadline from creation to result (default 10m, at most 24h)")
	fl.StringVar(&idemKey, "idempotency-key", "", "a retried upgrade with the same key returns the same commands")
	fl.BoolVar(&noWait, "no-wait", false, "print the command ids and return at once")
	outputFlag(cmd, &out)
	return cmd
}
