package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/bcd/doctor"
	"github.com/better-compute/better-compute/bcd/helper"
	"github.com/better-compute/better-compute/bcd/identity"
)

type doctorFlags struct {
	dataDir      string
	gateways     []string
	tokenFile    string
	helperSocket string
	pluginDir    string
	timeout      time.Duration
	strict       bool
	output       string
}

// doctorError makes bcd doctor exit 1 after its report.
type doctorError struct{ fails, warns int }

func (e doctorError) Error() string {
	return fmt.Sprintf("doctor: %d check(s) failed, %d warned", e.fails, e.warns)
}

func newDoctorCmd(e env) *cobra.Command {
	var f doctorFlags
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check this node: identity, gateways (DNS, TCP, TLS, clock), NVML, the helper and plugins",
		Long: `Doctor checks what the node needs to hold its session, without opening one:
the identity and node certificate, the running node's session state (as bcd
status reads it), each gateway's DNS name, TCP port, TLS
certificate (verified against the pinned CA, as bcd node does) and clock, this
machine's NTP state, NVML, the root helper and the plugins. It works with the
network down; each check prints an id, a status (ok, warn, fail) and a hint.

Before a join, name the gateway and the token: bcd doctor --gateway URL
--token-file FILE checks the network path with the token's pin.

Exit status: 0 when no check failed (with --strict: none warned either), 1
otherwise, 2 for bad flags.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.output != "table" && f.output != "json" {
				return usagef("--output %q: want table or json", f.output)
			}
			if f.timeout <= 0 {
				return usagef("--timeout must be positive")
			}
			if f.dataDir == "" {
				return usagef("--data-dir must not be empty")
			}
			rep := doctor.Run(cmd.Context(), doctor.Config{DataDir: f.dataDir, Gateways: f.gateways, TokenFile: f.tokenFile,
				HelperSocket: f.helperSocket, PluginDir: f.pluginDir, Timeout: f.timeout, Now: wallNow})
			if err := printDoctor(e, rep, f.output); err != nil {
				return err
			}
			if rep.Failed(f.strict) {
				return doctorError{fails: rep.Count(doctor.Fail), warns: rep.Count(doctor.Warn)}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dataDir, "data-dir", identity.DefaultDir, "directory holding the node's identity")
	fl.StringArrayVar(&f.gateways, "gateway", nil, "gateway URL to check besides the identity's, https://host[:port] (repeatable)")
	fl.StringVar(&f.tokenFile, "token-file", "", "join token file to check; before a join its pin verifies the gateways")
	fl.StringVar(&f.helperSocket, "helper-socket", "", "root helper socket to ping (default "+helper.DefaultSocket+", when it exists)")
	fl.StringVar(&f.pluginDir, "plugin-dir", doctor.DefaultPluginDir, "plugin directory")
	fl.DurationVar(&f.timeout, "timeout", 5*time.Second, "time limit of each network step")
	fl.BoolVar(&f.strict, "strict", false, "exit non-zero on warnings too")
	fl.StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	return cmd
}

// printDoctor writes the report as a table (details of the checks that are
// not ok below it) or as JSON.
func printDoctor(e env, rep *doctor.Report, output string) error {
	if output == "json" {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tTARGET\tSTATUS\tHINT")
	for _, c := range rep.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", c.ID, orDash(c.Target), c.Status, c.Hint)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var details []string
	for _, c := range rep.Checks {
		if c.Status != doctor.OK && c.Detail != "" {
			details = append(details, fmt.Sprintf("%s %s: %s", c.ID, orDash(c.Target), c.Detail))
		}
	}
	if len(details) > 0 {
		fmt.Fprintf(e.stdout, "\n%s\n", strings.Join(details, "\n"))
	}
	_, err := fmt.Fprintf(e.stdout, "\n%d ok, %d warn, %d fail\n", rep.Count(doctor.OK), rep.Count(doctor.Warn), rep.Count(doctor.Fail))
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
