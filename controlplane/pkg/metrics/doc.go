// Package metrics is the control plane's Prometheus instrumentation
// (DESIGN.md, "api": GET /metrics). A Metrics holds its collectors on a
// private prometheus.Registry, never the global default one, and serves them
// in the Prometheus text format through Handler. The api role mounts that
// handler at /metrics behind the bearer token of host.metrics.bearerToken
// (Mount); a process without the api role serves it on host.metrics.listen
// (Serve). One namespace, bettercompute_, for every series.
//
// Two kinds of series:
//
// Read from the database at each scrape, so they describe the whole
// deployment whichever process is scraped (with split roles the api process
// runs neither gateway nor workers):
//
//	bettercompute_store_up                      gauge     1 when the database answered the scrape's ping
//	bettercompute_gateway_sessions              gauge     sessions of each live gateway {gateway, region}
//	bettercompute_gateway_max_streams           gauge     each live gateway's stream limit {gateway, region}
//	bettercompute_leases_held                   gauge     unexpired leases by kind (shard, singleton, gateway) and holder
//	bettercompute_lease_takeovers_total         counter   changes of holder, by lease kind: the sum of (epoch − 1)
//	bettercompute_outbox_backlog_entries        gauge     outbox entries a sink has not yet taken {sink}
//	bettercompute_store_query_duration_seconds  histogram the scrape's own queries {op}, and those components report
//	bettercompute_nodes                         gauge     nodes by state {state}, every state always
//	bettercompute_nodes_cordoned                gauge     cordoned nodes
//	bettercompute_gpus                          gauge     GPUs by health {health}, counted at most every GPUCacheTTL
//	bettercompute_outbox_lag_seconds            gauge     age of the oldest entry some configured sink has not taken
//	bettercompute_sink_delivery_lag_seconds     gauge     age of the oldest entry after a sink's cursor {sink}
//	bettercompute_singleton_held                gauge     1 when singleton:<job>'s lease is held {job}
//	bettercompute_remediation_breaker_tripped   gauge     1 while the pool's remediation breaker is tripped {pool}
//	bettercompute_remediation_breaker_acted_nodes, _limit_nodes, _held_cases  gauges of each pool's breaker {pool}
//	bettercompute_remediation_time_to_quarantine_seconds, _time_to_return_seconds  histograms over the cases kept {pool}
//	bettercompute_remediation_time_between_incidents_seconds  histogram {pool, scope: node or gpu}
//	bettercompute_gpu_incidents                 gauge     cases kept that name a GPU, by its model {model}, counted at most every GPUCacheTTL
//
// The remediation histograms are computed from the cases the database
// keeps (retention.history), reused for GPUCacheTTL: a count can fall when
// old returned cases are pruned.
//
// Lifetimes: bettercompute_certificate_expiry_timestamp_seconds {kind, use}
// for the certificate files given to WatchCertificate (kind serving: api,
// gateway; kind internal: server, client), read at each scrape, and, from
// the database at most every LifetimeCacheTTL, for the CAs of the sealed
// bundle (kind ca: node, gateway, internal) and the earliest certificate of
// the connected nodes (kind node, use earliest);
// bettercompute_api_tokens_expiring (live API tokens ending within
// iam.TokenExpiryWarning) and bettercompute_api_token_expiry_timestamp_seconds
// (the earliest end among them).
//
// Of the process itself: bettercompute_build_info {version, commit,
// goversion} (always 1).
//
// Reported by the components of the process through the methods of Metrics
// (each safe on a nil *Metrics, so a component can hold one unconditionally):
//
//	bettercompute_gateway_handshakes_total        counter   TLS handshakes a gateway completed {gateway}
//	bettercompute_gateway_refusals_total          counter   handshakes and sessions refused {gateway, reason}
//	bettercompute_gateway_heartbeat_lag_seconds   histogram how late heartbeats arrive past the interval {gateway}
//	bettercompute_gateway_node_clock_skew_max_seconds gauge the largest node clock skew of the gateway's sessions {gateway}
//	bettercompute_commands_finished_total         counter   commands that reached a terminal state {kind, state}
//	bettercompute_command_dispatch_latency_seconds histogram from a command's creation to its dispatch to the node
//	bettercompute_listener_accept_errors_total    counter   failed accepts of the process's listeners {listener}
//	bettercompute_nodes_drifting                  gauge     nodes whose driver or CUDA version is off their pool's {pool} (the drift job)
//
// plus the Go runtime (go_*) and process (process_*) collectors.
//
// Lease takeovers are derived from the leases table: every change of holder
// raises a lease's epoch by one, a graceful hand-over after a release
// included, so epoch − 1 counts them over the lease's life. The count is
// monotonic as long as lease rows are not deleted.
package metrics
