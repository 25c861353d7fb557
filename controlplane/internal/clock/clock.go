// Package clock is the control plane's one time source for loops: every
// loop of the gateway and the workers (leases, shard membership, the
// reconcilers' rounds, the sweeper, the reaper) reads Now and waits on After
// of the Clock it is given, so a test drives it with a fake one
// (controlplane/internal/clocktest) instead of sleeping (STYLE.md, "Leases
// and loops"; issue 42).
package clock

import "time"

// Clock is a loop's time source.
type Clock interface {
	// Now returns the current time. The system clock's readings carry a
	// monotonic reading; trust windows (leases) are measured with it.
	Now() time.Time
	// After returns a channel that receives once d has passed (at once
	// when d ≤ 0), like time.After.
	After(d time.Duration) <-chan time.Time
}

// system is the Clock of the real world.
type system struct{}

func (system) Now() time.Time                         { return time.Now() }
func (system) After(d time.Duration) <-chan time.Time { return time.After(d) }

// System is the system clock: every Config's default.
var System Clock = system{}

// Or returns c, or System when c is nil: a constructor's default.
func Or(c Clock) Clock {
	if c == nil {
		return System
	}
	return c
}

// Reading returns a Clock whose Now is now and whose After waits on the
// system clock: a process's wall clock read through a function (serve's
// Options.Now, which a test build shifts), with real waits.
func Reading(now func() time.Time) Clock {
	if now == nil {
		return System
	}
	return reading(now)
}

type reading func() time.Time

func (r reading) Now() time.Time                       { return r() }
func (reading) After(d time.Duration) <-chan time.Time { return time.After(d) }
