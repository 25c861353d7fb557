// Package upgrade moves bcd to another release: the "upgrade" command
// (DESIGN.md, "bcd"; docs/bcd.md, "Self-upgrade").
//
// # The command
//
// Upgrader.Upgrade runs an "upgrade" command (UpgradeSpec{version,
// base_url}):
//
//  1. It downloads {base}/bcd/{version}/manifest.json and its .minisig from
//     the control plane's downloads route (or a mirror), with timeouts and
//     retries, and verifies the signature against the pinned release keys
//     (/etc/bcd/release-pins, one pin a line), the version and the expiry
//     (package installer/manifest). Nothing in the command is trusted for
//     verification: base_url only says where to download from.
//  2. It downloads {base}/bcd/{version}/{os}-{arch} (resuming with ranges)
//     and checks its size and sha256 against the manifest's binary entry.
//  3. It writes the pending-upgrade marker (DataDir/upgrade/pending.json),
//     then has the Installer swap the binary: as root bcd does it itself
//     (Swap), unprivileged it asks the root helper (op "upgrade"), which
//     verifies everything again against its own pins. The swap copies the new
//     binary beside the running one, keeps the running one as <binary>.prev
//     (a hard link) and renames the new one into place: atomic, never a
//     moment without a binary.
//  4. It asks the node to restart and returns no result: the restarted bcd
//     reports it (see below).
//
// An expired, unverifiable or unpinned manifest, a missing pin file, a
// binary whose digest differs: each fails the command with one clear line and
// changes nothing. None of them is ever checked when bcd starts, so a lost key
// or an expired manifest cannot stop an installed bcd.
//
// # The restart, and rolling back
//
// Once the agent has stopped, Handover tries the new binary before handing
// the process to it: it starts it as a child in trial mode (TrialEnv), which
// loads the identity, connects to a gateway and, on the gateway's Welcome,
// writes "ok <version>" on file descriptor 3 and exits. A binary that does not
// say so within Config.HealthTimeout (it crashed, exited, cannot connect, or
// reports another version) is rolled back: <binary>.prev is restored. Either
// way the result (SUCCEEDED with detail {"from","to"}, or FAILED saying why
// and that it rolled back) is recorded in DataDir/upgrade/result.json and the
// process re-executes the binary now in place (same pid, so systemd's
// Type=notify service and a test's process handle both follow it).
//
// The gateway delivers the command again to the restarted bcd (it is still
// in flight), and Upgrade answers it from the record: the command id is the
// idempotency key across the restart too.
//
// The marker stays until the restarted bcd's first Welcome (Connected). A
// start that finds it still there after an earlier start of the new binary
// (that one crashed before connecting), or a new binary that gets no Welcome
// within HealthTimeout (Resume's health timer), rolls back to <binary>.prev
// and restarts into it.
package upgrade
