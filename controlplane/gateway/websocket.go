package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
)

// WebSocketPath is the path of the WebSocket fallback (the seeds'
// wss://<publicHost>/v1/session).
const WebSocketPath = "/v1/session"

// The WebSocket fallback (DESIGN.md, "Tunnels, the internal control API and
// the WebSocket fallback") carries the gateway's gRPC connection, byte for
// byte, inside a WebSocket, for sites whose TLS-inspecting proxies
// terminate TLS and strip client certificates. The proxy sees the outer
// TLS (its own, or the gateway's when Config.WebSocketTLS); inside the
// WebSocket the node and the gateway run the same TLS 1.3 handshake as a
// direct connection, end to end: the gateway signs the handshake
// transcript, which holds both sides' random nonces, with the key the
// node pinned at join (CertificateVerify), and the node sends its
// certificate chain and signs the transcript with its node key. Only then
// is a byte of gRPC exchanged, so the session, Join, Renew, Secret and
// every later stream are sealed end to end, and a proxy that terminates
// the outer TLS sees ciphertext. The connection then joins the gateway's
// one listener (rate, setup slots, ending a session by closing its
// connection) like a direct one.

// wsListener is a net.Listener of the connections the WebSocket handler
// upgrades: Accept returns them in arrival order.
type wsListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newWSListener(addr net.Addr) *wsListener {
	return &wsListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *wsListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *wsListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *wsListener) Addr() net.Addr { return l.addr }

// mergedListener accepts from several listeners at once: the gateway's
// TCP listener and the WebSocket one feed one gRPC server through one
// tracking listener.
type mergedListener struct {
	net.Listener // the first: its Addr is the merged one's
	conns        chan acceptResult
	done         chan struct{}
	once         sync.Once
	all          []net.Listener
}

type acceptResult struct {
	c   net.Conn
	err error
}

func mergeListeners(lns ...net.Listener) *mergedListener {
	m := &mergedListener{Listener: lns[0], conns: make(chan acceptResult), done: make(chan struct{}), all: lns}
	for _, ln := range lns {
		go func() {
			for {
				c, err := ln.Accept()
				select {
				case m.conns <- acceptResult{c, err}:
				case <-m.done:
					if c != nil {
						c.Close()
					}
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	return m
}

func (m *mergedListener) Accept() (net.Conn, error) {
	select {
	case r := <-m.conns:
		return r.c, r.err
	case <-m.done:
		return nil, net.ErrClosed
	}
}

func (m *mergedListener) Close() error {
	m.once.Do(func() { close(m.done) })
	var errs []error
	for _, ln := range m.all {
		errs = append(errs, ln.Close())
	}
	return errors.Join(errs...)
}

// wsConn is an upgraded WebSocket as a net.Conn, with the address of its
// TCP peer (the node, or the proxy in front of it) prefixed "ws:" so that
// the tracking listener's keys never meet a direct connection's. Close
// tells the upgrade handler, which holds the request until then.
type wsConn struct {
	net.Conn
	remote wsAddr
	closed chan struct{}
	once   sync.Once
}

type wsAddr string

func (a wsAddr) Network() string { return "websocket" }
func (a wsAddr) String() string  { return string(a) }

// wsAddrPrefix prefixes a WebSocket connection's TCP peer address in its
// wsAddr.
const wsAddrPrefix = "ws:"

// ip is the IP address of the TCP peer, or the peer's whole address when
// it has no port.
func (a wsAddr) ip() string {
	tcp := strings.TrimPrefix(string(a), wsAddrPrefix)
	if host, _, err := net.SplitHostPort(tcp); err == nil {
		return host
	}
	return tcp
}

func (c *wsConn) RemoteAddr() net.Addr { return c.remote }

func (c *wsConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.closed) })
	return err
}

// serveWebSocket serves the fallback's upgrades on ln until ctx ends and
// hands each upgraded connection to wl. With tlsCfg the listener speaks
// TLS itself (the gateway's certificate, no client certificate asked:
// identity is in-band); without, it is plain HTTP behind a proxy that
// terminates TLS.
func (g *Gateway) serveWebSocket(ctx context.Context, ln net.Listener, wl *wsListener, tlsCfg *tls.Config) error {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+WebSocketPath, func(w http.ResponseWriter, r *http.Request) {
		if g.draining.Load() {
			http.Error(w, "gateway is draining: connect to another gateway of the region", http.StatusServiceUnavailable)
			return
		}
		// No origin check: the peer is bcd, not a browser, and nothing
		// rides on the upgrade's cookies or headers; identity is the inner
		// TLS handshake's.
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true, CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			g.log.DebugContext(r.Context(), "WebSocket upgrade refused", "remote", r.RemoteAddr, logkey.Err, err)
			return
		}
		connCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		defer cancel()
		wc := &wsConn{Conn: websocket.NetConn(connCtx, c, websocket.MessageBinary), remote: wsAddr(wsAddrPrefix + r.RemoteAddr),
			closed: make(chan struct{})}
		select {
		case wl.conns <- wc:
		case <-wl.done:
			wc.Close()
			return
		case <-r.Context().Done():
			wc.Close()
			return
		}
		select {
		case <-wc.closed:
		case <-ctx.Done():
			wc.Close()
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "the gateway's WebSocket fallback serves GET "+WebSocketPath+" only", http.StatusNotFound)
	})
	srv := &http.Server{Handler: mux, TLSConfig: tlsCfg, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: nil, BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	var err error
	if tlsCfg != nil {
		err = srv.ServeTLS(ln, "", "")
	} else {
		err = srv.Serve(ln)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("gateway WebSocket fallback: %w", err)
}
