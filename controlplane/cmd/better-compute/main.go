// Command better-compute is the control plane: one binary whose processes
// each run a subset of the roles api, gateway, controllers, scheduler, sinks
// and iam, plus the operator CLI (DESIGN.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
)

// Set at build time with -ldflags "-X main.version=... -X main.commit=...".
var (
	version = "dev"
	commit  = "none"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// env is what every command shares.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	log            *slog.Logger
	configPath     string
	dataDir        string
	databaseURL    string
	// api is where the last API client's server and token came from
	// (apiclient.go), named by an UNAUTHENTICATED answer.
	api *apiTarget
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	e := &env{stdout: stdout, stderr: stderr, getenv: getenv,
		log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	root := newRoot(e)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	for _, w := range []io.Writer{e.stdout, e.stderr} {
		if ew, ok := w.(*escapingWriter); ok {
			_ = ew.Flush()
		}
	}
	if err == nil {
		return exitOK
	}
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return 130 // interrupted (Ctrl-C): what was running was cancelled
	}
	var rx remoteExitError
	if errors.As(err, &rx) {
		return rx.code // the remote shell's own status; it said why itself
	}
	err = e.explain(err)
	fmt.Fprintln(stderr, "better-compute:", escapeText(err.Error(), true))
	var cf commandFailedError
	if errors.As(err, &cf) {
		return exitCommandFailed
	}
	return exitCode(err)
}

// newRoot is the whole command tree, its commands sharing e.
func newRoot(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:           "better-compute",
		Short:         "The Better Compute control plane and operator CLI",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	// Everything printed for people is escaped (escape.go); -o json is
	// the API's answer, exact.
	root.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		if cmd.Annotations[annotationRawOutput] != "" {
			return nil
		}
		if f := cmd.Flags().Lookup("output"); f == nil || f.Value.String() != "json" {
			e.stdout = &escapingWriter{w: e.stdout}
		}
		e.stderr = &escapingWriter{w: e.stderr}
		return nil
	}
	pf := root.PersistentFlags()
	pf.StringVar(&e.configPath, "config", "", "configuration file (YAML)")
	pf.StringVar(&e.dataDir, "data-dir", "", "data directory (env "+config.EnvDataDir+")")
	pf.StringVar(&e.databaseURL, "database-url", "", "PostgreSQL URL (env "+config.EnvDatabaseURL+"); empty uses the embedded SQLite database")
	root.AddCommand(versionCmd(e), serveCmd(e), migrateCmd(e), releaseCmd(e), daemonCmd(e))
	root.AddCommand(pkiCmd(e), sitesCmd(e), poolsCmd(e), joinTokensCmd(e))
	root.AddCommand(nodesCmd(e), commandsCmd(e), tokensCmd(e), devCmd(e))
	root.AddCommand(doctorCmd(e), bmcCmd(e), auditCmd(e), eventsCmd(e), sinksCmd(e))
	root.AddCommand(reservationsCmd(e), capacityCmd(e))
	root.AddCommand(remediationCmd(e))
	root.AddCommand(gpusCmd(e))
	root.AddCommand(tenantsCmd(e), policyCmd(e), accessCmd(e))
	root.AddCommand(loginCmd(e), logoutCmd(e))
	root.AddCommand(rolloutsCmd(e))
	root.AddCommand(recordingsCmd(e))
	root.AddCommand(gatewaysCmd(e), processesCmd(e))
	root.AddCommand(storeCmd(e), backupCmd(e), restoreCmd(e))
	enforceUsage(root)
	addCompletions(root, e)
	return root
}

// load reads the configuration with flags over it.
func (e *env) load(f config.Flags) (*config.Config, error) {
	f.DataDir = e.dataDir
	f.DatabaseURL = e.databaseURL
	return config.Load(e.configPath, e.getenv, f)
}
