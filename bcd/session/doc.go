// Package session is the node side of the Better Compute session protocol
// (proto/session/v1): joining with a join token, the one long-lived
// Connect stream to a gateway of the node's region, heartbeats, command
// delivery and in-session certificate renewal. It is written once and used
// by both bcd (bcd/cmd/bcd) and the simulator's FakeDaemon
// (controlplane/pkg/sim).
//
// # Joining
//
// [Join] sends a CSR for the node's key and the join token to a gateway's
// JoinService over server-authenticated TLS 1.3 and returns the node's
// identity ([JoinResult]). The gateway is trusted only through a [Trust]:
// the pin that the join token carries, an explicit pin, or an explicit CA
// pool. Nothing is ever trusted on first use.
//
// # The session
//
// A [Client] holds the session. [Client.Run] loops until its context ends:
//
//  1. The first connection is staggered by a random delay of up to
//     [Config].StartJitter, so that daemons started together (a rack
//     powering on, a fleet of simulated daemons) do not dial at once.
//  2. It dials one gateway of [Config].Gateways (one gRPC ClientConn at a
//     time, TLS 1.3, the client certificate taken from the Client's current
//     certificate at each handshake, so a renewed certificate is used for
//     every later connection), opens SessionService.Connect, sends Hello and
//     waits for Welcome, all within [Config].HandshakeTimeout.
//  3. It sends a Heartbeat every Welcome.heartbeat_interval, delivers
//     Command and Cancel to the [Handler], and renews the certificate
//     through JoinService.Renew at its renew-after time (about two thirds of
//     its life), handing the new certificate to [Config].Identity to be
//     persisted.
//  4. When the session ends it waits a full-jitter exponential backoff
//     (uniform in [0, min(BackoffMax, BackoffBase·2^n)]), at least the
//     gateway's retry-after-ms hint when one was sent, and dials again; the
//     attempt counter n resets when a welcomed session is drained or closed
//     by the gateway (EOF), or is lost after lasting [Config].StableAfter
//     from its Welcome. Failures before Welcome, lost sessions shorter than
//     that and sessions the gateway ends as superseded (ABORTED) count as
//     failed attempts. A failed attempt moves
//     on to the next gateway of the list; a Drain makes it wait a random
//     share of the Drain's delay (also when the gateway closes sooner) and
//     then reconnect to a preferred or another gateway without backoff.
//
// Run returns nil when its context ends, an error wrapping [ErrRevoked] when
// the gateway says the node is revoked (Revoked, or PERMISSION_DENIED on
// Connect, or UNAUTHENTICATED on Renew), and an error wrapping
// [ErrCertificateExpired] when the gateway refuses to re-attest the node's
// certificate because it expired longer ago than the re-attestation grace:
// both need an operator, so retrying would only be a crash loop. A
// certificate that expired within the grace, or whose issuer the gateway no
// longer trusts (a node-CA rotation retired it while the node was off: the
// handshake fails with unknown_ca), is re-attested with the node's key
// (JoinService.Reattest), without an operator; any other failure of that is
// retried with backoff, and so is a refusal with GRACE_PASSED of a
// certificate still valid by the gateway's time (the gateway may hold a
// stale bundle, or have re-attestation off): only once it has expired is
// that final. bad_certificate is not taken for a refused issuer.
//
// # Clocks
//
// Join and Renew answers and Welcome carry the gateway's time. When this
// machine's clock disagrees by more than a minute, the Client (and Join)
// logs the skew once, in seconds and with its direction ("this machine's
// clock is 5400 s behind the gateway's"), judges the certificate it was just
// issued by the gateway's time, so that a wrong clock never refuses a
// certificate a join token was spent on, and keeps the offset: later TLS
// verification of gateways' certificates, the renewal time and the expiry
// check use the gateway-corrected time, never earlier than the NotBefore of
// the node's current certificate. Heartbeats carry the machine's own time,
// from which the gateway records the skew. A certificate outside its
// validity at that time fails verification with "certificate not yet valid /
// expired: this machine's clock reads T", not as a pin mismatch.
//
// # Cost per session
//
// The simulator runs thousands of Clients in one process, so a Client keeps
// its footprint small: no gRPC read buffer (TLS already buffers each
// record), a small pooled write buffer, static 64 KiB flow-control windows,
// no DNS resolver goroutine (passthrough target), and, besides gRPC's own,
// one goroutine per Client (the one running Run, which also receives) plus
// short-lived timer callbacks for heartbeats, renewals and drains. gRPC
// keepalive pings ([Config].Keepalive) also make gRPC set TCP_USER_TIMEOUT,
// so a heartbeat left unacknowledged closes a dead connection; the
// simulator turns them off to save their goroutine.
//
// # Observing a Client
//
// [Config].OnEvent receives an [Event] for each change (connecting,
// connected, disconnected, backoff, draining, renewed), synchronously and in
// order, which is how bcd sends sd_notify READY=1 and how tests wait without
// sleeping.
package session
