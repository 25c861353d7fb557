package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"net/http/pprof"
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
		s.mux.Handle("GET /debug/pprof/profile", &bearer{want: want, next: http.HandlerFunc(pprof.Profile)})
		s.mux.Handle("GET /debug/pprof/trace", &bearer{want: want, next: http.HandlerFunc(pprof.Trace)})
		s.mux.Handle("GET /debug/pprof/symbol", &bearer{want: want, next: http.HandlerFunc(pprof.Symbol)})
	}
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
