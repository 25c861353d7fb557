package tests

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestLifetimesWatched (issue 35, item 3) with a real serve (embedded
// SQLite): /metrics has an expiry series for each CA and certificate kind;
// doctor names each CA with the end date /metrics gives; an API token made
// to live 3 days is announced by a token.expiring event, once, and counted
// by bettercompute_api_tokens_expiring.
func TestLifetimesWatched(t *testing.T) {
	t.Parallel()
	const bearer = "metrics-token-0123456789"
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{host: "  metrics:\n    bearerToken: " + bearer + "\n"})
	scrape := func() string { t.Helper(); return scrapeMetrics(t, d.api, bearer) }
	text := scrape()
	expiry := func(kind, use string) (time.Time, bool) { return expirySeries(text, kind, use) }
	for _, s := range [][2]string{{"ca", "node"}, {"ca", "gateway"}, {"ca", "internal"}, {"serving", "gateway"}} {
		if end, ok := expiry(s[0], s[1]); !ok || !end.After(time.Now()) {
			t.Errorf("/metrics: no future expiry for kind=%q use=%q (%v)", s[0], s[1], end)
		}
	}
	nodeCA, ok := expiry("ca", "node")
	if !ok {
		t.Fatalf("/metrics has no node CA expiry:\n%s", text)
	}

	// Doctor names each CA with its end date (the warn and fail windows
	// are judged by the database's clock, which no test build moves:
	// controlplane/doctor sees them with an injected one, TestLifetimeWindows
	// with short lifetimes).
	_, checks := doctorRun(t, d)
	for id, name := range map[string]string{"pki.node-ca": "node CA", "pki.gateway-ca": "gateway CA", "pki.internal-ca": "internal CA"} {
		c, ok := checks[id]
		if !ok || c.Status != "ok" || !regexp.MustCompile(`the `+name+` ends on \d{4}-\d{2}-\d{2}`).MatchString(c.Hint) {
			t.Errorf("doctor %s: %+v, want ok naming the %s and its end date", id, c, name)
		}
	}
	if c := checks["pki.node-ca"]; !strings.Contains(c.Hint, nodeCA.Format("2006-01-02")) {
		t.Errorf("doctor pki.node-ca %q does not name the end /metrics gives (%s)", c.Hint, nodeCA.Format("2006-01-02"))
	}

	// A token made to live 3 days: token.expiring, once, and the gauge.
	var created struct {
		APIToken struct {
			ID string `json:"id"`
		} `json:"apiToken"`
	}
	d.cliJSON(&created, "tokens", "create", "--role", "viewer", "--ttl", "72h")
	tok := created.APIToken
	if tok.ID == "" {
		t.Fatal("tokens create gave no id")
	}
	var events struct {
		Events []struct {
			Subject string `json:"subject"`
		} `json:"events"`
	}
	eventually(t, 3*time.Minute, func() bool {
		d.cliJSON(&events, "events", "list", "--type", "token.expiring")
		return len(events.Events) > 0
	}, func() string { return "no token.expiring event for " + tok.ID })
	if len(events.Events) != 1 || events.Events[0].Subject != tok.ID {
		t.Errorf("token.expiring events: %+v, want one naming %s", events.Events, tok.ID)
	}
	eventually(t, 60*time.Second, func() bool {
		text = scrape()
		return strings.Contains(text, "\nbettercompute_api_tokens_expiring 1\n")
	}, func() string {
		return fmt.Sprintf("bettercompute_api_tokens_expiring is not 1:\n%s", grepLines(text, "api_token"))
	})
}

// TestLifetimeWindows (issue 35, item 3) with short lifetimes on a real
// serve (PostgreSQL, the operator's own PKI): a node CA with 60 days left,
// a gateway CA with 20 and an internal CA with ten years are reported by
// doctor as warn, fail and ok, each naming the CA and the end date /metrics
// gives; a gateway certificate issued for 10 days warns, re-issued for 3
// days fails, and /metrics follows the file; an API token made to live 3
// days warns in iam.token-expiry.
func TestLifetimeWindows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const bearer = "metrics-token-windows-0123456789"
	now := time.Now().UTC()
	var certDir string
	var b *pki.Bundle
	d := newDeploymentWith(t, backendPostgres, deploymentConfig{
		host: "  metrics:\n    bearerToken: " + bearer + "\n",
		pki: func(d *deployment) string {
			if code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, "migrate"); code != 0 {
				t.Fatalf("better-compute migrate: exit %d\n%s%s", code, stdout, stderr)
			}
			// One bundle of three CAs made with three lives.
			made := map[time.Duration]*pki.Bundle{}
			for _, life := range []time.Duration{60 * 24 * time.Hour, 20 * 24 * time.Hour, 0} {
				var err error
				if made[life], err = pki.Init(pki.InitOptions{TrustDomain: e2eTrustDomain, Now: now, Validity: life}); err != nil {
					t.Fatal(err)
				}
			}
			b = &pki.Bundle{TrustDomain: e2eTrustDomain, NodeCA: made[60*24*time.Hour].NodeCA,
				GatewayCA: made[20*24*time.Hour].GatewayCA, InternalCA: made[0].InternalCA}
			sealed, err := b.SealBundle(testSecret)
			if err != nil {
				t.Fatal(err)
			}
			st, err := backend.Open(ctx, d.dbURL, "")
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if err := st.PKIBundleCreate(ctx, &store.PKIBundle{TrustDomain: e2eTrustDomain, Sealed: sealed}); err != nil {
				t.Fatal(err)
			}
			certDir = t.TempDir()
			issueGateway(t, d, certDir, 240*time.Hour)
			return fmt.Sprintf("    tlsFiles:\n      cert: %s\n      key: %s\n",
				filepath.Join(certDir, "gateway.crt"), filepath.Join(certDir, "gateway.key"))
		},
	})

	// The CAs: doctor's windows, each naming the CA and its end date, the
	// same end as /metrics.
	text := scrapeMetrics(t, d.api, bearer)
	code, checks := doctorRun(t, d)
	for _, c := range []struct {
		id, name, use, status, says string
		end                         time.Time
	}{
		{"pki.node-ca", "node CA", "node", "warn", "plan its rotation", b.NodeCA.Cert.NotAfter},
		{"pki.gateway-ca", "gateway CA", "gateway", "fail", "rotate it now", b.GatewayCA.Cert.NotAfter},
		{"pki.internal-ca", "internal CA", "internal", "ok", "", b.InternalCA.Cert.NotAfter},
	} {
		date := c.end.UTC().Format("2006-01-02")
		if got := checks[c.id]; got.Status != c.status || !strings.Contains(got.Hint, "the "+c.name+" ends on "+date) || !strings.Contains(got.Hint, c.says) {
			t.Errorf("doctor %s: %+v, want %s naming the %s, its end %s and %q", c.id, got, c.status, c.name, date, c.says)
		}
		if end, ok := expirySeries(text, "ca", c.use); !ok || end.Unix() != c.end.Unix() {
			t.Errorf("/metrics kind=ca use=%s: %v (found %v), want %v", c.use, end, ok, c.end)
		}
	}
	if code == 0 {
		t.Errorf("doctor exited 0 with a failing check")
	}

	// The gateway certificate: 10 days left warns, 3 days fails; /metrics
	// reads the file at each scrape.
	for _, c := range []struct {
		ttl    time.Duration
		status string
	}{{240 * time.Hour, "warn"}, {72 * time.Hour, "fail"}} {
		if c.ttl != 240*time.Hour {
			issueGateway(t, d, certDir, c.ttl)
		}
		_, checks = doctorRun(t, d)
		if got := checks["host.gateway.identity"]; got.Status != c.status || !strings.Contains(got.Hint, "the gateway certificate ends in") {
			t.Errorf("doctor host.gateway.identity with %s left: %+v, want %s", c.ttl, got, c.status)
		}
		end, ok := expirySeries(scrapeMetrics(t, d.api, bearer), "serving", "gateway")
		if left := time.Until(end); !ok || left > c.ttl || left < c.ttl-time.Hour {
			t.Errorf("/metrics kind=serving use=gateway: %v (found %v), want about %s from now", end, ok, c.ttl)
		}
	}

	// A token made to live 3 days warns (made short on purpose, it never
	// fails).
	var created struct {
		APIToken struct {
			ID string `json:"id"`
		} `json:"apiToken"`
	}
	d.cliJSON(&created, "tokens", "create", "--role", "viewer", "--ttl", "72h")
	_, checks = doctorRun(t, d)
	if got := checks["iam.token-expiry"]; got.Status != "warn" || !strings.Contains(got.Hint, "1 API token(s) end within 7 days") {
		t.Errorf("doctor iam.token-expiry with %s ending in 3 days: %+v, want warn", created.APIToken.ID, got)
	}
}

// issueGateway issues the gateway certificate into dir with the CLI, valid
// for ttl.
func issueGateway(t *testing.T, d *deployment, dir string, ttl time.Duration) {
	t.Helper()
	args := []string{"pki", "issue-gateway", "--dns", "localhost", "--ip", "127.0.0.1", "--ttl", ttl.String(), "--out-dir", dir}
	if code, stdout, stderr := testenv.Run(t, d.env, "", d.bc, args...); code != 0 {
		t.Fatalf("better-compute %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
	}
}

// expirySeries is the time bettercompute_certificate_expiry_timestamp_seconds
// gives for kind and use in a scrape.
func expirySeries(text, kind, use string) (time.Time, bool) {
	m := regexp.MustCompile(`(?m)^bettercompute_certificate_expiry_timestamp_seconds\{kind="` + kind + `",use="` + use + `"\} (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return time.Time{}, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return time.Unix(int64(v), 0).UTC(), err == nil
}
