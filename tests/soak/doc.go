// Package soak runs a small fleet on PostgreSQL through a compressed day of
// faults and checks, from the database, a write log and the nodes' own
// files, that no node is lost and every command ends exactly once
// (DESIGN.md, "Time in the tests"; issue 15, item 6).
//
// The deployment is the production shape: one migrate, then an api, two
// gateways and two workers (controllers, scheduler, sinks, iam) as separate
// better-compute serve processes from one secret, each with a
// configuration file of its own that fixes its ports, so that a restart
// listens where daemons dial. The fleet is 20 real bcd node processes, each
// under unshare(1) with a hostname and /etc/machine-id of its own
// (testenv.Machine), and 200 FakeDaemons (controlplane/pkg/sim) in the test
// process, all speaking the real protocol over TLS to the real gateways.
// Node certificates live 60 s, so they are renewed many times and expire
// during the control-plane outage.
//
// A steady stream of commands goes through the API, each with an
// idempotency key that a call retries with after a failure: on a real node
// the command appends its key, one line, to a file beside the node's data
// dir; a FakeDaemon's simulated run is enough. On a schedule the test
// injects, in turn: kill -9 of the api, of a gateway, of a worker and of a
// bcd node, each restarted; SIGSTOP of a worker past its leases' TTL, then
// SIGCONT; a gateway removed for good and a new one added on another port;
// the whole control plane stopped for three certificate lifetimes; a clone
// of a node (its hostname and machine id, a data dir of its own) joining.
// At the end it checks that every node is ready and present with no
// operator action; that every command reached exactly one terminal state;
// that no key appears twice in a node's file (and that each command that
// succeeded on a real node appears there once); and that no fenced write
// landed after its lease had passed to a newer epoch.
//
// The fencing check reads a write log the test installs as triggers: the
// processes run with postgres.EnvFenceTag set, so every fenced transaction
// carries "<lease> <holder> <epoch>" in postgres.FenceTagSetting, and a
// trigger on every table records it with each row written; another records
// every change of a lease's holder or epoch. A fenced row whose lease had,
// by the log's order, already moved to another holder or epoch is a
// violation. The check is run once more over the same log with a stale
// write added, in a transaction rolled back, and must catch it.
//
// The test is skipped unless SOAK_DURATION is set (./tests/run sets 8m and
// runs the package on its own, with its own go test -timeout):
//
//	SOAK_DURATION=8m go test -timeout 30m -v ./tests/soak
//	SOAK_DURATION=2h go test -timeout 3h ./tests/soak
//
// The schedule is one cycle of the faults above per 8 minutes, compressed
// or repeated to fit the duration; below 8 minutes the certificate life is
// shortened too (an eighth of the duration, at least 10 s), so that the
// outage is still three lifetimes. The processes' logs go to a folder that
// is kept, and named, when the test fails (SOAK_LOG_DIR chooses it). At the
// end the test prints a summary: faults injected and how long each took to
// recover from, commands by state, and the longest time any node was away.
package soak
