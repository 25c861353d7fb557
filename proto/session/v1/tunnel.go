package sessionv1

// CapabilityTunnel is the capability of a node that opens tunnels on
// TunnelOpen (session.proto, docs/tunnels.md).
const CapabilityTunnel = "tunnel"

// Tunnel kinds (TunnelOpen.kind).
const (
	// TunnelKindShell is an interactive shell with a PTY.
	TunnelKindShell = "shell"
	// TunnelKindPort is a TCP connection to 127.0.0.1:port on the node.
	TunnelKindPort = "port"
)
