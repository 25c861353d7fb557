package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/installer/manifest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// releasePinAPICmd is one of `release pins add|status|remove`: call makes
// its API call from the argument.
func releasePinAPICmd(e *env, use, short, long string, call func(arg string) (func(context.Context, *client.Client) (*apiv1.ReleasePinResponse, error), error)) *cobra.Command {
	var af apiFlags
	var out string
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			f, err := call(args[0])
			if err != nil {
				return err
			}
			return runAPI(cmd.Context(), e, &af, out, f, func(_ *client.Client, res *apiv1.ReleasePinResponse) error {
				printReleasePin(e, res)
				return nil
			})
		},
	}
	af.add(cmd)
	outputFlag(cmd, &out)
	return cmd
}

// statementCall reads FILE and FILE.minisig for pinsAdd or pinsRemove.
func statementCall(remove bool) func(string) (func(context.Context, *client.Client) (*apiv1.ReleasePinResponse, error), error) {
	return func(file string) (func(context.Context, *client.Client) (*apiv1.ReleasePinResponse, error), error) {
		doc, err := readBounded(file, manifest.MaxPinStatementSize, "is it a pin statement from release pins sign?")
		if err != nil {
			return nil, err
		}
		sig, err := readBounded(file+".minisig", 2<<10, "is it a pin statement's signature from release pins sign?")
		if err != nil {
			return nil, err
		}
		req := &apiv1.ReleasePinStatementRequest{Statement: doc, Signature: sig}
		return func(ctx context.Context, c *client.Client) (*apiv1.ReleasePinResponse, error) {
			if remove {
				return c.ReleasePinsRemove(ctx, req)
			}
			return c.ReleasePinsAdd(ctx, req)
		}, nil
	}
}

// readBounded reads a file of at most limit bytes; a larger or missing
// one is a usage error, whose message ends with hint (what the file
// should be).
func readBounded(path string, limit int64, hint string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, usageError{fmt.Errorf("read %s: %w", path, err)}
	}
	if st.Size() > limit {
		return nil, usageError{fmt.Errorf("%s is %d bytes, at most %d: %s", path, st.Size(), limit, hint)}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usageError{fmt.Errorf("read %s: %w", path, err)}
	}
	return b, nil
}

func releasePinsAddCmd(e *env) *cobra.Command {
	return releasePinAPICmd(e, "add FILE", "Send every node a pin statement (FILE and FILE.minisig from release pins sign --add)",
		`add uploads a statement that adds a pin, made by release pins sign --add
with a key the deployment already pins (downloads.releasePins), and its
signature FILE.minisig. The control plane verifies it, keeps it, and every
gateway sends it to its live nodes at once and to the others when they
reconnect; bcd verifies it against its own pin file and adds the pin (through
its root helper when unprivileged). It prints the pin's reach: see status.`, statementCall(false))
}

func releasePinsRemoveCmd(e *env) *cobra.Command {
	return releasePinAPICmd(e, "remove FILE", "Send every node a statement that removes a pin (FILE and FILE.minisig from release pins sign --remove)",
		`remove uploads a statement that removes a pin, made by release pins sign
--remove. It is refused (exit 1) while a live node would be left with no pin
that verifies the current release (the newest bcd in the downloads folder),
naming those nodes, and when the pin is the current release's signer.`, statementCall(true))
}

func releasePinsStatusCmd(e *env) *cobra.Command {
	return releasePinAPICmd(e, "status PIN", "How many live nodes hold PIN in their pin file, and which do not",
		`status counts the live nodes whose pin file holds PIN (as each last
reported it) and lists up to 100 that do not. The first line is
"held N/M": N live nodes of M hold it.`,
		func(pin string) (func(context.Context, *client.Client) (*apiv1.ReleasePinResponse, error), error) {
			if _, err := manifest.ParsePin(pin); err != nil {
				return nil, usageError{err}
			}
			return func(ctx context.Context, c *client.Client) (*apiv1.ReleasePinResponse, error) {
				return c.ReleasePinsStatus(ctx, &apiv1.ReleasePinStatusRequest{Pin: pin})
			}, nil
		})
}

// printReleasePin writes "held N/M" first, then the pin, the nodes
// missing and the deployment's pins in force.
func printReleasePin(e *env, r *apiv1.ReleasePinResponse) {
	fmt.Fprintf(e.stdout, "held %d/%d\n", r.GetHoldingNodes(), r.GetLiveNodes())
	fmt.Fprintf(e.stdout, "pin         %s\n", r.GetPin())
	if ids := r.GetMissingNodeIds(); len(ids) > 0 {
		fmt.Fprintf(e.stdout, "missing     %s\n", listed(ids, int(r.GetLiveNodes()-r.GetHoldingNodes())))
	}
	fmt.Fprintf(e.stdout, "in force    %s\n", strings.Join(r.GetPins(), ", "))
	fmt.Fprintf(e.stdout, "statements  %d\n", r.GetStatements())
}
