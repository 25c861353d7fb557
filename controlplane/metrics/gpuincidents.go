package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/remediation"
	"github.com/better-compute/better-compute/controlplane/store"
)

// GPUIncidentStore is what the per-model incident series reads: the cases
// kept that name a GPU, by the GPU's model (store.GPUStore).
type GPUIncidentStore interface {
	GPUIncidentsByModel(ctx context.Context, excludeFinding string) ([]*store.GPUModelCount, error)
}

var descGPUIncidents = prometheus.NewDesc(Namespace+"_gpu_incidents",
	"Remediation cases kept that name a GPU, by the GPU's model (operator-ordered repairs left out).", []string{"model"}, nil)

// gpuIncidentCollector reports the incidents per GPU model, counted at
// most every GPUCacheTTL (the count joins every case kept with the GPUs'
// stays).
type gpuIncidentCollector struct {
	m  *Metrics
	st GPUIncidentStore

	mu     sync.Mutex
	at     time.Time
	counts []*store.GPUModelCount
}

func (c *gpuIncidentCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descGPUIncidents }

func (c *gpuIncidentCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.m.cfg.ScrapeTimeout)
	defer cancel()
	now := c.m.cfg.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil || now.Sub(c.at) >= c.m.cfg.GPUCacheTTL {
		counts, err := c.st.GPUIncidentsByModel(ctx, remediation.FindingOrdered)
		if err != nil {
			c.m.cfg.Log.Warn("Scrape: GPU incidents by model", logkey.Err, err)
			ch <- prometheus.NewInvalidMetric(descGPUIncidents, err)
			return
		}
		c.counts, c.at = counts, now
		if c.counts == nil {
			c.counts = []*store.GPUModelCount{}
		}
	}
	for _, n := range c.counts {
		ch <- prometheus.MustNewConstMetric(descGPUIncidents, prometheus.GaugeValue, float64(n.Count), n.Model)
	}
}
