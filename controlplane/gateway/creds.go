package gateway

import (
	"context"
	"log/slog"
	"net"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/credentials"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
)

// loggedCreds reports refused TLS handshakes (a certificate from another CA,
// an old TLS version) in the gateway's log, at most a few a second so that a
// storm of them cannot flood it.
type loggedCreds struct {
	credentials.TransportCredentials
	log     *slog.Logger
	limit   *rate.Limiter
	metrics Metrics
	gateway string
}

func newLoggedCreds(c credentials.TransportCredentials, log *slog.Logger, m Metrics, gateway string) *loggedCreds {
	return &loggedCreds{TransportCredentials: c, log: log, limit: rate.NewLimiter(5, 20), metrics: m, gateway: gateway}
}

// ServerHandshake runs the TLS handshake and logs its failure. A
// connection that brought no client certificate (a Join, or a client with no
// business with sessions) leaves setup here: it cannot open a session, so it
// holds no slot while it idles.
func (c *loggedCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		c.metrics.Refused(c.gateway, reasonTLS)
	} else {
		c.metrics.Handshake(c.gateway)
		if tc, ok := conn.(*trackedConn); ok {
			if ti, ok := info.(credentials.TLSInfo); !ok || len(ti.State.PeerCertificates) == 0 {
				tc.settle()
			}
		}
	}
	if err != nil && c.limit.Allow() {
		c.log.LogAttrs(context.Background(), slog.LevelWarn, "TLS handshake refused",
			slog.String("remote", conn.RemoteAddr().String()), slog.String(logkey.Err, err.Error()))
	}
	return out, info, err
}

// Clone returns a copy sharing the log and its limit.
func (c *loggedCreds) Clone() credentials.TransportCredentials {
	return &loggedCreds{TransportCredentials: c.TransportCredentials.Clone(), log: c.log, limit: c.limit, metrics: c.metrics, gateway: c.gateway}
}
