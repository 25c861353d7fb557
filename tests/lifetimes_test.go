package tests

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
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
	scrape := func() string {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, d.api+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+bearer)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("/metrics: %d %s", res.StatusCode, b)
		}
		return string(b)
	}
	text := scrape()
	expiry := func(kind, use string) (time.Time, bool) {
		m := regexp.MustCompile(`(?m)^bettercompute_certificate_expiry_timestamp_seconds\{kind="` + kind + `",use="` + use + `"\} (\S+)$`).FindStringSubmatch(text)
		if m == nil {
			return time.Time{}, false
		}
		v, err := strconv.ParseFloat(m[1], 64)
		return time.Unix(int64(v), 0).UTC(), err == nil
	}
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
	// controlplane/doctor's lifetimes_test sees them with an injected one).
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
