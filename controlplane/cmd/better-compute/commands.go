package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
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
	return apiGroup(e, "commands", "Run commands on nodes and follow them", commandsRunCmd, commandsGetCmd, commandsListCmd, commandsCancelCmd)
}

// runFlags are the flags of a command that creates commands on nodes
// (commands run, nodes upgrade): which nodes, the deadline, the
// idempotency key, whether to wait, and -o.
type runFlags struct {
	nodes     []string
	pool      string
	selectors []string
	timeout   time.Duration
	idemKey   string
	noWait    bool
	out       string
}

// add registers the flags on cmd; verb names a retry in the help of
// --idempotency-key ("run", "upgrade").
func (f *runFlags) add(cmd *cobra.Command, verb string) {
	fl := cmd.Flags()
	fl.StringArrayVar(&f.nodes, "node", nil, "target node id (repeatable)")
	fl.StringVar(&f.pool, "pool", "", "target every uncordoned node of this pool (id or name)")
	fl.StringArrayVar(&f.selectors, "selector", nil, "with --pool, only nodes with this label key=value (repeatable)")
	fl.DurationVar(&f.timeout, "timeout", 0, "deadline from creation to result (default 10m, at most 24h)")
	fl.StringVar(&f.idemKey, "idempotency-key", "", "a retried "+verb+" with the same key returns the same commands")
	fl.BoolVar(&f.noWait, "no-wait", false, "print the command ids and return at once")
	outputFlag(cmd, &f.out)
}

// request checks -o and the flags (usage errors) and returns the
// commands.create request of kind for them, its spec still to set.
func (f *runFlags) request(kind string) (*apiv1.CreateCommandsRequest, error) {
	if err := checkOutput(f.out); err != nil {
		return nil, err
	}
	if (len(f.nodes) == 0) == (f.pool == "") {
		return nil, usageError{errors.New("give --node (one or more) or --pool")}
	}
	sel := map[string]string{}
	for _, s := range f.selectors {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return nil, usageError{fmt.Errorf("--selector %q: want key=value", s)}
		}
		sel[k] = v
	}
	if f.timeout < 0 {
		return nil, usageError{fmt.Errorf("--timeout %s: must not be negative", f.timeout)}
	}
	req := &apiv1.CreateCommandsRequest{NodeIds: f.nodes, Pool: f.pool, Selector: sel, Kind: kind, IdempotencyKey: f.idemKey}
	if f.timeout > 0 {
		req.Timeout = durationpb.New(f.timeout)
	}
	return req, nil
}

// startCommands makes the client of af, creates req's commands
// (commands.create) and hands them to wait with the client; with noWait
// it prints them instead: -o json (out) the API's answer, else a line
// "ID\tNODE" each.
func (e *env) startCommands(ctx context.Context, af *apiFlags, out string, noWait bool, req *apiv1.CreateCommandsRequest,
	wait func(*client.Client, []*apiv1.Command) error) error {
	c, err := e.client(af)
	if err != nil {
		return err
	}
	resp, err := c.CommandsCreate(ctx, req)
	if err != nil {
		return err
	}
	if !noWait {
		return wait(c, resp.Commands)
	}
	if out == "json" {
		return printJSON(e.stdout, resp)
	}
	for _, x := range resp.Commands {
		fmt.Fprintf(e.stdout, "%s\t%s\n", x.Id, x.NodeId)
	}
	return nil
}

func commandsRunCmd(e *env, af *apiFlags) *cobra.Command {
	var (
		f        runFlags
		asRoot   bool
		progress bool
	)
	cmd := &cobra.Command{
		Use:   "run (--node N... | --pool P [--selector k=v]...) [flags] -- ARGV...",
		Short: "Run a program on nodes, print each node's output and wait for the results",
		Long: "Creates one exec command per node, prints each node's output prefixed by the node id as it arrives,\n" +
			"and exits non-zero when any command did not succeed. Ctrl-C cancels the commands still running.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, argv []string) error {
			req, err := f.request(sessionv1.KindExec)
			if err != nil {
				return err
			}
			req.Exec = &apiv1.ExecSpec{Argv: argv, AsRoot: asRoot}
			ctx := cmd.Context()
			every := time.Duration(0)
			if progress || isTerminalWriter(e.stderr) {
				every = waitReportInterval
			}
			return e.startCommands(ctx, af, f.out, f.noWait, req, func(c *client.Client, cmds []*apiv1.Command) error {
				return follow(ctx, c, cmds, e.stdout, e.stderr, f.out, every)
			})
		},
	}
	f.add(cmd, "run")
	cmd.Flags().BoolVar(&asRoot, "as-root", false, "run as root through the node's root helper")
	cmd.Flags().BoolVar(&progress, "progress", false, "every 10s, print on standard error which nodes have not answered yet (on when standard error is a terminal)")
	return cmd
}

// waitReportInterval is how often commands run says which nodes it still
// waits for (on a terminal, or with --progress).
const waitReportInterval = 10 * time.Second

// maxWaitReportNodes bounds the node ids one waiting line names; the rest
// are counted.
const maxWaitReportNodes = 10

// isTerminalWriter reports whether w is a terminal.
func isTerminalWriter(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// waitingLine is the line commands run prints while commands have not
// finished: how long it has waited, for how many of the nodes, and which
// (at most maxWaitReportNodes ids, with each command's state).
func waitingLine(waited time.Duration, total int, pending []*apiv1.Command) string {
	var b strings.Builder
	fmt.Fprintf(&b, "waited %s for %d of %d node(s): ", waited.Round(time.Second), len(pending), total)
	for i, x := range pending {
		if i == maxWaitReportNodes {
			fmt.Fprintf(&b, " and %d more", len(pending)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (%s)", x.NodeId, x.State)
	}
	return b.String()
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
			got, err := getCommand(ctx, c, x.Id, includeOutput)
			if err != nil {
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
				progress(got)
			}
			if isTerminal(got.State) {
				done[i] = got
			} else {
				remaining++
			}
		}
		if ctx.Err() != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			for i, x := range cmds {
				if done[i] == nil {
					_, _ = c.CommandsCancel(cctx, &apiv1.CancelCommandRequest{Id: x.Id})
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
//
// Every `every` (0: never) it prints on stderr which nodes it still waits
// for (waitingLine); when the results come, the nodes whose commands
// expired (no result before the deadline) are named in one line.
func follow(ctx context.Context, c *client.Client, cmds []*apiv1.Command, stdout, stderr io.Writer, out string, every time.Duration) error {
	type lines struct {
		stdout, stderr   int
		pendOut, pendErr []byte
	}
	prog := map[string]*lines{}
	latest := make(map[string]*apiv1.Command, len(cmds))
	for _, x := range cmds {
		latest[x.Id] = x
	}
	start := time.Now()
	lastReport := start
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
		latest[got.Id] = got
		if every > 0 && time.Since(lastReport) >= every {
			lastReport = time.Now()
			var pending []*apiv1.Command
			for _, x := range cmds {
				if l := latest[x.Id]; !isTerminal(l.State) {
					pending = append(pending, l)
				}
			}
			if len(pending) > 0 {
				fmt.Fprintln(stderr, waitingLine(time.Since(start), len(cmds), pending))
			}
		}
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
	var expired []string
	for _, d := range results {
		if d.State == "succeeded" {
			continue
		}
		if d.State == "expired" {
			expired = append(expired, d.NodeId)
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
	if len(expired) > 0 {
		fmt.Fprintf(stderr, "no result before the deadline (--timeout) from %d node(s): %s\n", len(expired), strings.Join(expired, ", "))
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
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Command, error) {
					return getCommand(ctx, c, args[0], true)
				},
				func(_ *client.Client, x *apiv1.Command) error {
					code := "-"
					if x.ExitCode != nil {
						code = fmt.Sprint(*x.ExitCode)
					}
					rows := [][]string{
						{"id", x.Id}, {"node", x.NodeId}, {"kind", x.Kind}, {"state", x.State}, {"exit code", code},
						{"error", orDash(x.Error)}, {"created", when(x.CreateTime)}, {"finished", when(x.FinishTime)},
						{"truncated", yesNo(x.OutputTruncated)},
					}
					if x.Exec != nil {
						// Whether it ran as root (an admin's asRoot).
						rows = append(rows[:4], append([][]string{{"as root", yesNo(x.Exec.GetAsRoot())}}, rows[4:]...)...)
					}
					if err := table(e.stdout, []string{"FIELD", "VALUE"}, rows); err != nil {
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
				})
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
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.ListCommandsResponse, error) {
					return c.CommandsList(ctx, &apiv1.ListCommandsRequest{NodeId: node, BatchId: batch, State: state,
						Page: &apiv1.Page{Cursor: cursor, Limit: limit}})
				},
				func(_ *client.Client, resp *apiv1.ListCommandsResponse) error {
					if err := tableOf(e.stdout, []string{"ID", "NODE", "KIND", "STATE", "CREATED"}, resp.Commands, func(x *apiv1.Command) []string {
						return []string{x.Id, x.NodeId, x.Kind, x.State, when(x.CreateTime)}
					}); err != nil {
						return err
					}
					if resp.NextCursor != "" {
						fmt.Fprintf(e.stderr, "more: --cursor %s\n", resp.NextCursor)
					}
					return nil
				})
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
			return runAPI(cmd.Context(), e, af, out,
				func(ctx context.Context, c *client.Client) (*apiv1.Command, error) {
					resp, err := c.CommandsCancel(ctx, &apiv1.CancelCommandRequest{Id: args[0]})
					return resp.GetCommand(), err
				},
				func(_ *client.Client, x *apiv1.Command) error {
					fmt.Fprintf(e.stdout, "%s\t%s\n", x.Id, x.State)
					return nil
				})
		},
	}
	outputFlag(cmd, &out)
	return cmd
}
