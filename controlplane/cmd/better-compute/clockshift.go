//go:build clockshift

// The clockshift build of better-compute (go build -tags clockshift
// ./controlplane/cmd/better-compute), for end-to-end tests of a control
// plane whose clock is wrong (issue 36; DESIGN.md, "Identity over time",
// Clocks): serve's wall clock (the gateway's judgement of certificates, the
// clock check) and doctor's are the system's plus
// BETTER_COMPUTE_TEST_CLOCK_OFFSET, a Go duration ("-48h"). The database's
// clock is not shifted: SQLite's now() and PostgreSQL's stay the system's.
// Production builds (no tag) do not contain this file.

package main

import (
	"fmt"
	"os"
	"time"
)

// clockOffsetEnv names the variable holding the offset of the clockshift
// build.
const clockOffsetEnv = "BETTER_COMPUTE_TEST_CLOCK_OFFSET"

func init() {
	v := os.Getenv(clockOffsetEnv)
	if v == "" {
		return
	}
	off, err := time.ParseDuration(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "better-compute: %s=%q: %v\n", clockOffsetEnv, v, err)
		os.Exit(2)
	}
	testNow = func() time.Time { return time.Now().Add(off) }
}
