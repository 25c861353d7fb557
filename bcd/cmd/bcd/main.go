// Command bcd is the Better Compute node agent: `bcd join` gives the
// machine its identity with a join token, `bcd node` runs the agent (the
// session with the control plane's gateways, inventory, GPU events,
// commands), `bcd helper` runs the root helper beside an unprivileged node,
// `bcd status` says whether the running node holds a session (from its state
// file, without network), `bcd doctor` checks the node, `bcd version` says
// what build this is.
//
// Exit status: 0 on success and after SIGINT/SIGTERM; 1 for a failure; 2
// for bad flags or arguments; 3 when the node's identity is revoked; 4 when
// its certificate has expired; 5 when `bcd node` finds no identity. A
// systemd unit should list 3, 4 and 5 in RestartPreventExitStatus=: each
// needs an operator to join the machine again, and restarting would only
// loop.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/session"
)

// Exit statuses of bcd.
const (
	exitOK        = 0
	exitFailure   = 1
	exitUsage     = 2
	exitRevoked   = 3
	exitExpired   = 4
	exitNotJoined = 5
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], env{
		stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, geteuid: os.Geteuid,
	})
	stop()
	os.Exit(code)
}

// env is what a bcd invocation reads and writes besides its arguments.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	geteuid        func() int
}

// usageError marks an error in the command line: exit status 2.
type usageError struct{ error }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// run runs bcd with args and returns its exit status. Cancelling ctx is
// how a signal stops it.
func run(ctx context.Context, args []string, e env) int {
	root := newRoot(e)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(e.stderr, "bcd: %s\n", oneLine(err))
	var ue usageError
	switch {
	case errors.As(err, &ue):
		return exitUsage
	case errors.Is(err, session.ErrRevoked):
		return exitRevoked
	case errors.Is(err, session.ErrCertificateExpired):
		return exitExpired
	case errors.Is(err, identity.ErrNotJoined):
		return exitNotJoined
	}
	return exitFailure
}

// oneLine keeps an error message on one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

func newRoot(e env) *cobra.Command {
	root := &cobra.Command{
		Use:           "bcd",
		Short:         "Better Compute node agent",
		SilenceUsage:  true,
		SilenceErrors: true,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q (see bcd --help)", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			_ = cmd.Usage()
			return usagef("no command given (see bcd --help)")
		},
	}
	root.SetIn(e.stdin)
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newVersionCmd(e), newJoinCmd(e), newNodeCmd(e), newHelperCmd(e))
	root.AddCommand(newDoctorCmd(e), newStatusCmd(e))
	// cobra's completion command (bash, zsh, fish, powershell), added now
	// rather than at Execute so that help and tests see it: bcd completes
	// its commands and flags, nothing from a server.
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() != "completion" {
			continue
		}
		// A missing or unknown shell and extra arguments are usage errors
		// (exit 2), as elsewhere.
		c.Args = func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown shell %q (see %s --help)", args[0], c.CommandPath())
			}
			return nil
		}
		c.RunE = func(c *cobra.Command, _ []string) error {
			c.SetOut(c.ErrOrStderr())
			_ = c.Usage()
			return usagef("%s needs a shell: bash, zsh, fish or powershell", c.CommandPath())
		}
		for _, shell := range c.Commands() {
			shell.Args = func(c *cobra.Command, args []string) error {
				if len(args) > 0 {
					return usagef("%s takes no arguments, got %q", c.CommandPath(), args[0])
				}
				return nil
			}
		}
	}
	return root
}

// noArgs refuses positional arguments as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args[0])
	}
	return nil
}

// newLogger returns the slog logger for level, writing text to w.
func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
