package plugin

import (
	"context"

	goplugin "github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	pluginv1 "github.com/better-compute/better-compute/proto/plugin/v1"
)

// ProtocolVersion is the plugin protocol version this package speaks:
// bettercompute.plugin.v1. It is raised only for a change old plugins or old
// hosts cannot live with; additions go through InfoResponse.capabilities.
const ProtocolVersion = 1

// Handshake is the go-plugin handshake of bcd's plugins. The magic cookie is
// not a secret: it only makes a plugin run by hand say what it is and exit.
var Handshake = goplugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "BCD_PLUGIN_COOKIE",
	MagicCookieValue: "7f1c0e4a9b2d4c3e8a6f5b1d0c9e8f7a",
}

// pluginSetKey names the one plugin every bcx executable serves.
const pluginSetKey = "plugin"

// Capability strings of bettercompute.plugin.v1, as proto/plugin/v1
// declares them.
const (
	CapabilityPower   = pluginv1.CapabilityPower
	CapabilityBoot    = pluginv1.CapabilityBoot
	CapabilityBMCInfo = pluginv1.CapabilityBMCInfo
)

// versionedPlugins is the plugin set per protocol version, for both ends.
func versionedPlugins(impl pluginv1.PluginServiceServer) map[int]goplugin.PluginSet {
	return map[int]goplugin.PluginSet{
		ProtocolVersion: {pluginSetKey: &grpcPlugin{impl: impl}},
	}
}

// grpcPlugin is the go-plugin glue: it registers impl on the plugin's gRPC
// server, and on the host it wraps the connection in a conn.
type grpcPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	impl pluginv1.PluginServiceServer // plugin side only
}

func (p *grpcPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	pluginv1.RegisterPluginServiceServer(s, p.impl)
	return nil
}

// GRPCClient is called with a context go-plugin cancels when the plugin
// process exits: conn.exited.
func (p *grpcPlugin) GRPCClient(ctx context.Context, _ *goplugin.GRPCBroker, cc *grpc.ClientConn) (any, error) {
	return &conn{rpc: pluginv1.NewPluginServiceClient(cc), exited: ctx.Done()}, nil
}

// conn is the host's end of one running plugin process.
type conn struct {
	rpc    pluginv1.PluginServiceClient
	exited <-chan struct{}
}
