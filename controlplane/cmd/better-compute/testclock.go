package main

import "time"

// testNow, set only by the clockshift test build (clockshift.go), is this
// machine's wall clock off by the test's offset, for tests of a control
// plane whose clock is wrong (issue 36). Nil in production builds: the
// system clock.
var testNow func() time.Time
