package api_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/metrics"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

const metricsToken = "scrape-token-0123456789"

func metricsServer(t *testing.T, token string) http.Handler {
	t.Helper()
	return metricsServerWith(t, api.Config{MetricsToken: token})
}

func metricsServerWith(t *testing.T, cfg api.Config) http.Handler {
	t.Helper()
	st := sqlitetest.Open(t)
	m := metrics.New(metrics.Config{}, st)
	m.CommandFinished("exec", "succeeded")
	cfg.Secret, cfg.Metrics = strings.Repeat("s", 32), m.Handler()
	return api.New(cfg, st, nil).Handler()
}

func get(h http.Handler, auth string) *httptest.ResponseRecorder {
	return getPath(h, "/metrics", auth)
}

func getPath(h http.Handler, path, auth string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", path, nil)
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

func TestPprofBehindTheMetricsToken(t *testing.T) {
	t.Parallel()
	h := metricsServerWith(t, api.Config{MetricsToken: metricsToken, Pprof: true})
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/heap", "/debug/pprof/profile?seconds=1"} {
		if w := getPath(h, path, ""); w.Code != http.StatusUnauthorized {
			t.Errorf("%s without the token: %d", path, w.Code)
		}
		if w := getPath(h, path, "Bearer wrong-token-0123456789"); w.Code != http.StatusUnauthorized {
			t.Errorf("%s with a wrong token: %d", path, w.Code)
		}
	}
	if w := getPath(h, "/debug/pprof/goroutine?debug=1", "Bearer "+metricsToken); w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "goroutine profile:") {
		t.Errorf("goroutine profile with the token: %d %.80q", w.Code, w.Body.String())
	}
	if w := getPath(h, "/debug/pprof/heap", "Bearer "+metricsToken); w.Code != http.StatusOK || w.Body.Len() == 0 {
		t.Errorf("heap profile with the token: %d, %d bytes", w.Code, w.Body.Len())
	}

	for _, q := range []string{"seconds=0", "seconds=-5", "seconds=301", "seconds=86400", "seconds=1.5", "seconds=x"} {
		if w := getPath(h, "/debug/pprof/profile?"+q, "Bearer "+metricsToken); w.Code != http.StatusBadRequest {
			t.Errorf("profile?%s: %d, want 400", q, w.Code)
		}
		if w := getPath(h, "/debug/pprof/trace?"+q, "Bearer "+metricsToken); w.Code != http.StatusBadRequest {
			t.Errorf("trace?%s: %d, want 400", q, w.Code)
		}
	}

	off := metricsServerWith(t, api.Config{MetricsToken: metricsToken})
	if w := getPath(off, "/debug/pprof/heap", "Bearer "+metricsToken); w.Code != http.StatusNotFound {
		t.Errorf("pprof off: /debug/pprof/heap answered %d", w.Code)
	}
}
