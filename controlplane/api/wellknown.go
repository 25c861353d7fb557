package api

import (
	"net/http"
	"time"

	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// wellKnown answers GET /.well-known/better-compute: where the API and the
// live gateways are, and how to trust them. It is public: it holds nothing
// secret (a CA pin is the hash of a public key).
func (s *Server) wellKnown(w http.ResponseWriter, r *http.Request) {
	out := &apiv1.WellKnown{BasePath: s.cfg.BasePath, Version: s.cfg.Version, ApiUrl: "http://" + r.Host + s.cfg.BasePath}
	if r.TLS != nil {
		out.ApiUrl = "https://" + r.Host + s.cfg.BasePath
	}
	ctx := r.Context()
	if gws, err := s.store.GatewayList(ctx); err == nil {
		for _, g := range gws {
			if time.Since(g.HeartbeatAt) < 20*time.Second && !g.Draining && g.Address != "" {
				out.Gateways = append(out.Gateways, g.Address)
			}
		}
	}
	if pin, td, err := s.gatewayPin(ctx); err == nil {
		out.GatewayCaPin, out.TrustDomain = pin, td
	}
	body, err := marshal.Marshal(out)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "max-age=30")
	_, _ = w.Write(body)
}
