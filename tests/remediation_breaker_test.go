package tests

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
)

// watchFragment logs in to the fleet page with token and returns its live
// part (GET /watch/fragment).
func (d *deployment) watchFragment(token string) string {
	d.t.Helper()
	form := url.Values{"token": {token}}
	req, _ := http.NewRequest(http.MethodPost, d.api+"/watch/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", d.api)
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	resp.Body.Close()
	var cookie *http.Cookie
	for _, ck := range resp.Cookies() {
		cookie = ck
	}
	if cookie == nil {
		d.t.Fatalf("watch login: %d, no cookie", resp.StatusCode)
	}
	req, _ = http.NewRequest(http.MethodGet, d.api+"/watch/fragment", nil)
	req.AddCookie(cookie)
	code, body := do(d.t, req)
	if code != http.StatusOK {
		d.t.Fatalf("watch fragment: %d %s", code, body)
	}
	return body
}

// scrape reads /metrics with the deployment's metrics token.
func (d *deployment) scrape(token string) string {
	d.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, d.api+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	code, body := do(d.t, req)
	if code != http.StatusOK {
		d.t.Fatalf("/metrics: %d %s", code, body)
	}
	return body
}

// TestBreakerShareOfPool: serve and a 20-node pool of FakeDaemons with the
// default breaker (10 % of the GPU nodes, at least 1, in 10 min: 2 nodes).
// The pool's breaker and figure series are in /metrics before anything
// happens. 60 % of the pool (12 nodes) raise XID 95 within a second: 2 are
// acted on (reset and returned), the breaker trips, the other 10 are
// cordoned and held without a command and a pool-wide command reaches none
// of them; the breaker shows tripped in remediation list, /metrics, doctor
// and on the fleet page. After remediation reset-breaker the held nodes
// are acted on in the order their cases opened, two per window.
func TestBreakerShareOfPool(t *testing.T) {
	t.Parallel()
	const metricsToken = "breaker-metrics-token-0123456789"
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{top: "remediation:\n  interval: 300ms\n  verifySettle: 1s\n",
		host: "  metrics:\n    bearerToken: " + metricsToken + "\n"})
	ctx := t.Context()
	pool, err := d.st.PoolGet(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	// Present from the pool's creation, with zero counts.
	m := d.scrape(metricsToken)
	for _, want := range []string{
		`bettercompute_remediation_breaker_tripped{pool="` + pool.ID + `"} 0`,
		`bettercompute_remediation_time_to_quarantine_seconds_count{pool="` + pool.ID + `"} 0`,
		`bettercompute_remediation_time_to_return_seconds_count{pool="` + pool.ID + `"} 0`,
		`bettercompute_remediation_time_between_incidents_seconds_count{pool="` + pool.ID + `",scope="node"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics of a new pool lacks %s", want)
		}
	}

	dms := remediationFleet(t, d, 20, sim.Recovery{ResetDelay: 500 * time.Millisecond})
	failing := dms[:12]
	for _, dm := range failing {
		if err := dm.RaiseXID(1, 95); err != nil {
			t.Fatal(err)
		}
	}
	cases := func() map[string]*store.Remediation {
		out := map[string]*store.Remediation{}
		cs, err := d.st.RemediationList(ctx, &store.RemediationListParams{PoolID: pool.ID, ListParams: store.ListParams{Limit: 100}})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			out[c.NodeID] = c
		}
		return out
	}
	count := func(cs map[string]*store.Remediation, pred func(*store.Remediation) bool) int {
		n := 0
		for _, c := range cs {
			if pred(c) {
				n++
			}
		}
		return n
	}
	held := func(c *store.Remediation) bool { return c.State == store.RemediationHeld }
	acted := func(c *store.Remediation) bool { return c.QuarantinedAt != nil }
	eventually(t, 60*time.Second, func() bool {
		cs := cases()
		return len(cs) == 12 && count(cs, held) == 10 && count(cs, func(c *store.Remediation) bool { return c.State == store.RemediationReturned }) == 2
	}, func() string {
		cs := cases()
		return fmt.Sprintf("%d cases, %d held, %d acted on", len(cs), count(cs, held), count(cs, acted))
	})
	cs := cases()
	if n := count(cs, acted); n != 2 {
		t.Fatalf("%d nodes acted on within the window, want 2", n)
	}
	var heldNodes []string
	for node, c := range cs {
		if held(c) {
			heldNodes = append(heldNodes, node)
			n, err := d.st.NodeGet(ctx, node)
			if err != nil || !n.Cordoned || n.Disruption != store.DisruptionQuarantined {
				t.Errorf("held %s: cordoned %v, disruption %q (%v)", node, n.Cordoned, n.Disruption, err)
			}
		}
	}
	// A pool-wide command reaches none of the held nodes.
	d.cli(d.viaAPI("commands", "run", "--no-wait", "--pool", "default", "--", "true")...)
	for _, node := range heldNodes {
		cmds, err := d.st.CommandList(ctx, &store.CommandListParams{NodeID: node})
		if err != nil {
			t.Fatal(err)
		}
		if len(cmds) != 0 {
			t.Errorf("held %s took %d commands (%s)", node, len(cmds), cmds[0].Kind)
		}
	}

	// Tripped in remediation list, /metrics, doctor and the page.
	list := d.cli(d.viaAPI("remediation", "list")...)
	if !strings.Contains(list, "tripped") || !strings.Contains(list, pool.ID) {
		t.Errorf("remediation list shows no tripped breaker:\n%s", list)
	}
	var breakers struct {
		Breakers []struct {
			PoolID   string `json:"poolId"`
			Tripped  bool   `json:"tripped"`
			Acted    int    `json:"acted"`
			Limit    int    `json:"limit"`
			GPUNodes int    `json:"gpuNodes"`
			Held     int    `json:"held"`
		} `json:"breakers"`
	}
	req, _ := http.NewRequest(http.MethodPost, d.api+"/api/remediation/breakers", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Better-Compute", "1")
	req.Header.Set("Authorization", "Bearer "+d.adminToken)
	if code, body := do(t, req); code != http.StatusOK || json.Unmarshal([]byte(body), &breakers) != nil {
		t.Fatalf("remediation.breakers: %d %s", code, body)
	}
	if b := breakers.Breakers; len(b) != 1 || !b[0].Tripped || b[0].Acted != 2 || b[0].Limit != 2 || b[0].GPUNodes != 20 || b[0].Held != 10 {
		t.Errorf("remediation.breakers: %+v, want tripped, 2 of 2 acted on, 20 GPU nodes, 10 held", b)
	}
	m = d.scrape(metricsToken)
	for _, want := range []string{`bettercompute_remediation_breaker_tripped{pool="` + pool.ID + `"} 1`,
		`bettercompute_remediation_breaker_held_cases{pool="` + pool.ID + `"} 10`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if _, checks := doctorRun(t, d); checks["remediation.breaker"].Status != "fail" {
		t.Errorf("doctor remediation.breaker: %+v, want fail", checks["remediation.breaker"])
	}
	if page := d.watchFragment(d.adminToken); !strings.Contains(page, `data-pool="default" class="tripped"`) {
		t.Errorf("the fleet page shows no tripped breaker for pool default")
	}

	// reset-breaker: the held nodes are acted on in the order their cases
	// opened.
	order := slices.Clone(heldNodes)
	slices.SortFunc(order, func(a, b string) int {
		return cmpCase(cs[a], cs[b])
	})
	d.cli(d.viaAPI("remediation", "reset-breaker", "default")...)
	eventually(t, 60*time.Second, func() bool { return count(cases(), acted) == 4 },
		func() string { return fmt.Sprintf("%d acted on after the reset", count(cases(), acted)) })
	now := cases()
	for _, node := range order[:2] {
		if !acted(now[node]) {
			t.Errorf("after the reset the oldest held cases go first: %s (%s) is %s", node, now[node].CreatedAt, now[node].State)
		}
	}
	if n := count(now, held); n != 8 {
		t.Errorf("%d held after one reset, want 8 (the breaker admits 2 per window)", n)
	}

	// The figures: remediation stats.
	var stats struct {
		Pools []struct {
			PoolID           string `json:"poolId"`
			Cases            int    `json:"cases"`
			TimeToQuarantine struct {
				Count      int     `json:"count"`
				P99Seconds float64 `json:"p99Seconds"`
			} `json:"timeToQuarantine"`
			TimeToReturn struct {
				Count int `json:"count"`
			} `json:"timeToReturn"`
		} `json:"pools"`
	}
	d.cliJSON(&stats, d.viaAPI("remediation", "stats", "--pool", "default")...)
	if p := stats.Pools; len(p) != 1 || p[0].Cases != 12 || p[0].TimeToQuarantine.Count != 4 || p[0].TimeToReturn.Count < 2 {
		t.Errorf("remediation stats: %+v, want 12 cases, 4 quarantined, at least 2 returned", p)
	}
	if out := d.cli(d.viaAPI("remediation", "stats")...); !strings.Contains(out, "detection to quarantine") {
		t.Errorf("remediation stats printed:\n%s", out)
	}
}

func cmpCase(a, b *store.Remediation) int {
	if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}
