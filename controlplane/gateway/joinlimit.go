package gateway

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// joinLimiterMaxSources is the most source addresses a joinLimiter keeps a
// bucket for; the sources beyond it share one bucket until idle ones are
// evicted.
const joinLimiterMaxSources = 65536

// joinLimiterIdle is how long a source's bucket is kept after its last
// Join, at least: longer than a bucket takes to fill again, so that
// evicting it forgets nothing.
const joinLimiterIdle = time.Minute

// joinLimiter is a token bucket per source address for Join calls. Its
// memory is bounded: buckets idle for joinLimiterIdle (and full again) are
// evicted once a sweep interval, and at most joinLimiterMaxSources are
// kept, the sources beyond sharing one bucket.
type joinLimiter struct {
	limit rate.Limit
	burst int
	idle  time.Duration

	mu        sync.Mutex
	buckets   map[string]*joinBucket
	overflow  *rate.Limiter // for sources beyond joinLimiterMaxSources
	lastSweep time.Time
	max       int
}

type joinBucket struct {
	lim  *rate.Limiter
	seen time.Time
}

func newJoinLimiter(perSecond float64, burst int) *joinLimiter {
	l := rate.Limit(perSecond)
	idle := joinLimiterIdle
	if perSecond > 0 {
		// Never forget a bucket that is not full again.
		idle = max(idle, time.Duration(math.Ceil(float64(burst)/perSecond*float64(time.Second))))
	}
	return &joinLimiter{limit: l, burst: burst, idle: idle, buckets: map[string]*joinBucket{},
		overflow: rate.NewLimiter(l, burst), max: joinLimiterMaxSources}
}

// allow takes a token of src's bucket at now. When there is none it returns
// false and how long until there is.
func (j *joinLimiter) allow(src string, now time.Time) (bool, time.Duration) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.sweep(now)
	var lim *rate.Limiter
	if b := j.buckets[src]; b != nil {
		b.seen, lim = now, b.lim
	} else if len(j.buckets) < j.max {
		lim = rate.NewLimiter(j.limit, j.burst)
		j.buckets[src] = &joinBucket{lim: lim, seen: now}
	} else {
		lim = j.overflow
	}
	r := lim.ReserveN(now, 1)
	if !r.OK() {
		return false, time.Second
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// sweep evicts the buckets idle for j.idle, at most once per j.idle.
func (j *joinLimiter) sweep(now time.Time) {
	if now.Sub(j.lastSweep) < j.idle {
		return
	}
	j.lastSweep = now
	for src, b := range j.buckets {
		if now.Sub(b.seen) >= j.idle {
			delete(j.buckets, src)
		}
	}
}

// sources is how many source addresses have a bucket.
func (j *joinLimiter) sources() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.buckets)
}
