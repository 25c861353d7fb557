package control

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
	controlv1 "github.com/better-compute/better-compute/proto/control/v1"
)

// Store is what the client reads to find a node's gateway.
type Store interface {
	SessionGet(ctx context.Context, nodeID string) (*store.Session, error)
	GatewayGet(ctx context.Context, id string) (*store.Gateway, error)
	GatewayList(ctx context.Context) ([]*store.Gateway, error)
}

// Waker is the fallback the client wakes when the internal API cannot
// reach a node's gateway (a *wake.Bus: in-process subscribers and
// PostgreSQL NOTIFY).
type Waker interface {
	Wake(ctx context.Context, nodeIDs []string)
}

// ClientConfig configures a Client. Zero fields take the documented
// defaults.
type ClientConfig struct {
	// Timeout bounds one call to one gateway. Defaults to 1 s.
	Timeout time.Duration
	// MaxLookups is the most nodes whose session rows one Wake reads; a
	// Wake of more nodes calls every gateway that has an internal address
	// with all of them instead. Defaults to 256.
	MaxLookups int
	// Fallback, when set, is woken for the nodes the internal API did not
	// reach (no session, no internal address, a failed call).
	Fallback Waker
}

// Client calls the internal API of the gateway that holds a node's
// session. It satisfies api.Waker and api.Revoker. Safe for concurrent use.
type Client struct {
	cfg   ClientConfig
	id    *Identity
	store Store
	log   *slog.Logger

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // by internal address
}

// Identity is the identity the client presents; its owner runs
// Identity.Run.
func (c *Client) Identity() *Identity { return c.id }

// NewClient returns a Client presenting id.
func NewClient(cfg ClientConfig, id *Identity, st Store, log *slog.Logger) (*Client, error) {
	cfg.Timeout = cmp.Or(cfg.Timeout, time.Second)
	cfg.MaxLookups = cmp.Or(cfg.MaxLookups, 256)
	if id == nil || st == nil || log == nil {
		return nil, errors.New("internal control API client: identity, store and logger are required")
	}
	return &Client{cfg: cfg, id: id, store: st, log: log, conns: map[string]*grpc.ClientConn{}}, nil
}

// Close closes the connections to the gateways.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for addr, conn := range c.conns {
		conn.Close()
		delete(c.conns, addr)
	}
}

// conn returns the (lazily connecting) client connection to address.
func (c *Client) conn(address string) (controlv1.ControlServiceClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[address]; cc != nil {
		return controlv1.NewControlServiceClient(cc), nil
	}
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return nil, fmt.Errorf("internal address %q: %w", address, err)
	}
	cc, err := grpc.NewClient("passthrough:///"+address, grpc.WithTransportCredentials(credentials.NewTLS(c.id.clientTLS(host))))
	if err != nil {
		return nil, fmt.Errorf("dial internal API %s: %w", address, err)
	}
	c.conns[address] = cc
	return controlv1.NewControlServiceClient(cc), nil
}

// route groups nodeIDs by the internal address of the gateway holding each
// one's session; the rest are returned as missed.
func (c *Client) route(ctx context.Context, nodeIDs []string) (byAddr map[string][]string, missed []string) {
	byAddr = map[string][]string{}
	if len(nodeIDs) > c.cfg.MaxLookups {
		gws, err := c.store.GatewayList(ctx)
		if err != nil {
			return nil, nodeIDs
		}
		for _, g := range gws {
			if g.InternalAddress != "" && !g.Draining {
				byAddr[g.InternalAddress] = nodeIDs
			}
		}
		if len(byAddr) == 0 {
			return nil, nodeIDs
		}
		return byAddr, nil
	}
	addrOf := map[string]string{} // gateway id → internal address
	for _, n := range nodeIDs {
		s, err := c.store.SessionGet(ctx, n)
		if err != nil {
			missed = append(missed, n)
			continue
		}
		addr, ok := addrOf[s.GatewayID]
		if !ok {
			if g, err := c.store.GatewayGet(ctx, s.GatewayID); err == nil {
				addr = g.InternalAddress
			}
			addrOf[s.GatewayID] = addr
		}
		if addr == "" {
			missed = append(missed, n)
			continue
		}
		byAddr[addr] = append(byAddr[addr], n)
	}
	return byAddr, missed
}

// Wake calls Wake on the gateway holding each node's session, and wakes
// the fallback for the nodes it could not reach that way. It returns once
// every call has answered or timed out; errors are logged, never returned:
// the gateways' loops find the commands anyway.
func (c *Client) Wake(ctx context.Context, nodeIDs []string) {
	if len(nodeIDs) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	byAddr, missed := c.route(ctx, nodeIDs)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for addr, nodes := range byAddr {
		wg.Go(func() {
			if err := c.wakeOne(ctx, addr, nodes); err != nil {
				c.log.WarnContext(ctx, "Internal wake-up failed; falling back to the wake-up bus", "address", addr, logkey.Err, err)
				mu.Lock()
				missed = append(missed, nodes...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(missed) > 0 && c.cfg.Fallback != nil {
		c.cfg.Fallback.Wake(ctx, missed)
	}
}

func (c *Client) wakeOne(ctx context.Context, addr string, nodes []string) error {
	cl, err := c.conn(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	if _, err := cl.Wake(ctx, &controlv1.WakeRequest{NodeIds: nodes}); err != nil {
		return fmt.Errorf("wake on %s: %w", addr, err)
	}
	return nil
}

// Revoked tells the gateway holding the node's session (every gateway with
// an internal address when nodeID is empty, a revocation by serial alone)
// to read the revocation feed now. Errors are logged: the gateways poll the
// feed every second anyway.
func (c *Client) Revoked(ctx context.Context, nodeID, serial string) {
	ctx = context.WithoutCancel(ctx)
	var addrs []string
	if nodeID != "" {
		byAddr, _ := c.route(ctx, []string{nodeID})
		for a := range byAddr {
			addrs = append(addrs, a)
		}
	} else if gws, err := c.store.GatewayList(ctx); err == nil {
		for _, g := range gws {
			if g.InternalAddress != "" {
				addrs = append(addrs, g.InternalAddress)
			}
		}
	}
	var wg sync.WaitGroup
	for _, addr := range addrs {
		wg.Go(func() {
			cl, err := c.conn(addr)
			if err == nil {
				cctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
				_, err = cl.Revoke(cctx, &controlv1.RevokeRequest{NodeId: nodeID, Serial: serial})
				cancel()
			}
			if err != nil {
				c.log.WarnContext(ctx, "Internal revocation push failed; the gateway reads the feed within a second", "address", addr, logkey.Err, err)
			}
		})
	}
	wg.Wait()
}
