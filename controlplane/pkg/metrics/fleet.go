package metrics

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"maps"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/better-compute/better-compute/controlplane/pkg/inventory"
	"github.com/better-compute/better-compute/controlplane/store"
)

var (
	descNodes = prometheus.NewDesc(Namespace+"_nodes",
		"Nodes by state (joined, ready, unreachable, powered-off, draining, clock-skewed).", []string{"state"}, nil)
	descNodesCordoned = prometheus.NewDesc(Namespace+"_nodes_cordoned",
		"Nodes that are cordoned, whatever their state.", nil, nil)
	descGPUs = prometheus.NewDesc(Namespace+"_gpus",
		"GPUs in the nodes' last inventories, by health (ok, degraded, failed); read at most every GPUCacheTTL.", []string{"health"}, nil)
	descOutboxLag = prometheus.NewDesc(Namespace+"_outbox_lag_seconds",
		"Age of the oldest outbox entry some configured sink has not taken yet; 0 when every sink is caught up or none is configured.", nil, nil)
	descDeliveryLag = prometheus.NewDesc(Namespace+"_sink_delivery_lag_seconds",
		"Age of the oldest outbox entry the sink has not taken yet; 0 when it is caught up.", []string{"sink"}, nil)
	descSingletonHeld = prometheus.NewDesc(Namespace+"_singleton_held",
		"1 when the singleton job's lease (singleton:<job>) is held and unexpired, else 0.", []string{"job"}, nil)
	descCertExpiry = prometheus.NewDesc(Namespace+"_certificate_expiry_timestamp_seconds",
		"When a certificate ends (Unix time), by kind and use: ca (node, gateway, internal: the deployment's CAs), serving (api, gateway: this process's files), "+
			"internal (server, client: host.gateway.internal.tlsFiles), node (earliest: the fleet's earliest among connected nodes).", []string{"kind", "use"}, nil)
)

// nodeStates are the states bettercompute_nodes always reports, 0 when no
// node is in them.
var nodeStates = []string{store.NodeJoined, store.NodeReady, store.NodeUnreachable, store.NodePoweredOff, store.NodeDraining, store.NodeClockSkewed}

// fleetOps name the fleet collector's queries in
// bettercompute_store_query_duration_seconds.
var fleetOps = []string{"node_counts", "node_scan", "outbox_oldest"}

// fleetCollector reports the fleet: nodes by state, GPUs by health, the
// outbox's lag and singleton jobs.
type fleetCollector struct {
	m  *Metrics
	st Store

	mu   sync.Mutex
	gpus map[string]int
	at   time.Time // when gpus was counted
}

// Describe sends the descriptors of every series the collector makes.
func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descNodes, descNodesCordoned, descGPUs, descOutboxLag, descDeliveryLag} {
		ch <- d
	}
}

// Collect reads the database; a failed read leaves its series out.
func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.m.cfg.ScrapeTimeout)
	defer cancel()
	if c.st == nil {
		return
	}
	c.nodes(ctx, ch)
	c.gpuHealth(ctx, ch)
	c.outboxLag(ctx, ch)
}

func (c *fleetCollector) timed(op string, fn func() error) error {
	return (&storeCollector{m: c.m}).timed(op, fn)
}

// nodes reports the nodes by state, from one grouped query.
func (c *fleetCollector) nodes(ctx context.Context, ch chan<- prometheus.Metric) {
	var counts []*store.NodeCount
	err := c.timed("node_counts", func() (err error) {
		counts, err = c.st.NodeCounts(ctx)
		return err
	})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descNodes, err)
		return
	}
	by := map[string]int{}
	cordoned := 0
	for _, n := range counts {
		by[n.State] += n.Nodes
		cordoned += n.Cordoned
	}
	for _, s := range nodeStates {
		ch <- prometheus.MustNewConstMetric(descNodes, prometheus.GaugeValue, float64(by[s]), s)
		delete(by, s)
	}
	for s, n := range by { // a state this build does not list
		ch <- prometheus.MustNewConstMetric(descNodes, prometheus.GaugeValue, float64(n), s)
	}
	ch <- prometheus.MustNewConstMetric(descNodesCordoned, prometheus.GaugeValue, float64(cordoned))
}

// gpuHealth reports the GPUs by health (inventory.CountGPUs, which reads
// every node's inventory: O(nodes)), so the count is kept for GPUCacheTTL.
func (c *fleetCollector) gpuHealth(ctx context.Context, ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gpus == nil || c.m.cfg.Now().Sub(c.at) >= c.m.cfg.GPUCacheTTL {
		var counts map[string]int
		err := c.timed("node_scan", func() (err error) {
			counts, err = inventory.CountGPUs(ctx, c.st)
			return err
		})
		if err != nil {
			ch <- prometheus.NewInvalidMetric(descGPUs, err)
			return
		}
		c.gpus, c.at = counts, c.m.cfg.Now()
	}
	for _, h := range inventory.Healths {
		ch <- prometheus.MustNewConstMetric(descGPUs, prometheus.GaugeValue, float64(c.gpus[h]), h)
	}
}

// outboxLag reports how old the oldest entry each sink has not taken is.
func (c *fleetCollector) outboxLag(ctx context.Context, ch chan<- prometheus.Metric) {
	now := c.m.cfg.Now()
	var worst time.Duration
	for _, sink := range c.m.cfg.Sinks {
		var lag time.Duration
		err := c.timed("outbox_oldest", func() error {
			cursor, err := c.st.OutboxCursor(ctx, sink)
			if err != nil {
				return err
			}
			oldest, err := c.st.OutboxQuery(ctx, &store.OutboxQueryParams{AfterID: cursor, Ascending: true, Limit: 1})
			if err != nil {
				return err
			}
			if len(oldest) > 0 {
				lag = max(now.Sub(oldest[0].CreatedAt), 0)
			}
			return nil
		})
		if err != nil {
			ch <- prometheus.NewInvalidMetric(descDeliveryLag, err)
			return
		}
		worst = max(worst, lag)
		ch <- prometheus.MustNewConstMetric(descDeliveryLag, prometheus.GaugeValue, lag.Seconds(), sink)
	}
	ch <- prometheus.MustNewConstMetric(descOutboxLag, prometheus.GaugeValue, worst.Seconds())
}

// certificates reports the expiry of the certificate files given to
// WatchCertificate (and Config.CertFiles), read at each scrape (they are
// re-read by their users every 60 s too); one that cannot be read is an
// invalid metric.
func (c *lifetimeCollector) certificates(ch chan<- prometheus.Metric) {
	c.m.certMu.Lock()
	files := maps.Clone(c.m.certFiles)
	c.m.certMu.Unlock()
	for k, file := range files {
		notAfter, err := leafNotAfter(file)
		if err != nil {
			ch <- prometheus.NewInvalidMetric(descCertExpiry, fmt.Errorf("%s certificate of %s: %w", k.kind, k.use, err))
			continue
		}
		ch <- prometheus.MustNewConstMetric(descCertExpiry, prometheus.GaugeValue, float64(notAfter.Unix()), k.kind, k.use)
	}
}

// leafNotAfter is the expiry of the first certificate in a PEM file.
func leafNotAfter(file string) (time.Time, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return time.Time{}, err
	}
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			return time.Time{}, fmt.Errorf("%s: no certificate", file)
		}
		if blk.Type == "CERTIFICATE" {
			cert, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return time.Time{}, fmt.Errorf("%s: %w", file, err)
			}
			return cert.NotAfter, nil
		}
	}
}

// buildInfo is the constant bettercompute_build_info series.
func buildInfo(version, commit string) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help:        "Always 1; the labels name the build of this process.",
		ConstLabels: prometheus.Labels{"version": orUnknown(version), "commit": orUnknown(commit), "goversion": runtime.Version()},
	}, func() float64 { return 1 })
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
