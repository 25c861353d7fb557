package session_test

import (
	"errors"
	"testing"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/bcd/session/sessiontest"
)

// TestWebSocketURLs: the fallback's URL form is accepted and nothing near
// it, and a gateway list may not mix the fallback with direct gateways
// (the transport is configured, never chosen by bcd).
func TestWebSocketURLs(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"wss://proxy.example/v1/session", "wss://proxy.example:8443/v1/session", "wss://proxy.example",
		"https://gw.example:8443"} {
		if err := session.CheckGatewayURL(ok); err != nil {
			t.Errorf("CheckGatewayURL(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"ws://proxy.example/v1/session", "wss://proxy.example/v2/session", "wss://proxy.example/v1/session?x=1",
		"wss://user@proxy.example/v1/session", "https://gw.example/v1/session", "wss:///v1/session"} {
		if err := session.CheckGatewayURL(bad); !errors.Is(err, session.ErrConfig) {
			t.Errorf("CheckGatewayURL(%q) = %v, want ErrConfig", bad, err)
		}
	}
	if !session.IsWebSocketURL("wss://proxy.example/v1/session") || session.IsWebSocketURL("https://gw.example") {
		t.Error("IsWebSocketURL misjudges")
	}

	p := sessiontest.NewPKI(t)
	gw := sessiontest.NewGateway(t, p, sessiontest.GatewayOptions{ID: "gw-a"})
	cfg := joinNode(t, gw).config()
	cfg.Gateways = []string{"wss://proxy.example/v1/session", gw.URL}
	if _, err := session.New(cfg); !errors.Is(err, session.ErrConfig) {
		t.Fatalf("New with a list mixing wss and https: %v, want ErrConfig", err)
	}
	cfg.Gateways = []string{"wss://proxy.example/v1/session"}
	cfg.KnownGateways = []session.KnownGateway{{URL: gw.URL}}
	if _, err := session.New(cfg); err != nil {
		t.Fatalf("New with the fallback configured and a known direct gateway (left out): %v", err)
	}
}
