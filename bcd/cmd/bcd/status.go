package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/bcd/identity"
	"github.com/better-compute/better-compute/bcd/nodestate"
)

type statusFlags struct {
	dataDir string
	output  string
}

func newStatusCmd(e env) *cobra.Command {
	var f statusFlags
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Say whether the running bcd node holds a session, from its state file (no network)",
		Long: `Status reads the state the running bcd node keeps in its data directory
(state.json, rewritten at every connect, disconnect and renewal) and prints it:
connected or disconnected, since when, the gateway, the session id, the last
error, the node certificate's end and renew-after time, and how long
re-attestation could still bring the node back after its certificate expires.
It opens no connection. A state whose bcd node no longer runs (its process is
gone, or nobody holds the data directory's lock) is printed as not running.

Exit status: 0 when bcd node runs and holds a session; 1 when it is
disconnected, not running, or has left no state; 2 for bad flags.`,
		Args: noArgs,
		RunE: func(*cobra.Command, []string) error { return status(e, &f, wallNow()) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dataDir, "data-dir", identity.DefaultDir, "directory holding the node's identity and state")
	fl.StringVarP(&f.output, "output", "o", "table", "output format: table or json")
	return cmd
}

// status prints the node's state judged at now; it fails (exit 1) unless
// the node runs and is connected.
func status(e env, f *statusFlags, now time.Time) error {
	if f.output != "table" && f.output != "json" {
		return usagef("--output %q: want table or json", f.output)
	}
	if f.dataDir == "" {
		return usagef("--data-dir must not be empty")
	}
	r, err := nodestate.Inspect(f.dataDir, now)
	if errors.Is(err, nodestate.ErrNoState) {
		return fmt.Errorf("%w: bcd node is not running on %s or has never run there (start it: systemctl start bcd)", err, f.dataDir)
	}
	if err != nil {
		return err
	}
	if f.output == "json" {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(r)
	} else {
		err = printStatus(e.stdout, r)
	}
	if err != nil {
		return err
	}
	switch {
	case !r.Running:
		return fmt.Errorf("bcd node is not running: %s; its last state was written at %s", r.NotRunning, r.UpdatedAt.UTC().Format(time.RFC3339))
	case !r.Connected:
		return errors.New("not connected: " + r.Line())
	}
	return nil
}

// printStatus writes r as a table of fields and values.
func printStatus(w io.Writer, r *nodestate.Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, orDash(v)) }
	if r.Running {
		row("agent", fmt.Sprintf("running (pid %d)", r.PID))
	} else {
		row("agent", "not running: "+r.NotRunning)
	}
	state := "disconnected"
	if r.Connected {
		state = "connected"
	}
	row("state", state)
	row("since", stampAgo(r.Since, r.Now))
	row("gateway", r.Gateway)
	row("session", r.SessionID)
	lastErr := r.LastError
	if lastErr != "" && !r.LastErrorAt.IsZero() {
		lastErr = stampAgo(r.LastErrorAt, r.Now) + ": " + lastErr
	}
	row("last error", lastErr)
	row("clock", r.ClockSummary())
	row("certificate", "expires "+r.CertificateSummary())
	row("renew after", r.CertRenewAfter.UTC().Format(time.RFC3339))
	row("re-attestation", r.ReattestSummary())
	row("updated", stampAgo(r.UpdatedAt, r.Now))
	return tw.Flush()
}

// stampAgo is t in RFC 3339 and how long before now it was.
func stampAgo(t, now time.Time) string {
	if t.IsZero() {
		return ""
	}
	return fmt.Sprintf("%s (%s ago)", t.UTC().Format(time.RFC3339), nodestate.Human(now.Sub(t)))
}
