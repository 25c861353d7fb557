package session

import "time"

// Clock is the time source of a Client. Tests inject a fake one; the
// default is the system clock.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine after d, like time.AfterFunc.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call; it reports false when the call already
	// started or was stopped, like (*time.Timer).Stop.
	Stop() bool
}

// systemClock is the Clock of the real world.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
