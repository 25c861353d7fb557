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
	GPUServiceByModel(ctx context.Context, now time.Time) ([]*store.GPUModelService, error)
}

var (
	descGPUIncidents = prometheus.NewDesc(Namespace+"_gpu_incidents",
		"Remediation cases kept that name a GPU, by the GPU's model (operator-ordered repairs left out).", []string{"model"}, nil)
	descGPUService = prometheus.NewDesc(Namespace+"_gpu_service_seconds",
		"GPU-seconds the GPUs of a model were seen in service: each stay in a node, from its first inventory to its last (or now).",
		[]string{"model"}, nil)
	descGPUMTBF = prometheus.NewDesc(Namespace+"_gpu_mean_time_between_failures_seconds",
		"GPU-seconds in service per incident, by GPU model: gpu_service_seconds / gpu_incidents (models with an incident only).",
		[]string{"model"}, nil)
)

// gpuIncidentCollector reports the incidents per GPU model, counted at
// most every GPUCacheTTL (the count joins every case kept with the GPUs'
// stays).
type gpuIncidentCollector struct {
	m  *Metrics
	st GPUIncidentStore

	mu      sync.Mutex
	at      time.Time
	counts  []*store.GPUModelCount
	service []*store.GPUModelService
}

func (c *gpuIncidentCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descGPUIncidents
	ch <- descGPUService
	ch <- descGPUMTBF
}

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
		service, err := c.st.GPUServiceByModel(ctx, now)
		if err != nil {
			c.m.cfg.Log.Warn("Scrape: GPU service by model", logkey.Err, err)
			ch <- prometheus.NewInvalidMetric(descGPUService, err)
			return
		}
		c.counts, c.service, c.at = counts, service, now
		if c.counts == nil {
			c.counts = []*store.GPUModelCount{}
		}
	}
	incidents := map[string]int{}
	for _, n := range c.counts {
		incidents[n.Model] = n.Count
		ch <- prometheus.MustNewConstMetric(descGPUIncidents, prometheus.GaugeValue, float64(n.Count), n.Model)
	}
	for _, m := range c.service {
		ch <- prometheus.MustNewConstMetric(descGPUService, prometheus.GaugeValue, m.Seconds, m.Model)
		if n := incidents[m.Model]; n > 0 {
			ch <- prometheus.MustNewConstMetric(descGPUMTBF, prometheus.GaugeValue, m.Seconds/float64(n), m.Model)
		}
	}
}
