package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/remediation"
	"github.com/better-compute/better-compute/controlplane/store"
)

// RemediationStore is what the remediation series read: every pool's
// breaker and the cases kept (retention.history).
type RemediationStore interface {
	RemediationBreakerStates(ctx context.Context, window time.Duration, now *time.Time) ([]*store.RemediationBreakerState, error)
	RemediationList(ctx context.Context, p *store.RemediationListParams) ([]*store.Remediation, error)
}

// Buckets of the remediation histograms, in seconds: from a round of the
// reconciler to days between incidents.
var remediationBuckets = []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600,
	86400, 7 * 86400, 30 * 86400}

var (
	descBreakerTripped = prometheus.NewDesc(Namespace+"_remediation_breaker_tripped",
		"1 while the pool's remediation circuit breaker is tripped.", []string{"pool"}, nil)
	descBreakerActed = prometheus.NewDesc(Namespace+"_remediation_breaker_acted_nodes",
		"Distinct nodes the pool's remediation acted on within the breaker's window.", []string{"pool"}, nil)
	descBreakerLimit = prometheus.NewDesc(Namespace+"_remediation_breaker_limit_nodes",
		"The most distinct nodes the pool's breaker admits within its window: max(minNodes, share of the GPU nodes).", []string{"pool"}, nil)
	descBreakerHeld = prometheus.NewDesc(Namespace+"_remediation_breaker_held_cases",
		"Cases the pool's breaker holds: cordoned, not acted on.", []string{"pool"}, nil)
	descTimeToQuarantine = prometheus.NewDesc(Namespace+"_remediation_time_to_quarantine_seconds",
		"From a case's detection to its node's quarantine, over the cases kept.", []string{"pool"}, nil)
	descTimeToReturn = prometheus.NewDesc(Namespace+"_remediation_time_to_return_seconds",
		"From a case's detection to its return to service (MTTR), over the cases kept.", []string{"pool"}, nil)
	descTimeBetween = prometheus.NewDesc(Namespace+"_remediation_time_between_incidents_seconds",
		"Between one incident and the next on the same node (scope node) or GPU (scope gpu), over the cases kept.",
		[]string{"pool", "scope"}, nil)
)

// remediationCollector reports every pool's breaker, read from the
// database at each scrape, and its remediation figures, which read every
// case kept and are reused for GPUCacheTTL. Each pool's series are there
// from its creation, with zero counts.
type remediationCollector struct {
	m       *Metrics
	st      RemediationStore
	breaker config.RemediationBreaker

	mu    sync.Mutex
	at    time.Time
	stats map[string]*remediation.PoolStats
}

func (c *remediationCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBreakerTripped, descBreakerActed, descBreakerLimit, descBreakerHeld,
		descTimeToQuarantine, descTimeToReturn, descTimeBetween} {
		ch <- d
	}
}

func (c *remediationCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.m.cfg.ScrapeTimeout)
	defer cancel()
	now := c.m.cfg.Now()
	window := c.breaker.Window.Duration
	if window <= 0 {
		window = 10 * time.Minute
	}
	bs, err := c.st.RemediationBreakerStates(ctx, window, &now)
	if err != nil {
		c.m.cfg.Log.Warn("Scrape: remediation breakers", logkey.Err, err)
		ch <- prometheus.NewInvalidMetric(descBreakerTripped, err)
		return
	}
	var pools []string
	for _, b := range bs {
		pools = append(pools, b.PoolID)
	}
	stats, err := c.figures(ctx, now, pools)
	if err != nil {
		c.m.cfg.Log.Warn("Scrape: remediation figures", logkey.Err, err)
		ch <- prometheus.NewInvalidMetric(descTimeToQuarantine, err)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	hist := func(d *prometheus.Desc, xs []float64, labels ...string) {
		counts := make(map[float64]uint64, len(remediationBuckets))
		sum := 0.0
		for _, x := range xs {
			sum += x
			for _, b := range remediationBuckets {
				if x <= b {
					counts[b]++
				}
			}
		}
		ch <- prometheus.MustNewConstHistogram(d, uint64(len(xs)), sum, counts, labels...)
	}
	for _, b := range bs {
		tripped := 0.0
		if b.TrippedAt != nil {
			tripped = 1
		}
		gauge(descBreakerTripped, tripped, b.PoolID)
		gauge(descBreakerActed, float64(b.Acted), b.PoolID)
		gauge(descBreakerLimit, float64(c.breaker.Limit(b.GPUNodes)), b.PoolID)
		gauge(descBreakerHeld, float64(b.Held), b.PoolID)
		ps := stats[b.PoolID]
		if ps == nil {
			ps = &remediation.PoolStats{PoolID: b.PoolID} // a pool newer than the cached figures
		}
		hist(descTimeToQuarantine, ps.ToQuarantine, b.PoolID)
		hist(descTimeToReturn, ps.ToReturn, b.PoolID)
		hist(descTimeBetween, ps.BetweenNode, b.PoolID, "node")
		hist(descTimeBetween, ps.BetweenGPU, b.PoolID, "gpu")
	}
}

// figures returns each pool's figures, read again when older than
// GPUCacheTTL.
func (c *remediationCollector) figures(ctx context.Context, now time.Time, pools []string) (map[string]*remediation.PoolStats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stats != nil && now.Sub(c.at) < c.m.cfg.GPUCacheTTL {
		return c.stats, nil
	}
	cases, err := remediation.AllCases(ctx, c.st, store.RemediationListParams{})
	if err != nil {
		return c.stats, err
	}
	c.stats, c.at = remediation.Stats(pools, cases), now
	return c.stats, nil
}
