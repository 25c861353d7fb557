// Package doctor checks a deployment the way an operator would before and
// while it runs (DESIGN.md, "Operator CLI"; `better-compute doctor`). Each
// check is one function returning a Result: an id, a status (ok, warn or
// fail), a one-line hint saying what to do, and a detail with the figures
// behind it. Run runs them all in a fixed order.
//
// The checks, by id:
//
//	schema                  pending expand migrations (fail), pending contract ones (warn), or migrations this build does not know (fail)
//	clock                   the database clock against this machine's: warn beyond 2 s, fail beyond 30 s
//	pki                     the PKI bundle is present and opens with the deployment secret
//	pki.node-ca             the node CA's end, named with its date: warn under 90 days, fail under 30
//	pki.gateway-ca          the gateway CA's, the same way
//	pki.internal-ca         the internal CA's, the same way
//	iam.token-expiry        live API tokens ending within 7 days (warn); a long-lived one within a day (fail)
//	host.gateway.identity   the gateway role can authenticate daemons: node CA roots and trust domain, the
//	                        serving certificate files readable, matching their key, chaining to the gateway
//	                        serving CA (which the file must carry for pinning daemons), naming the public host,
//	                        and not near expiry (warn under 30 days, fail under 7)
//	api.tls                 plain HTTP on a listen address other machines reach (warn); the API certificate
//	                        (host.tls files, or mode auto's DataDir/pki/api.crt) unreadable, not matching its
//	                        key, expired, not yet valid or within 7 days of its end (fail), or within 30 days (warn)
//	host.gateway.notifier   PostgreSQL LISTEN (database.notifyURL, else database.url) hears a NOTIFY sent through
//	                        database.url within 2 s (the API's wake-ups to gateways; fail); in-process on SQLite
//	host.routes             configured host routes clash with neither basePath nor the built-in routes
//	workers.queue           commands past their deadline that the sweeper has not ended
//	workers.sweeper         the singleton:command-sweeper lease is held and not expired
//	sinks.dead-letter       events a sink gave up on wait in the dead-letter table (warn, counted per sink)
//	remediation.breaker     a pool's remediation circuit breaker is tripped (fail, until it closes after its window or reset-breaker)
//	database.btree-gist     PostgreSQL: btree_gist and the reservations' exclusion constraint are there (fail)
//	fleet.gateway-headroom  a live gateway's sessions against its max streams: warn at 90 %, fail at 100 %
//	host.gateway.internal   the internal control API (host.gateway.internal.tlsFiles): certificate chains to the
//	                        internal CA with an internal SPIFFE ID, names host.gateway.internal.address, is valid
//	                        and not within 7 days of its end (fail) nor 30 (warn); live gateways advertise an address (warn)
//	host.gateway.tunnels    the api can open tunnels: in its own process, or over the internal control API (split
//	                        roles without it: warn)
//	fleet.heartbeats        ready nodes silent for more than 3 heartbeat intervals
//	fleet.old-daemons       nodes whose bcd is older (semantic versions) than the newest one seen
//	fleet.expiring-certs    node certificates ending within 6 h (warn) or already ended (fail)
//	fleet.clock-skew        node clocks (as gateways measure them from heartbeats) more than 30 s off (warn)
//	fleet.duplicate-hostnames hostnames that several nodes share (warn): a reinstall joined with a plain
//	                        token, or machines named alike
//
// Times the database decides (deadlines, lease expiry, heartbeats) are
// compared with the database's clock, read by the clock check, so that a
// skewed operator machine does not produce false findings.
//
// When the schema is not migrated (pending migrations, or no database), only
// schema, clock and host.routes run: the other checks read tables that may
// not exist yet.
package doctor
