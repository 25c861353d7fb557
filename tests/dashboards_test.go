package tests

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/tests/testenv"
)

// metricName matches the control plane's metric names in PromQL.
var metricName = regexp.MustCompile(`\bbettercompute_[a-z0-9_]+`)

// alertsFile and dashboardFile ship in packaging/.
var (
	alertsFile    = filepath.Join("..", "packaging", "prometheus", "alerts.yml")
	dashboardFile = filepath.Join("..", "packaging", "grafana", "better-compute.json")
)

// TestAlertRules: promtool (Debian's prometheus package) accepts
// packaging/prometheus/alerts.yml, and each of the alerts the issue names
// is there.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not found (Debian: apt-get install prometheus); under CI=true a missing dependency is a failure")
		}
		t.Skip("promtool not found (Debian: apt-get install prometheus)")
	}
	out, err := exec.Command(promtool, "check", "rules", alertsFile).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", alertsFile, err, out)
	}
	b, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, alert := range []string{"BetterComputeNodesUnreachable", "BetterComputeGPUFailed", "BetterComputeOutboxLag",
		"BetterComputeSweeperStalled", "BetterComputeGatewayNearMaxStreams", "BetterComputeCertificateExpiring",
		"BetterComputeCAExpiring", "BetterComputeCAExpiringSoon", "BetterComputeNodeCertificateNotRenewed", "BetterComputeAPITokensExpiring"} {
		if !strings.Contains(string(b), "alert: "+alert+"\n") {
			t.Errorf("%s has no alert %s", alertsFile, alert)
		}
	}
	t.Logf("promtool: %s", strings.TrimSpace(string(out)))
}

// queriedMetrics are the bettercompute_* names the dashboard's panels and
// the alert rules query.
func queriedMetrics(t *testing.T) (dashboard, alerts []string) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			dashboard = append(dashboard, metricName.FindAllString(tg.Expr, -1)...)
		}
	}
	b, err = os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if expr, ok := strings.CutPrefix(strings.TrimSpace(line), "expr:"); ok {
			alerts = append(alerts, metricName.FindAllString(expr, -1)...)
		}
	}
	slices.Sort(dashboard)
	slices.Sort(alerts)
	return slices.Compact(dashboard), slices.Compact(alerts)
}

// scrapeNames fetches url with the bearer token and returns the names of
// the series it serves.
func scrapeNames(t *testing.T, url, token string) map[string]bool {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, res.StatusCode, b)
	}
	names := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		names[name] = true
	}
	return names
}

// TestDashboardMetricsExist, on both backends: a real serve (every role
// in one process) with a metrics token and a file sink, a FakeDaemon joined
// (its GPUs and heartbeats), made to do what the panels count (a command
// runs, an API call is refused for its token, gateway handshakes fail), and
// every metric the Grafana dashboard and the alert rules query is served by
// its /metrics.
func TestDashboardMetricsExist(t *testing.T) {
	t.Parallel()
	forEachBackend(t, testDashboardMetricsExist)
}

func testDashboardMetricsExist(t *testing.T, backend string) {
	const token = "dashboard-metrics-token-0123"
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := newDeploymentWith(t, backend, deploymentConfig{
		host:    fmt.Sprintf("  metrics:\n    bearerToken: %s\n", token),
		gateway: "    heartbeatInterval: 1s\n",
		top:     fmt.Sprintf("sinks:\n  files:\n    - name: archive\n      path: %s\n", filepath.Join(t.TempDir(), "events.jsonl")),
	})

	tokenFile, _ := d.joinToken(1, time.Hour)
	fd, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: "dashboard-sim-01", Session: session.Config{StartJitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fd.Join(ctx, d.gatewayURL, strings.TrimSpace(readFile(t, tokenFile))); err != nil {
		t.Fatal(err)
	}
	simCtx, stopSim := context.WithCancel(ctx)
	simDone := make(chan error, 1)
	go func() { simDone <- fd.Run(simCtx) }()
	t.Cleanup(func() { stopSim(); <-simDone })
	eventually(t, 30*time.Second, func() bool { return d.nodes()[fd.NodeID()].State == "ready" },
		func() string { return fmt.Sprintf("node %s is %+v, want ready", fd.NodeID(), d.nodes()[fd.NodeID()]) })

	cmd := d.runNoWait(fd.NodeID(), nil, "true")
	eventually(t, 30*time.Second, func() bool { return d.command(cmd).State == "succeeded" },
		func() string { return fmt.Sprintf("command %s: %+v", cmd, d.command(cmd)) })
	if code, _ := testenv.Get(t, d.api+"/api/events/watch"); code != http.StatusUnauthorized {
		t.Fatalf("events/watch without a token = %d, want 401", code)
	}
	// A client that speaks no TLS: a refused handshake.
	if c, err := net.Dial("tcp", d.gwAddr); err == nil {
		_, _ = c.Write([]byte("not tls\r\n\r\n"))
		_, _ = io.ReadAll(c)
		c.Close()
	}
	// And one whose certificate the gateway does not know.
	if c, err := tls.Dial("tcp", d.gwAddr, &tls.Config{InsecureSkipVerify: true}); err == nil {
		c.Close()
	}

	dashboard, alerts := queriedMetrics(t)
	var missing []string
	eventually(t, 30*time.Second, func() bool {
		names := scrapeNames(t, d.api+"/metrics", token)
		missing = missing[:0]
		for _, n := range slices.Concat(dashboard, alerts) {
			if !names[n] {
				missing = append(missing, n)
			}
		}
		return len(missing) == 0
	}, func() string { return fmt.Sprintf("/metrics of a running serve (%s) lacks %v", backend, missing) })
	t.Logf("%s: the dashboard queries %d metrics, the alert rules %d: all served", backend, len(dashboard), len(alerts))
}

// TestMetricsListener: on PostgreSQL, a worker-only process and a
// gateway-only process serve /metrics on host.metrics.listen behind the
// bearer token (401 without it), with their own series and the build info.
func TestMetricsListener(t *testing.T) {
	t.Parallel()
	const token = "listener-metrics-token-0123"
	url := pgtest.URL(t)
	env := []string{"BETTER_COMPUTE_DATABASE_URL=" + url, "BETTER_COMPUTE_SECRET=" + testSecret}
	pkiCfg := initPostgresPKI(t, env)
	for _, tc := range []struct {
		roles string
		want  []string
	}{
		{"controllers,sinks,iam", []string{"bettercompute_build_info", "bettercompute_singleton_held", "bettercompute_nodes", "go_goroutines"}},
		{"gateway", []string{"bettercompute_build_info", "bettercompute_gateway_sessions", "bettercompute_certificate_expiry_timestamp_seconds"}},
	} {
		port := freePort(t)
		cfg := serveConfig + pkiCfg + fmt.Sprintf("  metrics:\n    bearerToken: %s\n    listen: 127.0.0.1:%d\n", token, port)
		bin := testenv.Binary(t, "better-compute")
		p := testenv.Start(t, env, bin, "serve", "--config", testenv.WriteFile(t, "metrics-"+tc.roles+".yaml", cfg), "--roles", tc.roles)
		p.WaitLine(`msg="Metrics listening" addr=127\.0\.0\.1:`+fmt.Sprint(port), 60*time.Second)
		metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
		if code, _ := testenv.Get(t, metricsURL); code != http.StatusUnauthorized {
			t.Fatalf("%s: /metrics without the token = %d, want 401", tc.roles, code)
		}
		eventually(t, 30*time.Second, func() bool {
			names := scrapeNames(t, metricsURL, token)
			for _, n := range tc.want {
				if !names[n] {
					return false
				}
			}
			return true
		}, func() string { return fmt.Sprintf("%s: /metrics lacks one of %v", tc.roles, tc.want) })
	}
}
