package metrics

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Kinds of bettercompute_certificate_expiry_timestamp_seconds (label kind).
const (
	// CertKindCA is a CA of the deployment's bundle; use node, gateway or
	// internal.
	CertKindCA = "ca"
	// CertKindServing is a serving certificate of this process; use api or
	// gateway.
	CertKindServing = "serving"
	// CertKindInternal is the internal control API's certificate
	// (host.gateway.internal.tlsFiles); use server (the gateway serves with
	// it) or client (the api presents it).
	CertKindInternal = "internal"
	// CertKindNode is the earliest node certificate of the nodes that hold
	// a session (ready, draining, clock-skewed); use earliest.
	CertKindNode = "node"
)

// NodeCertStates are the node states whose certificates the node series
// watches: a node in them is connected and renews by itself, so an end
// coming near means its renewal failed. Unreachable and powered-off nodes'
// certificates run out while they are away; they re-attest on return.
var NodeCertStates = []string{store.NodeReady, store.NodeDraining, store.NodeClockSkewed}

// LifetimeStore is what the lifetime series read: the sealed PKI bundle,
// the earliest node certificate and the API tokens' expiry, each one
// aggregate query.
type LifetimeStore interface {
	PKIBundleGet(ctx context.Context) (*store.PKIBundle, error)
	NodeCertEarliest(ctx context.Context, states []string) (*time.Time, error)
	APITokenExpiry(ctx context.Context, p *store.APITokenExpiryParams) (*store.APITokenExpiry, error)
}

var (
	descTokensExpiring = prometheus.NewDesc(Namespace+"_api_tokens_expiring",
		"Live API tokens (not revoked, not expired) that expire within 7 days; each is also announced once by a token.expiring event.", nil, nil)
	descTokenExpiry = prometheus.NewDesc(Namespace+"_api_token_expiry_timestamp_seconds",
		"The earliest expiry among live API tokens that have one (Unix time); absent when none has.", nil, nil)
)

// lifetimes is what one read of the database found, kept for
// LifetimeCacheTTL.
type lifetimes struct {
	cas      map[string]time.Time // use → the CA's NotAfter
	caErr    error
	node     *time.Time
	nodeErr  error
	tokens   *store.APITokenExpiry
	tokenErr error
}

// lifetimeOps name the lifetime collector's queries in
// bettercompute_store_query_duration_seconds.
var lifetimeOps = []string{"pki_bundle", "node_cert_earliest", "api_token_expiry"}

// lifetimeCollector reports the expiry of the certificate files this
// process watches, at each scrape, and of the CAs, the fleet's node
// certificates and the API tokens, read from the database at most every
// LifetimeCacheTTL (the bundle is opened with the deployment secret).
type lifetimeCollector struct {
	m  *Metrics
	st LifetimeStore // nil: the files only

	mu   sync.Mutex
	at   time.Time
	last *lifetimes
}

func (c *lifetimeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descCertExpiry
	ch <- descTokensExpiring
	ch <- descTokenExpiry
}

func (c *lifetimeCollector) Collect(ch chan<- prometheus.Metric) {
	c.certificates(ch)
	if c.st == nil {
		return
	}
	now := c.m.cfg.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil || now.Sub(c.at) >= c.m.cfg.LifetimeCacheTTL {
		ctx, cancel := context.WithTimeout(context.Background(), c.m.cfg.ScrapeTimeout)
		c.last, c.at = c.read(ctx, now), now
		cancel()
	}
	l := c.last
	switch {
	case l.caErr != nil:
		ch <- prometheus.NewInvalidMetric(descCertExpiry, l.caErr)
	default:
		for use, end := range l.cas {
			ch <- prometheus.MustNewConstMetric(descCertExpiry, prometheus.GaugeValue, float64(end.Unix()), CertKindCA, use)
		}
	}
	switch {
	case l.nodeErr != nil:
		ch <- prometheus.NewInvalidMetric(descCertExpiry, l.nodeErr)
	case l.node != nil:
		ch <- prometheus.MustNewConstMetric(descCertExpiry, prometheus.GaugeValue, float64(l.node.Unix()), CertKindNode, "earliest")
	}
	switch {
	case l.tokenErr != nil:
		ch <- prometheus.NewInvalidMetric(descTokensExpiring, l.tokenErr)
	default:
		ch <- prometheus.MustNewConstMetric(descTokensExpiring, prometheus.GaugeValue, float64(l.tokens.Within))
		if l.tokens.Earliest != nil {
			ch <- prometheus.MustNewConstMetric(descTokenExpiry, prometheus.GaugeValue, float64(l.tokens.Earliest.Unix()))
		}
	}
}

// read makes the three reads; a failed one is kept as its error.
func (c *lifetimeCollector) read(ctx context.Context, now time.Time) *lifetimes {
	l := &lifetimes{}
	timed := (&storeCollector{m: c.m}).timed
	l.caErr = timed("pki_bundle", func() error {
		row, err := c.st.PKIBundleGet(ctx)
		if errors.Is(err, store.ErrNotFound) {
			return nil // before pki init: no CA to report
		}
		if err != nil {
			return err
		}
		b, err := pki.OpenBundle(c.m.cfg.Secret, row.Sealed)
		if err != nil {
			return fmt.Errorf("open the PKI bundle: %w", err)
		}
		l.cas = map[string]time.Time{"node": b.NodeCA.Cert.NotAfter, "gateway": b.GatewayCA.Cert.NotAfter,
			"internal": b.InternalCA.Cert.NotAfter}
		return nil
	})
	l.nodeErr = timed("node_cert_earliest", func() (err error) {
		l.node, err = c.st.NodeCertEarliest(ctx, NodeCertStates)
		return err
	})
	l.tokenErr = timed("api_token_expiry", func() (err error) {
		l.tokens, err = c.st.APITokenExpiry(ctx, &store.APITokenExpiryParams{Within: iam.TokenExpiryWarning, Now: &now})
		return err
	})
	for _, err := range []error{l.caErr, l.nodeErr, l.tokenErr} {
		if err != nil {
			c.m.cfg.Log.Warn("Scrape: lifetimes", logkey.Err, err)
		}
	}
	return l
}
