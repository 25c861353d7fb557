// Package nodestate keeps what a running `bcd node` says about itself in its
// data directory, so that `bcd status` and `bcd doctor` can tell without any
// network whether the node holds a session (DESIGN.md, "Identity over time",
// "Health is visible").
//
// The agent (package bcd/agent) writes File (state.json, mode 0644) on every
// change of its connection state and of its certificate: connected or not,
// since when, the gateway, the session id, the last error, the certificate's
// NotAfter and renew-after times, and the re-attestation deadline (NotAfter
// plus the re-attestation grace). Each write replaces the file atomically (a
// temporary file in the same directory, fsync, rename), so a reader sees the
// old state or the new one, never a mix. The file is a report, not a record:
// the directory is not fsynced and nothing reads it back into the agent.
//
// A state file outlives its writer. Inspect judges whether the agent that
// wrote it still runs: the process id it recorded must be alive and the data
// directory's lock (identity.LockFile, which bcd node holds while it runs)
// must be held. Either missing means the state is stale: it says how things
// stood when that agent stopped.
//
// The re-attestation grace is the gateway's (JoinResponse.reattest_grace,
// RenewResponse.reattest_grace, as session.Client.ReattestGrace reports it).
// While the gateway has not said one (a zero grace: never said, or off), the
// agent records DefaultReattestGrace (7 days, the control plane's default
// pki.reattestGrace) with ReattestGraceFrom "default", and readers say that
// the figure is assumed.
package nodestate
