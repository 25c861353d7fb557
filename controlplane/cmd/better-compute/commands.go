package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/client"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// exitCommandFailed is the exit status of `commands run` when any command
// did not succeed.
const exitCommandFailed = 1

// commandFailedError makes run exit non-zero without a second message.
type commandFailedError struct{ n int }

func (e commandFailedError) Error() string { return fmt.Sprintf("%d command(s) did not succeed", e.n) }

func commandsCmd(e *env) *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{Use: "commands", Short: "Run commands on nodes and follow them"}
	af.add(cmd)
	cmd.AddCommand(commandsRunCmd(e, &af), commandsGetCmd(e, &af), commandsListCmd(e, &af), commandsCancelCmd(e, &af))
	return cmd
}

func commandsRunCmd(e *env, af *apiFlags) *cobra.Command {
	var (
		nodes     []string
		pool      string
		selectors []string
		timeout   time.Duration
		asRoot    bool
		idemKey   string
		out       string
		noWait    bool
	)
	cmd := &cobra.Command{
		Use:   "run (--node N... | --pool P [--selector k=v]...) [flags] -- ARGV...",
		Short: "Run a program on nodes, print each node's output and wait for the results",
		Long: "Creates one exec command per node, prints each node's output prefixed by the node id as it arrives,\n" +
			"and exits non-zero when any command did not succeed. Ctrl-C cancels the commands still running.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			if (len(nodes) == 0) == (pool == "") {
				return usageError{errors.New("give --node (one or more) or --pool")}
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
			req := &apiv1.CreateCommandsRequest{NodeIds: nodes, Pool: pool, Selector: sel, Kind: sessionv1.KindExec,
				Exec: &apiv1.ExecSpec{Argv: argv, AsRoot: asRoot}, IdempotencyKey: idemKey}
			if timeout < 0 {
				return usageError{fmt.Errorf("--timeout %s: must not be negative", timeout)}
			}
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
			return follow(cmd.Context(), c, resp.Commands, e.stdout, e.stderr, out)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&nodes, "node", nil, "target node id (repeatable)")
	fl.StringVar(&pool, "pool", "", "target every uncordoned node of this pool (id or name)")
	fl.StringArrayVar(&selectors, "selector", nil, "with --pool, only nodes with this label key=value (repeatable)")
	fl.DurationVar(&timeout, "timeout", 0, "deadline from creation to result (default 10m, at most 24h)")
	fl.BoolVar(&asRoot, "as-root", false, "run as root through the node's root helper")
	fl.StringVar(&idemKey, "idempotency-key", "", "a retried run with the same key returns the same commands")
	fl.BoolVar(&noWait, "no-wait", false, "print the command ids and return at once")
	outputFlag(cmd, &out)
	return cmd
}

// followGrace is how long polling keeps retrying an API that does not
// answer (a control-plane restart).
const followGrace = 60 * time.Second

// awaitCommands polls the commands until each is terminal and returns them
// in order. With includeOutput each poll carries the output so far and is
// passed to progress. An API that stops answering is retried for
// followGrace; when ctx ends first, the commands still running are
// cancelled.
func awaitCommands(ctx context.Context, c *client.Client, cmds []*apiv1.Command, stderr io.Writer, includeOutput bool,
	progress func(*apiv1.Command)) ([]*apiv1.Command, error) {
	done := make([]*apiv1.Command, len(cmds))
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var lostSince time.Time
	for {
		remaining := 0
		for i, x := range cmds {
			if done[i] != nil {
				continue
			}
			resp := &apiv1.GetCommandResponse{}
			if err := c.Call(ctx, "commands.get", &apiv1.GetCommandRequest{Id: x.Id, IncludeOutput: includeOutput}, resp); err != nil {
				if ctx.Err() != nil {
					break
				}
				if lostSince.IsZero() {
					lostSince = time.Now()
					fmt.Fprintf(stderr, "lost contact with the API (%v); retrying for %v — the commands keep running\n", err, followGrace)
				}
				if time.Since(lostSince) > followGrace {
					return nil, fmt.Errorf("%w; the commands may still be running: better-compute commands get %s", err, x.Id)
				}
				remaining++
				continue
			}
			lostSince = time.Time{}
			if progress != nil {
				progress(resp.Command)
			}
			if isTerminal(resp.Command.State) {
				done[i] = resp.Command
			} else {
				remaining++
			}
		}
		if ctx.Err() != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			for i, x := range cmds {
				if done[i] == nil {
					_ = c.Call(cctx, "commands.cancel", &apiv1.CancelCommandRequest{Id: x.Id}, &apiv1.CancelCommandResponse{})
					fmt.Fprintf(stderr, "%s: cancelled %s\n", x.NodeId, x.Id)
				}
			}
			cancel()
			return nil, ctx.Err()
		}
		if remaining == 0 {
			return done, nil
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
}

// follow waits for the commands, printing new output lines prefixed by
// node id (table output), then each failure; it returns a
// commandFailedError when any did not succeed.
func follow(ctx context.Context, c *client.Client, cmds []*apiv1.Command, stdout, stderr io.Writer, out string) error {
	type lines struct {
		stdout, stderr   int
		pendOut, pendErr []byte
	}
	prog := map[string]*lines{}
	emit := func(w io.Writer, node string, pend *[]byte, data []byte, final bool) {
		*pend = append(*pend, data...)
		for {
			i := bytes.IndexByte(*pend, '\n')
			if i < 0 {
				break
			}
			fmt.Fprintf(w, "%s: %s\n", node, (*pend)[:i])
			*pend = (*pend)[i+1:]
		}
		if final && len(*pend) > 0 {
			fmt.Fprintf(w, "%s: %s\n", node, *pend)
			*pend = nil
		}
	}
	results, err := awaitCommands(ctx, c, cmds, stderr, true, func(got *apiv1.Command) {
		if out != "table" {
			return
		}
		p := prog[got.Id]
		if p == nil {
			p = &lines{}
			prog[got.Id] = p
		}
		final := isTerminal(got.State)
		gotOut, gotErr := commandOutput(got)
		emit(stdout, got.NodeId, &p.pendOut, gotOut[min(p.stdout, len(gotOut)):], final)
		emit(stderr, got.NodeId, &p.pendErr, gotErr[min(p.stderr, len(gotErr)):], final)
		p.stdout, p.stderr = len(gotOut), len(gotErr)
	})
	if err != nil {
		return err
	}
	failed := 0
	for _, d := range results {
		if d.State == "succeeded" {
			continue
		}
		failed++
		if out == "table" {
			code := "-"
			if d.ExitCode != nil {
				code = fmt.Sprint(*d.ExitCode)
			}
			fmt.Fprintf(stderr, "%s: %s (exit %s) %s\n", d.NodeId, d.State, code, d.Error)
		}
	}
	if out == "json" {
		if err := printJSON(stdout, &apiv1.ListCommandsResponse{Commands: results}); err != nil {
			return err
		}
	}
	if failed > 0 {
		return commandFailedError{failed}
	}
	return nil
}

func isTerminal(state string) bool {
	switch state {
	case "succeeded", "failed", "cancelled", "expired", "lost":
		return true
	}
	return false
}

func commandsGetCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "get COMMAND_ID",
		Short: "Show a command with its output",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			c, err := e.client(af)
			if err != nil {
				return err
			}
			resp := &apiv1.GetCommandResponse{}
			if err := c.Call(cmd.Context(), "commands.get", &apiv1.GetCommandRequest{Id: args[0], IncludeOutput: true}, resp); err != nil {
				return err
			}
			if out == "json" {
				return printJSON(e.stdout, resp.Command)
			}
			x := resp.Command
			code := "-"
			if x.ExitCode != nil {
				code = fmt.Sprint(*x.ExitCode)
			}
			if err := table(e.stdout, []string{"FIELD", "VALUE"}, [][]string{
				{"id", x.Id}, {"node", x.NodeId}, {"kind", x.Kind}, {"state", x.State}, {"exit code", code},
				{"error", orDash(x.Error)}, {"created", when(x.CreateTime)}, {"finished", when(x.FinishTime)},
				{"truncated", yesNo(x.OutputTruncated)},
			}); err != nil {
				return err
			}
			stdout, stderr := commandOutput(x)
			if len(stdout) > 0 {
				fmt.Fprintf(e.stdout, "--- stdout\n%s", stdout)
			}
			if len(stderr) > 0 {
				fmt.Fprintf(e.stdout, "--- stderr\n%s", stderr)
			}
			return nil
		},
	}
	outputFlag(cmd, &out)
	return cmd
}

func commandsListCmd(e *env, af *apiFlags) *cobra.Command {
	var out, node, batch, state, cursor string
	var limit int32
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List commands",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			c, err := e.client(af)
			if err != nil {
				return err
			}
			resp := &apiv1.ListCommandsResponse{}
			req := &apiv1.ListCommandsRequest{NodeId: node, BatchId: batch, State: state, Page: &apiv1.Page{Cursor: cursor, Limit: limit}}
			if err := c.Call(cmd.Context(), "commands.list", req, resp); err != nil {
				return err
			}
			if out == "json" {
				return printJSON(e.stdout, resp)
			}
			var rows [][]string
			for _, x := range resp.Commands {
				rows = append(rows, []string{x.Id, x.NodeId, x.Kind, x.State, when(x.CreateTime)})
			}
			if err := table(e.stdout, []string{"ID", "NODE", "KIND", "STATE", "CREATED"}, rows); err != nil {
				return err
			}
			if resp.NextCursor != "" {
				fmt.Fprintf(e.stderr, "more: --cursor %s\n", resp.NextCursor)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&node, "node", "", "only this node's commands")
	fl.StringVar(&batch, "batch", "", "only this batch")
	fl.StringVar(&state, "state", "", "only commands in this state")
	fl.StringVar(&cursor, "cursor", "", "continue after this command id")
	fl.Int32Var(&limit, "limit", 0, "at most this many (default 100, at most 1000)")
	outputFlag(cmd, &out)
	return cmd
}

func commandsCancelCmd(e *env, af *apiFlags) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "cancel COMMAND_ID",
		Short: "Cancel a command (a running one is killed with its whole process group)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			c, err := e.client(af)
			if err != nil {
				return err
			}
			resp := &apiv1.CancelCommandResponse{}
			if err := c.Call(cmd.Context(), "commands.cancel", &apiv1.CancelCommandRequest{Id: args[0]}, resp); err != nil {
				return err
			}
			if out == "json" {
				return printJSON(e.stdout, resp.Command)
			}
			fmt.Fprintf(e.stdout, "%s\t%s\n", resp.Command.Id, resp.Command.State)
			return nil
		},
	}
	outputFlag(cmd, &out)
	return cmd
}
