// Package agent is bcd's node agent, what `bcd node` runs (DESIGN.md,
// "bcd"): it holds the session with the gateways of the node's region
// (package bcd/session), runs the commands they send (package bcd/executor;
// root work through the root helper, package bcd/helper, when unprivileged)
// and reports the machine's inventory and GPU health (packages
// bcd/inventory and bcd/inventory/gpu).
//
// # Inventory
//
//   - The host is scanned once at start, before the first connection: Hello
//     carries the inventory's digest and offers "gpu.nvml" only when NVML
//     answered.
//   - The full Inventory is sent after every Welcome, so a gateway that has
//     just taken the session holds the current one.
//   - The host is scanned again every Config.RescanInterval (5 min by
//     default); the Inventory is sent when its digest changed (Host.Digest
//     leaves readings such as temperatures out, so only a changed machine
//     sends).
//   - The command "inventory.refresh" scans and sends whether or not the
//     digest changed, and succeeds once the scan is done; without a session
//     the Inventory goes out after the next Welcome.
//   - Every Heartbeat carries the current digest, with load, uptime,
//     available memory and the ids of running commands.
//
// # GPU events
//
// The GPU collector's Watch (NVML event set) runs for the life of the agent.
// Each XID or uncorrectable ECC event is sent at once as an Event message
// (kind "gpu.xid" with the XID number, or "gpu.ecc.uncorrected"; GPU UUID;
// severity). Events that find no session are kept, up to MaxPendingEvents,
// and sent after the next Welcome. Each event also starts a scan, so a GPU
// whose health changed is reported in a new Inventory at once. A host without
// NVML watches nothing and says so once, at info level.
//
// # Commands and the root helper
//
// The executor is the session's Handler; its undelivered results go into
// the next Hello, and into each later Hello until a Welcome answers one.
// Commands and shells without as_root run as the command user
// (Config.CommandUser, package bcd/cmduser), never as root or bcd's own uid.
// Commands that ask for root (ExecSpec.as_root) run in bcd itself when it
// runs as root. With Config.Unprivileged every command and shell goes to
// the root helper's socket (a root one under a grant bound to its id), and
// when no helper listens they fail with helper.ErrUnavailable's message
// ("the bcd root helper is not running ...").
//
// # State
//
// The agent keeps its connection state for bcd status and bcd doctor
// (package bcd/nodestate): with Config.StateDir it rewrites the state file
// there at start, at every connect and disconnect (failed attempts included,
// with their error), renewal and failed renewal, and when it stops; with
// Config.Notifier it sends the state's line ("connected to <gateway> since
// <time>", "disconnected since <time>: <last error>; certificate valid until
// <time>") whenever the line changes, which bcd node passes to systemd as
// STATUS=. Nothing here stops the systemd watchdog: a disconnected agent
// is alive and retrying.
//
// # Stopping
//
// Run returns when its context ends (nil) or the session client fails for
// good (revoked, certificate expired). Running commands are cancelled, their
// process groups killed, and Run waits for them before it returns.
package agent
