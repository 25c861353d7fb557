// Package plugin runs bcd's plugins and is the library plugins are built on.
//
// A plugin is an executable named bcx-<name> in bcd's plugin directory
// (/usr/lib/bcd/plugins by default; DESIGN.md, "bcd": plugins). The host side
// (Host) finds the executables, starts each through hashicorp/go-plugin over
// gRPC and keeps it running: a plugin that exits is restarted with
// exponential backoff, a plugin that stops answering is killed and restarted,
// and List reports every plugin's version, capabilities and health for the
// node's inventory. The plugin side is Serve, which a plugin's main calls with
// its implementation of pluginv1.PluginServiceServer.
//
// The protocol is bettercompute.plugin.v1 (proto/plugin/v1/plugin.proto),
// versioned through go-plugin's handshake: a magic cookie (so a plugin run by
// hand says so and exits) and ProtocolVersion. A plugin that speaks no
// version the host knows is refused at start with an error naming both.
//
// Every call runs under a deadline. BMC calls (Power, BootDevice, BMCInfo)
// get the target's own timeout (30 s when unset) plus Config.CallGrace, so the
// plugin's clean timeout error arrives first and a hung plugin still cannot
// hold a caller longer. A call in flight when its plugin dies fails at once
// with ErrCrashed; the next call waits for the restart.
//
// Secrets: a BMC password travels only inside the gRPC request on the
// plugin's private socket (go-plugin's automatic mutual TLS, in a directory
// only bcd can enter), never in the plugin's arguments or environment. The
// plugin starts with an environment of its own (Config.Env), not bcd's. Every
// error this package returns and every log line it writes, the plugin's own
// stderr lines included, has the passwords of recent calls replaced by
// "[REDACTED]".
//
// Errors: match with errors.Is against ErrNotFound, ErrUnavailable,
// ErrCrashed, ErrTimeout, ErrUnsupported, ErrBMC and ErrClosed; errors.As
// with *Error gives the plugin, operation and, for errors the plugin
// reported, its Reason (AUTH_FAILED, UNREACHABLE, ...).
//
// What is left to callers: the command executor maps session commands
// (power.status|on|off|cycle|reset, boot.set) to Power and BootDevice, fills
// the BMCTarget from the node's configuration and the sealed credentials it
// fetched with JoinService.Secret, and runs the call in the root helper; the
// inventory converts List to sessionv1.PluginInfo.
package plugin
