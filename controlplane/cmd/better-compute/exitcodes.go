package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// Exit statuses of better-compute (DESIGN.md, "Operator CLI"; README.md,
// "Exit status"). exitCommandFailed (commands.go) is exitFailure; 130 is an
// interrupt.
const (
	exitOK      = 0
	exitFailure = 1
	// exitUsage is a usage error: an unknown command or flag, a missing or
	// malformed argument, a bad configuration, or a value the API refuses
	// as INVALID_ARGUMENT.
	exitUsage = 2
)

// usageError marks errors that exit with status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// exitCode is the exit status err calls for: exitUsage for a usageError, a
// configuration error (*config.Error), an API answer of INVALID_ARGUMENT or
// a request the client could not encode (an argument that is not valid
// UTF-8, which the API would refuse the same way); exitFailure for anything
// else.
func exitCode(err error) int {
	var (
		ue usageError
		ce *config.Error
		ae *client.Error
		ee *client.EncodeError
	)
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue), errors.As(err, &ce), errors.As(err, &ee):
		return exitUsage
	case errors.As(err, &ae) && ae.Code == apiv1.CodeInvalidArgument:
		return exitUsage
	}
	return exitFailure
}

// enforceUsage makes cobra's own refusals usage errors everywhere under
// root, so that no command needs to remember it: every command's Args
// validator (nil on a command without subcommands means no arguments) and
// its required flags and flag groups fail with a usageError, and a command
// that only groups others refuses an unknown or missing subcommand the same
// way instead of printing its help and exiting 0. Call it once the tree is
// complete; it adds cobra's help and completion commands first so they are
// covered too. Unknown flags become usage errors through root's
// FlagErrorFunc.
func enforceUsage(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if c.HasSubCommands() && !c.Runnable() {
			c.Args = unknownSubcommand
			c.RunE = func(c *cobra.Command, _ []string) error {
				c.SetOut(c.ErrOrStderr())
				_ = c.Usage()
				return usageError{fmt.Errorf("%s needs a command (see %s --help)", c.CommandPath(), c.CommandPath())}
			}
			return
		}
		validate := c.Args
		switch {
		case c.Parent() == root && c.Name() == "help":
			validate = helpTopic
		case validate == nil:
			validate = cobra.NoArgs
		}
		c.Args = func(c *cobra.Command, args []string) error {
			// Named without the binary, which run puts first.
			name := strings.TrimPrefix(c.CommandPath(), c.Root().Name()+" ")
			if err := validate(c, args); err != nil {
				return usageError{fmt.Errorf("%s: %w (see %s --help)", name, err, c.CommandPath())}
			}
			// cobra checks these after the pre-run hooks and as plain
			// errors; checking them here first makes them usage errors.
			if err := c.ValidateRequiredFlags(); err != nil {
				return usageError{fmt.Errorf("%s: %w", name, err)}
			}
			if err := c.ValidateFlagGroups(); err != nil {
				return usageError{fmt.Errorf("%s: %w", name, err)}
			}
			return nil
		}
	}
	walk(root)
}

// unknownSubcommand is the Args of a command that only groups others: any
// argument is an unknown command, named with cobra's suggestions.
func unknownSubcommand(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
	if s := c.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return usageError{errors.New(msg)}
}

// helpTopic is the Args of cobra's help command: the arguments must name a
// command ("help nodes get"), else the topic is unknown.
func helpTopic(c *cobra.Command, args []string) error {
	found, rest, err := c.Root().Find(args)
	if err != nil || len(rest) > 0 || (len(args) > 0 && found == c.Root()) {
		return fmt.Errorf("unknown help topic %q", strings.Join(args, " "))
	}
	return nil
}
