package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
)

// MinMetricsTokenLen is the shortest bearer token that enables /metrics
// (host.metrics.bearerToken).
const MinMetricsTokenLen = 16

// mountMetrics serves GET /metrics when a handler and a token of at least
// MinMetricsTokenLen characters are configured; otherwise the route does not
// exist (404).
func (s *Server) mountMetrics() {
	if s.cfg.Metrics == nil || s.cfg.MetricsToken == "" {
		return
	}
	if len(s.cfg.MetricsToken) < MinMetricsTokenLen {
		s.log.Warn("Metrics not served: the bearer token is shorter than 16 characters")
		return
	}
	s.mux.Handle("GET /metrics", &bearer{want: sha256.Sum256([]byte(s.cfg.MetricsToken)), next: s.cfg.Metrics})
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
