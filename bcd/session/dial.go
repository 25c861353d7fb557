package session

import (
	"crypto/tls"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
)

// minWindow is the smallest HTTP/2 flow-control window gRPC accepts.
const minWindow = 64 << 10

// transport holds the gRPC connection settings shared by Join and Client.
type transport struct {
	readBuffer       int
	writeBuffer      int
	keepalive        time.Duration
	keepaliveTimeout time.Duration
	userAgent        string
}

// dial returns a lazily connecting ClientConn to gw over TLS cfg. The
// target uses the passthrough resolver: the host is resolved when the
// connection is made, with no resolver goroutine kept per connection. For
// a WebSocket fallback URL the connection is a WebSocket (websocket.go)
// and cfg's TLS runs inside it, end to end.
func dial(gw gatewayAddr, cfg *tls.Config, t transport) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithReadBufferSize(t.readBuffer),
		grpc.WithWriteBufferSize(t.writeBuffer),
		grpc.WithInitialWindowSize(minWindow),
		grpc.WithInitialConnWindowSize(minWindow),
		grpc.WithDisableServiceConfig(),
		grpc.WithUserAgent(t.userAgent),
	}
	if t.keepalive > 0 {
		// gRPC also sets TCP_USER_TIMEOUT to the keepalive timeout, so a
		// heartbeat left unacknowledged that long breaks the connection.
		opts = append(opts, grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:    t.keepalive,
			Timeout: t.keepaliveTimeout,
		}))
	}
	if gw.ws != "" {
		opts = append(opts, grpc.WithContextDialer(webSocketDialer(gw.ws)))
	}
	cc, err := grpc.NewClient("passthrough:///"+gw.addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial gateway %s: %w", gw.url, err)
	}
	return cc, nil
}

// verifyFailure remembers the last TLS verification failure of one
// connection, so that an RPC error (which carries it only as text) can be
// reported as the typed error it was.
type verifyFailure struct {
	mu  sync.Mutex
	err error
}

func (v *verifyFailure) set(err error) {
	v.mu.Lock()
	v.err = err
	v.mu.Unlock()
}

func (v *verifyFailure) get() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.err
}
