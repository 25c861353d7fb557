package tests

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/tests/testenv"
)

// GET /metrics through a real serve: refused without the configured bearer
// token, Prometheus text with the token.
func TestMetricsEndpoint(t *testing.T) {
	t.Parallel()
	const token = "metrics-token-0123456789"
	cfg := testenv.WriteFile(t, "better-compute.yaml", serveConfig+"  metrics:\n    bearerToken: "+token+"\n")
	p := testenv.Start(t, []string{"BETTER_COMPUTE_DATA_DIR=" + filepath.Join(t.TempDir(), "data")}, testenv.Binary(t, "better-compute"), "serve", "--config", cfg)
	api := "http://" + p.WaitLine(`msg="API listening" addr=(\S+)`, 60*time.Second)[1]
	p.WaitLine(`msg="Gateway listening"`, 30*time.Second)
	get := func(auth string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, api+"/metrics", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, auth := range []string{"", "Bearer wrong-token-0123456789", "Basic " + token} {
		if code, _ := get(auth); code != http.StatusUnauthorized {
			t.Fatalf("/metrics with %q: %d, want 401", auth, code)
		}
	}
	code, body := get("Bearer " + token)
	if code != http.StatusOK {
		t.Fatalf("/metrics with the token: %d", code)
	}
	for _, name := range []string{"bettercompute_command_dispatch_latency_seconds", "bettercompute_leases_held", "bettercompute_gateway_sessions"} {
		if !strings.Contains(body, name) {
			t.Fatalf("/metrics lacks %s:\n%s", name, body)
		}
	}
}
