// Package compute embeds the Better Compute control plane in a Go program:
// the HTTP API as an http.Handler to mount on the program's own server or
// mux, beside its own routes, and the other roles (gateway, workers) run
// in the program's process.
//
//	cp, err := compute.New(compute.Config{Config: cfg}) // cfg from config.Load
//	mux := http.NewServeMux()
//	mux.Handle("/api/", cp.Handler()) // cfg.BasePath and below
//	mux.HandleFunc("GET /hello", hello) // the program's own routes
//	go cp.Run(ctx, nil)                 // the configuration's roles
//
// Handler is the same handler `better-compute serve` listens with
// (package api): the caller's address is the connection's peer
// (http.Request.RemoteAddr), and the client's own forwarding headers
// (X-Forwarded-For, Forwarded, X-Real-IP and the like) are removed before
// any method sees the request. Only when the peer is one of the
// configuration's trustedProxies (addresses or CIDRs; none by default) is
// X-Forwarded-For walked from the right to the first untrusted hop. So a
// program behind a load balancer names the balancer in trustedProxies, and
// one that is not names nothing: no caller can choose its own address.
//
// Run runs the roles the way serve does (migrations first, then the
// gateway, the API's background work, the workers; stopped in DESIGN.md's
// order when ctx ends), except that the api role opens no listener: it
// serves through Handler only, and host.listen and host.tls are unused
// (TLS is the program's server's business). Until Run has started the api
// role, Handler answers 503 UNAVAILABLE with Retry-After.
//
// The embedded SQLite default runs all roles in one process, as serve
// does; split roles need PostgreSQL (database.url). docs/embedding.md has
// the whole example.
package compute
