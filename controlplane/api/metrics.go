package api

import (
	"github.com/better-compute/better-compute/controlplane/pkg/metrics"
)

// MinMetricsTokenLen is the shortest bearer token that enables /metrics
// (host.metrics.bearerToken).
const MinMetricsTokenLen = metrics.MinTokenLen

// MaxProfileSeconds is the longest CPU profile or execution trace
// /debug/pprof/ runs for one request.
const MaxProfileSeconds = metrics.MaxProfileSeconds

// mountMetrics serves GET /metrics when a handler and a token of at least
// MinMetricsTokenLen characters are configured, and, when Pprof is set, the
// runtime's profiles under GET /debug/pprof/ behind the same token
// (metrics.Mount); otherwise the routes do not exist (404).
func (s *Server) mountMetrics() {
	if s.cfg.Metrics == nil || s.cfg.MetricsToken == "" {
		return
	}
	if !metrics.Mount(s.mux, s.cfg.Metrics, s.cfg.MetricsToken, s.cfg.Pprof) {
		s.log.Warn("Metrics not served: the bearer token is shorter than 16 characters")
	}
}
