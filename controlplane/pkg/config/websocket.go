package config

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
)

// WebSocket fallback TLS modes (host.gateway.ws.tls).
const (
	// WebSocketTLSGateway serves the fallback over TLS with the gateway's
	// serving certificate: a proxy in front re-encrypts to it, or nodes
	// reach it directly.
	WebSocketTLSGateway = "gateway"
	// WebSocketTLSOff serves plain HTTP: a TLS-terminating proxy in front
	// speaks TLS to the nodes. The nodes' own TLS still runs inside the
	// WebSocket, end to end.
	WebSocketTLSOff = "off"
)

// WebSocketFallback configures the gateway's WebSocket fallback
// (docs/websocket.md): the gateway's gRPC connection inside a WebSocket
// at GET /v1/session, for sites whose TLS-inspecting proxies strip client
// certificates. Setting PublicURL turns it on.
type WebSocketFallback struct {
	// PublicURL is what the site's nodes dial: wss://host[:port]/v1/session,
	// the name their proxy answers to. It goes into install scripts asked
	// for with ?transport=websocket (nodes add --websocket), and its host
	// into the gateway's certificate, since the node's TLS inside the
	// WebSocket names it.
	PublicURL string `yaml:"publicURL"`
	// Listen is where the gateway serves it. Defaults to :443 (a port
	// below 1024 needs CAP_NET_BIND_SERVICE, which better-compute.service
	// grants).
	Listen string `yaml:"listen"`
	// TLS is gateway (the default) or off.
	TLS string `yaml:"tls"`
}

// Enabled reports whether the fallback is configured.
func (w WebSocketFallback) Enabled() bool { return w.PublicURL != "" }

func (w *WebSocketFallback) setDefaults() {
	if !w.Enabled() {
		return
	}
	if w.Listen == "" {
		w.Listen = ":443"
	}
	if w.TLS == "" {
		w.TLS = WebSocketTLSGateway
	}
}

func (w *WebSocketFallback) validate() error {
	if !w.Enabled() {
		if w.Listen != "" || w.TLS != "" {
			return &Error{Key: "host.gateway.ws.publicURL", Msg: "required with host.gateway.ws.listen or tls: the wss://host[:port]/v1/session URL the site's nodes dial"}
		}
		return nil
	}
	u, err := url.Parse(w.PublicURL)
	if err != nil || u.Scheme != "wss" || u.Hostname() == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" ||
		u.Path != "/v1/session" {
		return &Error{Key: "host.gateway.ws.publicURL", Msg: fmt.Sprintf("%q: want wss://host[:port]/v1/session", w.PublicURL)}
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return &Error{Key: "host.gateway.ws.publicURL", Msg: fmt.Sprintf("%q: port %s: want 1 to 65535", w.PublicURL, p)}
		}
	}
	_, port, err := net.SplitHostPort(w.Listen)
	if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
		return &Error{Key: "host.gateway.ws.listen", Msg: fmt.Sprintf("%q is not a host:port address with a port of 0 to 65535", w.Listen)}
	}
	if w.TLS != WebSocketTLSGateway && w.TLS != WebSocketTLSOff {
		return &Error{Key: "host.gateway.ws.tls", Msg: fmt.Sprintf("%q: want gateway or off", w.TLS)}
	}
	return nil
}
