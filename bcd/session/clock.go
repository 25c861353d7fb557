package session

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
)

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

// gatewayClock estimates the gateways' time from this machine's clock and
// the times the gateways' answers carry (JoinResponse, RenewResponse and
// Welcome server_time), so that a machine whose clock is wrong still judges
// certificates as the control plane does (DESIGN.md, "Identity over time",
// Clocks). Certificates are backdated an hour, so a clock up to an hour
// behind needs none of this; one further off does.
//
// Its now is this machine's time plus the offset last measured when the
// clocks disagreed by more than maxSkew (none otherwise), and never earlier
// than the floor when one is set: the NotBefore of the node's current
// certificate, which the node CA issued an hour after it by the gateway's
// clock, so the gateway's time is at least that even before any answer
// (after a restart, say). Heartbeats still carry this machine's own time:
// the gateway measures the skew from them.
type gatewayClock struct {
	local func() time.Time
	floor func() time.Time // nil: none
	log   *slog.Logger

	mu     sync.Mutex
	offset time.Duration // the gateway's clock minus this machine's; 0 within maxSkew
	logged time.Duration // the skew last logged; 0: none logged
}

func newGatewayClock(local, floor func() time.Time, log *slog.Logger) *gatewayClock {
	return &gatewayClock{local: local, floor: floor, log: log}
}

// now is the estimate of the gateway's time.
func (g *gatewayClock) now() time.Time {
	g.mu.Lock()
	off := g.offset
	g.mu.Unlock()
	t := g.local().Add(off)
	if g.floor != nil {
		if f := g.floor(); t.Before(f) {
			t = f
		}
	}
	return t
}

// skew is this machine's clock minus the gateway's as last measured: 0
// when they agreed within maxSkew, or before any answer.
func (g *gatewayClock) skew() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return -g.offset
}

// observe takes the time st that gateway gw put in an answer just received
// (nil or invalid: the gateway sent none) and returns the time to judge the
// answer's certificates by, and this machine's clock minus the gateway's
// (0 when unknown). When the two disagree by more than maxSkew, the
// answer is judged by the gateway's time, later verifications use the
// offset, and the skew is logged, once until it changes by more than
// maxSkew again; when they agree again, that is logged too.
func (g *gatewayClock) observe(ctx context.Context, gw string, st *timestamppb.Timestamp) (judge time.Time, skew time.Duration) {
	if st == nil || !st.IsValid() {
		return g.now(), 0
	}
	local, theirs := g.local(), st.AsTime()
	skew = local.Sub(theirs)
	g.mu.Lock()
	if skew.Abs() <= maxSkew {
		g.offset = 0
		was := g.logged
		g.logged = 0
		g.mu.Unlock()
		if was != 0 {
			g.log.InfoContext(ctx, "This machine's clock agrees with the gateway's again", attrGateway, gw,
				attrSkew, skewText(skew), attrSkewSec, skewSeconds(skew))
		}
		return local, skew
	}
	g.offset = -skew
	report := g.logged == 0 || (skew-g.logged).Abs() > maxSkew
	if report {
		g.logged = skew
	}
	g.mu.Unlock()
	if report {
		g.log.WarnContext(ctx, "This machine's clock differs from the gateway's: certificates are judged by the gateway's time; fix the clock (NTP)",
			attrGateway, gw, attrSkew, skewText(skew), attrSkewSec, skewSeconds(skew), attrLocalTime, local.UTC().Format(time.RFC3339))
	}
	return theirs, skew
}

// skewSeconds is skew (this machine's clock minus the gateway's) in whole
// seconds, rounded.
func skewSeconds(skew time.Duration) int64 { return int64(skew.Round(time.Second) / time.Second) }

// skewText says skew in words: "this machine's clock is 5400 s behind the
// gateway's".
func skewText(skew time.Duration) string {
	s := skewSeconds(skew)
	switch {
	case s < 0:
		return fmt.Sprintf("this machine's clock is %d s behind the gateway's", -s)
	case s > 0:
		return fmt.Sprintf("this machine's clock is %d s ahead of the gateway's", s)
	}
	return "this machine's clock agrees with the gateway's"
}
