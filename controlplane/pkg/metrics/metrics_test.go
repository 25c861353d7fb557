package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/better-compute/better-compute/controlplane/pkg/metrics"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// scrape returns the text exposition of m.
func scrape(t *testing.T, m *metrics.Metrics) string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("scrape: %d %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("content type %q", ct)
	}
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

func has(t *testing.T, text string, lines ...string) {
	t.Helper()
	for _, l := range lines {
		if !strings.Contains(text, l+"\n") {
			t.Errorf("exposition lacks %q", l)
		}
	}
}

func TestScrapeReadsTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	now := time.Now()
	stale := now.Add(-time.Hour)
	for _, g := range []struct {
		id       string
		sessions int
		at       time.Time
	}{{"gw-1", 95, now}, {"gw-2", 3, now}, {"gw-dead", 50, stale}} {
		if _, err := st.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: g.id, Region: "eu-1", Sessions: g.sessions, MaxStreams: 100, Now: &g.at}); err != nil {
			t.Fatal(err)
		}
	}
	// Three shards and the sweeper held by w1; shard:2 was taken over twice
	// (w1, then w2, then w1 after w2's lease expired); an expired singleton.
	acquire := func(name, holder string, at time.Time) {
		t.Helper()
		if _, ok, err := st.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: name, Holder: holder, TTL: 15 * time.Second, Now: &at}); err != nil || !ok {
			t.Fatalf("acquire %s for %s: %v %v", name, holder, ok, err)
		}
	}
	acquire("shard:0", "w1", now)
	acquire("shard:1", "w1", now)
	acquire("shard:2", "w1", now.Add(-2*time.Minute))
	acquire("shard:2", "w2", now.Add(-time.Minute))
	acquire("shard:2", "w1", now)
	acquire("singleton:command-sweeper", "w1", now)
	acquire("singleton:retention", "w2", stale)
	for range 5 {
		if _, err := st.OutboxInsert(ctx, "node.joined", "n", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	newest, _ := st.OutboxMaxID(ctx)
	if err := st.OutboxCursorSet(ctx, "hooks", newest-2); err != nil {
		t.Fatal(err)
	}

	m := metrics.New(metrics.Config{Sinks: []string{"hooks", "archive"}}, st)
	text := scrape(t, m)
	has(t, text,
		"bettercompute_store_up 1",
		`bettercompute_gateway_sessions{gateway="gw-1",region="eu-1"} 95`,
		`bettercompute_gateway_sessions{gateway="gw-2",region="eu-1"} 3`,
		`bettercompute_gateway_max_streams{gateway="gw-1",region="eu-1"} 100`,
		`bettercompute_leases_held{holder="w1",kind="shard"} 3`,
		`bettercompute_leases_held{holder="w1",kind="singleton"} 1`,
		`bettercompute_lease_takeovers_total{kind="shard"} 2`,
		`bettercompute_lease_takeovers_total{kind="singleton"} 0`,
		`bettercompute_outbox_backlog_entries{sink="hooks"} 2`,
		// The gateways' rows wrote events too (gateway.up): archive has
		// taken none of them.
		fmt.Sprintf(`bettercompute_outbox_backlog_entries{sink="archive"} %d`, newest),
		"# TYPE bettercompute_lease_takeovers_total counter",
		"# TYPE bettercompute_store_query_duration_seconds histogram",
	)
	if strings.Contains(text, "gw-dead") || strings.Contains(text, `holder="w2"`) {
		t.Errorf("stale gateway or expired lease reported:\n%s", text)
	}
	if !strings.Contains(text, `bettercompute_store_query_duration_seconds_count{op="lease_list"}`) || !strings.Contains(text, "go_goroutines") {
		t.Errorf("query durations or Go collector missing:\n%s", text)
	}
}

func TestReportedSeries(t *testing.T) {
	t.Parallel()
	m := metrics.New(metrics.Config{}, nil)
	m.Handshake("gw-1")
	m.Handshake("gw-1")
	m.Refused("gw-1", metrics.ReasonFull)
	m.Refused("gw-1", "something new")
	m.HeartbeatReceived("gw-1", 12*time.Second, 10*time.Second)
	m.HeartbeatReceived("gw-1", 9*time.Second, 10*time.Second)
	m.CommandFinished("exec", store.CommandSucceeded)
	m.CommandFinished("exec", store.CommandSucceeded)
	m.CommandFinished("exec", store.CommandRunning)
	m.DispatchLatency(30 * time.Millisecond)
	m.StoreQuery("heartbeat_flush", 2*time.Millisecond)
	m.APIUnauthenticated("unknown_token")
	m.APIUnauthenticated("unknown_token")
	m.APIUnauthenticated("no_token")
	m.APIUnauthenticated("a reason of a later build")
	m.XIDNoAction(13)
	m.XIDNoAction(13)
	m.XIDNoAction(154)
	m.XIDNoAction(100000) // past the bound: other
	text := scrape(t, m)
	has(t, text,
		`bettercompute_gateway_handshakes_total{gateway="gw-1"} 2`,
		`bettercompute_gateway_refusals_total{gateway="gw-1",reason="full"} 1`,
		`bettercompute_gateway_refusals_total{gateway="gw-1",reason="other"} 1`,
		`bettercompute_gateway_heartbeat_lag_seconds_bucket{gateway="gw-1",le="0.05"} 1`,
		`bettercompute_gateway_heartbeat_lag_seconds_sum{gateway="gw-1"} 2`,
		`bettercompute_commands_finished_total{kind="exec",state="succeeded"} 2`,
		`bettercompute_commands_finished_total{kind="exec",state="other"} 1`,
		`bettercompute_command_dispatch_latency_seconds_bucket{le="0.05"} 1`,
		`bettercompute_store_query_duration_seconds_count{op="heartbeat_flush"} 1`,
		`bettercompute_api_unauthenticated_total{reason="unknown_token"} 2`,
		`bettercompute_api_unauthenticated_total{reason="no_token"} 1`,
		`bettercompute_api_unauthenticated_total{reason="other"} 1`,
		`bettercompute_gpu_xids_no_action_total{code="13"} 2`,
		`bettercompute_gpu_xids_no_action_total{code="154"} 1`,
		`bettercompute_gpu_xids_no_action_total{code="other"} 1`,
	)
	if strings.Contains(text, "bettercompute_store_up") {
		t.Error("store series without a store")
	}

	// Every method is a no-op on a nil *Metrics.
	var none *metrics.Metrics
	none.Handshake("gw")
	none.Refused("gw", metrics.ReasonTLS)
	none.HeartbeatReceived("gw", time.Second, time.Second)
	none.CommandFinished("exec", store.CommandFailed)
	none.DispatchLatency(time.Second)
	none.StoreQuery("x", time.Second)
	none.APIUnauthenticated("no_token")
	none.XIDNoAction(13)
}

// TestNamesFollowConventions runs Prometheus's own linter over every series
// (base units, _total on counters, no reserved suffixes).
func TestNamesFollowConventions(t *testing.T) {
	t.Parallel()
	st := sqlitetest.Open(t)
	now := time.Now()
	ctx := context.Background()
	if _, err := st.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: "gw-1", Sessions: 1, MaxStreams: 10, Now: &now}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: "shard:0", Holder: "w1", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	m := metrics.New(metrics.Config{Sinks: []string{"hooks"}}, st)
	m.Handshake("gw-1")
	m.Refused("gw-1", metrics.ReasonTLS)
	m.HeartbeatReceived("gw-1", time.Second, time.Second)
	m.CommandFinished("exec", store.CommandSucceeded)
	m.DispatchLatency(time.Second)
	m.XIDNoAction(13)
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "bettercompute_") {
			t.Errorf("%s: %s", p.Metric, p.Text)
		}
	}
	n, err := testutil.GatherAndCount(m.Registry())
	if err != nil || n == 0 {
		t.Fatalf("gathered %d series: %v", n, err)
	}
}

// failing is a store whose database is down.
type failing struct{ store.Store }

func (failing) Ping(context.Context) error { return errors.New("connection refused") }

func TestScrapeWithTheDatabaseDown(t *testing.T) {
	t.Parallel()
	m := metrics.New(metrics.Config{Sinks: []string{"hooks"}}, failing{sqlitetest.Open(t)})
	m.Handshake("gw-1")
	text := scrape(t, m)
	has(t, text, "bettercompute_store_up 0", `bettercompute_gateway_handshakes_total{gateway="gw-1"} 1`)
	if strings.Contains(text, "bettercompute_outbox_backlog_entries") {
		t.Errorf("backlog reported with the database down:\n%s", text)
	}
}

// TestFleetSeries: build info, nodes by state (every state, 0 when
// empty), GPUs by health from the inventories, the outbox and delivery lag
// of each sink, singleton jobs held or not.
func TestFleetSeries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	for i, inv := range []string{
		`{"gpus":[{"uuid":"GPU-a","health":{"state":"GPU_HEALTH_STATE_FAILED"}},{"uuid":"GPU-b"}]}`,
		`{"gpus":[{"uuid":"GPU-c","health":{"state":"GPU_HEALTH_STATE_DEGRADED"}},{"uuid":"GPU-d","health":{"state":"GPU_HEALTH_STATE_OK"}}]}`,
		``,
	} {
		n, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{PoolID: pool.ID, Hostname: fmt.Sprintf("h%d", i),
			MachineID: fmt.Sprintf("m%d", i), ID: store.NewID("node")})
		if err != nil {
			t.Fatal(err)
		}
		if inv != "" {
			if err := st.NodeSetInventory(ctx, n.ID, []byte(inv), fmt.Sprint(i)); err != nil {
				t.Fatal(err)
			}
		}
		if i == 0 {
			if err := st.NodeSetState(ctx, n.ID, store.NodeUnreachable); err != nil {
				t.Fatal(err)
			}
			if err := st.NodeSetCordoned(ctx, n.ID, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	now := time.Now()
	if _, ok, err := st.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: "singleton:command-sweeper", Holder: "w1",
		TTL: 15 * time.Second, Now: &now}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	old := now.Add(-time.Hour)
	if _, ok, err := st.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: "singleton:retention", Holder: "w1",
		TTL: 15 * time.Second, Now: &old}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	newest, err := st.OutboxInsert(ctx, "com.better-compute.test", "x", []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.OutboxCursorSet(ctx, "hooks", newest); err != nil {
		t.Fatal(err)
	}
	// Ten minutes from now, what "archive" has not taken is ten minutes old
	// or more; "hooks" has taken everything.
	later := now.Add(10 * time.Minute)
	m := metrics.New(metrics.Config{Sinks: []string{"hooks", "archive"}, Version: "1.2.3", Commit: "abc",
		Now: func() time.Time { return later }}, st)
	text := scrape(t, m)
	has(t, text,
		`bettercompute_nodes{state="joined"} 2`,
		`bettercompute_nodes{state="unreachable"} 1`,
		`bettercompute_nodes{state="ready"} 0`,
		`bettercompute_nodes{state="powered-off"} 0`,
		`bettercompute_nodes{state="draining"} 0`,
		`bettercompute_nodes_cordoned 1`,
		`bettercompute_gpus{health="ok"} 2`,
		`bettercompute_gpus{health="degraded"} 1`,
		`bettercompute_gpus{health="failed"} 1`,
		`bettercompute_sink_delivery_lag_seconds{sink="hooks"} 0`,
		`bettercompute_singleton_held{job="command-sweeper"} 0`, // expired ten minutes from now
		`bettercompute_singleton_held{job="retention"} 0`,
	)
	if !strings.Contains(text, `bettercompute_build_info{commit="abc",goversion="go`) {
		t.Errorf("no build info:\n%s", text)
	}
	var lag, archive float64
	for _, line := range strings.Split(text, "\n") {
		fmt.Sscanf(line, "bettercompute_outbox_lag_seconds %g", &lag)
		fmt.Sscanf(line, `bettercompute_sink_delivery_lag_seconds{sink="archive"} %g`, &archive)
	}
	if lag < 600 || archive != lag {
		t.Errorf("outbox lag %g, archive's %g: want both at least 600 s and equal\n%s", lag, archive, text)
	}
	// With the real clock the sweeper's lease is held.
	text = scrape(t, metrics.New(metrics.Config{}, st))
	has(t, text, `bettercompute_singleton_held{job="command-sweeper"} 1`, `bettercompute_outbox_lag_seconds 0`)
}

// TestGPUIncidentsByModel: bettercompute_gpu_incidents counts the cases
// that name a GPU by that GPU's model, an operator's repair left out.
func TestGPUIncidentsByModel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_m", PoolID: pool.ID, Hostname: "m", MachineID: "m"}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().UTC().Truncate(time.Second)
	if err := st.GPUPlacementsSet(ctx, &store.GPUPlacementsSetParams{NodeID: "node_m", Now: &t0, GPUs: []store.GPUSeen{
		{UUID: "GPU-1", Model: "NVIDIA A100-SXM4-40GB"}, {UUID: "GPU-2", Model: "NVIDIA A100-SXM4-40GB"}}}); err != nil {
		t.Fatal(err)
	}
	for _, finding := range []string{"xid", "operator"} {
		c, err := st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_m", State: store.RemediationDetected, Finding: finding,
			GPUUUID: "GPU-1", Action: "escalate"}, "remediation:w")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationReturned, Actor: "w"}); err != nil {
			t.Fatal(err)
		}
	}
	// Two GPUs seen for 3 h with one incident: 6 GPU-hours between
	// failures.
	text := scrape(t, metrics.New(metrics.Config{Now: func() time.Time { return t0.Add(3 * time.Hour) }}, st))
	has(t, text, `bettercompute_gpu_incidents{model="NVIDIA A100-SXM4-40GB"} 1`, "# TYPE bettercompute_gpu_incidents gauge",
		`bettercompute_gpu_service_seconds{model="NVIDIA A100-SXM4-40GB"} 21600`,
		`bettercompute_gpu_mean_time_between_failures_seconds{model="NVIDIA A100-SXM4-40GB"} 21600`)
}
