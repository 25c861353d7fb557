package metrics

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/better-compute/better-compute/controlplane/store"
)

var (
	descStoreUp = prometheus.NewDesc(Namespace+"_store_up",
		"1 when the database answered this scrape's ping, 0 otherwise.", nil, nil)
	descGatewaySessions = prometheus.NewDesc(Namespace+"_gateway_sessions",
		"Sessions held by each live gateway, from the gateways table.", []string{"gateway", "region"}, nil)
	descGatewayMaxStreams = prometheus.NewDesc(Namespace+"_gateway_max_streams",
		"Stream limit of each live gateway, from the gateways table.", []string{"gateway", "region"}, nil)
	descLeasesHeld = prometheus.NewDesc(Namespace+"_leases_held",
		"Unexpired leases by kind (shard, singleton, gateway) and holder.", []string{"kind", "holder"}, nil)
	descLeaseTakeovers = prometheus.NewDesc(Namespace+"_lease_takeovers_total",
		"Changes of holder over the leases' lives (the sum of epoch - 1), by lease kind.", []string{"kind"}, nil)
	descOutboxBacklog = prometheus.NewDesc(Namespace+"_outbox_backlog_entries",
		"Outbox entries a sink has not taken yet: the newest entry id less the sink's cursor.", []string{"sink"}, nil)
)

// scrapeOps name the queries of a scrape in
// bettercompute_store_query_duration_seconds.
var scrapeOps = []string{"ping", "gateway_list", "lease_list", "outbox_max_id", "outbox_cursor"}

// storeCollector reads the deployment-wide series from the database at each
// scrape.
type storeCollector struct {
	m  *Metrics
	st Store
}

// Describe sends the descriptors of every series the collector makes.
func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descStoreUp, descGatewaySessions, descGatewayMaxStreams, descLeasesHeld,
		descLeaseTakeovers, descOutboxBacklog, descSingletonHeld} {
		ch <- d
	}
}

// Collect reads the database. A failed read leaves its series out and
// reports an invalid metric, which the handler logs.
func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.m.cfg.ScrapeTimeout)
	defer cancel()
	if err := c.timed("ping", func() error { return c.st.Ping(ctx) }); err != nil {
		ch <- prometheus.MustNewConstMetric(descStoreUp, prometheus.GaugeValue, 0)
		ch <- prometheus.NewInvalidMetric(descStoreUp, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(descStoreUp, prometheus.GaugeValue, 1)
	now := c.m.cfg.Now()
	c.gateways(ctx, ch, now)
	c.leases(ctx, ch, now)
	c.outbox(ctx, ch)
}

// gateways reports the sessions and stream limit of each live gateway.
func (c *storeCollector) gateways(ctx context.Context, ch chan<- prometheus.Metric, now time.Time) {
	var gws []*store.Gateway
	err := c.timed("gateway_list", func() (err error) {
		gws, err = c.st.GatewayList(ctx)
		return err
	})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descGatewaySessions, err)
		return
	}
	for _, g := range gws {
		if now.Sub(g.HeartbeatAt) > c.m.cfg.GatewayLiveWithin {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descGatewaySessions, prometheus.GaugeValue, float64(g.Sessions), g.ID, g.Region)
		ch <- prometheus.MustNewConstMetric(descGatewayMaxStreams, prometheus.GaugeValue, float64(g.MaxStreams), g.ID, g.Region)
	}
}

// leases reports the unexpired leases by kind and holder, and the
// takeovers by kind.
func (c *storeCollector) leases(ctx context.Context, ch chan<- prometheus.Metric, now time.Time) {
	var ls []*store.Lease
	err := c.timed("lease_list", func() (err error) {
		ls, err = c.st.LeaseList(ctx, "")
		return err
	})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descLeasesHeld, err)
		return
	}
	type key struct{ kind, holder string }
	held := map[key]int{}
	takeovers := map[string]int64{}
	for _, l := range ls {
		kind := leaseKind(l.Name)
		takeovers[kind] += max(l.Epoch-1, 0)
		if l.Holder != "" && l.ExpiresAt.After(now) {
			held[key{kind, l.Holder}]++
		}
	}
	for k, n := range held {
		ch <- prometheus.MustNewConstMetric(descLeasesHeld, prometheus.GaugeValue, float64(n), k.kind, k.holder)
	}
	for kind, n := range takeovers {
		ch <- prometheus.MustNewConstMetric(descLeaseTakeovers, prometheus.CounterValue, float64(n), kind)
	}
	// Every singleton job this deployment ever ran has a lease row: held
	// and unexpired is 1, anything else 0 (an alert on 0 finds a stalled
	// sweeper).
	for _, l := range ls {
		if job, ok := strings.CutPrefix(l.Name, "singleton:"); ok {
			held := 0.0
			if l.Holder != "" && l.ExpiresAt.After(now) {
				held = 1
			}
			ch <- prometheus.MustNewConstMetric(descSingletonHeld, prometheus.GaugeValue, held, job)
		}
	}
}

// outbox reports each configured sink's backlog.
func (c *storeCollector) outbox(ctx context.Context, ch chan<- prometheus.Metric) {
	if len(c.m.cfg.Sinks) == 0 {
		return
	}
	var newest int64
	err := c.timed("outbox_max_id", func() (err error) {
		newest, err = c.st.OutboxMaxID(ctx)
		return err
	})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descOutboxBacklog, err)
		return
	}
	for _, sink := range c.m.cfg.Sinks {
		var cursor int64
		err := c.timed("outbox_cursor", func() (err error) {
			cursor, err = c.st.OutboxCursor(ctx, sink)
			return err
		})
		if err != nil {
			ch <- prometheus.NewInvalidMetric(descOutboxBacklog, err)
			continue
		}
		ch <- prometheus.MustNewConstMetric(descOutboxBacklog, prometheus.GaugeValue, float64(max(newest-cursor, 0)), sink)
	}
}

// timed runs fn and records its duration as op.
func (c *storeCollector) timed(op string, fn func() error) error {
	start := time.Now()
	err := fn()
	c.m.storeQuery.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if err != nil {
		return fmt.Errorf("metrics scrape: %s: %w", op, err)
	}
	return nil
}

// leaseKind is the part of a lease name before its first colon: shard,
// singleton or gateway.
func leaseKind(name string) string {
	kind, _, _ := strings.Cut(name, ":")
	return kind
}
