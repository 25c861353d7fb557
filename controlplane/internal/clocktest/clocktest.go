// Package clocktest is a fake clock for the control plane's tests: time
// moves only when the test advances it, and a test waits for the code under
// test to be waiting on the clock (BlockUntil) instead of sleeping
// (STYLE.md, "Tests": a fake clock, test signals instead of sleeps). Its
// methods match clock.Clock (controlplane/internal/clock), which every loop
// of the gateway and the workers takes.
package clocktest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Clock is a fake clock. The zero value is not usable; call New.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
	changed chan struct{} // closed, and replaced, whenever waiters changes
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

// New returns a Clock reading start.
func New(start time.Time) *Clock {
	return &Clock{now: start, changed: make(chan struct{})}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that receives the clock's time once it has been
// advanced by d (at once when d ≤ 0), like time.After.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, waiter{at: c.now.Add(d), ch: ch})
	c.notify()
	return ch
}

// Advance moves the clock on by d and fires, in time order, every After
// whose time has come.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	slices.SortStableFunc(c.waiters, func(a, b waiter) int { return a.at.Compare(b.at) })
	n := 0
	for _, w := range c.waiters {
		if w.at.After(c.now) {
			break
		}
		w.ch <- c.now
		n++
	}
	if n > 0 {
		c.waiters = slices.Delete(c.waiters, 0, n)
		c.notify()
	}
}

// Waiters returns how many Afters are pending.
func (c *Clock) Waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}

// BlockUntil waits until at least n Afters are pending: the code under test
// has reached its wait. It fails when ctx ends first.
func (c *Clock) BlockUntil(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		have, changed := len(c.waiters), c.changed
		c.mu.Unlock()
		if have >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("clocktest: %d waiters, want %d: %w", have, n, context.Cause(ctx))
		}
	}
}

// Until waits until cond holds: it checks cond at once and again each time
// a wait on the clock begins or ends, that is whenever the code under test
// has moved on to its next wait (a loop's pass is over). It fails when ctx
// ends first. cond must not call the clock's Advance.
func (c *Clock) Until(ctx context.Context, cond func() bool) error {
	return until(ctx, func() <-chan struct{} {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.changed
	}, cond)
}

// until checks cond, then again each time the channel changed returns (read
// before each check, so no change is missed) is closed, until it holds or
// ctx ends.
func until(ctx context.Context, changed func() <-chan struct{}, cond func() bool) error {
	for {
		ch := changed()
		if cond() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("clocktest: condition not met: %w", context.Cause(ctx))
		}
	}
}

// notify wakes BlockUntil and Until; c.mu is held.
func (c *Clock) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Real is the system clock, watched: Now and After are the real clock's,
// and Until wakes each time the code under test begins a wait on it (a
// loop finished its pass). Tests of code that must run on real time (a
// gateway serving real sessions) wait on it instead of polling.
type Real struct {
	mu      sync.Mutex
	changed chan struct{}
}

// NewReal returns a watched system clock.
func NewReal() *Real { return &Real{changed: make(chan struct{})} }

// Now returns the system clock's time.
func (r *Real) Now() time.Time { return time.Now() }

// After is time.After, and wakes Until.
func (r *Real) After(d time.Duration) <-chan time.Time {
	r.mu.Lock()
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
	return time.After(d)
}

// Until waits until cond holds: it checks cond at once and again each time
// a wait on the clock begins. It fails when ctx ends first.
func (r *Real) Until(ctx context.Context, cond func() bool) error {
	return until(ctx, r.waits, cond)
}

// waits returns the channel closed when the next wait begins.
func (r *Real) waits() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// Next returns once the next wait on the clock begins (some loop finished
// a pass), or when ctx ends.
func (r *Real) Next(ctx context.Context) error {
	select {
	case <-r.waits():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("clocktest: no wait began: %w", context.Cause(ctx))
	}
}
