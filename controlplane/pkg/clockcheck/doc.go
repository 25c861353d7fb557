// Package clockcheck keeps a control-plane process whose clock is wrong
// from serving (issue 36; DESIGN.md, "Identity over time", Clocks). A
// gateway judges every node certificate by its own clock: one set back more
// than the certificates' backdate (an hour; a VM restored from a snapshot,
// an RTC after a power loss) would find every node's valid certificate not
// yet valid and take the whole fleet offline, and spend join tokens on
// joins that then fail. So a process refuses to become ready, and says why,
// rather than refusing the fleet.
//
// The clock is wrong when it differs from the database's clock by more
// than MaxDifference (either way), or is more than MaxDifference behind the
// newest node certificate the deployment issued (the newest successful
// node.join, node.renew or node.reattested audit row, stamped by the
// issuing process's clock). On SQLite the database's clock is this
// process's, so only the second holds there.
//
// A Gate checks at start and every Interval until the clock is right; the
// roles that judge certificates or act on time (the gateway, the workers)
// start only once it is. The reason is logged (once per change), returned
// by Check for /readyz, and shown by better-compute doctor (its clock
// check). The check runs before readiness only: a clock that steps back
// while the process serves is left to the nodes' own skew handling and to
// doctor.
package clockcheck
