// Package gateway is the gateway role: the gRPC endpoint daemons dial
// (DESIGN.md, "The session protocol" and "gateway"). It serves JoinService
// (Join, Renew, Secret) and SessionService.Connect on one TLS 1.3 listener.
//
// # Identity
//
// The listener asks for a client certificate but does not require one
// (tls.VerifyClientCertIfGiven with the node CA roots): Join is authorised by
// its join token alone. Renew, Secret and Connect need a node certificate that
// chains to the node CA roots, names exactly one node SPIFFE ID in the
// deployment's trust domain (pki.NodeVerifier), whose serial is not revoked and
// whose node exists. The node id always comes from the certificate, never from
// a message. The serving certificate is read from files and re-read every
// CertReloadInterval; new handshakes get the new one, open connections keep
// theirs. New connections are set up at a bounded rate (HandshakeRate, with
// HandshakeBurst) and at most MaxConnecting at a time between accept and
// Welcome, so a reconnect storm waits instead of starving live sessions of
// CPU, and the gateway finishes the sessions it started before the daemons'
// handshake deadlines pass. Of those, at most MaxConnectingPerSource come
// from one source address, so that idle connections from one address cannot
// starve the nodes of others; a source's further connections wait in its
// own queue (MaxQueuedPerSource; past it they are closed), and past
// MaxQueued waiting in all the gateway stops accepting (listen.go). The TLS
// handshake and the Hello must each come within HelloTimeout.
//
// Join calls are rate-limited per source address (JoinRate, JoinBurst;
// joinlimit.go): past it a Join is refused with RESOURCE_EXHAUSTED, a
// "retry-after-ms" trailer and a RetryInfo detail. Refused Joins are audited
// in summary, one row a minute per source and reason at most (package
// admission, RefusalSummaryEvery).
//
// # Sessions
//
// A Connect stream must open with Hello within HelloTimeout. The gateway then
// records the session (store.SessionOpen: a newer session of the node
// supersedes the older one with a higher epoch), marks the node ready and
// answers Welcome with the session id, the heartbeat interval, its clock, the
// capabilities in force (those of Hello the gateway supports) and the node and
// gateway ids. Beyond MaxStreams open streams a Connect is refused with
// RESOURCE_EXHAUSTED, a "retry-after-ms" trailer and a RetryInfo detail.
//
// Each session costs one goroutine, the handler's receive loop; sends are
// serialised by a per-session mutex (Gateway.Send is the seam command dispatch
// uses). Welcome is a session's first message: a dispatch round that finds the
// session between its record and its Welcome sends it nothing (its commands
// wait for the round after). A session is ended from outside (superseded,
// revoked) by closing its connection, which ends the receive loop; a node
// keeps one session per connection. The gRPC server is configured for many idle streams: no read
// buffer of its own (TLS buffers already), a pooled 16 KiB write buffer,
// static 64 KiB flow-control windows and few streams per connection.
//
// Heartbeats (and any other message) are recorded in memory and written at
// most once per FlushInterval in one transaction for all sessions of the
// gateway, together with the rows of sessions that ended. The same
// transaction reads back which sessions the database still gives this
// gateway: a session superseded on another gateway is closed within one
// interval.
//
// A heartbeat's sent_at, the node's clock, against the gateway's gives the
// node's clock skew (store.Node.ClockSkew, the node's clock minus the
// gateway's). It is queued on a session's first heartbeat and then only when
// it moved by more than a second, and written after each flush in one
// transaction for all nodes measured (NodeSetClockSkew), never once per
// heartbeat.
//
// # Liveness and revocation
//
// The gateway holds the lease gateway:<id> (LeaseTTL, renewed every
// LeaseRenewInterval) and keeps its gateways row (public URL, region, session
// count, max streams, heartbeat_at) fresh at each renewal. Its session writes
// are fenced on that lease. Every RevocationPollInterval it reads the
// revocation feed and ends the sessions it concerns with a Revoked message: a
// session whose certificate serial is revoked, and, for a revocation that
// names a node, every session of that node opened before the revocation.
//
// # Draining on command
//
// An operator's gateways.drain sets the row's drain_requested; the gateway
// reads it back with each refresh of its row (every LeaseRenewInterval) and
// then refuses new sessions and sends each session Drain with a random delay
// up to DrainDelay, preferring the region's other gateways, without
// stopping. gateways.undrain clears it and the gateway takes sessions again;
// a shutdown is never undone (drain.go).
//
// # Shutdown
//
// When Run's context ends the gateway marks itself draining, sends every
// session Drain with a random delay up to DrainDelay, stops accepting, gives
// streams ShutdownGrace to end and then closes every connection, writes the
// ended sessions' rows in one transaction, releases its lease and deletes its
// gateways row.
package gateway
