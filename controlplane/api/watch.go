package api

import (
	"strings"

	"github.com/better-compute/better-compute/controlplane/watch"
)

// mountWatch serves the fleet page, GET /watch and the routes under it
// (package watch). Its cookie authorises only those routes: serveRPC reads
// bearer tokens alone, so a page session never reaches the API. The page's
// stream follows the server's event feed: one outbox reader per process.
func (s *Server) mountWatch() {
	h, err := watch.New(watch.Config{Auth: s.auth, CallerAddr: CallerAddr, Feed: s.feed,
		Secure: s.cfg.TLSCertFile != "" || strings.HasPrefix(s.cfg.PublicURL, "https://")}, s.store, s.log)
	if err != nil {
		panic("api: " + err.Error()) // only a bad Config fails, and this one is fixed
	}
	h.Register(s.mux)
}
