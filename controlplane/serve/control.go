package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/better-compute/better-compute/controlplane/gateway"
	"github.com/better-compute/better-compute/controlplane/internal/accept"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/control"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	"github.com/better-compute/better-compute/controlplane/pkg/wake"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// internalServer binds the internal control API of a gateway process
// (host.gateway.internal), or returns nil when it is not configured.
func internalServer(cfg *config.Config, bundle *pki.Bundle, listeners *accept.Watch, log *slog.Logger) (*control.Server, error) {
	in := cfg.Host.Gateway.Internal
	if !in.Enabled() {
		return nil, nil
	}
	id, err := control.NewIdentity(bundle, in.TLSFiles.Cert, in.TLSFiles.Key, log)
	if err != nil {
		return nil, &config.Error{Key: "host.gateway.internal.tlsFiles", Msg: err.Error()}
	}
	srv, err := control.Listen(control.ServerConfig{Listen: in.Listen, Address: in.Address, Listeners: listeners}, id, log)
	if err != nil {
		return nil, fmt.Errorf("gateway role: %w", err)
	}
	return srv, nil
}

// internalClient is the api's client of the gateways' internal control
// API, waking bus for what it cannot reach; nil when it is not configured.
// It presents id, the identity of this process's gateway role when it has
// one, else an identity of its own.
func internalClient(ctx context.Context, cfg *config.Config, st store.Store, bus *wake.Bus, id *control.Identity, log *slog.Logger) (*control.Client, error) {
	in := cfg.Host.Gateway.Internal
	if !in.Enabled() {
		return nil, nil
	}
	if id == nil {
		bundle, err := bootstrap.LoadBundle(ctx, st, cfg.Secret)
		if err != nil {
			return nil, fmt.Errorf("api role: internal control API: %w", err)
		}
		if id, err = control.NewIdentity(bundle, in.TLSFiles.Cert, in.TLSFiles.Key, log); err != nil {
			return nil, &config.Error{Key: "host.gateway.internal.tlsFiles", Msg: err.Error()}
		}
	}
	return control.NewClient(control.ClientConfig{Fallback: bus}, id, st, log)
}

// tunnelRouter opens a tunnel on the gateway of this process when it holds
// the node's session, else through the internal control API (when
// configured).
type tunnelRouter struct {
	st interface {
		SessionGet(context.Context, string) (*store.Session, error)
	}
	local  *gateway.Gateway // nil: no gateway role here
	remote *control.Client  // nil: no internal control API
}

func (r *tunnelRouter) OpenTunnel(ctx context.Context, nodeID string, open *sessionv1.TunnelOpen) (tunnel.Conn, string, error) {
	if r.local != nil {
		if s, err := r.st.SessionGet(ctx, nodeID); err == nil && s.GatewayID == r.local.ID() {
			return r.local.OpenTunnel(ctx, nodeID, open)
		}
	}
	if r.remote != nil {
		return r.remote.OpenTunnel(ctx, nodeID, open)
	}
	if r.local != nil {
		return r.local.OpenTunnel(ctx, nodeID, open)
	}
	return nil, "", errors.New("this api process cannot reach the gateways: configure the internal control API (host.gateway.internal)")
}

// localRevoker pushes revocations to the gateway of this process (the
// all-in-one process without the internal control API).
type localRevoker struct{ gw *gateway.Gateway }

func (r localRevoker) Revoked(_ context.Context, nodeID, _ string) { r.gw.RevokeNow(nodeID) }
