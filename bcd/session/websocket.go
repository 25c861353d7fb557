package session

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"github.com/coder/websocket"
)

// webSocketDialer dials the gateway's WebSocket fallback at wsURL
// (wss://host[:port]/v1/session) and returns the WebSocket as a byte
// stream, for gRPC to run its TLS and HTTP/2 over as over TCP: the node's
// TLS handshake with the gateway (the gateway's pinned key, the node's
// certificate chain and key) happens inside the WebSocket, end to end,
// whatever terminates the outer TLS. The outer connection trusts the
// system's roots (SSL_CERT_FILE and SSL_CERT_DIR are honoured: a site's
// TLS-inspecting proxy CA goes there) and takes HTTPS_PROXY and NO_PROXY
// from the environment, as any HTTPS client of the machine does.
func webSocketDialer(wsURL string) func(context.Context, string) (net.Conn, error) {
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	return func(ctx context.Context, _ string) (net.Conn, error) {
		c, resp, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPClient: client,
			CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			if resp != nil {
				return nil, fmt.Errorf("WebSocket fallback %s: %s: %w", wsURL, resp.Status, err)
			}
			return nil, fmt.Errorf("WebSocket fallback %s: %w", wsURL, err)
		}
		c.SetReadLimit(-1)
		// The stream outlives the dial's context: gRPC closes the
		// connection when it is done with it.
		return websocket.NetConn(context.Background(), c, websocket.MessageBinary), nil
	}
}
