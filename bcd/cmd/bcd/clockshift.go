//go:build clockshift

// The clockshift build of bcd (go build -tags clockshift ./bcd/cmd/bcd), for
// end-to-end tests of a machine whose clock is wrong (issue 36; DESIGN.md,
// "Identity over time", Clocks): every time bcd reads from the wall clock
// (the session's heartbeats, its certificate and TLS judgements, bcd
// doctor and bcd status) is the system's plus BCD_TEST_CLOCK_OFFSET, a Go
// duration ("48h", "-720h"). Timers and time elapsed are not shifted, as
// a wrong wall clock leaves the monotonic one right. Production builds (no
// tag) do not contain this file.

package main

import (
	"fmt"
	"os"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
)

// clockOffsetEnv names the variable holding the offset of the clockshift
// build.
const clockOffsetEnv = "BCD_TEST_CLOCK_OFFSET"

func init() {
	v := os.Getenv(clockOffsetEnv)
	if v == "" {
		return
	}
	off, err := time.ParseDuration(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bcd: %s=%q: %v\n", clockOffsetEnv, v, err)
		os.Exit(2)
	}
	testClock = shiftedClock{off: off}
}

// shiftedClock is the system clock off by off.
type shiftedClock struct{ off time.Duration }

func (c shiftedClock) Now() time.Time { return time.Now().Add(c.off) }

func (shiftedClock) AfterFunc(d time.Duration, f func()) session.Timer { return time.AfterFunc(d, f) }
