package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/doctor"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store/backend"
)

// doctorError makes doctor exit 1 after its report.
type doctorError struct{ fails, warns int }

func (e doctorError) Error() string {
	return fmt.Sprintf("doctor: %d check(s) failed, %d warned", e.fails, e.warns)
}

func doctorCmd(e *env) *cobra.Command {
	var out, roles string
	var strict bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check the schema, clock, PKI, gateway identity, notifier, routes, workers and fleet",
		Long: `Doctor runs every check of docs/doctor.md against the configured database and
prints each one's id, status (ok, warn or fail) and a one-line hint, for
a process running the configuration's roles (or --roles: run it beside
each process of a split deployment with that process's roles). It
never writes: a data directory without a deployment (no state.db) is an
error naming it, and no secret, database or migration is made.

Exit status: 0 when no check failed (with --strict: none warned either), 1
otherwise, 2 for bad flags or configuration.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			cfg, err := e.load(config.Flags{Roles: roles})
			if err != nil {
				return err
			}
			// Doctor reads only: no deployment, secret or schema is made
			// for it (docs/doctor.md).
			if err := checkDeployment(cfg); err != nil {
				return err
			}
			if err := readEmbeddedSecret(cfg); err != nil {
				return err
			}
			st, err := backend.Open(cmd.Context(), cfg.Database.URL, cfg.DataDir)
			if err != nil {
				return fmt.Errorf("open store: %w", err)
			}
			defer st.Close()
			dc := doctor.FromConfig(cfg)
			dc.Now = testNow // nil but in the clockshift test build
			rep := doctor.Run(cmd.Context(), st, dc)
			if out == "json" {
				err = printValue(e.stdout, rep)
			} else {
				err = printReport(e, rep)
			}
			if err != nil {
				return err
			}
			if rep.Failed(strict) {
				return doctorError{fails: rep.Count(doctor.Fail), warns: rep.Count(doctor.Warn)}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&strict, "strict", false, "exit non-zero on warnings too")
	cmd.Flags().StringVar(&roles, "roles", "", "judge the checks for a process running these roles, as serve --roles (env "+config.EnvRoles+"; default the configuration's)")
	outputFlag(cmd, &out)
	return cmd
}

// readEmbeddedSecret gives the embedded default's cfg the secret in its
// data directory, as EnsureEmbeddedSecret does, but never makes one: without
// the file cfg.Secret stays empty and the PKI check says what is missing.
func readEmbeddedSecret(cfg *config.Config) error {
	if cfg.Secret != "" || !cfg.Embedded {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(cfg.DataDir, config.SecretFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read secret: %w", err)
	}
	cfg.Secret = strings.TrimSpace(string(b))
	return nil
}

// printReport writes the report as a table, then the details of the checks
// that are not ok.
func printReport(e *env, rep *doctor.Report) error {
	rows := make([][]string, 0, len(rep.Checks))
	for _, c := range rep.Checks {
		rows = append(rows, []string{c.ID, string(c.Status), c.Hint})
	}
	if err := table(e.stdout, []string{"CHECK", "STATUS", "HINT"}, rows); err != nil {
		return err
	}
	first := true
	for _, c := range rep.Checks {
		if c.Status == doctor.OK || c.Detail == "" {
			continue
		}
		if first {
			fmt.Fprintln(e.stdout)
			first = false
		}
		fmt.Fprintf(e.stdout, "%s: %s\n", c.ID, c.Detail)
	}
	_, err := fmt.Fprintf(e.stdout, "\n%d ok, %d warn, %d fail\n", rep.Count(doctor.OK), rep.Count(doctor.Warn), rep.Count(doctor.Fail))
	return err
}
