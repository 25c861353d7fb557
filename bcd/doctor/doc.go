// Package doctor checks a node from its own side: what `bcd doctor` runs
// when a node does not show up in the control plane (DESIGN.md, "bcd"). It
// needs no session and no control plane: every check works with the network
// down, and says so.
//
// The checks, by id (Target names the gateway, file or plugin when there is
// one):
//
//	identity          the data directory holds an identity that loads
//	node.certificate  the node certificate matches the key, chains to the node CA roots, is valid now; time left,
//	                  and whether its renewal is overdue
//	node.session      the running bcd node's own word from its state file (package bcd/nodestate): connected,
//	                  or disconnected since when and why, and the certificate's and re-attestation's time left
//	join-token        the --token-file parses; its pin matches the one the node trusts (expiry and uses are
//	                  known only to the control plane)
//	gateway.dns       each gateway's host name resolves
//	gateway.tcp       a TCP connection to each gateway opens
//	gateway.tls       the TLS 1.3 handshake succeeds and the gateway's chain verifies against the pinned gateway
//	                  CA (or the CA file the node joined with), as the agent verifies it; a TLS-inspecting proxy
//	                  fails here
//	gateway.clock     this machine's clock against the gateway's (see below)
//	clock             this machine's clock is synchronised by NTP (the kernel's adjtimex state; Linux only)
//	nvml              the NVIDIA driver answers NVML; no driver warns (a host without GPUs)
//	helper            the root helper answers on its socket, when one is there or was named
//	plugins           the plugin directory is safe to run from (not world-writable)
//	plugin            each bcx-<name> plugin is an executable that reports its version
//
// # Clock skew against the gateway
//
// The session's Welcome carries the gateway's clock, but doctor must work
// when no session can be had, and opening one would supersede the running
// agent's. TLS 1.3 carries no time (the Random field has not held one since
// TLS 1.2, and never reliably). So doctor asks the gateway for a
// JoinService.Challenge over a verified TLS connection without a client
// certificate (the nonce is stateless: nothing is written on the gateway)
// and reads its server_time: skew = server_time − the midpoint of the call,
// known to half the round trip. A gateway that sends no server_time is asked
// for a gRPC health check (grpc.health.v1.Health/Check) instead, whose HTTP
// Date header ("date", RFC 9110 §6.6.1) gives its clock to the second.
// Beyond 5 s it warns; beyond an hour it fails, since a node that far behind
// finds fresh certificates (backdated an hour) not yet valid until it has
// heard the gateway's time. A gateway that sends neither leaves the skew
// unknown, which is reported as ok with that said, next to the local NTP
// state of the clock check.
//
// node.certificate and node.session judge the certificate by the gateway's
// time as bcd node last measured it (its state file's clock_skew_seconds),
// as the gateway judges it: a machine whose clock is ahead does not call a
// working certificate expired.
package doctor
