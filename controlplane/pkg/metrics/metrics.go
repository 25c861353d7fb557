package metrics

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Namespace prefixes every metric of the control plane.
const Namespace = "bettercompute"

// Reasons for bettercompute_gateway_refusals_total. Other values are
// counted as ReasonOther, so the label stays bounded.
const (
	// ReasonTLS: the TLS handshake failed (another CA, an old TLS version).
	ReasonTLS = "tls"
	// ReasonNoCertificate: Connect, Renew or Secret without a client
	// certificate.
	ReasonNoCertificate = "no_certificate"
	// ReasonUntrusted: a client certificate that does not verify.
	ReasonUntrusted = "untrusted"
	// ReasonRevoked: a revoked certificate or node.
	ReasonRevoked = "revoked"
	// ReasonUnknownNode: a certificate naming a node the deployment lacks.
	ReasonUnknownNode = "unknown_node"
	// ReasonFull: the gateway holds MaxStreams sessions.
	ReasonFull = "full"
	// ReasonDraining: the gateway is shutting down.
	ReasonDraining = "draining"
	// ReasonHelloTimeout: no Hello within the gateway's limit.
	ReasonHelloTimeout = "hello_timeout"
	// ReasonProtocol: a malformed first message.
	ReasonProtocol = "protocol"
	// ReasonJoinToken: Join refused for its token (unknown, expired,
	// revoked, used up, malformed).
	ReasonJoinToken = "join_token"
	// ReasonJoinRate: Join refused for its source address's rate
	// (RESOURCE_EXHAUSTED).
	ReasonJoinRate = "join_rate"
	// ReasonUnavailable: the gateway could not reach the database.
	ReasonUnavailable = "unavailable"
	// ReasonOther: anything else.
	ReasonOther = "other"
)

var reasons = map[string]bool{ReasonTLS: true, ReasonNoCertificate: true, ReasonUntrusted: true, ReasonRevoked: true,
	ReasonUnknownNode: true, ReasonFull: true, ReasonDraining: true, ReasonHelloTimeout: true, ReasonProtocol: true,
	ReasonJoinToken: true, ReasonJoinRate: true, ReasonUnavailable: true, ReasonOther: true}

// Store is what the scrape reads.
type Store interface {
	Ping(ctx context.Context) error
	GatewayList(ctx context.Context) ([]*store.Gateway, error)
	LeaseList(ctx context.Context, prefix string) ([]*store.Lease, error)
	OutboxMaxID(ctx context.Context) (int64, error)
	OutboxCursor(ctx context.Context, sink string) (int64, error)
	OutboxQuery(ctx context.Context, p *store.OutboxQueryParams) ([]*store.OutboxEntry, error)
	NodeCounts(ctx context.Context) ([]*store.NodeCount, error)
	NodeList(ctx context.Context, p *store.NodeListParams) ([]*store.Node, error)
}

// Config configures Metrics.
type Config struct {
	// Sinks are the names of the configured event sinks, whose outbox
	// backlog is reported. Defaults to none.
	Sinks []string
	// ScrapeTimeout bounds the database reads of one scrape. Defaults to
	// 5 s.
	ScrapeTimeout time.Duration
	// GatewayLiveWithin is how fresh a gateways row must be for its
	// sessions to be reported. Defaults to 30 s (the gateway lease lives
	// 20 s; the row is refreshed every 5 s).
	GatewayLiveWithin time.Duration
	// Now is the clock lease expiry and gateway freshness are judged by.
	// Defaults to time.Now.
	Now func() time.Time
	// Log receives scrape errors. Defaults to discarding them.
	Log *slog.Logger
	// Version and Commit label bettercompute_build_info. Default to
	// "unknown".
	Version, Commit string
	// GPUCacheTTL is how long a count of the GPUs by health is reused:
	// counting reads every node's inventory. Defaults to 30 s.
	GPUCacheTTL time.Duration
	// Breaker is remediation.breaker (its window and limit for the
	// bettercompute_remediation_breaker_* series).
	Breaker config.RemediationBreaker
	// CertFiles are the serving certificates whose expiry is reported, by
	// use ("api", "gateway"): PEM files, the leaf first. Defaults to none.
	CertFiles map[string]string
	// Secret is the deployment secret, to open the PKI bundle whose CAs'
	// expiry is reported. Empty: the CAs' series are invalid (logged).
	Secret string
	// LifetimeCacheTTL is how long a read of the lifetimes (the CAs, the
	// earliest node certificate, the API tokens' expiry) is reused.
	// Defaults to 30 s.
	LifetimeCacheTTL time.Duration
}

// Metrics holds the control plane's collectors on a private registry. Its
// methods are safe for concurrent use and do nothing on a nil *Metrics.
type Metrics struct {
	cfg Config
	reg *prometheus.Registry

	handshakes   *prometheus.CounterVec
	opened       *prometheus.CounterVec
	refusals     *prometheus.CounterVec
	heartbeatLag *prometheus.HistogramVec
	clockSkew    *prometheus.GaugeVec
	finished     *prometheus.CounterVec
	dispatch     prometheus.Histogram
	storeQuery   *prometheus.HistogramVec
	apiUnauth    *prometheus.CounterVec
	wakeups      *prometheus.CounterVec
	acceptErrors *prometheus.CounterVec
	xidsNoAct    *prometheus.CounterVec
	drifting     *prometheus.GaugeVec

	certMu    sync.Mutex
	certFiles map[certKey]string // kind and use → PEM file, for the expiry series
}

// New returns Metrics reading the deployment-wide series from st at each
// scrape (st may be nil: those series are then left out).
func New(cfg Config, st Store) *Metrics {
	cfg.ScrapeTimeout = cmp.Or(cfg.ScrapeTimeout, 5*time.Second)
	cfg.GatewayLiveWithin = cmp.Or(cfg.GatewayLiveWithin, 30*time.Second)
	cfg.GPUCacheTTL = cmp.Or(cfg.GPUCacheTTL, 30*time.Second)
	cfg.LifetimeCacheTTL = cmp.Or(cfg.LifetimeCacheTTL, 30*time.Second)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m := &Metrics{cfg: cfg, reg: prometheus.NewRegistry()}
	m.handshakes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "gateway", Name: "handshakes_total",
		Help: "TLS handshakes the gateway completed.",
	}, []string{"gateway"})
	m.opened = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "gateway", Name: "sessions_opened_total",
		Help: "Sessions the gateway opened (Welcome sent), by whether the node was reconnecting (its Hello resumed an earlier session: reconnect=\"true\") or connecting afresh.",
	}, []string{"gateway", "reconnect"})
	m.refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "gateway", Name: "refusals_total",
		Help: "Handshakes, joins and sessions the gateway refused, by reason.",
	}, []string{"gateway", "reason"})
	m.heartbeatLag = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Subsystem: "gateway", Name: "heartbeat_lag_seconds",
		Help:    "How late each heartbeat arrived: the time since the session's previous heartbeat less the heartbeat interval, 0 when on time.",
		Buckets: []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60},
	}, []string{"gateway"})
	m.clockSkew = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: "gateway", Name: "node_clock_skew_max_seconds",
		Help: "The largest node clock skew, either way, among the gateway's sessions, measured from their heartbeats; 0 when none was measured. Past host.gateway.clockSkewLimit (5 min) a node is clock-skewed.",
	}, []string{"gateway"})
	m.finished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "commands", Name: "finished_total",
		Help: "Commands that reached a terminal state, by kind and state.",
	}, []string{"kind", "state"})
	m.dispatch = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: Namespace, Subsystem: "command", Name: "dispatch_latency_seconds",
		Help:    "Time from a command's creation to its dispatch to the node.",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	})
	m.storeQuery = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Subsystem: "store", Name: "query_duration_seconds",
		Help:    "Duration of database queries: those each scrape makes, and those components report, by operation.",
		Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5},
	}, []string{"op"})
	m.apiUnauth = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "api", Name: "unauthenticated_total",
		Help: "API calls refused for their token (none, unknown, expired, revoked, or from a denied address), by reason; summarised in the audit log at most once a minute.",
	}, []string{"reason"})
	m.wakeups = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "gateway", Name: "wakeups_total",
		Help: "Dispatch wake-ups a gateway received, by source: internal (the internal control API, for a node with a session there) or bus (in-process or LISTEN/NOTIFY).",
	}, []string{"gateway", "source"})
	m.acceptErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "listener", Name: "accept_errors_total",
		Help: "Failed accepts of the process's listeners (gateway, gateway_websocket, api, internal_api, metrics), each followed by a back-off of 5 ms doubling to 1 s; /readyz answers not ready while one has failed for more than 10 s in a row.",
	}, []string{"listener"})
	m.xidsNoAct = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "gpu", Name: "xids_no_action_total",
		Help: "XIDs nodes reported that act on nothing (resolution IGNORE or RESTART_APP; XID 154, informational, is sent as IGNORE), by code: 0-999, else other.",
	}, []string{"code"})
	m.drifting = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "nodes_drifting",
		Help: "Nodes whose driver or CUDA version differs from their pool's, by pool, as the drift job of this process last counted them (docs/gpu-health.md, \"Drift\").",
	}, []string{"pool"})
	m.reg.MustRegister(m.handshakes, m.opened, m.refusals, m.heartbeatLag, m.clockSkew, m.finished, m.dispatch, m.storeQuery, m.apiUnauth, m.wakeups, m.acceptErrors, m.xidsNoAct, m.drifting,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo(cfg.Version, cfg.Commit))
	if st != nil {
		m.reg.MustRegister(&storeCollector{m: m, st: st}, &fleetCollector{m: m, st: st})
		if rs, ok := st.(RemediationStore); ok {
			m.reg.MustRegister(&remediationCollector{m: m, st: rs, breaker: cfg.Breaker.WithDefaults()})
		}
		if gs, ok := st.(GPUIncidentStore); ok {
			m.reg.MustRegister(&gpuIncidentCollector{m: m, st: gs})
		}
		lc := &lifetimeCollector{m: m}
		if ls, ok := st.(LifetimeStore); ok {
			lc.st = ls
			for _, op := range lifetimeOps {
				m.storeQuery.WithLabelValues(op)
			}
		}
		m.reg.MustRegister(lc)
		// The scrape observes its queries while the registry gathers, in no
		// set order: made now, their series are there from the first scrape.
		for _, op := range append(scrapeOps, fleetOps...) {
			m.storeQuery.WithLabelValues(op)
		}
	} else {
		m.reg.MustRegister(&fleetCollector{m: m}, &lifetimeCollector{m: m})
	}
	m.certFiles = map[certKey]string{}
	for use, file := range cfg.CertFiles {
		m.certFiles[certKey{CertKindServing, use}] = file
	}
	return m
}

// certKey is the kind and use labels of a watched certificate file.
type certKey struct{ kind, use string }

// WatchCertificate reports the expiry of the certificate in the PEM file
// (leaf first) as bettercompute_certificate_expiry_timestamp_seconds with
// labels kind (CertKindServing, CertKindInternal) and use ("api",
// "gateway"; "server", "client"), read at each scrape.
func (m *Metrics) WatchCertificate(kind, use, file string) {
	if m == nil || file == "" {
		return
	}
	m.certMu.Lock()
	defer m.certMu.Unlock()
	m.certFiles[certKey{kind, use}] = file
}

// Registry returns the private registry, for more collectors or for tests.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus text format (or OpenMetrics
// when the scraper asks for it). A failed database read leaves its series out
// of that scrape and is logged; the rest is served.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:          errorLog{m.cfg.Log},
		ErrorHandling:     promhttp.ContinueOnError,
		Timeout:           m.cfg.ScrapeTimeout + time.Second,
		EnableOpenMetrics: true,
	})
}

// Handshake counts a TLS handshake gateway completed.
func (m *Metrics) Handshake(gateway string) {
	if m == nil {
		return
	}
	m.handshakes.WithLabelValues(gateway).Inc()
}

// SessionOpened counts a session gateway opened; reconnect is whether the
// node's Hello resumed an earlier session (a reconnect after a loss).
func (m *Metrics) SessionOpened(gateway string, reconnect bool) {
	if m == nil {
		return
	}
	m.opened.WithLabelValues(gateway, strconv.FormatBool(reconnect)).Inc()
}

// Refused counts a refusal by gateway for reason, one of the Reason
// constants (others count as ReasonOther).
func (m *Metrics) Refused(gateway, reason string) {
	if m == nil {
		return
	}
	if !reasons[reason] {
		reason = ReasonOther
	}
	m.refusals.WithLabelValues(gateway, reason).Inc()
}

// APIUnauthenticated counts an API call refused for its token; reason is
// one of no_token, unknown_token, expired, revoked, address_denied,
// tenant_stopped (others
// count as "other", so the label stays bounded).
func (m *Metrics) APIUnauthenticated(reason string) {
	if m == nil {
		return
	}
	switch reason {
	case "no_token", "unknown_token", "expired", "revoked", "address_denied", "tenant_stopped":
	default:
		reason = ReasonOther
	}
	m.apiUnauth.WithLabelValues(reason).Inc()
}

// HeartbeatReceived records a heartbeat that arrived since after the
// session's previous one, on a gateway telling daemons interval: its lag
// is since − interval, 0 when on time.
func (m *Metrics) HeartbeatReceived(gateway string, since, interval time.Duration) {
	if m == nil {
		return
	}
	m.heartbeatLag.WithLabelValues(gateway).Observe(max(since-interval, 0).Seconds())
}

// CommandFinished counts a command of kind that reached terminal state
// (succeeded, failed, cancelled, expired or lost). Call it only when the
// state was recorded (CommandFinish returned ok), so that duplicates of a
// result are not counted.
func (m *Metrics) CommandFinished(kind, state string) {
	if m == nil {
		return
	}
	if !store.IsTerminal(state) {
		state = ReasonOther
	}
	m.finished.WithLabelValues(kind, state).Inc()
}

// DispatchLatency records the time d from a command's creation to its
// dispatch to the node.
func (m *Metrics) DispatchLatency(d time.Duration) {
	if m == nil {
		return
	}
	m.dispatch.Observe(max(d, 0).Seconds())
}

// Wakeup counts a dispatch wake-up of gateway from source ("internal" or
// "bus"; others count as "other", so the label stays bounded).
func (m *Metrics) Wakeup(gateway, source string) {
	if m == nil {
		return
	}
	if source != "internal" && source != "bus" {
		source = ReasonOther
	}
	m.wakeups.WithLabelValues(gateway, source).Inc()
}

// AcceptError counts a failed accept of the named listener
// (internal/accept's Metrics).
func (m *Metrics) AcceptError(listener string) {
	if m == nil {
		return
	}
	m.acceptErrors.WithLabelValues(listener).Inc()
}

// StoreQuery records a database operation op (a short fixed name, such as
// "heartbeat_flush") that took d.
func (m *Metrics) StoreQuery(op string, d time.Duration) {
	if m == nil {
		return
	}
	m.storeQuery.WithLabelValues(op).Observe(d.Seconds())
}

// errorLog adapts slog to promhttp's logger.
type errorLog struct{ log *slog.Logger }

func (l errorLog) Println(v ...any) {
	l.log.Warn("Metrics scrape incomplete", logkey.Err, v)
}

// maxXIDLabel is the largest XID code that is its own label value of
// bettercompute_gpu_xids_no_action_total; larger ones are "other", so that
// a node cannot grow the series without bound (NVIDIA's codes are below
// 200 today).
const maxXIDLabel = 999

// XIDNoAction counts one XID a node reported that acts on nothing (its
// resolution IGNORE or RESTART_APP), by code (issue 32: codes that do not
// act are counted, not acted on). The label is the code, not the GPU, to
// keep the series bounded; the GPU is in the event.
func (m *Metrics) XIDNoAction(code uint32) {
	if m == nil {
		return
	}
	label := "other"
	if code <= maxXIDLabel {
		label = strconv.FormatUint(uint64(code), 10)
	}
	m.xidsNoAct.WithLabelValues(label).Inc()
}

// NodesDrifting reports the drift job's count of drifting nodes per pool
// (pool id → nodes; package drift), replacing the previous round's.
func (m *Metrics) NodesDrifting(counts map[string]int) {
	if m == nil {
		return
	}
	m.drifting.Reset()
	for pool, n := range counts {
		m.drifting.WithLabelValues(pool).Set(float64(n))
	}
}

// ClockSkewMax reports the largest node clock skew, either way, among
// gateway's sessions (0 when none was measured).
func (m *Metrics) ClockSkewMax(gateway string, d time.Duration) {
	if m == nil {
		return
	}
	m.clockSkew.WithLabelValues(gateway).Set(d.Seconds())
}
