package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strconv"
)

// MinMetricsTokenLen is the shortest bearer token that enables /metrics
// (host.metrics.bearerToken).
const MinMetricsTokenLen = 16

// mountMetrics serves GET /metrics when a handler and a token of at least
// MinMetricsTokenLen characters are configured, and, when Pprof is set, the
// runtime's profiles under GET /debug/pprof/ behind the same token;
// otherwise the routes do not exist (404).
func (s *Server) mountMetrics() {
	if s.cfg.Metrics == nil || s.cfg.MetricsToken == "" {
		return
	}
	if len(s.cfg.MetricsToken) < MinMetricsTokenLen {
		s.log.Warn("Metrics not served: the bearer token is shorter than 16 characters")
		return
	}
	want := sha256.Sum256([]byte(s.cfg.MetricsToken))
	s.mux.Handle("GET /metrics", &bearer{want: want, next: s.cfg.Metrics})
	if s.cfg.Pprof {
		// pprof.Index serves the named profiles (heap, goroutine, allocs,
		// ...) below it; profile and trace run for ?seconds=N.
		s.mux.Handle("GET /debug/pprof/", &bearer{want: want, next: http.HandlerFunc(pprof.Index)})
		s.mux.Handle("GET /debug/pprof/profile", &bearer{want: want, next: boundedSeconds(pprof.Profile)})
		s.mux.Handle("GET /debug/pprof/trace", &bearer{want: want, next: boundedSeconds(pprof.Trace)})
		s.mux.Handle("GET /debug/pprof/symbol", &bearer{want: want, next: http.HandlerFunc(pprof.Symbol)})
	}
}

// MaxProfileSeconds is the longest CPU profile or execution trace
// /debug/pprof/ runs for one request.
const MaxProfileSeconds = 300

// boundedSeconds refuses a ?seconds= that is not a whole number from 1 to
// MaxProfileSeconds (400), so that no request holds the profiler for hours.
func boundedSeconds(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.URL.Query().Get("seconds"); v != "" {
			if n, err := strconv.Atoi(v); err != nil || n < 1 || n > MaxProfileSeconds {
				http.Error(w, fmt.Sprintf("seconds=%q: want a whole number from 1 to %d", v, MaxProfileSeconds), http.StatusBadRequest)
				return
			}
		}
		h(w, r)
	})
}

// bearer lets through only requests carrying the token, compared in
// constant time (over SHA-256 digests, so not even the length leaks).
type bearer struct {
	want [sha256.Size]byte
	next http.Handler
}

func (b *bearer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token := bearerToken(r)
	got := sha256.Sum256([]byte(token))
	if token == "" || subtle.ConstantTimeCompare(got[:], b.want[:]) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="metrics"`)
		http.Error(w, "unauthorized: send Authorization: Bearer <host.metrics.bearerToken>", http.StatusUnauthorized)
		return
	}
	b.next.ServeHTTP(w, r)
}
