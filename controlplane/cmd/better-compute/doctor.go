package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/config"
	"github.com/better-compute/better-compute/controlplane/doctor"
)

// doctorError makes doctor exit 1 after its report.
type doctorError struct{ fails, warns int }

func (e doctorError) Error() string {
	return fmt.Sprintf("doctor: %d check(s) failed, %d warned", e.fails, e.warns)
}

func doctorCmd(e *env) *cobra.Command {
	var out string
	var strict bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check the schema, clock, PKI, gateway identity, notifier, routes, workers and fleet",
		Long: `Doctor runs every check of docs/doctor.md against the configured database and
prints each one's id, status (ok, warn or fail) and a one-line hint.

Exit status: 0 when no check failed (with --strict: none warned either), 1
otherwise, 2 for bad flags or configuration.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(out); err != nil {
				return err
			}
			cfg, err := e.load(config.Flags{})
			if err != nil {
				return err
			}
			st, err := openStore(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			defer st.Close()
			rep := doctor.Run(cmd.Context(), st, doctor.FromConfig(cfg))
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
	outputFlag(cmd, &out)
	return cmd
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
