package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/coder/websocket"

	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// OpenTunnel calls tunnels.create and upgrades GET {basePath}/tunnels/{ticket}
// to a WebSocket with the client's bearer token (docs/tunnels.md). query
// may carry rows, cols and term for a shell. A refusal before the upgrade
// is an *Error with the API's code.
func (c *Client) OpenTunnel(ctx context.Context, req *apiv1.CreateTunnelRequest, query url.Values) (*Tunnel, error) {
	t, err := c.TunnelsCreate(ctx, req)
	if err != nil {
		return nil, err
	}
	return c.DialTunnel(ctx, t.GetPath(), query)
}

// DialTunnel upgrades path (a tunnels.create answer's) to the tunnel's
// WebSocket.
func (c *Client) DialTunnel(ctx context.Context, path string, query url.Values) (*Tunnel, error) {
	u, err := url.Parse(c.BaseURL)
	if err != nil {
		return nil, fmt.Errorf("open tunnel: base URL: %w", err)
	}
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	u.Path, u.RawQuery = path, query.Encode()
	h := http.Header{}
	h.Set("X-Better-Compute", "1")
	if c.Token != "" {
		h.Set("Authorization", "Bearer "+c.Token)
	}
	opts := &websocket.DialOptions{HTTPHeader: h, CompressionMode: websocket.CompressionDisabled, HTTPClient: c.HTTP}
	ws, res, err := websocket.Dial(ctx, u.String(), opts)
	if err != nil {
		if res != nil && res.StatusCode != http.StatusSwitchingProtocols {
			var b []byte
			if res.Body != nil {
				b, _ = io.ReadAll(io.LimitReader(res.Body, 1024))
			}
			return nil, newError(res, b)
		}
		return nil, fmt.Errorf("open tunnel: %w", err)
	}
	ws.SetReadLimit(tunnel.MaxFrame)
	return &Tunnel{ws: ws}, nil
}

// Tunnel is the client's end of a tunnel: TunnelFrame messages.
type Tunnel struct {
	ws *websocket.Conn
}

// Send sends a frame. Not safe for concurrent use with itself.
func (t *Tunnel) Send(ctx context.Context, f *sessionv1.TunnelFrame) error {
	return t.ws.Write(ctx, websocket.MessageBinary, tunnel.Encode(f))
}

// ErrRevoked matches (errors.Is) a *RevokedError.
var ErrRevoked = errors.New("credential revoked")

// RevokedError reports that the API ended a long-lived call (a tunnel, the
// event stream) because the API token that opened it, or the node it
// reached, was revoked, deleted or expired. Its text is the API's one line,
// such as "credential revoked: API token tok_… was revoked"; retrying with
// the same token does not help.
type RevokedError struct{ Reason string }

func (e *RevokedError) Error() string {
	if e.Reason == "" {
		return ErrRevoked.Error()
	}
	return e.Reason
}

// Is makes errors.Is(err, ErrRevoked) hold.
func (e *RevokedError) Is(target error) bool { return target == ErrRevoked }

// Recv reads the next frame; io.EOF when the API closed the tunnel
// normally; a *RevokedError when the API ended it because its token or
// node was revoked (close status tunnel.CloseRevoked).
func (t *Tunnel) Recv(ctx context.Context) (*sessionv1.TunnelFrame, error) {
	typ, b, err := t.ws.Read(ctx)
	if err != nil {
		var ce websocket.CloseError
		switch s := websocket.CloseStatus(err); {
		case s == websocket.StatusNormalClosure || s == websocket.StatusGoingAway:
			return nil, io.EOF
		case s == websocket.StatusCode(tunnel.CloseRevoked) && errors.As(err, &ce):
			return nil, &RevokedError{Reason: ce.Reason}
		}
		return nil, err
	}
	if typ != websocket.MessageBinary {
		return nil, fmt.Errorf("%w: a text message", tunnel.ErrFrame)
	}
	return tunnel.Parse(b)
}

// Close closes the WebSocket.
func (t *Tunnel) Close() error { return t.ws.Close(websocket.StatusNormalClosure, "") }
