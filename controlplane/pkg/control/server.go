package control

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/controlplane/internal/accept"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	controlv1 "github.com/better-compute/better-compute/proto/control/v1"
)

// DefaultListen is host.gateway.internal.listen's default.
const DefaultListen = ":8444"

// maxWakeNodes bounds the node ids of one Wake call.
const maxWakeNodes = 100000

// Gateway is what the server asks of the gateway of its process (a
// *gateway.Gateway satisfies it).
type Gateway interface {
	// WakeNodes runs a dispatch round now when any of the nodes holds a
	// session here, and returns how many do.
	WakeNodes(nodeIDs []string) int
	// RevokeNow reads the revocation feed now, and reports whether the
	// node (empty: none named) holds a session here.
	RevokeNow(nodeID string) bool
	// OpenTunnel opens a tunnel on the node's session here.
	tunnel.Opener
}

// ServerConfig configures a Server. Zero fields take the documented
// defaults.
type ServerConfig struct {
	// Listen is the TCP address. Defaults to DefaultListen (:8444).
	Listen string
	// Address is the host:port other processes dial, written to the
	// gateways row. Defaults to the bound address when Listen names a
	// host, else localhost:<bound port>.
	Address string
	// Listeners watches the listener: accepts back off on temporary
	// errors, and the process's /readyz reports it when it keeps failing
	// (internal/accept). Defaults to none (back-off only).
	Listeners *accept.Watch
}

// Server serves ControlService for one gateway.
type Server struct {
	cfg     ServerConfig
	id      *Identity
	log     *slog.Logger
	ln      net.Listener
	address string
}

// Listen binds the internal API's listener; Run serves it. It fails when
// the address is malformed or cannot be bound.
func Listen(cfg ServerConfig, id *Identity, log *slog.Logger) (*Server, error) {
	cfg.Listen = cmp.Or(cfg.Listen, DefaultListen)
	if id == nil || log == nil {
		return nil, errors.New("internal control API: identity and logger are required")
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("internal control API: listen %q is not a host:port address", cfg.Listen)
	}
	if cfg.Address != "" {
		if _, _, err := net.SplitHostPort(cfg.Address); err != nil {
			return nil, fmt.Errorf("internal control API: address %q is not a host:port address", cfg.Address)
		}
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("internal control API listen on %s: %w", cfg.Listen, err)
	}
	address := cfg.Address
	if address == "" {
		port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
			host = "localhost"
		}
		address = net.JoinHostPort(host, port)
	}
	return &Server{cfg: cfg, id: id, log: log, ln: cfg.Listeners.Wrap("internal_api", ln), address: address}, nil
}

// Identity is the identity the server presents and verifies clients
// with; its owner runs Identity.Run (the files and the bundle re-read).
func (s *Server) Identity() *Identity { return s.id }

// Address is the host:port other processes dial (ServerConfig.Address).
func (s *Server) Address() string { return s.address }

// Addr is the bound address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Run serves gw until ctx ends, then stops (in-flight calls get a second
// to finish).
func (s *Server) Run(ctx context.Context, gw Gateway) error {
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(s.id.serverTLS())), grpc.MaxRecvMsgSize(8<<20))
	controlv1.RegisterControlServiceServer(srv, &service{gw: gw, log: s.log})
	s.log.InfoContext(ctx, "Internal control API listening", "addr", s.ln.Addr().String(), "address", s.address)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(s.ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("internal control API serve: %w", err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(time.Second):
		srv.Stop()
	}
	return nil
}

// service implements ControlService over a Gateway.
type service struct {
	controlv1.UnimplementedControlServiceServer
	gw  Gateway
	log *slog.Logger
}

func (s *service) Wake(_ context.Context, r *controlv1.WakeRequest) (*controlv1.WakeResponse, error) {
	if n := len(r.GetNodeIds()); n > maxWakeNodes {
		return nil, status.Errorf(codes.InvalidArgument, "wake: %d node ids, at most %d", n, maxWakeNodes)
	}
	return &controlv1.WakeResponse{Sessions: int32(s.gw.WakeNodes(r.GetNodeIds()))}, nil
}

func (s *service) Revoke(_ context.Context, r *controlv1.RevokeRequest) (*controlv1.RevokeResponse, error) {
	return &controlv1.RevokeResponse{Held: s.gw.RevokeNow(r.GetNodeId())}, nil
}

// Close closes the listener; Run closes it too. Safe to call more than
// once.
func (s *Server) Close() { _ = s.ln.Close() }
