package api_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/metrics"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
)

const metricsToken = "scrape-token-0123456789"

func metricsServer(t *testing.T, token string) http.Handler {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	m := metrics.New(metrics.Config{}, st)
	m.CommandFinished("exec", "succeeded")
	return api.New(api.Config{Secret: strings.Repeat("s", 32), Metrics: m.Handler(), MetricsToken: token}, st, nil).Handler()
}

func get(h http.Handler, auth string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/metrics", nil)
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestMetricsNeedTheBearerToken(t *testing.T) {
	t.Parallel()
	h := metricsServer(t, metricsToken)
	for _, auth := range []string{"", "Bearer", "Bearer wrong-token-0123456789", "Basic " + metricsToken, "Bearer " + metricsToken + "x", metricsToken} {
		w := get(h, auth)
		if w.Code != http.StatusUnauthorized || !strings.HasPrefix(w.Header().Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("Authorization %q: %d %q", auth, w.Code, w.Header().Get("WWW-Authenticate"))
		}
		if strings.Contains(w.Body.String(), "bettercompute_") {
			t.Errorf("Authorization %q: metrics leaked", auth)
		}
	}
	w := get(h, "Bearer "+metricsToken)
	body, _ := io.ReadAll(w.Body)
	if w.Code != http.StatusOK || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		t.Fatalf("with the token: %d %q", w.Code, w.Header().Get("Content-Type"))
	}
	for _, want := range []string{
		"# TYPE bettercompute_commands_finished_total counter",
		`bettercompute_commands_finished_total{kind="exec",state="succeeded"} 1`,
		"bettercompute_store_up 1",
		"# TYPE bettercompute_store_query_duration_seconds histogram",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if w := get(h, "bearer "+metricsToken); w.Code != http.StatusOK {
		t.Errorf("lower-case scheme: %d", w.Code)
	}
	r := httptest.NewRequest("POST", "/metrics", nil)
	r.Header.Set("Authorization", "Bearer "+metricsToken)
	pw := httptest.NewRecorder()
	h.ServeHTTP(pw, r)
	if pw.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics: %d", pw.Code)
	}
}

func TestMetricsNotMountedWithoutToken(t *testing.T) {
	t.Parallel()
	for _, token := range []string{"", "short-token"} {
		h := metricsServer(t, token)
		if w := get(h, "Bearer "+token); w.Code != http.StatusNotFound {
			t.Errorf("token %q: /metrics answered %d", token, w.Code)
		}
	}
}
