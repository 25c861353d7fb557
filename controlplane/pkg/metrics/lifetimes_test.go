package metrics_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/metrics"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// TestLifetimeSeries: the expiry series of the CAs (from the sealed bundle
// in the database), of the fleet's earliest node certificate among
// connected nodes, and of the API tokens (the count within 7 days, always,
// and the earliest), read at most every LifetimeCacheTTL by the injected
// clock.
func TestLifetimeSeries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	const secret = "metrics-lifetimes-secret-0123456789abcdef"
	now := time.Now().UTC().Truncate(time.Second)
	clock := now
	m := metrics.New(metrics.Config{Secret: secret, LifetimeCacheTTL: time.Minute, Now: func() time.Time { return clock }}, st)

	// Before pki init, with no node and no token: the token count only.
	text := scrape(t, m)
	has(t, text, "bettercompute_api_tokens_expiring 0")
	if strings.Contains(text, "bettercompute_certificate_expiry_timestamp_seconds{") || strings.Contains(text, "bettercompute_api_token_expiry_timestamp_seconds ") {
		t.Fatalf("expiry series without a bundle, node or token:\n%s", text)
	}

	// A bundle whose CAs live 60 days, two connected nodes and an
	// unreachable one, tokens within and beyond the week.
	b, err := pki.Init(pki.InitOptions{TrustDomain: "lifetimes.test", Now: now, Validity: 60 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := b.SealBundle(secret)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PKIBundleCreate(ctx, &store.PKIBundle{TrustDomain: b.TrustDomain, Sealed: sealed}); err != nil {
		t.Fatal(err)
	}
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct {
		id    string
		left  time.Duration
		state string
	}{{"node_a", 20 * time.Hour, store.NodeReady}, {"node_b", 9 * time.Hour, store.NodeReady}, {"node_c", -72 * time.Hour, store.NodeUnreachable}} {
		na := now.Add(n.left)
		if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: n.id, PoolID: pool.ID, Hostname: n.id, MachineID: n.id, CertSerial: "01", CertNotAfter: &na}); err != nil {
			t.Fatal(err)
		}
		if err := st.NodeSetState(ctx, n.id, n.state); err != nil {
			t.Fatal(err)
		}
	}
	for id, left := range map[string]time.Duration{"tok_a": 2 * 24 * time.Hour, "tok_b": 30 * 24 * time.Hour} {
		exp := now.Add(left)
		if err := st.APITokenCreate(ctx, &store.APIToken{ID: id, Role: store.RoleViewer, ExpiresAt: &exp}, []byte(id)); err != nil {
			t.Fatal(err)
		}
	}
	// Within the cache's minute the first read stands.
	clock = now.Add(59 * time.Second)
	has(t, scrape(t, m), "bettercompute_api_tokens_expiring 0")

	clock = now.Add(time.Minute)
	text = scrape(t, m)
	has(t, text, "bettercompute_api_tokens_expiring 1")
	for series, want := range map[string]time.Time{
		`bettercompute_certificate_expiry_timestamp_seconds{kind="ca",use="node"}`:       b.NodeCA.Cert.NotAfter,
		`bettercompute_certificate_expiry_timestamp_seconds{kind="ca",use="gateway"}`:    b.GatewayCA.Cert.NotAfter,
		`bettercompute_certificate_expiry_timestamp_seconds{kind="ca",use="internal"}`:   b.InternalCA.Cert.NotAfter,
		`bettercompute_certificate_expiry_timestamp_seconds{kind="node",use="earliest"}`: now.Add(9 * time.Hour),
		`bettercompute_api_token_expiry_timestamp_seconds`:                               now.Add(2 * 24 * time.Hour),
	} {
		if got, ok := value(text, series); !ok || int64(got) != want.Unix() {
			t.Errorf("%s = %v (found %v), want %d", series, got, ok, want.Unix())
		}
	}
	if !strings.Contains(text, `bettercompute_store_query_duration_seconds_count{op="node_cert_earliest"}`) {
		t.Errorf("the lifetime queries are not timed:\n%s", text)
	}

	// Opened with another secret, the CA series is left out (and logged);
	// the rest is served.
	other := metrics.New(metrics.Config{Secret: "another-secret-0123456789abcdefghijkl"}, st)
	text = scrape(t, other)
	if strings.Contains(text, `kind="ca"`) {
		t.Errorf("CA series from a bundle that did not open:\n%s", text)
	}
	has(t, text, "bettercompute_api_tokens_expiring 1")
}

// TestWatchedCertificateKinds: the certificate files a process watches
// carry their kind and use.
func TestWatchedCertificateKinds(t *testing.T) {
	t.Parallel()
	b, err := pki.Init(pki.InitOptions{TrustDomain: "files.test"})
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, err := b.IssueGateway([]string{"localhost"}, nil, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "gateway.crt")
	if err := os.WriteFile(file, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	m := metrics.New(metrics.Config{}, nil)
	m.WatchCertificate(metrics.CertKindServing, "gateway", file)
	m.WatchCertificate(metrics.CertKindInternal, "client", file)
	text := scrape(t, m)
	for _, l := range []string{`{kind="serving",use="gateway"}`, `{kind="internal",use="client"}`} {
		if !strings.Contains(text, "bettercompute_certificate_expiry_timestamp_seconds"+l) {
			t.Errorf("exposition lacks the %s series:\n%s", l, text)
		}
	}
}

// value is the value of series (its name and labels as exposed) in text.
func value(text, series string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f, true
			}
		}
	}
	return 0, false
}
