package serve

import (
	"context"
	"errors"
	"fmt"

	"github.com/better-compute/better-compute/controlplane/gateway"
	"github.com/better-compute/better-compute/controlplane/internal/accept"
	"github.com/better-compute/better-compute/controlplane/internal/clock"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/control"
	"github.com/better-compute/better-compute/controlplane/pkg/metrics"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// newGateway builds the gateway role. The embedded default makes its PKI,
// gateway certificate and default site and pool on first start; with
// PostgreSQL the operator runs pki init and pki issue-gateway first.
//
// When host.gateway.internal is configured it also binds the internal
// control API's listener (returned for Run to serve; nil otherwise) and
// advertises its address in the gateway's row.
func newGateway(ctx context.Context, cfg *config.Config, st store.Store, opts Options, wakeups <-chan struct{}, m *metrics.Metrics, listeners *accept.Watch) (*gateway.Gateway, *control.Server, error) {
	gc := cfg.Host.Gateway
	certFile, keyFile := gc.TLSFiles.Cert, gc.TLSFiles.Key
	var bundle *pki.Bundle
	if cfg.Embedded {
		setup, err := bootstrap.Embedded(ctx, st, cfg.Secret, cfg.DataDir, gc.Region, cfg.PublicHosts(), cfg.PKI.NodeCAValidity.Duration)
		if err != nil {
			return nil, nil, fmt.Errorf("gateway role: %w", err)
		}
		if setup.Initialised {
			opts.Log.InfoContext(ctx, "PKI initialised for the embedded default", "trust_domain", setup.Bundle.TrustDomain,
				"gateway_cert", setup.CertFile)
		}
		if setup.CertIssued {
			opts.Log.InfoContext(ctx, "Gateway certificate issued", "cert", setup.CertFile, "names", setup.Names.String())
		}
		bundle = setup.Bundle
		if certFile == "" && keyFile == "" {
			certFile, keyFile = setup.CertFile, setup.KeyFile
		}
	} else {
		b, err := bootstrap.LoadBundle(ctx, st, cfg.Secret)
		if errors.Is(err, bootstrap.ErrNoBundle) {
			return nil, nil, fmt.Errorf("gateway role: %w: run better-compute pki init --trust-domain <domain> first, then pki issue-gateway", err)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("gateway role: %w", err)
		}
		bundle = b
	}
	if certFile == "" || keyFile == "" {
		return nil, nil, &config.Error{Key: "host.gateway.tlsFiles", Msg: "cert and key are required with PostgreSQL: write them with better-compute pki issue-gateway --dns <public host> --out-dir <dir>"}
	}
	m.WatchCertificate(metrics.CertKindServing, "gateway", certFile)
	ctrl, err := internalServer(cfg, bundle, listeners, opts.Log)
	if err != nil {
		return nil, nil, err
	}
	var internalAddress string
	if ctrl != nil {
		internalAddress = ctrl.Address()
		m.WatchCertificate(metrics.CertKindInternal, "server", cfg.Host.Gateway.Internal.TLSFiles.Cert)
	}
	gw, err := gateway.New(gateway.Config{
		Clock:                  clock.Reading(opts.Now),
		Listen:                 gc.Listen,
		PublicURL:              gc.PublicURL,
		Region:                 gc.Region,
		CertFile:               certFile,
		KeyFile:                keyFile,
		MaxStreams:             gc.MaxStreams,
		HeartbeatInterval:      gc.HeartbeatInterval.Duration,
		GPUHealth:              cfg.GPUHealth.Thresholds(),
		DrainDelay:             gc.DrainDelay.Duration,
		NodeCertTTL:            gc.NodeCertTTL.Duration,
		NodeLogInterval:        gc.NodeLogInterval.Duration,
		HelloTimeout:           gc.Limits.HandshakeTimeout.Duration,
		MaxConnecting:          gc.Limits.Pending,
		MaxQueued:              gc.Limits.Queued,
		JoinRate:               gc.Limits.JoinsPerSecond,
		HandshakeRate:          gc.Limits.HandshakesPerSecond,
		JoinBurst:              gc.Limits.JoinBurst,
		MaxConnectingPerSource: gc.Limits.PendingPerSource,
		MaxQueuedPerSource:     gc.Limits.QueuedPerSource,
		ClockSkewLimit:         gc.ClockSkewLimit.Duration,
		ReattestGrace:          cfg.PKI.ReattestGrace.Duration,
		Secret:                 cfg.Secret,
		Version:                opts.Version,
		InternalAddress:        internalAddress,
		WebSocketListen:        wsListen(gc.WS),
		WebSocketTLS:           gc.WS.TLS == config.WebSocketTLSGateway,
		Wakeups:                wakeups,
		Metrics:                m,
		Listeners:              listeners,
	}, st, bundle, opts.Log)
	if err != nil {
		if ctrl != nil {
			ctrl.Close()
		}
		return nil, nil, err
	}
	return gw, ctrl, nil
}

// wsListen is the WebSocket fallback's listen address, "" when it is off.
func wsListen(ws config.WebSocketFallback) string {
	if !ws.Enabled() {
		return ""
	}
	return ws.Listen
}
