// Package sim simulates bcd daemons: FakeDaemon joins with a real join
// token and holds a real session with a real gateway, over real TLS, through
// the very protocol client bcd uses (package bcd/session, the one import of
// bcd/ that controlplane/ allows). Its identity is kept in memory, its
// facts are made up from its name, and its inventory is a simulated NVIDIA
// DGX A100 (8 × A100-SXM4-40GB) whose digest it reports in Hello and
// heartbeats and which it sends once after its first Welcome.
//
// Fleet joins and runs N FakeDaemons in one process, joins at a bounded
// concurrency, and counts what happens (joined, connected now, connects,
// reconnects), which is what `better-compute dev --sim N` and the scale
// benchmarks need: a gateway URL, a join token that admits N joins, and N.
//
// Each daemon costs one goroutine for its session plus gRPC's own, small
// gRPC buffers (session.DefaultBufferSize) and static 64 KiB windows: the
// same client bcd runs, at the footprint a 10,000-session benchmark needs.
package sim
