package plugin

import "time"

// Clock is the time source of a Host. Tests inject a fake one; the default is
// the system clock.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// After returns a channel that receives once d has passed, like
	// time.After.
	After(d time.Duration) <-chan time.Time
}

// systemClock is the Clock of the real world.
type systemClock struct{}

func (systemClock) Now() time.Time                         { return time.Now() }
func (systemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
